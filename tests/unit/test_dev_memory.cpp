// Key checks of the protection domain: every remote access is checked against key, owning QP
// (windows), range and rights.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <optional>

#include <ndwv/wvstatus.h>

#include <algorithm>
#include <vector>

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

TEST_F(MemoryTest, DeregisteredKeysAreRefused) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteWrite, &lkey, &rkey), WV_SUCCESS);
  ASSERT_EQ(pd.Deregister(lkey), WV_SUCCESS);
  EXPECT_EQ(pd.CheckRemote(rkey, 1, base(), 1, kRemoteWrite), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.CheckLocal(lkey, base(), 1, false), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.Deregister(lkey), WV_INVALID_PARAMETER);
  uint32_t lkey2, rkey2;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteWrite, &lkey2, &rkey2), WV_SUCCESS);
  EXPECT_NE(lkey2, lkey);
  EXPECT_NE(rkey2, rkey);
  EXPECT_EQ(pd.CheckRemote(rkey, 1, base(), 1, kRemoteWrite), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.CheckRemote(rkey2, 1, base(), 1, kRemoteWrite), KeyCheck::Ok);
}

// Stale keys stay refused however often the table's entries are reused: here 3000 registrations,
// each deregistered before the next, in a table of a few entries (every entry is reused hundreds
// of times, so its generation wraps). Each new region answers to its own keys only.
TEST_F(MemoryTest, NoStaleKeyEverMatchesALaterRegion) {
  std::vector<uint32_t> stale;
  for (int i = 0; i < 3000; ++i) {
    uint32_t lkey, rkey;
    ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteWrite, &lkey, &rkey), WV_SUCCESS);
    ASSERT_EQ(pd.CheckLocal(lkey, base(), 1, true), KeyCheck::Ok);
    ASSERT_EQ(pd.CheckRemote(rkey, 1, base(), 1, kRemoteWrite), KeyCheck::Ok);
    for (uint32_t old : stale) {
      ASSERT_NE(old, lkey) << "registration " << i;
      ASSERT_NE(old, rkey) << "registration " << i;
    }
    ASSERT_EQ(pd.Deregister(lkey), WV_SUCCESS);
    // The last 100 registrations' keys, checked against every later one (a full scan would be
    // quadratic); the compare above covers them all.
    stale.push_back(lkey);
    stale.push_back(rkey);
    if (stale.size() > 200) stale.erase(stale.begin(), stale.begin() + 2);
    for (uint32_t old : stale) {
      ASSERT_EQ(pd.CheckRemote(old, 1, base(), 1, kRemoteWrite), KeyCheck::InvalidKey);
      ASSERT_EQ(pd.CheckLocal(old, base(), 1, false), KeyCheck::InvalidKey);
    }
  }
}

