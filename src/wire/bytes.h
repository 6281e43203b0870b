// Big-endian (network order) loads and stores for the wire codecs. Byte-wise on purpose: wire
// buffers are not aligned, and compilers turn these into single moves plus a byte swap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ndwv::wire {

constexpr uint16_t LoadBe16(const uint8_t* p) { return uint16_t(uint16_t(p[0]) << 8 | p[1]); }
constexpr uint32_t LoadBe32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}
constexpr uint64_t LoadBe64(const uint8_t* p) {
  return uint64_t(LoadBe32(p)) << 32 | LoadBe32(p + 4);
}
constexpr uint32_t LoadLe32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

constexpr void StoreBe16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
constexpr void StoreBe32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v >> 24);
  p[1] = uint8_t(v >> 16);
  p[2] = uint8_t(v >> 8);
  p[3] = uint8_t(v);
}
constexpr void StoreBe64(uint8_t* p, uint64_t v) {
  StoreBe32(p, uint32_t(v >> 32));
  StoreBe32(p + 4, uint32_t(v));
}
constexpr void StoreLe32(uint8_t* p, uint32_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v >> 16);
  p[3] = uint8_t(v >> 24);
}

}  // namespace ndwv::wire
