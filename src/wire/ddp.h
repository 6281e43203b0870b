// DDP (RFC 5041) and RDMAP (RFC 5040) headers, the RDMA Read Request, and Terminate messages.
//
// Everything here works on an MPA ULPDU: the bytes after the 2-byte ULPDU_Length field, starting
// with the 16-bit DDP/RDMAP control field. (The one exception is the copy of an offending header
// inside a Terminate, which by RFC 5040 starts with that segment's ULPDU_Length.) All fields are
// big-endian. Decoders never read past the span they are given.
//
//   tagged   (RDMA Write, Read Response):  ctrl(2) STag(4) TO(8)                       = 14
//   untagged (Send*, Read Request, Term.): ctrl(2) ULP/InvSTag(4) QN(4) MSN(4) MO(4)   = 18
//   Read Request: untagged header + sink STag(4) sink TO(8) size(4) src STag(4) src TO(8) = 18+28
//   Terminate:    untagged header + control word(4) [+ the offending segment's headers]
//
// The RFC 7306 extensions (atomics, immediate data; opcodes 8-12) are not supported: their
// opcodes decode as BadOpcode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <span>

#include "wire/mpa.h"  // ReservedBits

namespace ndwv::wire {

// ---- control field --------------------------------------------------------------------------

inline constexpr uint16_t kDdpTagged = 0x8000;          // T
inline constexpr uint16_t kDdpLast = 0x4000;            // L: last segment of the message
inline constexpr uint16_t kDdpReserved = 0x3C00;
inline constexpr uint16_t kDdpVersionMask = 0x0300;     // DV, bits 9-8
inline constexpr uint16_t kRdmapVersionMask = 0x00C0;   // RV, bits 7-6
inline constexpr uint16_t kRdmapReserved = 0x0030;
inline constexpr uint16_t kRdmapOpcodeMask = 0x000F;
inline constexpr uint8_t kDdpVersion = 1;
inline constexpr uint8_t kRdmapVersion = 1;

inline constexpr size_t kDdpTaggedHeaderLen = 14;
inline constexpr size_t kDdpUntaggedHeaderLen = 18;
inline constexpr size_t kReadRequestLen = 28;
inline constexpr size_t kTerminateCtrlLen = 4;
inline constexpr size_t kTerminateHeaderLen = kDdpUntaggedHeaderLen + kTerminateCtrlLen;  // 22
// The most a Terminate ULPDU carries: its header, then the offending segment's ULPDU_Length,
// untagged DDP header and Read Request.
inline constexpr size_t kTerminateMaxLen = kTerminateHeaderLen + 2 + kDdpUntaggedHeaderLen +
                                           kReadRequestLen;  // 70

enum class RdmapOpcode : uint8_t {
  RdmaWrite = 0,
  ReadRequest = 1,
  ReadResponse = 2,
  Send = 3,
  SendInvalidate = 4,
  SendSolicited = 5,
  SendSolicitedInvalidate = 6,
  Terminate = 7,
};
const char* ToString(RdmapOpcode op);  // "unknown opcode" outside 0..7

// Untagged queues (QN).
enum class DdpQueue : uint8_t { Send = 0, ReadRequest = 1, Terminate = 2 };

// What an RDMAP opcode is and carries: one row per opcode, from which the codec, the helpers
// below and the stream's receive path read everything they need to know of it.
struct RdmapOpcodeInfo {
  RdmapOpcode opcode;
  const char* name;        // for logs
  bool tagged;             // DDP tagged buffer model (T bit): RDMA Write, Read Response
  DdpQueue queue;          // the untagged queue (QN) it travels on; Send for tagged ones
  size_t header_length;    // DDP header + the opcode's own RDMAP header: 14, 18, 18+28, 18+4
  bool is_send;            // a Send of any kind: consumes a receive
  bool solicited;          // Send with Solicited Event (and Invalidate)
  bool invalidates;        // carries an STag to invalidate (Send with Invalidate, with SE too)
};

inline constexpr RdmapOpcodeInfo kRdmapOpcodes[] = {
    // opcode, name, tagged, queue, header length, send, solicited, invalidates
    {RdmapOpcode::RdmaWrite, "RDMA Write", true, DdpQueue::Send, kDdpTaggedHeaderLen, false, false,
     false},
    {RdmapOpcode::ReadRequest, "RDMA Read Request", false, DdpQueue::ReadRequest,
     kDdpUntaggedHeaderLen + kReadRequestLen, false, false, false},
    {RdmapOpcode::ReadResponse, "RDMA Read Response", true, DdpQueue::Send, kDdpTaggedHeaderLen,
     false, false, false},
    {RdmapOpcode::Send, "Send", false, DdpQueue::Send, kDdpUntaggedHeaderLen, true, false, false},
    {RdmapOpcode::SendInvalidate, "Send with Invalidate", false, DdpQueue::Send,
     kDdpUntaggedHeaderLen, true, false, true},
    {RdmapOpcode::SendSolicited, "Send with Solicited Event", false, DdpQueue::Send,
     kDdpUntaggedHeaderLen, true, true, false},
    {RdmapOpcode::SendSolicitedInvalidate, "Send with SE and Invalidate", false, DdpQueue::Send,
     kDdpUntaggedHeaderLen, true, true, true},
    {RdmapOpcode::Terminate, "Terminate", false, DdpQueue::Terminate, kTerminateHeaderLen, false,
     false, false},
};
inline constexpr size_t kRdmapOpcodeCount = std::size(kRdmapOpcodes);
constexpr bool IsKnownOpcode(uint8_t op) { return op < kRdmapOpcodeCount; }
static_assert(kRdmapOpcodeCount == size_t(RdmapOpcode::Terminate) + 1);
static_assert([] {
  for (size_t i = 0; i < kRdmapOpcodeCount; ++i)
    if (size_t(kRdmapOpcodes[i].opcode) != i) return false;
  return true;
}(), "kRdmapOpcodes: row i is opcode i");

// `op` must be one of the eight (DecodeDdpHeader refuses any other before it sets one).
constexpr const RdmapOpcodeInfo& InfoFor(RdmapOpcode op) { return kRdmapOpcodes[uint8_t(op)]; }

constexpr bool IsTagged(RdmapOpcode op) { return InfoFor(op).tagged; }
constexpr bool IsSend(RdmapOpcode op) { return InfoFor(op).is_send; }
constexpr bool CarriesInvalidateStag(RdmapOpcode op) { return InfoFor(op).invalidates; }
constexpr bool IsSolicited(RdmapOpcode op) { return InfoFor(op).solicited; }
// The queue an untagged opcode travels on (meaningless for tagged ones).
constexpr DdpQueue QueueFor(RdmapOpcode op) { return InfoFor(op).queue; }

// The control field ndwv sends: versions 1/1, reserved bits zero.
constexpr uint16_t MakeDdpCtrl(RdmapOpcode op, bool last) {
  return uint16_t((IsTagged(op) ? kDdpTagged : 0) | (last ? kDdpLast : 0) | kDdpVersion << 8 |
                  kRdmapVersion << 6 | uint8_t(op));
}

// Header bytes at the start of a ULPDU, known from its control field alone, so that a stream
// reader knows how much to read before it places payload: 14 tagged, 18 untagged, 18 + 28 for a
// Read Request, 18 + 4 for a Terminate (the offending headers a Terminate may carry are its
// payload). A control field that will fail DecodeDdpHeader (bad version, unknown opcode, T bit
// at odds with the opcode) gives the DDP header length by its T bit: read that much, then let
// the decoder name the error.
constexpr size_t SegmentHeaderLength(uint16_t ctrl) {
  if (ctrl & kDdpTagged) return kDdpTaggedHeaderLen;
  const uint8_t op = ctrl & kRdmapOpcodeMask;
  if (!IsKnownOpcode(op) || InfoFor(RdmapOpcode(op)).tagged) return kDdpUntaggedHeaderLen;
  return InfoFor(RdmapOpcode(op)).header_length;
}

// ---- Terminate error codes (RFC 5040 §7, RFC 5044, RFC 6581) --------------------------------

enum class TermLayer : uint8_t { Rdmap = 0, Ddp = 1, Llp = 2 };

enum class RdmapErrorType : uint8_t { Catastrophic = 0, RemoteProtection = 1, RemoteOperation = 2 };
enum class RdmapErrorCode : uint8_t {
  InvalidStag = 0x00,
  BaseBounds = 0x01,
  AccessRights = 0x02,
  StagNotAssociated = 0x03,  // STag not associated with this RDMAP stream
  ToWrap = 0x04,
  BadVersion = 0x05,
  UnexpectedOpcode = 0x06,
  CatastrophicStream = 0x07,  // catastrophic error, localized to this RDMAP stream
  CatastrophicGlobal = 0x08,
  CannotInvalidate = 0x09,  // STag cannot be invalidated
  Unspecified = 0xFF,
};

enum class DdpErrorType : uint8_t { Catastrophic = 0, TaggedBuffer = 1, UntaggedBuffer = 2 };
enum class DdpTaggedCode : uint8_t {
  InvalidStag = 0,
  BaseBounds = 1,
  StagNotAssociated = 2,
  ToWrap = 3,
  BadVersion = 4,
};
enum class DdpUntaggedCode : uint8_t {
  InvalidQn = 1,
  InvalidMsnNoBuffer = 2,
  InvalidMsnRange = 3,
  InvalidMo = 4,
  MessageTooLong = 5,
  BadVersion = 6,
};

enum class LlpErrorType : uint8_t { Mpa = 0 };
enum class LlpErrorCode : uint8_t {
  StreamLost = 1,
  CrcError = 2,
  MarkerMismatch = 3,  // marker and FPDU start do not match
  InvalidMpaFrame = 4,  // invalid MPA request or reply
  LocalCatastrophic = 5,  // RFC 6581 (enhanced setup) from here on
  InsufficientIrd = 6,
  NoMatchingRtr = 7,
};

// Layer, error type, error code: the first 16 bits of a Terminate control word.
struct TermCode {
  TermLayer layer = TermLayer::Rdmap;
  uint8_t type = 0;
  uint8_t code = 0;
  constexpr bool operator==(const TermCode&) const = default;
};
constexpr TermCode MakeTerm(RdmapErrorType t, RdmapErrorCode c) {
  return {TermLayer::Rdmap, uint8_t(t), uint8_t(c)};
}
constexpr TermCode MakeTerm(DdpTaggedCode c) {
  return {TermLayer::Ddp, uint8_t(DdpErrorType::TaggedBuffer), uint8_t(c)};
}
constexpr TermCode MakeTerm(DdpUntaggedCode c) {
  return {TermLayer::Ddp, uint8_t(DdpErrorType::UntaggedBuffer), uint8_t(c)};
}
constexpr TermCode MakeTerm(LlpErrorCode c) {
  return {TermLayer::Llp, uint8_t(LlpErrorType::Mpa), uint8_t(c)};
}
inline constexpr TermCode kTermDdpCatastrophic{TermLayer::Ddp, 0, 0};
// The local catastrophic error (any code is allowed with this type; siw sends 0xFF).
inline constexpr TermCode kTermRdmapCatastrophic =
    MakeTerm(RdmapErrorType::Catastrophic, RdmapErrorCode::Unspecified);

// A readable name for logs, e.g. "RDMAP remote protection: invalid STag"; "unknown" for a
// combination no RFC defines.
const char* Describe(TermCode c);

// ---- DDP/RDMAP header -----------------------------------------------------------------------

struct DdpHeader {
  RdmapOpcode opcode = RdmapOpcode::Send;
  bool last = true;
  // Tagged (RDMA Write, Read Response): where the payload goes.
  uint32_t stag = 0;
  uint64_t to = 0;
  // Untagged. `inv_stag` is DDP's "reserved for the ULP" word: the STag to invalidate for the
  // Send-with-Invalidate opcodes, zero otherwise (not checked on receipt).
  uint32_t inv_stag = 0;
  uint32_t qn = 0, msn = 0, mo = 0;

