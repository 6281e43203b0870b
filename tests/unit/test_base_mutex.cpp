// The data path's locks (base/mutex.h): exclusion under contention, sleepers woken, and the
// reader-writer rules the placement lock relies on. Every wait is bounded (wait.h).
#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace ndwv::base
