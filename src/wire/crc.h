// CRC-32C (MPA's FPDU CRC) and CRC-32 (RoCEv2's ICRC), computed by ISA-L; short CRC-32C pieces
// by the CPU's crc32 instruction.
//
// Both functions use the usual convention: start value and final XOR are 0xFFFFFFFF, done
// inside the function. `crc` is a previous result (0 to start), so that a CRC over pieces
// chains:  Crc32c(b, nb, Crc32c(a, na)) == Crc32c(a ‖ b, na + nb).
// Check values: Crc32c("123456789") == 0xE3069283, Crc32("123456789") == 0xCBF43926.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ndwv::wire {

uint32_t Crc32c(const void* data, size_t len, uint32_t crc = 0);
uint32_t Crc32(const void* data, size_t len, uint32_t crc = 0);

inline uint32_t Crc32c(std::span<const uint8_t> data, uint32_t crc = 0) {
  return Crc32c(data.data(), data.size(), crc);
}
inline uint32_t Crc32(std::span<const uint8_t> data, uint32_t crc = 0) {
  return Crc32(data.data(), data.size(), crc);
}

}  // namespace ndwv::wire
