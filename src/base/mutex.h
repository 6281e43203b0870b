// Locks for the data path. Uncontended, lock and try_lock are one compare-and-swap and unlock
// one exchange, inline; std::mutex reaches the same two atomics through pthread's generic entry
// points, ~60 instructions a lock/unlock pair (callgrind), and a message takes about ten pairs on
// each side. Contended, a locker spins a moment, then sleeps in the kernel (a futex, base/futex.h)
// until the holder unlocks, as with std::mutex. The three-state protocol is the classic futex mutex:
// the unlocker makes a system call only when someone may be asleep. SharedMutex's readers are
// one atomic add each way, where pthread's rwlock takes ~80 instructions a pair.
//
// Debug and sanitizer builds define NDWV_CHECKED_BUILD (CMakeLists.txt): a Mutex then records the
// thread that holds it, and AssertHeld aborts, naming the lock and the caller, when the calling
// thread does not. Release builds record nothing and check nothing.
#pragma once
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <mutex>  // std::defer_lock_t, std::adopt_lock_t
#if defined(NDWV_CHECKED_BUILD)
#include <thread>
#endif

#include "base/futex.h"
#include "base/thread_safety.h"
#include "base/tsan.h"

namespace ndwv::base {

namespace detail {

// Prints which lock the caller at function (file:line) expected to hold, and aborts.
[[noreturn]] void LockNotHeld(const char* name, const void* lock, const char* function,
                              const char* file, int line) noexcept;

#if defined(NDWV_CHECKED_BUILD)
class LockOwner {
 public:
  constexpr explicit LockOwner(const char* name) noexcept : name_(name) {}
  // Cleared before the unlock proper, so that it never erases the next holder's mark.
  void Acquired() noexcept { owner_.store(std::this_thread::get_id(), std::memory_order_relaxed); }
  void Released() noexcept { owner_.store(std::thread::id(), std::memory_order_relaxed); }
  // Only the holder itself can have stored its id, so a relaxed load suffices.
  void Check(const void* lock, const char* function, const char* file, int line) const noexcept {
    if (owner_.load(std::memory_order_relaxed) != std::this_thread::get_id())
      LockNotHeld(name_, lock, function, file, line);
  }

 private:
  const char* name_;
  std::atomic<std::thread::id> owner_{};
};
#else
class LockOwner {
 public:
  constexpr explicit LockOwner(const char*) noexcept {}
  void Acquired() noexcept {}
  void Released() noexcept {}
  void Check(const void*, const char*, const char*, int) const noexcept {}
};
#endif

}  // namespace detail

class NDWV_CAPABILITY("mutex") Mutex {
 public:
  Mutex() noexcept { tsan::MutexCreate(this, 0); }
  // name: how AssertHeld's message calls it ("Class::member_").
  explicit Mutex(const char* name) noexcept : owner_(name) { tsan::MutexCreate(this, 0); }
  ~Mutex() { tsan::MutexDestroy(this); }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  // Debug builds: aborts unless the calling thread holds the lock; the analysis then treats it
  // as held. At the top of a function that requires the lock (NDWV_REQUIRES).
  void AssertHeld(const char* function = __builtin_FUNCTION(), const char* file = __builtin_FILE(),
                  int line = __builtin_LINE()) const noexcept NDWV_ASSERT_CAPABILITY(this) {
    owner_.Check(this, function, file, line);
  }

