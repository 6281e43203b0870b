// libFuzzer target: IB CM MADs and the RDMA-CM IP header (wire/ib_cm.h). Besides ASan's
// checks: a MAD that decodes re-encodes to bytes that decode to the same message (the first
// encoding drops only the bits ndwv ignores, so a second round is a fixed point), and an IP
// header that decodes re-encodes to its first 36 bytes but for the ignored bits.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/ib_cm.h"
#include "check.h"

using namespace ndwv::wire::ib;


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);

  CmMessage m;
  const CmError err = DecodeCm(in, m);
  CHECK(err == CmError::Ok || size != kMadLen || err != CmError::Truncated);
  if (err == CmError::Ok) {
    CHECK(size == kMadLen);
    CHECK(uint16_t(m.attr) == m.mad.attribute_id);
    std::vector<uint8_t> a(kMadLen), b(kMadLen);
    EncodeCm(m, std::span<uint8_t, kMadLen>(a.data(), kMadLen));
    CHECK(std::memcmp(a.data(), data, 18) == 0 && std::memcmp(a.data() + 20, data + 20, 4) == 0);
    CmMessage m2;
    CHECK(DecodeCm(a, m2) == CmError::Ok);
    EncodeCm(m2, std::span<uint8_t, kMadLen>(b.data(), kMadLen));
    CHECK(a == b);
  }

  // The IP header at the front of the input (as in a REQ's private data).
  IpHeader h;
  if (DecodeIpHeader(in, h)) {
    CHECK(size >= kIpHeaderLen);
    CHECK(h.source.ss_family == h.destination.ss_family);
    std::vector<uint8_t> out(kIpHeaderLen);
    CHECK(EncodeIpHeader(h, std::span<uint8_t, kIpHeaderLen>(out.data(), kIpHeaderLen)));
    CHECK(std::memcmp(out.data(), data, 1) == 0 && out[1] == (data[1] & 0xF0));
    CHECK(std::memcmp(out.data() + 2, data + 2, 2) == 0);
    if (h.source.ss_family == AF_INET6) {
      CHECK(std::memcmp(out.data() + 4, data + 4, 32) == 0);
    } else {
      CHECK(std::memcmp(out.data() + 16, data + 16, 4) == 0);
      CHECK(std::memcmp(out.data() + 32, data + 32, 4) == 0);
    }
  }
  return 0;
}
