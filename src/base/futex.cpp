#include "base/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

namespace ndwv::base {

namespace {
uint32_t* Address(const std::atomic<uint32_t>& word) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free);
  return reinterpret_cast<uint32_t*>(const_cast<std::atomic<uint32_t>*>(&word));
}
}  // namespace

void FutexWait(const std::atomic<uint32_t>& word, uint32_t expected) noexcept {
  // EAGAIN (the word changed), EINTR (a signal): both mean "look again", which the caller does.
  syscall(SYS_futex, Address(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

bool FutexWaitFor(const std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) noexcept {
  if (timeout <= timeout.zero()) return false;
  timespec relative{time_t(timeout.count() / 1'000'000'000), long(timeout.count() % 1'000'000'000)};
  return syscall(SYS_futex, Address(word), FUTEX_WAIT_PRIVATE, expected, &relative, nullptr, 0) == 0 ||
         errno != ETIMEDOUT;
}

void FutexWake(const std::atomic<uint32_t>& word, int count) noexcept {
  syscall(SYS_futex, Address(word), FUTEX_WAKE_PRIVATE, count, nullptr, nullptr, 0);
}

}  // namespace ndwv::base