  bool try_lock() noexcept NDWV_TRY_ACQUIRE(true) NDWV_NO_THREAD_SAFETY_ANALYSIS {
    tsan::PreLock(this, tsan::kTryLock);
    uint32_t expected = kFree;
    bool locked = state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                                 std::memory_order_relaxed);
    if (locked) owner_.Acquired();
    tsan::PostLock(this, locked ? tsan::kTryLock : tsan::kTryLock | tsan::kTryLockFailed);
    return locked;
  }
  void lock() noexcept NDWV_ACQUIRE() NDWV_NO_THREAD_SAFETY_ANALYSIS {
    tsan::PreLock(this, 0);
    // try_lock's compare-and-swap, not try_lock itself: TSan would see a try-lock inside a lock.
    uint32_t expected = kFree;
    if (!state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire,
                                        std::memory_order_relaxed))
      LockContended();
    owner_.Acquired();
    tsan::PostLock(this, 0);
  }
  void unlock() noexcept NDWV_RELEASE() NDWV_NO_THREAD_SAFETY_ANALYSIS {
    tsan::PreUnlock(this, 0);
    owner_.Released();
    if (state_.exchange(kFree, std::memory_order_release) == kSleepers) FutexWake(state_, 1);
    tsan::PostUnlock(this, 0);
  }

 private:
  // kSleepers: locked, and someone may be asleep waiting for it.
  static constexpr uint32_t kFree = 0, kLocked = 1, kSleepers = 2;

  void LockContended() noexcept {
    // The data path's locks are held for a few hundred instructions: a short spin often finds
    // the lock free and saves the two context switches of a sleep. Then a few sched_yield calls:
    // with more threads than cores the holder is often runnable but preempted, and yielding lets
    // it finish (sleeping at once instead doubled the futex calls and halved the RoCE teardown
    // rate of 4,000 connections, 64 at a time). This is std::atomic::wait's spin, as before.
    for (int spin = 0; spin < kSpins + kYields; ++spin) {
      uint32_t expected = kFree;
      if (state_.load(std::memory_order_relaxed) == kFree &&
          state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire, std::memory_order_relaxed))
        return;
      if (spin < kSpins) CpuRelax();
      else sched_yield();
    }
    // Taken as kSleepers, not kLocked: another waiter may still be asleep, and this holder's
    // unlock must wake it.
    while (state_.exchange(kSleepers, std::memory_order_acquire) != kFree) FutexWait(state_, kSleepers);
  }
  static constexpr int kSpins = 12, kYields = 4;

  std::atomic<uint32_t> state_{kFree};
  [[no_unique_address]] detail::LockOwner owner_{"a base::Mutex"};  // empty in release builds
};
#if !defined(NDWV_CHECKED_BUILD)
static_assert(sizeof(Mutex) == sizeof(uint32_t), "a release build's Mutex is its state alone");
#endif

// A reader-writer lock whose readers are the data path and whose writers are rare (a region's
// registration). As std::shared_mutex on glibc, readers are not held off by a waiting writer, only
// by one that holds the lock: a thread may take it shared again while holding it shared.
class NDWV_CAPABILITY("shared mutex") SharedMutex {
 public:
  SharedMutex() noexcept { tsan::MutexCreate(this, tsan::kReadReentrant); }
  ~SharedMutex() { tsan::MutexDestroy(this); }
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  // Debug builds: aborts unless the lock is held shared. Readers are not recorded, so this
  // checks that some thread reads, not that the caller does; for a lock held through an object
  // the analysis cannot follow (a std::shared_lock that is moved or handed in).
  void AssertReaderHeld(const char* function = __builtin_FUNCTION(),
                        const char* file = __builtin_FILE(), int line = __builtin_LINE()) const
      noexcept NDWV_ASSERT_SHARED_CAPABILITY(this) {
#if defined(NDWV_CHECKED_BUILD)
    uint32_t s = state_.load(std::memory_order_relaxed);
    if ((s & kReaders) == 0 || (s & kWriter))
      detail::LockNotHeld("a base::SharedMutex, shared,", this, function, file, line);
#else
    (void)function, (void)file, (void)line;
#endif
  }

