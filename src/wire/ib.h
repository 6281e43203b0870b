// InfiniBand transport headers as RoCEv2 carries them in a UDP datagram (design-facts §5.8):
//
//   BTH(12) [RETH(16) | AETH(4) | DETH(8) | ImmDt(4) | IETH(4) ...] payload pad(0-3) ICRC(4)
//
// Which extension headers follow the BTH is fixed by the opcode (OpcodeInfo). All fields are
// big-endian. Decoders never read past the span they are given and never trust a length field.
//
// ICRC: CRC-32 over the invariant fields of IP + UDP + the packet, with the variant fields set to
// ones (design-facts §5.8). A user-space device never sees the IP header its datagram travels
// in, so both ends compute the ICRC over the header a RoCEv2 NIC would have built for the same
// addresses (IPv4: no options, identification 0, DF; IPv6: no extension headers); IcrcAddresses
// names them. The ICRC goes on the wire as rxe (and hardware) put it: the standard CRC-32 value
// (wire::Crc32), least significant byte first.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace ndwv::wire::ib {

inline constexpr uint16_t kRoceUdpPort = 4791;
inline constexpr size_t kBthLen = 12, kRethLen = 16, kAethLen = 4, kDethLen = 8, kImmDtLen = 4,
                        kIethLen = 4, kAtomicEthLen = 28, kAtomicAckEthLen = 8, kCnpReservedLen = 16,
                        kIcrcLen = 4;
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
inline constexpr uint32_t kPsnMask = 0xFFFFFF;
inline constexpr uint32_t kQpnMask = 0xFFFFFF;
inline constexpr uint32_t kGsiQpn = 1;             // QP 1: the CM's MADs
inline constexpr uint32_t kGsiQkey = 0x80010000;

enum class Opcode : uint8_t {
  SendFirst = 0x00,
  SendMiddle = 0x01,
  SendLast = 0x02,
  SendLastImm = 0x03,
  SendOnly = 0x04,
  SendOnlyImm = 0x05,
  WriteFirst = 0x06,
  WriteMiddle = 0x07,
  WriteLast = 0x08,
  WriteLastImm = 0x09,
  WriteOnly = 0x0A,
  WriteOnlyImm = 0x0B,
  ReadRequest = 0x0C,
  ReadResponseFirst = 0x0D,
  ReadResponseMiddle = 0x0E,
  ReadResponseLast = 0x0F,
  ReadResponseOnly = 0x10,
  Acknowledge = 0x11,
  AtomicAcknowledge = 0x12,
  CompareSwap = 0x13,
  FetchAdd = 0x14,
  SendLastInv = 0x16,
  SendOnlyInv = 0x17,
  UdSendOnly = 0x64,
  UdSendOnlyImm = 0x65,
  // RoCEv2's congestion notification packet (the CNP group, 100b): the receiver of a flow that
  // met congestion tells its sender's QP (dest_qp) to slow down. BECN set, 16 reserved bytes.
  Cnp = 0x81,
};
const char* ToString(Opcode op);

// What an opcode is and carries: one row per opcode (ib.cpp, kOpcodes), from which the codec,
// the RC transport and the port read everything. Unknown opcodes have known == false.
enum HeaderBit : uint8_t { kReth = 1, kAeth = 2, kDeth = 4, kImmDt = 8, kIeth = 16, kAtomicEth = 32,
                           kAtomicAckEth = 64, kCnpReserved = 128 };
enum class OpcodeClass : uint8_t {
  Unknown, Send, Write, ReadRequest, ReadResponse, Acknowledge, Atomic, AtomicAcknowledge, UdSend,
  CongestionNotification
};
struct OpcodeInfo {
  bool known;
  uint8_t headers;     // HeaderBit set
  bool first, last;    // position in a message (both for *_ONLY)
  bool has_payload;    // may carry payload
  OpcodeClass op_class;
  const char* name;    // as the IBTA spec writes it
};
const OpcodeInfo& InfoFor(Opcode op);
inline bool IsSend(Opcode op) { return InfoFor(op).op_class == OpcodeClass::Send; }  // RC sends
inline bool IsWrite(Opcode op) { return InfoFor(op).op_class == OpcodeClass::Write; }
inline bool IsReadResponse(Opcode op) { return InfoFor(op).op_class == OpcodeClass::ReadResponse; }
// A packet that answers a request: an ACK/NAK or a Read Response.
inline bool IsAnswer(Opcode op) {
  OpcodeClass c = InfoFor(op).op_class;
  return c == OpcodeClass::Acknowledge || c == OpcodeClass::ReadResponse;
}
// Bytes of BTH + extension headers for an opcode (0 if unknown).
size_t HeaderLength(Opcode op);

struct Bth {
  Opcode opcode = Opcode::SendOnly;
  bool solicited = false;
  bool mig_req = false;
  uint8_t pad_count = 0;  // 0..3
  uint8_t tver = 0;
  uint16_t pkey = kDefaultPkey;
  uint8_t resv8a = 0;     // FECN, BECN, reserved
  uint32_t dest_qp = 0;   // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;       // 24 bits
};

inline constexpr uint8_t kBecn = 0x40;  // in Bth::resv8a: congestion met on the way back

// ECN, in the IP header's TOS or traffic class (RFC 3168): the two low bits. A RoCEv2 sender
// marks its datagrams ECT(0); a router on the way may mark them CE instead of dropping them.
inline constexpr uint8_t kEct0 = 0x02, kEcnCe = 0x03;
constexpr bool CongestionExperienced(uint8_t tos) { return (tos & 0x03) == kEcnCe; }

struct Reth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
};

