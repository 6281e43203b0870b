// Lock-held assertions (NDWV_CHECKED_BUILD, base/mutex.h): AssertHeld passes for the holder,
// however it took the lock, and aborts, naming the lock and the caller, for anyone else.
// Compiled only in trees that define NDWV_CHECKED_BUILD (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "base/mutex.h"
#include "wait.h"

namespace ndwv::base {
namespace {

using dev::WaitUntil;

class BaseLockAsserts : public ::testing::Test {
 protected:
  // Death tests fork; with threads about, the child re-runs the test from the start.
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

void RequiresLock(Mutex& mutex) NDWV_REQUIRES(mutex) { mutex.AssertHeld(); }

TEST_F(BaseLockAsserts, HolderPassesWhicheverWayItLocked) {
  Mutex mutex("Test::mutex_");
  {
    MutexLock lock(mutex);
    RequiresLock(mutex);
  }
  ASSERT_TRUE(mutex.try_lock());
  RequiresLock(mutex);
  mutex.unlock();
  // Taken after a wait (the contended path records its holder too).
  std::atomic<bool> held{false}, release{false};
  std::thread holder([&] {
    MutexLock lock(mutex);
    held = true;
    WaitUntil([&] { return release.load(); });
  });
  ASSERT_TRUE(WaitUntil([&] { return held.load(); }));
  release = true;
  {
    MutexLock lock(mutex);  // waits for the holder
    RequiresLock(mutex);
  }
  holder.join();
}

TEST_F(BaseLockAsserts, UnheldLockAbortsNamingIt) {
  Mutex mutex("Test::mutex_");
  EXPECT_DEATH(mutex.AssertHeld(),
               "lock assertion failed: Test::mutex_ \\(.*\\) is not held by this thread in "
               "TestBody \\(.*test_base_lock_asserts.cpp:[0-9]+\\)");
}

TEST_F(BaseLockAsserts, ReleasedLockAborts) {
  Mutex mutex("Test::mutex_");
  mutex.lock();
  mutex.unlock();
  EXPECT_DEATH(RequiresLock(mutex), "Test::mutex_ .* is not held by this thread in RequiresLock");
}

TEST_F(BaseLockAsserts, LockHeldByAnotherThreadAborts) {
  Mutex mutex("Test::mutex_");
  std::atomic<bool> held{false}, release{false};
  std::thread holder([&] {
    MutexLock lock(mutex);
    held = true;
    WaitUntil([&] { return release.load(); });
  });
  ASSERT_TRUE(WaitUntil([&] { return held.load(); }));
  EXPECT_DEATH(mutex.AssertHeld(), "Test::mutex_ .* is not held by this thread");
  release = true;
  holder.join();
}

TEST_F(BaseLockAsserts, UniqueLockRecordsEachTaking) {
  Mutex mutex("Test::mutex_");
  UniqueLock lock(mutex);
  RequiresLock(mutex);
  lock.unlock();
  EXPECT_DEATH(mutex.AssertHeld(), "Test::mutex_ .* is not held");
  lock.lock();
  RequiresLock(mutex);
}

}  // namespace
}  // namespace ndwv::base
