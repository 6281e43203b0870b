#include "base/fork.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <unordered_set>

#include "base/mutex.h"

namespace ndwv::base {

namespace {

std::atomic<uint32_t> g_generation{0};
std::atomic<bool> g_forked_from_device{false};

// Held by the forking thread across fork() (prepare to parent/child), so the child's copy of the
// set is whole. base::Mutex has no owner: the child's only thread may unlock it.
Mutex& RegistryMutex() {
  static Mutex* mutex = new Mutex;  // never destroyed: descriptors close during exit too
  return *mutex;
}

std::unordered_set<int>& Registry() {
  static auto* fds = new std::unordered_set<int>;
  return *fds;
}

// The lock is taken in the prepare handler and released in the parent's or the child's, which
// the analysis cannot pair.
void Prepare() NDWV_NO_THREAD_SAFETY_ANALYSIS { RegistryMutex().lock(); }
void InParent() NDWV_NO_THREAD_SAFETY_ANALYSIS { RegistryMutex().unlock(); }

void InChild() NDWV_NO_THREAD_SAFETY_ANALYSIS {
  if (!Registry().empty()) g_forked_from_device.store(true, std::memory_order_relaxed);
  for (int fd : Registry()) close(fd);
  Registry().clear();
  g_generation.fetch_add(1, std::memory_order_relaxed);
  RegistryMutex().unlock();
}

// From the library's load: a child forked before the first descriptor must count its generation.
[[maybe_unused]] const int g_watching =
    pthread_atfork(Prepare, InParent, InChild);

}  // namespace

namespace fork_detail {

// A lock and its unlock in two functions (OpenDescriptor calls both): the analysis cannot pair them.
void Lock() NDWV_NO_THREAD_SAFETY_ANALYSIS { RegistryMutex().lock(); }

void Unlock() NDWV_NO_THREAD_SAFETY_ANALYSIS {
  int saved = errno;  // the open's: a wake-up's system call must not change it
  RegistryMutex().unlock();
  errno = saved;
}

void Register(int fd) { Registry().insert(fd); }

}  // namespace fork_detail

int OpenSocket(int family, int type) {
  return OpenDescriptor([=] { return socket(family, type, 0); });
}

int OpenPipe(int ends[2], int flags) {
  int read_end = OpenDescriptor([&] {
    if (pipe2(ends, flags) != 0) return -1;
    fork_detail::Register(ends[1]);  // under the same lock
    return ends[0];
  });
  return read_end < 0 ? -1 : 0;
}

void CloseDescriptor(int fd) {
  if (fd < 0) return;
  // Closed under the lock: between an unregister and a close, a fork would leave the child a
  // copy; between a close and an unregister, the number could be reused and the child would
  // close a descriptor that is not ours.
  std::lock_guard lock(RegistryMutex());
  Registry().erase(fd);
  close(fd);
}

uint32_t ForkGeneration() { return g_generation.load(std::memory_order_relaxed); }

bool ForkedFromDevice() { return g_forked_from_device.load(std::memory_order_relaxed); }

}  // namespace ndwv::base