// AETH syndrome (bits 7-5 kind, 4-0 value).
enum class AethKind : uint8_t { Ack = 0, RnrNak = 1, Reserved = 2, Nak = 3 };
enum class NakCode : uint8_t {
  PsnSequenceError = 0,
  InvalidRequest = 1,
  RemoteAccessError = 2,
  RemoteOperationalError = 3,
  InvalidRdRequest = 4,
};
inline constexpr uint8_t kCreditInvalid = 0x1F;  // ACK without end-to-end credits
struct Aeth {
  uint8_t syndrome = kCreditInvalid;
  uint32_t msn = 0;  // 24 bits
  AethKind kind() const { return AethKind(syndrome >> 5); }
  uint8_t value() const { return syndrome & 0x1F; }  // credits, RNR timer code or NAK code
};
constexpr uint8_t MakeSyndrome(AethKind kind, uint8_t value) {
  return uint8_t(uint8_t(kind) << 5 | (value & 0x1F));
}

struct Deth {
  uint32_t qkey = 0;
  uint32_t src_qp = 0;  // 24 bits
};

struct AtomicEth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;  // swap value (CompareSwap) or addend (FetchAdd)
  uint64_t compare = 0;   // CompareSwap only
};

// A packet's headers, decoded or to encode. Only the headers the opcode carries are meaningful.
struct Headers {
  Bth bth;
  Reth reth;
  Aeth aeth;
  Deth deth;
  uint32_t imm = 0;   // ImmDt, host order
  uint32_t ieth = 0;  // R_Key to invalidate
  AtomicEth atomic;            // CompareSwap, FetchAdd
  uint64_t atomic_ack = 0;     // AtomicAckETH: the original value
};

// Writes BTH and the opcode's extension headers (in the IBTA order: DETH, RETH, AtomicETH, AETH,
// AtomicAckETH, ImmDt, IETH; a CNP's reserved bytes, zero); returns their length, or 0 if `out` is
// too small or the opcode unknown. Fields wider than the wire (QPNs, PSN, pad count) are masked; BTH's reserved 7 bits
// and DETH's reserved byte are written as zero.
size_t EncodeHeaders(const Headers& h, std::span<uint8_t> out);

enum class PacketError : uint8_t {
  Ok = 0,
  Truncated,      // shorter than BTH + its extension headers + ICRC, or than its pad count
                  // (also: shorter than BTH + ICRC, before anything else is looked at)
  BadVersion,     // BTH TVer != 0
  BadOpcode,      // not one we know
  PayloadNotAllowed,  // payload (or pad) on an opcode that carries none (ACK, Read Request, ...)
  BadIcrc,
};
const char* ToString(PacketError e);

// The addresses ICRC covers (those of the UDP datagram: the sender's and the receiver's).
// An IPv4-mapped IPv6 address (::ffff:a.b.c.d, what a dual-stack socket reports for an IPv4
// peer) counts as the IPv4 address: the datagram travelled as IPv4, and that is the header the
// sender covered. If both addresses are IPv4 (or mapped) the IPv4 header is used, else IPv6.
struct IcrcAddresses {
  const sockaddr* source;       // AF_INET or AF_INET6 (with ports)
  const sockaddr* destination;  // same family
};

// ICRC of a whole UDP payload (BTH through pad, without the 4 ICRC bytes).
uint32_t ComputeIcrc(const IcrcAddresses& addrs, std::span<const uint8_t> packet);
// The same for a payload in pieces, in order; the first holds the BTH whole.
uint32_t ComputeIcrc(const IcrcAddresses& addrs, std::span<const std::span<const uint8_t>> pieces);
// Stores the ICRC after the packet: `datagram` is BTH .. pad followed by 4 bytes to fill.
void StoreIcrc(const IcrcAddresses& addrs, std::span<uint8_t> datagram);

// The BTH alone, from the first bytes of a datagram (an ICMP error quotes back only the start of
// what we sent): Truncated if fewer than its 12 bytes, BadVersion, BadOpcode, else Ok.
PacketError DecodeBth(std::span<const uint8_t> bytes, Bth& out);

// Decodes a whole UDP payload: checks the ICRC (unless addrs is null), the headers, the pad, and
// gives the payload without pad and ICRC. Checks run in the order a NIC runs them: length
// (BTH + ICRC), ICRC, TVer, opcode, length (headers + ICRC), pad, payload. The ICRC comes first
// so that a corrupted packet is reported as BadIcrc (to be dropped silently) and not as a
// protocol error that would draw a NAK. Stateful checks (PSN, PMTU, pad on FIRST/MIDDLE, QP
// type against opcode) are the receiver's. `out` is meaningful only with Ok.
struct Packet {
  Headers headers;
  std::span<const uint8_t> payload;
};
PacketError DecodePacket(std::span<const uint8_t> datagram, const IcrcAddresses* addrs,
                         Packet& out);

// 24-bit PSN arithmetic: signed distance a - b in [-2^23, 2^23) (a difference of exactly 2^23
// counts as "behind").
constexpr int32_t PsnDiff(uint32_t a, uint32_t b) {
  return int32_t((a - b) << 8) >> 8;
}
constexpr uint32_t PsnAdd(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// Path MTU codes (1 = 256 .. 5 = 4096) and the RNR timer code table (design-facts §5.3).
uint32_t MtuBytes(uint8_t code);        // 0 for an invalid code
uint32_t RnrTimerMicros(uint8_t code);  // code 0 = 655.36 ms; only the low 5 bits count
// IB time value x: 4.096 us * 2^x, in microseconds, rounded down (x is clamped to 31). The
// caller handles any "0 = infinite" meaning of its field.
uint64_t TimeValueMicros(uint8_t x);

}  // namespace ndwv::wire::ib
