// The ring under every queue: positions that only grow, a capacity that need not be a power of two.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>

#include "dev/qp.h"
#include "dev/ring.h"

namespace ndwv::dev {
namespace {

TEST(Ring, AddressesPositionsFarPastItsStorageAndKeepsItsCapacity) {
  Ring<uint64_t> ring(3);
  EXPECT_EQ(ring.capacity(), 3u);
  for (uint64_t position = 0; position < 100; ++position) {
    ring[position] = position * 7;
    for (uint64_t live = position >= 2 ? position - 2 : 0; live <= position; ++live)
      ASSERT_EQ(ring[live], live * 7) << "position " << position;  // the last three are all there
  }
}

TEST(Ring, ResizeKeepsTheLiveEntriesInOrderFromPositionZero) {
  Ring<uint64_t> ring(3);
  for (uint64_t position = 10; position < 13; ++position) ring[position] = position;
  ring.Resize(5, 10, 3);
  EXPECT_EQ(ring.capacity(), 5u);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(ring[i], 10 + i);
}

// A work request keeps room for the SGEs its queue was created with, not for kMaxSge: entries lie
// that many bytes apart, each one's SGEs end where the next one's fields begin, and a resize
// moves them whole.
TEST(Ring, EntriesShorterThanTheirTypeLieBackToBackAndKeepTheirTails) {
  constexpr uint32_t kSges = 2;
  const size_t bytes = RecvWqeBytes(kSges);
  EXPECT_EQ(bytes, offsetof(RecvWqe, sge) + kSges * sizeof(Sge));
  EXPECT_LT(bytes, sizeof(RecvWqe));
  Ring<RecvWqe> ring(4, bytes);
  auto fill = [&](uint64_t position) {
    RecvWqe& wqe = ring[position];
    wqe.wr_id = position;
    wqe.num_sge = kSges;
    for (uint32_t i = 0; i < kSges; ++i) wqe.sge[i] = {position * 100 + i, uint32_t(position + i), uint32_t(i)};
  };
  auto check = [&](uint64_t position, uint64_t as) -> ::testing::AssertionResult {
    const RecvWqe& wqe = ring[position];
    if (wqe.wr_id != as || wqe.num_sge != kSges) return ::testing::AssertionFailure() << "fields of " << as;
    for (uint32_t i = 0; i < kSges; ++i)
      if (wqe.sge[i].addr != as * 100 + i || wqe.sge[i].length != uint32_t(as + i) || wqe.sge[i].lkey != i)
        return ::testing::AssertionFailure() << "SGE " << i << " of " << as;
    return ::testing::AssertionSuccess();
  };
  EXPECT_EQ(reinterpret_cast<const char*>(&ring[1]) - reinterpret_cast<const char*>(&ring[0]), ptrdiff_t(bytes));
  for (uint64_t position = 5; position < 9; ++position) fill(position);
  for (uint64_t position = 5; position < 9; ++position) EXPECT_TRUE(check(position, position));
  ring.Resize(6, 6, 3);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(check(i, 6 + i));

  // An entry with members to destroy (a Bind's window) is built and destroyed in its slot.
  Ring<SendWqe> sends(2, SendWqeBytes(1, 0));
  auto window = std::make_shared<MemoryWindow>();
  sends[0].window = window;
  sends[1].window = window;
  EXPECT_EQ(window.use_count(), 3);
  sends = Ring<SendWqe>(1, SendWqeBytes(1, 0));
  EXPECT_EQ(window.use_count(), 1);
}

}  // namespace
}  // namespace ndwv::dev