  constexpr bool tagged() const { return IsTagged(opcode); }
  constexpr size_t length() const { return tagged() ? kDdpTaggedHeaderLen : kDdpUntaggedHeaderLen; }

  static constexpr DdpHeader Tagged(RdmapOpcode op, uint32_t stag, uint64_t to, bool last) {
    DdpHeader h;
    h.opcode = op, h.last = last, h.stag = stag, h.to = to;
    return h;
  }
  // QN from the opcode. MSN counts messages per queue from 1; MO is the byte offset of this
  // segment in its message.
  static constexpr DdpHeader Untagged(RdmapOpcode op, uint32_t msn, uint32_t mo, bool last,
                                      uint32_t inv_stag = 0) {
    DdpHeader h;
    h.opcode = op, h.last = last, h.inv_stag = inv_stag;
    h.qn = uint8_t(QueueFor(op)), h.msn = msn, h.mo = mo;
    return h;
  }
};

// Each violation a decoder finds, mapped to its Terminate code by TermCodeFor.
enum class DdpError : uint8_t {
  Ok,
  Truncated,              // shorter than the headers its control field calls for
  BadDdpVersionTagged,    // DV != 1 in a tagged segment    -> DDP tagged / bad version
  BadDdpVersionUntagged,  // DV != 1 in an untagged segment -> DDP untagged / bad version
  BadRdmapVersion,        // RV != 1                        -> RDMAP remote op / bad version
  BadOpcode,              // opcode 8-15                    -> RDMAP remote op / unexpected opcode
  OpcodeModelMismatch,    // T bit at odds with the opcode  -> RDMAP remote op / unexpected opcode
  BadQueue,               // QN not the opcode's queue      -> DDP untagged / invalid QN
  DdpReservedBits,        // ctrl & 0x3C00                  -> DDP catastrophic
  RdmapReservedBits,      // ctrl & 0x0030                  -> RDMAP remote op / unspecified
  BadTerminate,           // a Terminate's M/D/R bits promise headers it does not carry
};
const char* ToString(DdpError e);

// The Terminate to send for a decode error. BadTerminate never needs one (a Terminate is not
// answered with a Terminate); it maps to the remote-operation "unspecified" code.
constexpr TermCode TermCodeFor(DdpError e) {
  switch (e) {
    case DdpError::Ok: return {};
    case DdpError::Truncated: return kTermDdpCatastrophic;
    case DdpError::BadDdpVersionTagged: return MakeTerm(DdpTaggedCode::BadVersion);
    case DdpError::BadDdpVersionUntagged: return MakeTerm(DdpUntaggedCode::BadVersion);
    case DdpError::BadRdmapVersion:
      return MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::BadVersion);
    case DdpError::BadOpcode:
    case DdpError::OpcodeModelMismatch:
      return MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::UnexpectedOpcode);
    case DdpError::BadQueue: return MakeTerm(DdpUntaggedCode::InvalidQn);
    case DdpError::DdpReservedBits: return kTermDdpCatastrophic;
    case DdpError::RdmapReservedBits:
    case DdpError::BadTerminate:
      return MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::Unspecified);
  }
  return kTermDdpCatastrophic;
}

