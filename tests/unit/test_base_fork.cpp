// The descriptor registry (base/fork.h): a forked child closes exactly the descriptors the library
// opened and has not closed, and counts its generation. The integration test test_fork.cpp checks
// what that means for ND objects.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "base/fork.h"

namespace ndwv::base {
namespace {

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(BaseFork, AChildClosesTheLibrarysOpenDescriptorsAndNoOthers) {
  int owned = OpenDescriptor([] { return eventfd(0, EFD_CLOEXEC); });
  int foreign = eventfd(0, EFD_CLOEXEC);
  int closed = OpenDescriptor([] { return eventfd(0, EFD_CLOEXEC); });
  CloseDescriptor(closed);
  int reused = eventfd(0, EFD_CLOEXEC);  // most likely `closed`'s number again: not ours now
  ASSERT_TRUE(owned >= 0 && foreign >= 0 && reused >= 0);
  uint32_t generation = ForkGeneration();

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Exit codes name the failed check; no gtest in the child.
    if (IsOpen(owned)) _exit(1);
    if (!IsOpen(foreign) || !IsOpen(reused)) _exit(2);
    if (ForkGeneration() != generation + 1 || !ForkedFromDevice()) _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));  // the child does not wait for anything
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status));
  EXPECT_TRUE(IsOpen(owned));  // the parent keeps its own
  EXPECT_EQ(generation, ForkGeneration());
  CloseDescriptor(owned);
  close(foreign);
  close(reused);
}

TEST(BaseFork, OpenDescriptorKeepsTheFailedCallsErrno) {
  int fd = OpenDescriptor([] {
    errno = EMFILE;
    return -1;
  });
  EXPECT_EQ(-1, fd);
  EXPECT_EQ(EMFILE, errno);
}

}  // namespace
}  // namespace ndwv::base
