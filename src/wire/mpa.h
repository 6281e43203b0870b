// MPA (RFC 5044) with enhanced connection setup (RFC 6581): the Request/Reply frames that open an
// iWARP stream, and the FPDU framing (length, pad, CRC-32C) of everything after them.
//
// Markers are never used: ndwv never sets M in its frames, and the connection manager rejects a
// peer whose frame has M set (the decoder reports the bit; refusing it is policy, not syntax).
// So an FPDU here is always  | ULPDU_Length (2) | ULPDU | pad (0-3) | CRC (4) |.
//
// Every MpaError maps to the Terminate code LLP / MPA / 0x04 "invalid MPA request or reply";
// FpduError::BadCrc maps to LLP / MPA / 0x02 "received CRC error" (see ddp.h for the codes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace ndwv::wire {

// Whether a decoder refuses frames with reserved bits set (the default) or ignores the bits.
// The RFCs ask senders to zero reserved bits; Linux siw can set an experimental bit (0x08 in the
// MPA flags byte) when its GSO option is on, so talking to such a peer needs Ignore.
enum class ReservedBits : uint8_t { Reject, Ignore };

// ---- Request / Reply frame ---------------------------------------------------------------------

inline constexpr char kMpaKeyRequest[] = "MPA ID Req Frame";  // 16 bytes on the wire, no NUL
inline constexpr char kMpaKeyReply[] = "MPA ID Rep Frame";
inline constexpr size_t kMpaKeyLen = 16;
inline constexpr size_t kMpaHeaderLen = 20;         // key, flags, revision, PD_Length
inline constexpr size_t kMpaMaxPrivateData = 512;   // PD_Length limit, IRD/ORD word included
inline constexpr size_t kMpaIrdOrdLen = 4;          // rev 2 enhanced: first 4 bytes of the PD

// Byte 16 of the frame.
inline constexpr uint8_t kMpaFlagMarkers = 0x80;   // sender wants to receive markers
inline constexpr uint8_t kMpaFlagCrc = 0x40;       // sender wants CRCs (used if either side asks)
inline constexpr uint8_t kMpaFlagReject = 0x20;    // reply only: connection refused
inline constexpr uint8_t kMpaFlagEnhanced = 0x10;  // rev 2: PD starts with the IRD/ORD word
inline constexpr uint8_t kMpaFlagsReservedRev1 = 0x1F;
inline constexpr uint8_t kMpaFlagsReservedRev2 = 0x0F;
// Byte 17.
inline constexpr uint8_t kMpaRevision1 = 1;  // RFC 5044
inline constexpr uint8_t kMpaRevision2 = 2;  // RFC 6581

// The rev 2 IRD/ORD word pair (big-endian 16-bit words).
inline constexpr uint16_t kMpaP2p = 0x8000;       // word 1: peer-to-peer mode (an RTR follows)
inline constexpr uint16_t kMpaRtrSend = 0x4000;   // word 1: zero-length Send usable as RTR
inline constexpr uint16_t kMpaRtrWrite = 0x8000;  // word 2: zero-length RDMA Write as RTR
inline constexpr uint16_t kMpaRtrRead = 0x4000;   // word 2: zero-length RDMA Read as RTR
inline constexpr uint16_t kMpaIrdOrdMask = 0x3FFF;

struct MpaFrame {
  bool reply = false;    // Reply ("Rep") key instead of Request
  bool reject = false;   // R: only in a reply
  bool markers = false;  // M: never sent by ndwv; a peer that sets it is refused by the CM
  bool crc = true;       // C
  uint8_t revision = kMpaRevision2;
  bool enhanced = true;  // rev 2 only: the IRD/ORD word precedes private_data
  // The IRD/ORD word; meaningful only when `enhanced`. In a request the RTR bits say which RTR
  // kinds the initiator can send; in a reply the responder keeps exactly the one it chose.
  bool p2p = false;
  bool rtr_send = false, rtr_write = false, rtr_read = false;
  uint16_t ird = 0, ord = 0;  // 14 bits each
  // The caller's private data, after the IRD/ORD word. Decoding points it into the input.
  std::span<const uint8_t> private_data;
};

enum class MpaKind : uint8_t { Request, Reply };

enum class MpaError : uint8_t {
  Ok,
  Truncated,           // fewer bytes than the header, or than 20 + PD_Length
  BadKey,              // neither key
  WrongKey,            // the other direction's key (a Reply where a Request is due, or v.v.)
  BadRevision,         // Rev not 1 or 2
  ReservedBits,        // a reserved flag bit set (R in a Request counts as reserved)
  PrivateDataTooLong,  // PD_Length > 512
  MissingIrdOrd,       // rev 2 with the enhanced flag but PD_Length < 4
  BytesAfterFrame,     // more after the frame before the peer may send it (MPA: the Initiator
                       // waits for the Reply, the Responder for the first FPDU or RTR)
};
const char* ToString(MpaError e);

// Bytes EncodeMpaFrame writes: 20 + (enhanced ? 4 : 0) + private_data.size().
constexpr size_t MpaFrameLength(const MpaFrame& f) {
  return kMpaHeaderLen + (f.enhanced ? kMpaIrdOrdLen : 0) + f.private_data.size();
}