// Writes the 14- or 18-byte header (chosen by the opcode) with versions 1/1 and zero reserved
// bits. QN, MSN and MO are written as given. Returns the bytes written, 0 if `out` is too small.
size_t EncodeDdpHeader(const DdpHeader& h, std::span<uint8_t> out);

// Decodes and checks the header at the start of a ULPDU: versions, opcode, T bit against opcode,
// reserved bits (unless ignored), QN against opcode. The control-field checks come first and
// need only 2 bytes, so a header whose control field is bad is reported as such even when
// truncated. Stateful checks (MSN, MO, STag, bounds) belong to the receiver, not here.
DdpError DecodeDdpHeader(std::span<const uint8_t> ulpdu, DdpHeader& out,
                         ReservedBits reserved = ReservedBits::Reject);

// ---- RDMA Read Request --------------------------------------------------------------------

struct ReadRequest {
  uint32_t sink_stag = 0;  // where the Read Response writes (the requester's buffer)
  uint64_t sink_to = 0;
  uint32_t size = 0;       // RDMA Read Message Size
  uint32_t src_stag = 0;   // what is read (the responder's buffer)
  uint64_t src_to = 0;
};
// 28 bytes; returns 28, or 0 if `out` is too small.
size_t EncodeReadRequest(const ReadRequest& r, std::span<uint8_t> out);
// Needs 28 bytes; false if fewer.
bool DecodeReadRequest(std::span<const uint8_t> in, ReadRequest& out);

