#include "wire/crc.h"

#include <isa-l/crc.h>

#include <climits>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ndwv::wire {

namespace {

#if defined(__x86_64__)
// Short pieces (FPDU headers, small messages: several per message) go through the CPU's crc32
// instruction, which computes CRC-32C: below a few hundred bytes ISA-L's call and dispatch cost
// more than the CRC itself. Same register convention as crc32_iscsi (no inversion).
constexpr size_t kShortCrc = 256;
const bool kHaveCrc32Instruction = __builtin_cpu_supports("sse4.2");

// The next sizeof(T) bytes as a T; `p` moves past them.
template <class T>
T Take(const uint8_t*& p) {
  T value;
  memcpy(&value, p, sizeof value);
  p += sizeof value;
  return value;
}

__attribute__((target("sse4.2"))) uint32_t Crc32cRegisterShort(const uint8_t* p, size_t len, uint32_t reg) {
  uint64_t wide = reg;
  for (; len >= 8; len -= 8) wide = _mm_crc32_u64(wide, Take<uint64_t>(p));
  reg = uint32_t(wide);
  // Fewer than 8 bytes left: a 4-, a 2- and a 1-byte step, as the bits of the count say.
  if (len & 4) reg = _mm_crc32_u32(reg, Take<uint32_t>(p));
  if (len & 2) reg = _mm_crc32_u16(reg, Take<uint16_t>(p));
  if (len & 1) reg = _mm_crc32_u8(reg, *p);
  return reg;
}
#endif

}  // namespace

uint32_t Crc32c(const void* data, size_t len, uint32_t crc) {
#if defined(__x86_64__)
  if (len < kShortCrc && kHaveCrc32Instruction)
    return ~Crc32cRegisterShort(static_cast<const uint8_t*>(data), len, ~crc);
#endif
  // ISA-L's crc32_iscsi does no inversion at all: it takes and returns the raw shift register.
  // The standard CRC-32C starts the register at 0xFFFFFFFF and inverts it at the end, so we
  // invert on the way in and out. Inverting a previous result gives back its register, which
  // is what makes chaining work. crc32_iscsi takes an int length and a non-const pointer (it
  // only reads), hence the chunking and the cast.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  uint32_t reg = ~crc;
  while (len > 0) {
    const int n = len > size_t(INT_MAX) ? INT_MAX : int(len);
    reg = crc32_iscsi(p, n, reg);
    p += n;
    len -= size_t(n);
  }
  return ~reg;
}

uint32_t Crc32(const void* data, size_t len, uint32_t crc) {
  // crc32_gzip_refl follows zlib: it inverts on entry and on exit itself, so a previous result
  // is passed straight through.
  return crc32_gzip_refl(crc, static_cast<const unsigned char*>(data), len);
}

}  // namespace ndwv::wire
