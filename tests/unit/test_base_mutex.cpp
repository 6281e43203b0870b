// The data path's locks (base/mutex.h): exclusion under contention, sleepers woken, and the
// reader-writer rules the placement lock relies on. Every wait is bounded (wait.h).
#include <gtest/gtest.h>

#include <atomic>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "base/mutex.h"
#include "wait.h"

namespace ndwv::base {
namespace {

using dev::WaitUntil;

TEST(BaseMutex, TryLockFailsWhileHeldAndSucceedsAfter) {
  Mutex mutex;
  ASSERT_TRUE(mutex.try_lock());
  EXPECT_FALSE(mutex.try_lock());
  mutex.unlock();
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

TEST(BaseMutex, ContendingThreadsLoseNoIncrement) {
  Mutex mutex;
  uint64_t count = 0;  // plain: only the lock orders the increments
  constexpr int kThreads = 4, kEach = 200000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        std::lock_guard lock(mutex);
        ++count;
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(count, uint64_t(kThreads) * kEach);
}

TEST(BaseMutex, ALockerAsleepBehindAHolderWakesAtTheUnlock) {
  Mutex mutex;
  mutex.lock();
  std::atomic<bool> locked{false};
  std::thread locker([&] {
    std::lock_guard lock(mutex);
    locked = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // long enough to fall asleep
  EXPECT_FALSE(locked);
  mutex.unlock();
  EXPECT_TRUE(WaitUntil([&] { return locked.load(); }));
  locker.join();
}

TEST(BaseSharedMutex, ReadersShareAndAWriterWaitsForTheLastOne) {
  SharedMutex mutex;
  mutex.lock_shared();
  mutex.lock_shared();  // a second reader, no writer: no wait
  std::atomic<bool> written{false};
  std::thread writer([&] {
    std::unique_lock lock(mutex);
    written = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(written);
  mutex.unlock_shared();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(written);  // one reader still in
  mutex.unlock_shared();
  EXPECT_TRUE(WaitUntil([&] { return written.load(); }));
  writer.join();
}

TEST(BaseSharedMutex, AReaderMayLockAgainWhileAWriterWaits) {
  // The placement lock is taken shared again on one thread (a Terminate queued while placing
  // kicks the transmit path, which reads a Read Response's source under it).
  SharedMutex mutex;
  mutex.lock_shared();
  std::atomic<bool> written{false};
  std::thread writer([&] {
    std::unique_lock lock(mutex);
    written = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the writer now waits
  mutex.lock_shared();  // must not wait behind it
  mutex.unlock_shared();
  EXPECT_FALSE(written);
  mutex.unlock_shared();
  EXPECT_TRUE(WaitUntil([&] { return written.load(); }));
  writer.join();
}

TEST(BaseSharedMutex, ReadersWaitWhileAWriterHoldsIt) {
  SharedMutex mutex;
  mutex.lock();
  std::atomic<int> reading{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 3; ++i)
    readers.emplace_back([&] {
      std::shared_lock lock(mutex);
      reading++;
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(reading.load(), 0);
  mutex.unlock();
  EXPECT_TRUE(WaitUntil([&] { return reading.load() == 3; }));
  for (std::thread& reader : readers) reader.join();
}

TEST(BaseSharedMutex, WritersExcludeEachOtherAndReadersSeeWholeUpdates) {
  SharedMutex mutex;
  uint64_t a = 0, b = 0;  // a writer keeps them equal; a reader must never see them differ
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0};
  std::vector<std::thread> threads;
  for (int w = 0; w < 2; ++w)
    threads.emplace_back([&] {
      for (int i = 0; i < 200000; ++i) {
        std::unique_lock lock(mutex);
        ++a;
        ++b;
      }
    });
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&] {
      while (!stop) {
        {
          std::shared_lock lock(mutex);
          if (a != b) torn++;
        }
        std::this_thread::yield();  // readers are preferred: leave the writers a gap
      }
    });
  threads[0].join();
  threads[1].join();
  stop = true;
  threads[2].join();
  threads[3].join();
  EXPECT_EQ(a, 400000u);
  EXPECT_EQ(b, 400000u);
  EXPECT_EQ(torn.load(), 0u);
}

// ---- CondVar

// A signal wakes a sleeper; a second one before it has run is not another wake for it (the
// sleeper is already on its way): no second system call, as with glibc's condition variable.
TEST(BaseCondVar, ASignalWakesTheSleeperAndASecondFindsItAlreadyOnItsWay) {
  Mutex mutex;
  CondVar changed;
  bool flag = false;
  std::atomic<int> woken{0};
  std::thread sleeper([&] {
    MutexLock lock(mutex);
    while (!flag) changed.Wait(mutex);
    ++woken;
  });
  int first = 0, second = -1;
  ASSERT_TRUE(WaitUntil([&] {
    MutexLock lock(mutex);
    first = changed.SignalOne(mutex);  // 0 until the sleeper sleeps
    if (first) {
      flag = true;
      second = changed.SignalOne(mutex);
    }
    return first == 1;
  }));
  EXPECT_EQ(second, 0);
  changed.Wake(first);
  EXPECT_TRUE(WaitUntil([&] { return woken.load() == 1; }));
  sleeper.join();
  MutexLock lock(mutex);
  EXPECT_EQ(changed.SignalAll(mutex), 0) << "nobody sleeps any more";
}

TEST(BaseCondVar, WaitUntilReturnsFalseAtItsDeadlineWithTheLockHeld) {
  Mutex mutex;
  CondVar changed;
  MutexLock lock(mutex);
  auto start = CondVar::Clock::now();
  EXPECT_FALSE(changed.WaitUntil(mutex, start + std::chrono::milliseconds(20)));
  EXPECT_GE(CondVar::Clock::now() - start, std::chrono::milliseconds(20));
  mutex.AssertHeld();
  EXPECT_FALSE(mutex.try_lock());
}

// Producers hand items one by one to consumers that sleep between them: every item is taken,
// and no consumer waits out its (long) deadline, which only a lost wake-up would make it do. With
// one consumer a lost wake-up cannot hide behind another consumer's being awake.
TEST(BaseCondVar, ProducersAndSleepingConsumersLoseNoWakeUp) {
  for (int consumers : {1, 3}) {
    SCOPED_TRACE(std::to_string(consumers) + " consumers");
    Mutex mutex;
    CondVar ready;
    std::deque<int> items;
    bool done = false;
    constexpr int kProducers = 2, kEach = 20000;
    std::atomic<int> taken{0}, timeouts{0};
    std::vector<std::thread> threads;
    for (int c = 0; c < consumers; ++c)
      threads.emplace_back([&] {
        MutexLock lock(mutex);
        for (;;) {
          while (items.empty() && !done)
            if (!ready.WaitUntil(mutex, CondVar::Clock::now() + std::chrono::seconds(30))) ++timeouts;
          if (items.empty()) return;
          items.pop_front();
          ++taken;
        }
      });
    for (int p = 0; p < kProducers; ++p)
      threads.emplace_back([&] {
        for (int i = 0; i < kEach; ++i) {
          int wake;
          {
            MutexLock lock(mutex);
            items.push_back(i);
            wake = ready.SignalOne(mutex);
          }
          ready.Wake(wake);
          if (i % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));  // let them sleep
        }
      });
    EXPECT_TRUE(WaitUntil([&] { return taken.load() == kProducers * kEach; }, std::chrono::seconds(20)));
    int wake;
    {
      MutexLock lock(mutex);
      done = true;
      wake = ready.SignalAll(mutex);
    }
    ready.Wake(wake);
    for (std::thread& thread : threads) thread.join();
    EXPECT_EQ(taken.load(), kProducers * kEach);
    EXPECT_EQ(timeouts.load(), 0);
  }
}

}  // namespace
}  // namespace ndwv::base