// ---- Terminate ----------------------------------------------------------------------------

inline constexpr uint32_t kTermFlagM = 0x00008000;  // DDP Segment Length field valid
inline constexpr uint32_t kTermFlagD = 0x00004000;  // offending DDP header included
inline constexpr uint32_t kTermFlagR = 0x00002000;  // offending RDMAP header included
inline constexpr uint32_t kTermCtrlReserved = 0x00001FFF;

// The 32-bit control word: layer(4) type(4) code(8) M D R reserved(13).
struct TerminateCtrl {
  TermCode code;
  bool m = false, d = false, r = false;
};
constexpr uint32_t EncodeTerminateCtrl(const TerminateCtrl& c) {
  return uint32_t(uint8_t(c.code.layer) & 0xF) << 28 | uint32_t(c.code.type & 0xF) << 24 |
         uint32_t(c.code.code) << 16 | (c.m ? kTermFlagM : 0) | (c.d ? kTermFlagD : 0) |
         (c.r ? kTermFlagR : 0);
}
// Reserved bits are ignored: a Terminate ends the stream whatever it says.
constexpr TerminateCtrl DecodeTerminateCtrl(uint32_t w) {
  TerminateCtrl c;
  c.code = {TermLayer(w >> 28), uint8_t((w >> 24) & 0xF), uint8_t(w >> 16)};
  c.m = w & kTermFlagM, c.d = w & kTermFlagD, c.r = w & kTermFlagR;
  return c;
}

