#include "wire/ib.h"

#include <netinet/in.h>

#include <array>
#include <cstring>

#include "wire/bytes.h"
#include "wire/crc.h"

namespace ndwv::wire::ib {

const char* ToString(Opcode op) { return InfoFor(op).name; }

const char* ToString(PacketError e) {
  switch (e) {
    case PacketError::Ok: return "ok";
    case PacketError::Truncated: return "truncated packet";
    case PacketError::BadVersion: return "bad BTH transport version";
    case PacketError::BadOpcode: return "unknown opcode";
    case PacketError::PayloadNotAllowed: return "payload on an opcode that carries none";
    case PacketError::BadIcrc: return "bad ICRC";
  }
  return "?";
}

namespace {

// {known, headers, first, last, has_payload, class, name}, one row per opcode (IBTA vol. 1, 9.2).
struct OpcodeRow {
  Opcode opcode;
  OpcodeInfo info;
};
constexpr OpcodeRow kOpcodes[] = {
    {Opcode::SendFirst, {true, 0, true, false, true, OpcodeClass::Send, "SEND FIRST"}},
    {Opcode::SendMiddle, {true, 0, false, false, true, OpcodeClass::Send, "SEND MIDDLE"}},
    {Opcode::SendLast, {true, 0, false, true, true, OpcodeClass::Send, "SEND LAST"}},
    {Opcode::SendLastImm, {true, kImmDt, false, true, true, OpcodeClass::Send, "SEND LAST with Immediate"}},
    {Opcode::SendOnly, {true, 0, true, true, true, OpcodeClass::Send, "SEND ONLY"}},
    {Opcode::SendOnlyImm, {true, kImmDt, true, true, true, OpcodeClass::Send, "SEND ONLY with Immediate"}},
    {Opcode::WriteFirst, {true, kReth, true, false, true, OpcodeClass::Write, "RDMA WRITE FIRST"}},
    {Opcode::WriteMiddle, {true, 0, false, false, true, OpcodeClass::Write, "RDMA WRITE MIDDLE"}},
    {Opcode::WriteLast, {true, 0, false, true, true, OpcodeClass::Write, "RDMA WRITE LAST"}},
    {Opcode::WriteLastImm,
     {true, kImmDt, false, true, true, OpcodeClass::Write, "RDMA WRITE LAST with Immediate"}},
    {Opcode::WriteOnly, {true, kReth, true, true, true, OpcodeClass::Write, "RDMA WRITE ONLY"}},
    {Opcode::WriteOnlyImm,
     {true, kReth | kImmDt, true, true, true, OpcodeClass::Write, "RDMA WRITE ONLY with Immediate"}},
    {Opcode::ReadRequest, {true, kReth, true, true, false, OpcodeClass::ReadRequest, "RDMA READ REQUEST"}},
    {Opcode::ReadResponseFirst,
     {true, kAeth, true, false, true, OpcodeClass::ReadResponse, "RDMA READ RESPONSE FIRST"}},
    {Opcode::ReadResponseMiddle,
     {true, 0, false, false, true, OpcodeClass::ReadResponse, "RDMA READ RESPONSE MIDDLE"}},
    {Opcode::ReadResponseLast,
     {true, kAeth, false, true, true, OpcodeClass::ReadResponse, "RDMA READ RESPONSE LAST"}},
    {Opcode::ReadResponseOnly,
     {true, kAeth, true, true, true, OpcodeClass::ReadResponse, "RDMA READ RESPONSE ONLY"}},
    {Opcode::Acknowledge, {true, kAeth, true, true, false, OpcodeClass::Acknowledge, "ACKNOWLEDGE"}},
    {Opcode::AtomicAcknowledge,
     {true, kAeth | kAtomicAckEth, true, true, false, OpcodeClass::AtomicAcknowledge, "ATOMIC ACKNOWLEDGE"}},
    {Opcode::CompareSwap, {true, kAtomicEth, true, true, false, OpcodeClass::Atomic, "COMPARE SWAP"}},
    {Opcode::FetchAdd, {true, kAtomicEth, true, true, false, OpcodeClass::Atomic, "FETCH ADD"}},
    {Opcode::SendLastInv, {true, kIeth, false, true, true, OpcodeClass::Send, "SEND LAST with Invalidate"}},
    {Opcode::SendOnlyInv, {true, kIeth, true, true, true, OpcodeClass::Send, "SEND ONLY with Invalidate"}},
    {Opcode::UdSendOnly, {true, kDeth, true, true, true, OpcodeClass::UdSend, "UD SEND ONLY"}},
    {Opcode::UdSendOnlyImm,
     {true, kDeth | kImmDt, true, true, true, OpcodeClass::UdSend, "UD SEND ONLY with Immediate"}},
    {Opcode::Cnp, {true, kCnpReserved, true, true, false, OpcodeClass::CongestionNotification, "CNP"}},
};

// The rows by opcode value; every other value is unknown.
constexpr std::array<OpcodeInfo, 256> kByValue = [] {
  std::array<OpcodeInfo, 256> table{};
  for (OpcodeInfo& info : table) info = {false, 0, false, false, false, OpcodeClass::Unknown, "unknown opcode"};
  for (const OpcodeRow& row : kOpcodes) table[uint8_t(row.opcode)] = row.info;
  return table;
}();

}  // namespace

const OpcodeInfo& InfoFor(Opcode op) { return kByValue[uint8_t(op)]; }

namespace {

size_t ExtensionLength(uint8_t headers) {
  return (headers & kDeth ? kDethLen : 0) + (headers & kReth ? kRethLen : 0) +
         (headers & kAtomicEth ? kAtomicEthLen : 0) + (headers & kAeth ? kAethLen : 0) +
         (headers & kAtomicAckEth ? kAtomicAckEthLen : 0) + (headers & kImmDt ? kImmDtLen : 0) +
         (headers & kIeth ? kIethLen : 0) + (headers & kCnpReserved ? kCnpReservedLen : 0);
}

}  // namespace

size_t HeaderLength(Opcode op) {
  const OpcodeInfo info = InfoFor(op);
  return info.known ? kBthLen + ExtensionLength(info.headers) : 0;
}

// ---- headers -----------------------------------------------------------------------------------

size_t EncodeHeaders(const Headers& h, std::span<uint8_t> out) {
  const OpcodeInfo info = InfoFor(h.bth.opcode);
  if (!info.known) return 0;
  const size_t len = kBthLen + ExtensionLength(info.headers);
  if (out.size() < len) return 0;
  uint8_t* p = out.data();

  const Bth& b = h.bth;
  p[0] = uint8_t(b.opcode);
  p[1] = uint8_t((b.solicited ? 0x80 : 0) | (b.mig_req ? 0x40 : 0) | (b.pad_count & 3) << 4 |
                 (b.tver & 0xF));
  StoreBe16(p + 2, b.pkey);
  StoreBe32(p + 4, uint32_t(b.resv8a) << 24 | (b.dest_qp & kQpnMask));
  StoreBe32(p + 8, (b.ack_req ? 0x80000000u : 0) | (b.psn & kPsnMask));
  p += kBthLen;

  // Extension headers in the order IBTA fixes for them (only some combinations exist, but one
  // order serves them all).
  if (info.headers & kDeth) {
    StoreBe32(p, h.deth.qkey);
    StoreBe32(p + 4, h.deth.src_qp & kQpnMask);
    p += kDethLen;
  }
  if (info.headers & kReth) {
    StoreBe64(p, h.reth.va);
    StoreBe32(p + 8, h.reth.rkey);
    StoreBe32(p + 12, h.reth.length);
    p += kRethLen;
  }
  if (info.headers & kAtomicEth) {
    StoreBe64(p, h.atomic.va);
    StoreBe32(p + 8, h.atomic.rkey);
    StoreBe64(p + 12, h.atomic.swap_add);
    StoreBe64(p + 20, h.atomic.compare);
    p += kAtomicEthLen;
  }
  if (info.headers & kAeth) {
    StoreBe32(p, uint32_t(h.aeth.syndrome) << 24 | (h.aeth.msn & 0xFFFFFF));
    p += kAethLen;
  }
  if (info.headers & kAtomicAckEth) {
    StoreBe64(p, h.atomic_ack);
    p += kAtomicAckEthLen;
  }
  if (info.headers & kImmDt) {
    StoreBe32(p, h.imm);
    p += kImmDtLen;
  }
  if (info.headers & kIeth) {
    StoreBe32(p, h.ieth);
    p += kIethLen;
  }
  if (info.headers & kCnpReserved) std::memset(p, 0, kCnpReservedLen);
  return len;
}

// ---- ICRC --------------------------------------------------------------------------------------

namespace {

// An address reduced to what the pseudo header needs: IPv4 (mapped IPv6 included) or IPv6.
struct Addr {
  bool v4 = true;
  uint8_t ip[16] = {};  // v4: first 4 bytes
  uint16_t port = 0;    // host order
};

Addr Reduce(const sockaddr* sa) {
  Addr a;
  if (sa == nullptr) return a;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    std::memcpy(a.ip, &in->sin_addr, 4);
    a.port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    a.port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      std::memcpy(a.ip, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      a.v4 = false;
      std::memcpy(a.ip, in6->sin6_addr.s6_addr, 16);
    }
  }
  return a;
}

// As IPv6 (an IPv4 address as ::ffff:a.b.c.d), for a mixed pair.
void AsV6(const Addr& a, uint8_t* out) {
  if (!a.v4) {
    std::memcpy(out, a.ip, 16);
    return;
  }
  std::memset(out, 0, 10);
  out[10] = out[11] = 0xFF;
  std::memcpy(out + 12, a.ip, 4);
}

// The ICRC of a packet of `length` bytes (BTH .. pad) given in pieces, the first of which holds
// the BTH whole or is the whole packet.
uint32_t IcrcOfPieces(const IcrcAddresses& addrs, size_t length, std::span<const std::span<const uint8_t>> pieces) {
  const Addr src = Reduce(addrs.source), dst = Reduce(addrs.destination);
  // 8 (LRH) + 40 (IPv6) + 8 (UDP) + 12 (BTH) at most, then what follows the BTH when it is short:
  // one CRC call instead of two (a call's fixed cost is most of a short CRC's: ACKs, small Sends).
  constexpr size_t kShortRest = 64;
  uint8_t ps[8 + 40 + 8 + kBthLen + kShortRest];
  std::memset(ps, 0xFF, 8);  // the LRH a RoCEv2 packet does not have, masked
  uint8_t* p = ps + 8;
  const size_t udp_len = 8 + length + kIcrcLen;
  if (src.v4 && dst.v4) {
    // Variant fields (TOS, TTL, checksum) are ones; the rest is what a NIC sends.
    p[0] = 0x45;
    p[1] = 0xFF;
    StoreBe16(p + 2, uint16_t(20 + udp_len));
    StoreBe16(p + 4, 0);       // identification
    StoreBe16(p + 6, 0x4000);  // DF, offset 0
    p[8] = 0xFF;               // TTL
    p[9] = IPPROTO_UDP;
    p[10] = p[11] = 0xFF;  // header checksum
    std::memcpy(p + 12, src.ip, 4);
    std::memcpy(p + 16, dst.ip, 4);
    p += 20;
  } else {
    // Version 6, then traffic class and flow label (variant) all ones.
    p[0] = 0x6F;
    p[1] = p[2] = p[3] = 0xFF;
    StoreBe16(p + 4, uint16_t(udp_len));
    p[6] = IPPROTO_UDP;
    p[7] = 0xFF;  // hop limit
    AsV6(src, p + 8);
    AsV6(dst, p + 24);
    p += 40;
  }
  StoreBe16(p, src.port);
  StoreBe16(p + 2, dst.port);
  StoreBe16(p + 4, uint16_t(udp_len));
  p[6] = p[7] = 0xFF;  // UDP checksum
  p += 8;
  // The BTH with resv8a (FECN, BECN: set by switches on the way) masked.
  const std::span<const uint8_t> head = pieces.empty() ? std::span<const uint8_t>() : pieces[0];
  const size_t bth = head.size() < kBthLen ? head.size() : kBthLen;
  std::memcpy(p, head.data(), bth);
  if (bth > 4) p[4] = 0xFF;
  p += bth;
  const std::span<const uint8_t> rest = head.subspan(bth);
  uint32_t crc;
  if (rest.size() <= kShortRest) {
    std::memcpy(p, rest.data(), rest.size());
    crc = Crc32(ps, size_t(p - ps) + rest.size());
  } else {
    crc = Crc32(rest, Crc32(ps, size_t(p - ps)));
  }
  for (size_t i = 1; i < pieces.size(); ++i) crc = Crc32(pieces[i], crc);
  return crc;
}

}  // namespace