  void lock_shared() noexcept NDWV_ACQUIRE_SHARED() NDWV_NO_THREAD_SAFETY_ANALYSIS {
    tsan::PreLock(this, tsan::kReadLock);
    while (state_.fetch_add(1, std::memory_order_acquire) & kWriter) {
      // A writer holds it: step back, as unlock_shared does (not unlock_shared itself, which
      // would tell TSan of an unlock), and sleep until the writer lets go.
      uint32_t before = state_.fetch_sub(1, std::memory_order_release);
      if ((before & kReaders) == 1 && (before & kWriterWaits)) FutexWakeAll(state_);
      for (uint32_t s; (s = state_.load(std::memory_order_relaxed)) & kWriter;) {
        // Marked first: the writer's unlock makes a system call only when a reader sleeps.
        if (!(s & kReadersWait) &&
            !state_.compare_exchange_weak(s, s | kReadersWait, std::memory_order_relaxed))
          continue;
        FutexWait(state_, s | kReadersWait);
      }
    }
    tsan::PostLock(this, tsan::kReadLock);
  }
  void unlock_shared() noexcept NDWV_RELEASE_SHARED() NDWV_NO_THREAD_SAFETY_ANALYSIS {
    tsan::PreUnlock(this, tsan::kReadLock);
    uint32_t before = state_.fetch_sub(1, std::memory_order_release);
    // The last reader out wakes a waiting writer.
    if ((before & kReaders) == 1 && (before & kWriterWaits)) FutexWakeAll(state_);
    tsan::PostUnlock(this, tsan::kReadLock);
  }

  void lock() noexcept NDWV_ACQUIRE() NDWV_NO_THREAD_SAFETY_ANALYSIS {
    writers_.lock();
    tsan::PreLock(this, 0);
    for (uint32_t s = state_.load(std::memory_order_relaxed);;) {
      // A failed compare-and-swap reloads s: look again.
      if ((s & kReaders) == 0) {
        if (state_.compare_exchange_weak(s, kWriter, std::memory_order_acquire,
                                         std::memory_order_relaxed))
          break;
        continue;
      }
      if (!(s & kWriterWaits) &&
          !state_.compare_exchange_weak(s, s | kWriterWaits, std::memory_order_relaxed))
        continue;
      FutexWait(state_, s | kWriterWaits);  // the last reader out wakes us
      s = state_.load(std::memory_order_relaxed);
    }
    tsan::PostLock(this, 0);
  }
  void unlock() noexcept NDWV_RELEASE() NDWV_NO_THREAD_SAFETY_ANALYSIS {
    tsan::PreUnlock(this, 0);
    if (state_.fetch_and(~(kWriter | kReadersWait), std::memory_order_release) & kReadersWait)
      FutexWakeAll(state_);  // readers that stepped back and sleep
    tsan::PostUnlock(this, 0);
    writers_.unlock();
  }

 private:
  // Readers in the low bits; readers stepping back count there for a moment too. kReadersWait:
  // a reader sleeps until the writer lets go (set only while kWriter is, cleared with it).
  static constexpr uint32_t kWriter = 1u << 31, kWriterWaits = 1u << 30, kReadersWait = 1u << 29;
  static constexpr uint32_t kReaders = kReadersWait - 1;

  std::atomic<uint32_t> state_{0};
  Mutex writers_;  // one writer at a time goes for state_
};

// std::lock_guard for a Mutex, which the analysis sees (libstdc++'s own is not annotated).
class NDWV_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) NDWV_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  // Takes over a lock the caller holds (a successful try_lock).
  MutexLock(Mutex& mutex, std::adopt_lock_t) NDWV_REQUIRES(mutex) : mutex_(mutex) {}
  ~MutexLock() NDWV_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

// std::unique_lock for a Mutex: released and taken again inside its scope, or taken later.
class NDWV_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(Mutex& mutex) NDWV_ACQUIRE(mutex) : mutex_(mutex) { lock(); }
  UniqueLock(Mutex& mutex, std::defer_lock_t) NDWV_EXCLUDES(mutex) : mutex_(mutex) {}
  ~UniqueLock() NDWV_RELEASE() {
    if (held_) mutex_.unlock();
  }
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;

  void lock() NDWV_ACQUIRE() {
    mutex_.lock();
    held_ = true;
  }
  void unlock() NDWV_RELEASE() {
    held_ = false;
    mutex_.unlock();
  }

 private:
  Mutex& mutex_;
  bool held_ = false;
};