// The keys of consecutive registrations follow no pattern a peer could extend: not a counter (the
// old scheme, slot << 8 | generation, made every three consecutive keys an arithmetic
// progression), every byte changes from one key to the next most of the time, the L_Key is not
// the R_Key, and neither works for the other's purpose. The bounds are loose enough never to fail
// for random keys: a byte repeats between two random keys 1 time in 256 (here at most about 1 in
// 16, for the consumer part of fresh entries); a progression of three random keys is a 1 in 2^32
// event.
TEST_F(MemoryTest, KeysOfConsecutiveRegistrationsAreUnpredictable) {
  constexpr int kKeys = 1000;
  std::vector<uint32_t> lkeys, rkeys;
  static uint8_t regions[kKeys];
  for (int i = 0; i < kKeys; ++i) {
    uint32_t lkey, rkey;
    ASSERT_EQ(pd.Register(&regions[i], 1, kLocalWrite | kRemoteWrite, &lkey, &rkey), WV_SUCCESS);
    EXPECT_NE(lkey, rkey);
    EXPECT_NE(lkey, 0u);
    EXPECT_NE(rkey, 0u);
    EXPECT_NE(rkey >> 24, 0xFFu) << "the top byte 0xFF is the transports'";
    EXPECT_NE(lkey >> 24, 0xFFu);
    EXPECT_EQ(pd.CheckRemote(lkey, 1, uint64_t(&regions[i]), 1, kRemoteWrite), KeyCheck::InvalidKey)
        << "an L_Key grants no remote access";
    EXPECT_EQ(pd.CheckLocal(rkey, uint64_t(&regions[i]), 1, true), KeyCheck::InvalidKey)
        << "an R_Key is no local key";
    lkeys.push_back(lkey);
    rkeys.push_back(rkey);
  }
  std::vector<uint32_t> all = lkeys;
  all.insert(all.end(), rkeys.begin(), rkeys.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "two live keys are equal";
  for (const std::vector<uint32_t>* keys : {&lkeys, &rkeys}) {
    int progressions = 0;
    int changed[4] = {};
    for (int i = 1; i < kKeys; ++i) {
      uint32_t a = (*keys)[i - 1], b = (*keys)[i];
      for (int byte = 0; byte < 4; ++byte) changed[byte] += ((a ^ b) >> (8 * byte) & 0xFF) != 0;
      if (i >= 2 && b - a == a - (*keys)[i - 2]) progressions++;
    }
    EXPECT_LE(progressions, 2);
    for (int byte = 0; byte < 4; ++byte)
      EXPECT_GE(changed[byte], kKeys / 2) << "byte " << byte << " changed between only " << changed[byte]
                                          << " of " << kKeys - 1 << " consecutive keys";
  }
  for (uint32_t lkey : lkeys) ASSERT_EQ(pd.Deregister(lkey), WV_SUCCESS);
}

// A window's token changes completely on every bind, its consumer part included, and only the
// latest token works.
TEST_F(MemoryTest, EveryBindGivesTheWindowANewTokenAndRetiresTheOldOne) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite, &lkey, &rkey), WV_SUCCESS);
  auto mw = pd.AllocateWindow();
  ASSERT_TRUE(mw);
  std::vector<uint32_t> tokens;
  for (int i = 0; i < 1000; ++i) {
    uint32_t token;
    ASSERT_EQ(pd.BindWindow(mw.get(), 5, lkey, base(), 64, kRemoteWrite, &token), KeyCheck::Ok);
    ASSERT_EQ(pd.CheckRemote(token, 5, base(), 64, kRemoteWrite), KeyCheck::Ok);
    if (!tokens.empty()) {
      ASSERT_NE(token & 0xFF, tokens.back() & 0xFF) << "bind " << i << ": the consumer part did not change";
      for (size_t back = 1; back <= std::min<size_t>(tokens.size(), 100); ++back) {
        uint32_t old = tokens[tokens.size() - back];
        ASSERT_NE(token, old);
        ASSERT_EQ(pd.CheckRemote(old, 5, base(), 1, kRemoteWrite), KeyCheck::InvalidKey) << "bind " << i;
      }
    }
    tokens.push_back(token);
    if (i % 3 == 0) {
      EXPECT_TRUE(pd.InvalidateWindow(mw.get()));  // rebinding from unbound, too
    }
  }
  pd.FreeWindow(mw.get());
  EXPECT_EQ(pd.CheckRemote(tokens.back(), 5, base(), 1, kRemoteWrite), KeyCheck::InvalidKey);
  EXPECT_EQ(pd.Deregister(lkey), WV_SUCCESS);
}

// The attack of issue 18: a peer holding a window's token guesses the R_Key of the region under
// it, which was never advertised, to write past the window. The old scheme handed out the region's
// key as slot << 8 | 1 right before the window's slot; such guesses, and the token's neighbours,
// name nothing now.
TEST_F(MemoryTest, ARegionKeyCannotBeGuessedFromAWindowToken) {
  uint32_t lkey, rkey;
  ASSERT_EQ(pd.Register(buffer, sizeof buffer, kLocalWrite | kRemoteWrite, &lkey, &rkey), WV_SUCCESS);
  auto mw = pd.AllocateWindow();
  uint32_t token;
  ASSERT_EQ(pd.BindWindow(mw.get(), 5, lkey, base(), 64, kRemoteWrite, &token), KeyCheck::Ok);
  int granted = 0;
  for (uint32_t guess : {((token >> 8) - 1) << 8 | 1, token - 0x100, token + 0x100, token - 1, token + 1,
                         0x101u, 0x201u, 0x102u})
    granted += pd.CheckRemote(guess, 5, base() + 64, 16, kRemoteWrite) == KeyCheck::Ok;
  EXPECT_EQ(pd.CheckRemote(rkey, 5, base() + 64, 16, kRemoteWrite), KeyCheck::Ok);  // the real key does
  EXPECT_EQ(granted, 0);
  EXPECT_TRUE(pd.InvalidateWindow(mw.get()));
  pd.FreeWindow(mw.get());
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