uint32_t ComputeIcrc(const IcrcAddresses& addrs, std::span<const uint8_t> packet) {
  return IcrcOfPieces(addrs, packet.size(), {&packet, 1});
}

uint32_t ComputeIcrc(const IcrcAddresses& addrs, std::span<const std::span<const uint8_t>> pieces) {
  size_t length = 0;
  for (const auto& piece : pieces) length += piece.size();
  return IcrcOfPieces(addrs, length, pieces);
}

void StoreIcrc(const IcrcAddresses& addrs, std::span<uint8_t> datagram) {
  if (datagram.size() < kIcrcLen) return;
  const size_t n = datagram.size() - kIcrcLen;
  StoreLe32(datagram.data() + n, ComputeIcrc(addrs, datagram.first(n)));
}

// ---- decoding ----------------------------------------------------------------------------------

PacketError DecodeBth(std::span<const uint8_t> bytes, Bth& b) {
  if (bytes.size() < kBthLen) return PacketError::Truncated;
  const uint8_t* p = bytes.data();
  if ((p[1] & 0xF) != 0) return PacketError::BadVersion;
  b.opcode = Opcode(p[0]);
  if (!InfoFor(b.opcode).known) return PacketError::BadOpcode;
  b.solicited = p[1] & 0x80;
  b.mig_req = p[1] & 0x40;
  b.pad_count = (p[1] >> 4) & 3;
  b.tver = p[1] & 0xF;
  b.pkey = LoadBe16(p + 2);
  b.resv8a = p[4];
  b.dest_qp = LoadBe32(p + 4) & kQpnMask;
  b.ack_req = p[8] & 0x80;
  b.psn = LoadBe32(p + 8) & kPsnMask;
  return PacketError::Ok;
}