// A condition variable for one Mutex. std::condition_variable pairs with std::mutex, and glibc's
// costs three system calls per wake-up where two do: the signal, the wait, and a wake at the
// waiter's next unlock (a mutex taken back inside pthread_cond_wait is marked contended whether
// or not anyone waits). A notifier signals with the lock held, which only does the bookkeeping,
// and wakes after letting go of it (a sleeper woken under it would block on it at once):
//     int wake;
//     { MutexLock lock(mutex); ...change the condition...; wake = changed.SignalOne(mutex); }
//     changed.Wake(wake);
// A signal wakes only sleepers no earlier signal is already waking, as glibc's does. Sleepers may
// also wake spuriously; they check their condition again.
class CondVar {
 public:
  using Clock = std::chrono::steady_clock;

  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Every call names the same mutex, held: it guards the counts below.
  // Returns with the lock held again, after a signal or spuriously.
  void Wait(Mutex& mutex) NDWV_REQUIRES(mutex) { Sleep(mutex, std::nullopt); }
  // The same; false if `deadline` passed first.
  bool WaitUntil(Mutex& mutex, Clock::time_point deadline) NDWV_REQUIRES(mutex) {
    return Sleep(mutex, deadline);
  }

  // How many sleepers to Wake once the lock is let go: one, or all not yet being woken.
  [[nodiscard]] int SignalOne(Mutex& mutex) NDWV_REQUIRES(mutex) {
    (void)mutex;
    return Signal(1);
  }
  [[nodiscard]] int SignalAll(Mutex& mutex) NDWV_REQUIRES(mutex) {
    (void)mutex;
    return Signal(INT32_MAX);
  }
  void Wake(int count) noexcept {
    if (count > 0) FutexWake(sequence_, count);
  }

 private:
  bool Sleep(Mutex& mutex, std::optional<Clock::time_point> deadline) NDWV_REQUIRES(mutex) {
    // Read under the lock: a signal for any change made after it (under the lock, so after the
    // unlock below) moves the word, and the wait does not sleep.
    const uint32_t seen = sequence_.load(std::memory_order_relaxed);
    ++sleepers_;
    mutex.unlock();
    bool woken = true;
    if (!deadline) FutexWait(sequence_, seen);
    else woken = FutexWaitFor(sequence_, seen, *deadline - Clock::now());
    mutex.lock();
    --sleepers_;
    // Whether this was the wake signalled or not (a timeout, a spurious return), one fewer is on
    // its way to a sleeper: at worst a later signal wakes one more than needed, never one fewer.
    if (signalled_ > 0) --signalled_;
    return woken;
  }
  int Signal(int most) {
    const int count = std::min(most, sleepers_ - signalled_);
    if (count <= 0) return 0;
    signalled_ += count;
    sequence_.fetch_add(1, std::memory_order_relaxed);  // a sleeper not yet in the kernel does not go in
    return count;
  }

  std::atomic<uint32_t> sequence_{0};
  int sleepers_ = 0;   // between their Sleep's unlock and lock
  int signalled_ = 0;  // wakes on their way to sleepers
};

// std::shared_lock and std::unique_lock for a SharedMutex, seen by the analysis. A reader may
// let go before the end of its scope.
class NDWV_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mutex) NDWV_ACQUIRE_SHARED(mutex) : mutex_(mutex) {
    mutex_.lock_shared();
  }
  ~ReaderLock() NDWV_RELEASE() {
    if (held_) mutex_.unlock_shared();
  }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

  void unlock() NDWV_RELEASE() {
    held_ = false;
    mutex_.unlock_shared();
  }

 private:
  SharedMutex& mutex_;
  bool held_ = true;
};

class NDWV_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mutex) NDWV_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~WriterLock() NDWV_RELEASE() { mutex_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mutex_;
};

}  // namespace ndwv::base
