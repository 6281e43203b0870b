// Key checks of the protection domain: every remote access is checked against key, owning QP
// (windows), range and rights.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include <ndwv/wvstatus.h>

#include "dev/memory.h"

namespace ndwv::dev {
namespace {

struct MemoryTest : ::testing::Test {
  ProtectionDomain pd;
  alignas(64) uint8_t buffer[4096] = {};
  uint64_t base() const { return reinterpret_cast<uint64_t>(buffer); }
};

TEST_F(MemoryTest, RegionGrantsOnlyItsRangeAndRights) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteRead, &lkey, &rkey), WV_SUCCESS);
  EXPECT_EQ(pd.CheckLocal(lkey, base(), sizeof buffer, true), KeyCheck::Ok);
  EXPECT_EQ(pd.CheckLocal(lkey, base() + 4000, 96, false), KeyCheck::Ok);
  EXPECT_EQ(pd.CheckLocal(lkey, base() + 4000, 97, false), KeyCheck::OutOfBounds);
  EXPECT_EQ(pd.CheckLocal(lkey, base() - 1, 1, false), KeyCheck::OutOfBounds);
  EXPECT_EQ(pd.CheckRemote(rkey, 7, base(), 100, kRemoteRead), KeyCheck::Ok);
  EXPECT_EQ(pd.CheckRemote(rkey, 7, base(), 100, kRemoteWrite), KeyCheck::NoRights);
  EXPECT_EQ(pd.CheckRemote(rkey, 7, base() + sizeof buffer, 1, kRemoteRead), KeyCheck::OutOfBounds);
  // A huge length must not wrap around the range check.
  EXPECT_EQ(pd.CheckRemote(rkey, 7, base() + 8, ~uint64_t(0) - 4, kRemoteRead), KeyCheck::OutOfBounds);
  EXPECT_EQ(pd.CheckRemote(rkey ^ 0x100, 7, base(), 1, kRemoteRead), KeyCheck::InvalidKey);
}

TEST_F(MemoryTest, LocalWriteNeedsTheRight) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kRemoteRead, &lkey, &rkey), WV_SUCCESS);
  EXPECT_EQ(pd.CheckLocal(lkey, base(), 8, false), KeyCheck::Ok);
  EXPECT_EQ(pd.CheckLocal(lkey, base(), 8, true), KeyCheck::NoRights);
}

TEST_F(MemoryTest, DeregisteredKeyIsRefusedEvenIfTheSlotIsReused) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteWrite, &lkey, &rkey), WV_SUCCESS);
  ASSERT_EQ(pd.Deregister(lkey), WV_SUCCESS);
  EXPECT_EQ(pd.CheckRemote(rkey, 1, base(), 1, kRemoteWrite), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.Deregister(lkey), WV_INVALID_PARAMETER);
  uint32_t lkey2, rkey2;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteWrite, &lkey2, &rkey2), WV_SUCCESS);
  EXPECT_EQ(lkey2 >> 8, lkey >> 8);  // same slot ...
  EXPECT_NE(rkey2, rkey);            // ... new generation
  EXPECT_EQ(pd.CheckRemote(rkey, 1, base(), 1, kRemoteWrite), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.CheckRemote(rkey2, 1, base(), 1, kRemoteWrite), KeyCheck::Ok);
}

TEST_F(MemoryTest, WindowIsBoundToOneQpRangeAndRightsWithAFreshKeyPerBind) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite, &lkey, &rkey), WV_SUCCESS);
  // The region itself grants no remote access.
  EXPECT_EQ(pd.CheckRemote(rkey, 5, base(), 1, kRemoteRead), KeyCheck::NoRights);
  auto mw = pd.AllocateWindow();
  ASSERT_TRUE(mw);
  uint32_t key1;
  ASSERT_EQ(pd.BindWindow(mw.get(), 5, lkey, base() + 100, 200, kRemoteRead | kRemoteWrite, &key1), KeyCheck::Ok);
  EXPECT_EQ(pd.CheckRemote(key1, 5, base() + 100, 200, kRemoteWrite), KeyCheck::Ok);
  EXPECT_EQ(pd.CheckRemote(key1, 5, base() + 99, 2, kRemoteWrite), KeyCheck::OutOfBounds);
  EXPECT_EQ(pd.CheckRemote(key1, 6, base() + 100, 1, kRemoteWrite), KeyCheck::WrongQp);
  EXPECT_EQ(pd.Deregister(lkey), WV_DEVICE_BUSY);  // a window is bound into it

  uint32_t key2;
  ASSERT_EQ(pd.BindWindow(mw.get(), 5, lkey, base(), 10, kRemoteRead, &key2), KeyCheck::Ok);
  EXPECT_NE(key1, key2);
  EXPECT_EQ(pd.CheckRemote(key1, 5, base() + 100, 1, kRemoteWrite), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.CheckRemote(key2, 5, base(), 10, kRemoteWrite), KeyCheck::NoRights);

  EXPECT_TRUE(pd.InvalidateWindow(mw.get()));
  EXPECT_FALSE(pd.InvalidateWindow(mw.get()));
  EXPECT_EQ(pd.CheckRemote(key2, 5, base(), 1, kRemoteRead), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.Deregister(lkey), WV_SUCCESS);
  pd.FreeWindow(mw.get());
}

