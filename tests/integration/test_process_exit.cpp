// A program that calls exit() while other threads of it still call into ndwv (Microsoft's ndconn
// does, from a completion thread, with its other threads busy connecting). exit() runs the
// static destructors and the atexit handlers before the process ends, and meanwhile those threads,
// and ndwv's own, go on: nothing of the library may have been destroyed under them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

// Calls into the library in a loop (objects made and released, the address list) until the
// process ends; nothing it gets back is checked: during exit only surviving is.
void CallInForever(IND2Adapter* adapter, HANDLE file, std::atomic<bool>* started) {
  for (;;) {
    IND2Connector* connector = nullptr;
    if (SUCCEEDED(adapter->CreateConnector(IID_IND2Connector, file, reinterpret_cast<void**>(&connector))))
      connector->Release();
    IND2CompletionQueue* cq = nullptr;
    if (SUCCEEDED(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 16, 0, 0,
                                                 reinterpret_cast<void**>(&cq))))
      cq->Release();
    char addresses[1024];
    SIZE_T size = sizeof addresses;
    (void)NdQueryAddressList(0, reinterpret_cast<SOCKET_ADDRESS_LIST*>(addresses), &size);
    started->store(true);
  }
}

// Exits with a thread calling in. The exit report of the counters (NDWV_COUNTERS=exit) goes to
// a FIFO that the test opens only a while later: the exit stops there, after the static
// destructors ran (the report's handler is registered when the devices are first listed, so
// it runs after theirs), for as long as the test holds it.
IT_PEER(exits_while_a_thread_calls_in) {
  Adapter adapter;
  std::atomic<bool> started{false};
  std::thread(CallInForever, adapter.get(), adapter.file(), &started).detach();
  Deadline deadline;
  while (!started.load()) IT_CHECK_MSG(!deadline.Expired(), "the calling thread's first round");
  parent.Send("exiting");
  std::fflush(nullptr);
  std::exit(0);
}

TEST(ProcessExit, ThreadsStillCallingInWhileTheProcessExitsFindTheLibraryWhole) {
  char dir[] = "/tmp/ndwv-exit-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/counters";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string report;
  RunWithPeer("exits_while_a_thread_calls_in",
              {{"env:NDWV_COUNTERS", "exit"}, {"env:NDWV_COUNTERS_FILE", fifo}},
              [&](Channel& peer) {
    peer.Expect("exiting");
    usleep(300 * 1000);  // the exit waits in the report's open, the thread calls in meanwhile
    int fd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    IT_CHECK(fd >= 0);
    // Until the report's writer closes the FIFO (end of file: a read of 0 once it was read
    // from; before the writer opens it a read is 0 too), within a bound. A peer that crashed
    // fails the test at once (Pause).
    Deadline deadline;
    unsigned spins = 0;
    for (bool written = false;;) {
      IT_CHECK_MSG(!deadline.Expired(), "the end of the exit report");
      char buffer[4096];
      ssize_t n = read(fd, buffer, sizeof buffer);
      if (n > 0) {
        report.append(buffer, size_t(n));
        written = true;
      } else if (n == 0 && written) {
        break;
      } else {
        Pause(spins);
      }
    }
    close(fd);
  });
  unlink(fifo.c_str());
  rmdir(dir);
  // The exit went on to its end (the peer exited 0, checked by RunWithPeer) and wrote its report.
  EXPECT_NE(report.find("ndwv counters"), std::string::npos) << report;
}

}  // namespace
}  // namespace ndit