PacketError DecodePacket(std::span<const uint8_t> datagram, const IcrcAddresses* addrs,
                         Packet& out) {
  if (datagram.size() < kBthLen + kIcrcLen) return PacketError::Truncated;
  const size_t n = datagram.size() - kIcrcLen;  // BTH .. pad
  if (addrs != nullptr &&
      LoadLe32(datagram.data() + n) != ComputeIcrc(*addrs, datagram.first(n)))
    return PacketError::BadIcrc;

  Bth& b = out.headers.bth;
  if (PacketError e = DecodeBth(datagram, b); e != PacketError::Ok) return e;
  const OpcodeInfo info = InfoFor(b.opcode);
  const size_t hlen = kBthLen + ExtensionLength(info.headers);
  if (n < hlen) return PacketError::Truncated;

  const size_t rest = n - hlen;  // payload + pad
  if (b.pad_count > rest) return PacketError::Truncated;
  if (!info.has_payload && rest != 0) return PacketError::PayloadNotAllowed;

  Headers& h = out.headers;
  const uint8_t* p = datagram.data() + kBthLen;
  if (info.headers & kDeth) {
    h.deth.qkey = LoadBe32(p);
    h.deth.src_qp = LoadBe32(p + 4) & kQpnMask;
    p += kDethLen;
  }
  if (info.headers & kReth) {
    h.reth.va = LoadBe64(p);
    h.reth.rkey = LoadBe32(p + 8);
    h.reth.length = LoadBe32(p + 12);
    p += kRethLen;
  }
  if (info.headers & kAtomicEth) {
    h.atomic.va = LoadBe64(p);
    h.atomic.rkey = LoadBe32(p + 8);
    h.atomic.swap_add = LoadBe64(p + 12);
    h.atomic.compare = LoadBe64(p + 20);
    p += kAtomicEthLen;
  }
  if (info.headers & kAeth) {
    h.aeth.syndrome = p[0];
    h.aeth.msn = LoadBe32(p) & 0xFFFFFF;
    p += kAethLen;
  }
  if (info.headers & kAtomicAckEth) {
    h.atomic_ack = LoadBe64(p);
    p += kAtomicAckEthLen;
  }
  if (info.headers & kImmDt) {
    h.imm = LoadBe32(p);
    p += kImmDtLen;
  }
  if (info.headers & kIeth) {
    h.ieth = LoadBe32(p);
    p += kIethLen;
  }
  // A CNP's reserved bytes are not looked at (a receiver ignores reserved fields).
  out.payload = datagram.subspan(hlen, rest - b.pad_count);
  return PacketError::Ok;
}

// ---- tables ------------------------------------------------------------------------------------

uint32_t MtuBytes(uint8_t code) { return code >= 1 && code <= 5 ? 128u << code : 0; }

uint32_t RnrTimerMicros(uint8_t code) {
  // IBTA table of minimal RNR NAK timer values (design-facts §5.3), in microseconds.
  static constexpr uint32_t kMicros[32] = {
      655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return kMicros[code & 0x1F];
}

uint64_t TimeValueMicros(uint8_t x) {
  if (x > 31) x = 31;
  return (uint64_t(4096) << x) / 1000;  // 4.096 us = 4096 ns
}

}  // namespace ndwv::wire::ib