TEST_F(MemoryTest, WritableWindowNeedsLocalWriteOnTheRegion) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kRemoteRead, &lkey, &rkey), WV_SUCCESS);
  auto mw = pd.AllocateWindow();
  uint32_t key;
  EXPECT_EQ(pd.BindWindow(mw.get(), 1, lkey, base(), 8, kRemoteWrite, &key), KeyCheck::NoRights);
  EXPECT_EQ(pd.BindWindow(mw.get(), 1, lkey, base(), 8, kRemoteRead, &key), KeyCheck::Ok);
  EXPECT_EQ(pd.BindWindow(mw.get(), 1, lkey, base() + 4090, 8, kRemoteRead, &key), KeyCheck::OutOfBounds);
  pd.FreeWindow(mw.get());
}

// A peer's Send with Invalidate (ND v1's SendAndInvalidate) unbinds only a window bound, under
// that very key, to the connection it arrives on, and only once.
TEST_F(MemoryTest, RemoteInvalidationTakesOnlyAWindowBoundToTheConnection) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite, &lkey, &rkey), WV_SUCCESS);
  auto mw = pd.AllocateWindow();
  uint32_t key;
  ASSERT_EQ(pd.BindWindow(mw.get(), 5, lkey, base(), 64, kRemoteRead, &key), KeyCheck::Ok);
  std::optional<uint64_t> report;
  EXPECT_FALSE(pd.InvalidateRemote(rkey, 5, &report));     // a region's key
  EXPECT_FALSE(pd.InvalidateRemote(key, 6, &report));      // another connection's window
  EXPECT_FALSE(pd.InvalidateRemote(key ^ 0x1, 5, &report));  // another generation
  EXPECT_EQ(pd.CheckRemote(key, 5, base(), 64, kRemoteRead), KeyCheck::Ok);
  EXPECT_TRUE(pd.InvalidateRemote(key, 5, &report));
  EXPECT_FALSE(report.has_value());  // nobody asked for a report
  EXPECT_EQ(pd.CheckRemote(key, 5, base(), 1, kRemoteRead), KeyCheck::InvalidKey);
  EXPECT_FALSE(pd.InvalidateRemote(key, 5, &report));  // once
  EXPECT_FALSE(pd.InvalidateWindow(mw.get()));         // and the owner's Invalidate then fails

  pd.SetRemoteInvalidateId(mw.get(), 0xABCD);
  ASSERT_EQ(pd.BindWindow(mw.get(), 5, lkey, base(), 64, kRemoteRead, &key), KeyCheck::Ok);
  EXPECT_TRUE(pd.InvalidateRemote(key, 5, &report));
  EXPECT_EQ(report, std::optional<uint64_t>(0xABCD));
  EXPECT_EQ(pd.Deregister(lkey), WV_SUCCESS);  // the window no longer holds the region
  pd.FreeWindow(mw.get());
}

// Registration refuses memory that is not mapped, rather than leaving the device to fault on it.
TEST_F(MemoryTest, RegistrationOfUnmappedMemoryIsRefused) {
  long page = sysconf(_SC_PAGESIZE);
  void* area = mmap(nullptr, size_t(3 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(area, MAP_FAILED);
  auto* bytes = static_cast<uint8_t*>(area);
  ASSERT_EQ(munmap(bytes + page, size_t(page)), 0);  // a hole in the middle
  uint32_t lkey, rkey;
  EXPECT_EQ(pd.Register(bytes, uint64_t(3 * page), kLocalWrite, &lkey, &rkey), WV_ACCESS_VIOLATION);
  EXPECT_EQ(pd.Register(bytes + page + 10, 5, kLocalWrite, &lkey, &rkey), WV_ACCESS_VIOLATION);
  ASSERT_EQ(pd.Register(bytes + 1, uint64_t(page - 1), kLocalWrite, &lkey, &rkey), WV_SUCCESS);
  EXPECT_EQ(pd.Deregister(lkey), WV_SUCCESS);
  munmap(bytes, size_t(page));
  munmap(bytes + 2 * page, size_t(page));
}

}  // namespace
}  // namespace ndwv::dev
