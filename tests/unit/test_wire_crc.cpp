// CRC-32C and CRC-32 (ISA-L; short CRC-32C pieces by the CPU's crc32 instruction): check values,
// chaining, and agreement with a plain bitwise reference written here from the definition
// (reflected, init and final XOR 0xFFFFFFFF), on both sides of the short-piece limit.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "wire/crc.h"

namespace ndwv::wire {
namespace {

uint32_t BitwiseCrc(uint32_t reflected_poly, const uint8_t* p, size_t n) {
  uint32_t reg = 0xFFFFFFFF;
  for (size_t i = 0; i < n; i++) {
    reg ^= p[i];
    for (int b = 0; b < 8; b++) reg = (reg >> 1) ^ ((reg & 1) ? reflected_poly : 0);
  }
  return ~reg;
}
constexpr uint32_t kCastagnoliReflected = 0x82F63B78;  // 0x1EDC6F41 bit-reversed
constexpr uint32_t kIeeeReflected = 0xEDB88320;        // 0x04C11DB7 bit-reversed

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

TEST(WireCrc, CheckValues) {
  const char* s = "123456789";
  EXPECT_EQ(Crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(Crc32(s, 9), 0xCBF43926u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  EXPECT_EQ(Crc32(nullptr, 0), 0u);
}

// The iSCSI test vectors (RFC 3720 appendix B.4), whose CRC MPA shares.
TEST(WireCrc, IscsiVectors) {
  uint8_t buf[32];
  std::memset(buf, 0, sizeof buf);
  EXPECT_EQ(Crc32c(buf, 32), 0x8A9136AAu);
  std::memset(buf, 0xFF, sizeof buf);
  EXPECT_EQ(Crc32c(buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) buf[i] = uint8_t(i);
  EXPECT_EQ(Crc32c(buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) buf[i] = uint8_t(31 - i);
  EXPECT_EQ(Crc32c(buf, 32), 0x113FDB5Cu);
}

TEST(WireCrc, MatchesBitwiseReference) {
  for (size_t n = 0; n <= 300; n++) {
    const auto v = RandomBytes(n, uint32_t(n));
    EXPECT_EQ(Crc32c(v.data(), n), BitwiseCrc(kCastagnoliReflected, v.data(), n)) << n;
    EXPECT_EQ(Crc32(v.data(), n), BitwiseCrc(kIeeeReflected, v.data(), n)) << n;
  }
}

TEST(WireCrc, ChainingEqualsOneCall) {
  const auto v = RandomBytes(257, 7);
  const uint32_t whole_c = Crc32c(v.data(), v.size());
  const uint32_t whole = Crc32(v.data(), v.size());
  for (size_t cut = 0; cut <= v.size(); cut++) {
    EXPECT_EQ(Crc32c(v.data() + cut, v.size() - cut, Crc32c(v.data(), cut)), whole_c) << cut;
    EXPECT_EQ(Crc32(v.data() + cut, v.size() - cut, Crc32(v.data(), cut)), whole) << cut;
  }
  // Three pieces, one of them empty, through the span overloads.
  std::span<const uint8_t> s(v);
  uint32_t c = Crc32c(s.first(100));
  c = Crc32c(s.subspan(100, 0), c);
  EXPECT_EQ(Crc32c(s.subspan(100), c), whole_c);
  uint32_t d = Crc32(s.first(1));
  d = Crc32(s.subspan(1, 200), d);
  EXPECT_EQ(Crc32(s.subspan(201), d), whole);
}

TEST(WireCrc, LargeBufferInOddPieces) {
  const auto v = RandomBytes(1 << 20, 99);
  const uint32_t whole = Crc32c(v.data(), v.size());
  uint32_t c = 0;
  size_t off = 0, step = 1;
  while (off < v.size()) {
    const size_t n = std::min(step, v.size() - off);
    c = Crc32c(v.data() + off, n, c);
    off += n;
    step = step * 3 + 1;
  }
  EXPECT_EQ(c, whole);
}

// Appending a CRC least-significant byte first leaves the fixed residue: a check of the byte
// order MPA uses on the wire (and Ethernet uses for its FCS).
TEST(WireCrc, Residue) {
  auto v = RandomBytes(64, 3);
  const uint32_t c = Crc32c(v.data(), v.size());
  const uint32_t e = Crc32(v.data(), v.size());
  auto vc = v, ve = v;
  for (int i = 0; i < 4; i++) vc.push_back(uint8_t(c >> (8 * i)));
  for (int i = 0; i < 4; i++) ve.push_back(uint8_t(e >> (8 * i)));
  EXPECT_EQ(Crc32c(vc.data(), vc.size()), 0x48674BC7u);
  EXPECT_EQ(Crc32(ve.data(), ve.size()), 0x2144DF1Cu);
}

}  // namespace
}  // namespace ndwv::wire
