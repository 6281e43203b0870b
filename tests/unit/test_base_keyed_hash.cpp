// base::KeyedHash: tables keyed by patterned or peer-chosen integers keep short chains.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "base/keyed_hash.h"

namespace ndwv::base {
namespace {

// The longest chain once `keys` are in a table of 257 buckets (what a table of ~150-260 entries
// has in libstdc++).
template <class Hash>
size_t LongestChain(const std::vector<uint32_t>& keys) {
  std::unordered_map<uint32_t, int, Hash> table;
  table.rehash(257);
  EXPECT_EQ(table.bucket_count(), 257u);
  for (uint32_t key : keys) table.emplace(key, 0);
  EXPECT_EQ(table.bucket_count(), 257u);  // no rehash: every key in the buckets measured
  size_t longest = 0;
  for (size_t b = 0; b < table.bucket_count(); ++b) longest = std::max(longest, table.bucket_size(b));
  return longest;
}

// 250 keys in 257 buckets at random: a chain of 12 or more has odds of ~4e-7.
constexpr size_t kRandomChainBound = 12;

TEST(KeyedHash, CmIdsInARowSpreadOverTheBuckets) {
  // CM communication IDs as CmAgent::NewCommId made them until they were permuted (and as a
  // peer's may still come): an 8-bit instance on top of a 24-bit index, both stepping by one per
  // ID. 2^24 is -1 modulo 257, so the integer itself as the hash (std::hash) puts IDs in a row
  // into one bucket until the instance wraps.
  std::vector<uint32_t> ids;
  uint32_t index = 0x3a5c11;
  uint8_t instance = 0;
  for (int i = 0; i < 250; ++i) ids.push_back(uint32_t(++instance) << 24 | (++index & 0xFFFFFF));
  EXPECT_EQ(LongestChain<std::hash<uint32_t>>(ids), 250u);
  EXPECT_LT(LongestChain<KeyedHasher>(ids), kRandomChainBound);
}

TEST(KeyedHash, KeysAPeerAimsAtOneBucketSpreadOverTheBuckets) {
  std::vector<uint32_t> aimed;
  for (uint32_t i = 1; i <= 250; ++i) aimed.push_back(i * 257);  // all 0 modulo 257
  EXPECT_EQ(LongestChain<std::hash<uint32_t>>(aimed), 250u);
  EXPECT_LT(LongestChain<KeyedHasher>(aimed), kRandomChainBound);
}

TEST(KeyedHash, EqualBytesHashEquallyAndEveryByteCounts) {
  struct Key {
    uint64_t guid;
    uint32_t id, zero;
  };
  Key a{0x0123456789abcdefull, 42, 0}, b = a;
  EXPECT_EQ(KeyedHasher()(a), KeyedHasher()(b));
  b.id = 43;
  EXPECT_NE(KeyedHasher()(a), KeyedHasher()(b));
  b = a;
  b.guid ^= 1ull << 63;
  EXPECT_NE(KeyedHasher()(a), KeyedHasher()(b));
  EXPECT_NE(KeyedHash("ab", 2), KeyedHash("ab", 1));
}

}  // namespace
}  // namespace ndwv::base
