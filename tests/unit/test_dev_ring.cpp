// The ring under every queue: positions that only grow, a capacity that need not be a power of two.
#include <gtest/gtest.h>

#include <cstdint>

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

}  // namespace
}  // namespace ndwv::dev
