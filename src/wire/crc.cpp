#include "wire/crc.h"

#include <isa-l/crc.h>

#include <climits>

namespace ndwv::wire {

uint32_t Crc32c(const void* data, size_t len, uint32_t crc) {
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
