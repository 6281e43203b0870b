// Sleeping on a 32-bit word and waking its sleepers: the futex system calls, bare.
//
// std::atomic::wait reaches the same futex, but libstdc++ first spins, and its last spins are
// sched_yield calls: four system calls per wait that sleeps, each of which hands the core to
// another runnable thread. An idle work-pool worker went to sleep that way at every item: one in
// six of the system calls of a connection's life with one connect outstanding, and a fifth of its
// context switches (perf -e syscalls:sys_enter_sched_yield with call graphs). It also counts its
// waiters in a table shared by all addresses, two atomic operations per wait on a contended line.
// The callers here keep their own record of who sleeps, so they need neither.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace ndwv::base {

// Sleeps until `word` is woken, unless it no longer holds `expected` (then at once). May return
// spuriously: the caller looks at the word again.
void FutexWait(const std::atomic<uint32_t>& word, uint32_t expected) noexcept;
// The same for at most `timeout`; false if that much time passed.
bool FutexWaitFor(const std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) noexcept;
// Wakes at most `count` threads sleeping on `word`.
void FutexWake(const std::atomic<uint32_t>& word, int count) noexcept;
inline void FutexWakeAll(const std::atomic<uint32_t>& word) noexcept { FutexWake(word, INT32_MAX); }

// One step of a spin before a FutexWait: tells the core (and a hypervisor) that this is a spin.
inline void CpuRelax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace ndwv::base
