// libFuzzer target: RoCEv2 packet decoding (wire/ib.h), with the ICRC checked (IPv4 and IPv6
// addresses) and without. Besides ASan's checks: the payload lies inside the input, after the
// opcode's headers and before pad and ICRC; whatever decodes re-encodes to the same header bytes
// (but for the fields the decoder ignores: reserved bits and bytes); and a packet whose ICRC we store decodes with it.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/ib.h"
#include "check.h"

using namespace ndwv::wire::ib;


namespace {

struct Addrs {
  sockaddr_in s4{}, d4{};
  sockaddr_in6 s6{}, d6{};
  IcrcAddresses v4, v6;
  Addrs() {
    s4.sin_family = d4.sin_family = AF_INET;
    s4.sin_port = htons(49152);
    d4.sin_port = htons(kRoceUdpPort);
    inet_pton(AF_INET, "10.0.0.1", &s4.sin_addr);
    inet_pton(AF_INET, "10.0.0.2", &d4.sin_addr);
    s6.sin6_family = d6.sin6_family = AF_INET6;
    s6.sin6_port = htons(49152);
    d6.sin6_port = htons(kRoceUdpPort);
    inet_pton(AF_INET6, "fd00::1", &s6.sin6_addr);
    inet_pton(AF_INET6, "fd00::2", &d6.sin6_addr);
    v4 = {reinterpret_cast<sockaddr*>(&s4), reinterpret_cast<sockaddr*>(&d4)};
    v6 = {reinterpret_cast<sockaddr*>(&s6), reinterpret_cast<sockaddr*>(&d6)};
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Addrs addrs;
  const std::span<const uint8_t> in(data, size);

  Packet p;
  const PacketError err = DecodePacket(in, nullptr, p);
  // With the ICRC checked the answer is the same, or BadIcrc.
  for (const IcrcAddresses* a : {&addrs.v4, &addrs.v6}) {
    Packet q;
    const PacketError e = DecodePacket(in, a, q);
    CHECK(e == err || (e == PacketError::BadIcrc && size >= kBthLen + kIcrcLen));
  }
  if (err == PacketError::Ok) {
    const Opcode op = p.headers.bth.opcode;
    const size_t hl = HeaderLength(op);
    CHECK(hl >= kBthLen && size >= hl + kIcrcLen);
    CHECK(p.payload.data() == data + hl);
    CHECK(hl + p.payload.size() + p.headers.bth.pad_count + kIcrcLen == size);
    CHECK(InfoFor(op).has_payload || p.payload.empty());
    // Re-encode: equal bytes except the BTH's reserved 7 bits, DETH's reserved byte and a CNP's
    // reserved bytes (written as zero, never read).
    std::vector<uint8_t> out(hl);
    CHECK(EncodeHeaders(p.headers, out) == hl);
    std::vector<uint8_t> want(data, data + hl);
    want[8] &= 0x80;
    if (InfoFor(op).headers & kDeth) want[kBthLen + 4] = 0;
    if (InfoFor(op).headers & kCnpReserved) std::fill(want.begin() + kBthLen, want.end(), uint8_t(0));
    CHECK(out == want);

    // The same packet with its ICRC stored decodes with the check, to the same payload.
    std::vector<uint8_t> d(data, data + size);
    StoreIcrc(addrs.v4, d);
    Packet q;
    CHECK(DecodePacket(d, &addrs.v4, q) == PacketError::Ok);
    CHECK(q.payload.size() == p.payload.size());
  }
  return 0;
}