// A received Terminate: its control word and views of what it carries (into the input).
struct TerminateMsg {
  TerminateCtrl ctrl;
  uint16_t ddp_segment_len = 0;         // the offending segment's ULPDU_Length, if m
  std::span<const uint8_t> ddp_header;  // the offending DDP header (14 or 18 bytes), if d
  std::span<const uint8_t> rdmap_header;  // the offending Read Request (28 bytes), if r and it
                                          // was one (other RDMAP headers live in the DDP header)
  // The bytes the control word and the headers its flags announce take: all a Terminate holds.
  size_t length() const;
};
// Decodes what follows a Terminate's untagged header (the control word and anything after it).
DdpError DecodeTerminatePayload(std::span<const uint8_t> in, TerminateMsg& out);

// What to copy of the offending segment into a Terminate.
enum class TermAttach : uint8_t {
  None,         // nothing: M = D = R = 0
  DdpHeader,    // its ULPDU_Length and DDP header: M = D = 1
  DdpAndRdmap,  // and, for a Read Request, its 28 bytes too: M = D = R = 1
};
// What RFC 5040 (and siw) attach for each error: nothing when the offending header cannot be
// trusted (bad versions, unknown opcode, LLP errors, catastrophic errors); the DDP header for
// DDP and RDMAP remote-operation errors; DDP and RDMAP headers for RDMAP protection errors.
constexpr TermAttach DefaultTermAttach(TermCode c) {
  switch (c.layer) {
    case TermLayer::Llp: return TermAttach::None;
    case TermLayer::Ddp:
      if (c.type == uint8_t(DdpErrorType::Catastrophic)) return TermAttach::None;
      if (c == MakeTerm(DdpTaggedCode::BadVersion) || c == MakeTerm(DdpUntaggedCode::BadVersion))
        return TermAttach::None;
      return TermAttach::DdpHeader;
    case TermLayer::Rdmap:
      if (c.type == uint8_t(RdmapErrorType::RemoteProtection)) return TermAttach::DdpAndRdmap;
      if (c.type == uint8_t(RdmapErrorType::RemoteOperation) &&
          c.code != uint8_t(RdmapErrorCode::BadVersion) &&
          c.code != uint8_t(RdmapErrorCode::UnexpectedOpcode))
        return TermAttach::DdpHeader;
      return TermAttach::None;
  }
  return TermAttach::None;
}

// Writes a complete Terminate ULPDU: untagged header (QN 2, MSN `msn`, MO 0, L = 1), control
// word, then per `attach` the head of the offending segment copied from `offending`, which must
// start at that segment's ULPDU_Length field (exactly as received: the copied length is the
// offending segment's ULPDU length; note that siw instead reports its payload length). Flags are
// set to what is really attached: if `offending` is too short for the DDP header, nothing is
// attached; a Read Request's 28 bytes are attached only if present. Returns the bytes written
// (kTerminateHeaderLen + what was attached, at most kTerminateMaxLen), 0 if `out` is too small.
size_t EncodeTerminate(std::span<uint8_t> out, TermCode code, uint32_t msn = 1,
                       std::span<const uint8_t> offending = {},
                       TermAttach attach = TermAttach::None);

// ---- whole segment ------------------------------------------------------------------------

// A decoded ULPDU: header, the opcode's extra header if it has one, and the rest.
struct DdpSegment {
  DdpHeader hdr;
  ReadRequest read;    // opcode ReadRequest
  TerminateMsg term;   // opcode Terminate
  // After all headers: the data of a Write, Read Response or Send*. For a Read Request it must
  // be empty and for a Terminate it normally is (both are the receiver's checks).
  std::span<const uint8_t> payload;
};
DdpError DecodeDdpSegment(std::span<const uint8_t> ulpdu, DdpSegment& out,
                          ReservedBits reserved = ReservedBits::Reject);

}  // namespace ndwv::wire
