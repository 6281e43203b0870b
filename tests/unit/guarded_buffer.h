// A registered region between two guard zones, all filled with a pattern, and the check that a
// hostile peer changed nothing outside what it was allowed to write. Shared by the hostile-peer
// tests of both transports.
#pragma once
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ndwv::dev {

inline constexpr size_t kGuard = 64;

// [guard][region][guard], all of it filled with a pattern; only the region is registered.
struct Buffer {
  Buffer(size_t length, uint8_t seed) : length(length), bytes(2 * kGuard + length) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(seed * 37 + i * 7 + (i >> 7));
    original = bytes;
  }
  uint8_t* region() { return bytes.data() + kGuard; }
  uint64_t addr() { return reinterpret_cast<uint64_t>(region()); }
  const size_t length;
  std::vector<uint8_t> bytes, original;
  uint32_t key = 0;   // its L_Key (local SGEs)
  uint32_t rkey = 0;  // its R_Key (what a peer names)
};

// The buffer equals its pattern except in [from, to) of the region (offsets into the region),
// where each byte is the pattern or `allowed` (allowed[i] is what may land at region offset from+i).
inline ::testing::AssertionResult Unchanged(const Buffer& b, const char* name, size_t from = 0, size_t to = 0,
                                     std::span<const uint8_t> allowed = {}) {
  for (size_t i = 0; i < b.bytes.size(); ++i) {
    if (b.bytes[i] == b.original[i]) continue;
    long offset = long(i) - long(kGuard);  // relative to the region
    if (offset >= long(from) && offset < long(to) && size_t(offset) - from < allowed.size() &&
        b.bytes[i] == allowed[size_t(offset) - from])
      continue;
    return ::testing::AssertionFailure()
           << name << ": byte at region offset " << offset << " changed from " << int(b.original[i]) << " to "
           << int(b.bytes[i]) << (offset < 0 || size_t(offset) >= b.length ? " (outside the region)" : "");
  }
  return ::testing::AssertionSuccess();
}

}  // namespace ndwv::dev