// Writes the frame to `out`. Returns the bytes written, or 0 if `out` is too small, PD_Length
// would exceed 512, the revision is not 1/2, `enhanced` is set with revision 1, `reject` is set
// in a request, or IRD/ORD exceed 14 bits.
size_t EncodeMpaFrame(const MpaFrame& f, std::span<uint8_t> out);

// Checks the 20-byte header (extra bytes are ignored) of a frame of the expected kind. Whenever
// `in` holds 20 bytes, `frame_len` is set to 20 + PD_Length (also on error), so that a stream
// reader knows how much more to read, and can drain a bad frame before answering it.
MpaError DecodeMpaHeader(std::span<const uint8_t> in, MpaKind kind, size_t& frame_len,
                         ReservedBits reserved = ReservedBits::Reject);

// Decodes a whole frame; `in` may hold more bytes than the frame (only MpaFrameLength(out) are
// used: 20 + PD_Length). On error, what was parsed before the error (reply, flags, revision) is
// left in `out`, e.g. to answer with the peer's revision.
MpaError DecodeMpaFrame(std::span<const uint8_t> in, MpaKind kind, MpaFrame& out,
                        ReservedBits reserved = ReservedBits::Reject);

// ---- FPDU framing ------------------------------------------------------------------------------

inline constexpr size_t kFpduLengthLen = 2;  // ULPDU_Length field
inline constexpr size_t kFpduCrcLen = 4;
inline constexpr size_t kFpduMaxUlpdu = 65535;
inline constexpr size_t kFpduMinLen = 8;  // empty ULPDU: 2 + 0 + 2 pad + 4

// Pad bytes so that 2 + ULPDU + pad is a multiple of 4.
constexpr size_t FpduPad(size_t ulpdu_len) { return (4 - ((ulpdu_len + kFpduLengthLen) & 3)) & 3; }
// Whole FPDU on the wire: length field, ULPDU, pad and CRC. The CRC field is always there; when
// CRCs were not negotiated ndwv sends it as zero and does not check it.
constexpr size_t FpduLength(size_t ulpdu_len) {
  return kFpduLengthLen + ulpdu_len + FpduPad(ulpdu_len) + kFpduCrcLen;
}
// Largest ULPDU whose FPDU fits in `fpdu_budget` bytes (e.g. the TCP MSS: MPA's MULPDU); capped
// at 65535; 0 if not even an empty FPDU fits.
constexpr size_t MaxUlpduFor(size_t fpdu_budget) {
  if (fpdu_budget < kFpduMinLen) return 0;
  const size_t u = ((fpdu_budget - kFpduCrcLen) & ~size_t(3)) - kFpduLengthLen;
  return u > kFpduMaxUlpdu ? kFpduMaxUlpdu : u;
}

// The FPDU CRC covers the length field, the ULPDU and the pad. These helpers take those bytes in
// wire order as any number of pieces (header in one buffer, payload in the application's), and if
// the pieces do not end on a multiple of 4 they add the zero pad themselves. So a sender passes
// {length+headers, payload...} and a receiver passes what it read, pad included; both get the
// CRC to put in / compare with the trailer.
class FpduCrcBuilder {
 public:
  FpduCrcBuilder& Add(std::span<const uint8_t> bytes);
  uint32_t Finish() const;  // the CRC over everything added, zero-padded to a multiple of 4
  size_t length() const { return len_; }

 private:
  uint32_t crc_ = 0;
  size_t len_ = 0;
};
uint32_t FpduCrc(std::span<const std::span<const uint8_t>> pieces);

// The trailer CRC is stored least-significant byte first (as Linux siw sends it and Wireshark
// checks it: the kernel's crc32c digest written out as-is, like iSCSI's digests).
constexpr void StoreFpduCrc(uint8_t* p, uint32_t crc) {
  p[0] = uint8_t(crc);
  p[1] = uint8_t(crc >> 8);
  p[2] = uint8_t(crc >> 16);
  p[3] = uint8_t(crc >> 24);
}
constexpr uint32_t LoadFpduCrc(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

// Writes pad (zeros) and CRC for an ULPDU of `ulpdu_len` bytes: FpduPad(ulpdu_len) + 4 bytes.
// Returns the bytes written, 0 if `out` is too small.
size_t EncodeFpduTrailer(std::span<uint8_t> out, size_t ulpdu_len, uint32_t crc);

// A whole FPDU in one buffer: for control messages, tests and fuzzers (the data path builds
// header and trailer around the payload with the helpers above instead).
// Returns the bytes written (FpduLength), 0 if `out` is too small or the ULPDU over 65535 bytes.
size_t EncodeFpdu(std::span<const uint8_t> ulpdu, bool with_crc, std::span<uint8_t> out);

enum class FpduError : uint8_t { Ok, Truncated, BadCrc };
const char* ToString(FpduError e);
struct FpduView {
  std::span<const uint8_t> ulpdu;  // points into the input
  size_t length = 0;               // FpduLength(ulpdu.size()): bytes the FPDU took
  uint32_t crc = 0;                // the trailer's value
};
// Parses one FPDU at the start of `in` (more may follow). With `check_crc` false the trailer is
// read but not compared (CRCs not negotiated).
FpduError DecodeFpdu(std::span<const uint8_t> in, bool check_crc, FpduView& out);

}  // namespace ndwv::wire
