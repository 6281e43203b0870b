#include "wire/ddp.h"

#include <cstring>

#include "wire/bytes.h"

namespace ndwv::wire {

const char* ToString(RdmapOpcode op) {
  return IsKnownOpcode(uint8_t(op)) ? InfoFor(op).name : "unknown opcode";
}

const char* ToString(DdpError e) {
  switch (e) {
    case DdpError::Ok: return "ok";
    case DdpError::Truncated: return "truncated DDP segment";
    case DdpError::BadDdpVersionTagged: return "bad DDP version (tagged)";
    case DdpError::BadDdpVersionUntagged: return "bad DDP version (untagged)";
    case DdpError::BadRdmapVersion: return "bad RDMAP version";
    case DdpError::BadOpcode: return "unknown RDMAP opcode";
    case DdpError::OpcodeModelMismatch: return "RDMAP opcode not valid for the DDP buffer model";
    case DdpError::BadQueue: return "invalid DDP queue number";
    case DdpError::DdpReservedBits: return "reserved DDP control bits set";
    case DdpError::RdmapReservedBits: return "reserved RDMAP control bits set";
    case DdpError::BadTerminate: return "Terminate shorter than its header flags say";
  }
  return "?";
}

const char* Describe(TermCode c) {
  switch (c.layer) {
    case TermLayer::Rdmap:
      if (c.type == uint8_t(RdmapErrorType::Catastrophic)) return "RDMAP local catastrophic";
      if (c.type == uint8_t(RdmapErrorType::RemoteProtection)) {
        switch (RdmapErrorCode(c.code)) {
          case RdmapErrorCode::InvalidStag: return "RDMAP remote protection: invalid STag";
          case RdmapErrorCode::BaseBounds:
            return "RDMAP remote protection: base or bounds violation";
          case RdmapErrorCode::AccessRights:
            return "RDMAP remote protection: access rights violation";
          case RdmapErrorCode::StagNotAssociated:
            return "RDMAP remote protection: STag not associated with RDMAP stream";
          case RdmapErrorCode::ToWrap: return "RDMAP remote protection: TO wrap";
          case RdmapErrorCode::CannotInvalidate:
            return "RDMAP remote protection: STag cannot be invalidated";
          case RdmapErrorCode::Unspecified: return "RDMAP remote protection: unspecified";
          default: break;
        }
      } else if (c.type == uint8_t(RdmapErrorType::RemoteOperation)) {
        switch (RdmapErrorCode(c.code)) {
          case RdmapErrorCode::BadVersion: return "RDMAP remote operation: invalid RDMAP version";
          case RdmapErrorCode::UnexpectedOpcode: return "RDMAP remote operation: unexpected opcode";
          case RdmapErrorCode::CatastrophicStream:
            return "RDMAP remote operation: catastrophic error localized to RDMAP stream";
          case RdmapErrorCode::CatastrophicGlobal:
            return "RDMAP remote operation: catastrophic error global";
          case RdmapErrorCode::CannotInvalidate:
            return "RDMAP remote operation: STag cannot be invalidated";
          case RdmapErrorCode::Unspecified: return "RDMAP remote operation: unspecified";
          default: break;
        }
      }
      break;
    case TermLayer::Ddp:
      switch (DdpErrorType(c.type)) {
        case DdpErrorType::Catastrophic: return "DDP local catastrophic";
        case DdpErrorType::TaggedBuffer:
          switch (DdpTaggedCode(c.code)) {
            case DdpTaggedCode::InvalidStag: return "DDP tagged buffer: invalid STag";
            case DdpTaggedCode::BaseBounds: return "DDP tagged buffer: base or bounds violation";
            case DdpTaggedCode::StagNotAssociated:
              return "DDP tagged buffer: STag not associated with DDP stream";
            case DdpTaggedCode::ToWrap: return "DDP tagged buffer: TO wrap";
            case DdpTaggedCode::BadVersion: return "DDP tagged buffer: invalid DDP version";
          }
          break;
        case DdpErrorType::UntaggedBuffer:
          switch (DdpUntaggedCode(c.code)) {
            case DdpUntaggedCode::InvalidQn: return "DDP untagged buffer: invalid QN";
            case DdpUntaggedCode::InvalidMsnNoBuffer:
              return "DDP untagged buffer: invalid MSN, no buffer available";
            case DdpUntaggedCode::InvalidMsnRange:
              return "DDP untagged buffer: invalid MSN, out of range";
            case DdpUntaggedCode::InvalidMo: return "DDP untagged buffer: invalid MO";
            case DdpUntaggedCode::MessageTooLong: return "DDP untagged buffer: message too long";
            case DdpUntaggedCode::BadVersion: return "DDP untagged buffer: invalid DDP version";
          }
          break;
      }
      break;
    case TermLayer::Llp:
      if (c.type != uint8_t(LlpErrorType::Mpa)) break;
      switch (LlpErrorCode(c.code)) {
        case LlpErrorCode::StreamLost: return "MPA: TCP connection lost";
        case LlpErrorCode::CrcError: return "MPA: received CRC error";
        case LlpErrorCode::MarkerMismatch: return "MPA: marker and FPDU header mismatch";
        case LlpErrorCode::InvalidMpaFrame: return "MPA: invalid request or reply";
        case LlpErrorCode::LocalCatastrophic: return "MPA: local catastrophic";
        case LlpErrorCode::InsufficientIrd: return "MPA: insufficient IRD";
        case LlpErrorCode::NoMatchingRtr: return "MPA: no matching RTR";
      }
      break;
  }
  return "unknown";
}

// ---- header ----------------------------------------------------------------------------------

size_t EncodeDdpHeader(const DdpHeader& h, std::span<uint8_t> out) {
  const size_t len = h.length();
  if (out.size() < len) return 0;
  uint8_t* p = out.data();
  StoreBe16(p, MakeDdpCtrl(h.opcode, h.last));
  if (h.tagged()) {
    StoreBe32(p + 2, h.stag);
    StoreBe64(p + 6, h.to);
  } else {
    StoreBe32(p + 2, h.inv_stag);
    StoreBe32(p + 6, h.qn);
    StoreBe32(p + 10, h.msn);
    StoreBe32(p + 14, h.mo);
  }
  return len;
}

DdpError DecodeDdpHeader(std::span<const uint8_t> ulpdu, DdpHeader& out, ReservedBits reserved) {
  if (ulpdu.size() < 2) return DdpError::Truncated;
  const uint8_t* p = ulpdu.data();
  const uint16_t ctrl = LoadBe16(p);
  const bool tagged = ctrl & kDdpTagged;

  // Checked in the order of the layers (DDP, then RDMAP), as a receiver that parses bottom-up
  // would: a bad DDP version makes every other field meaningless.
  if (((ctrl & kDdpVersionMask) >> 8) != kDdpVersion)
    return tagged ? DdpError::BadDdpVersionTagged : DdpError::BadDdpVersionUntagged;
  if (((ctrl & kRdmapVersionMask) >> 6) != kRdmapVersion) return DdpError::BadRdmapVersion;
  const uint8_t op = ctrl & kRdmapOpcodeMask;
  if (!IsKnownOpcode(op)) return DdpError::BadOpcode;  // before any use of the opcode table
  out.opcode = RdmapOpcode(op);
  out.last = ctrl & kDdpLast;
  if (tagged != IsTagged(out.opcode)) return DdpError::OpcodeModelMismatch;
  if (reserved == ReservedBits::Reject) {
    if (ctrl & kDdpReserved) return DdpError::DdpReservedBits;
    if (ctrl & kRdmapReserved) return DdpError::RdmapReservedBits;
  }

  if (ulpdu.size() < out.length()) return DdpError::Truncated;
  if (tagged) {
    out.stag = LoadBe32(p + 2);
    out.to = LoadBe64(p + 6);
    out.inv_stag = out.qn = out.msn = out.mo = 0;
    return DdpError::Ok;
  }
  out.stag = 0;
  out.to = 0;
  out.inv_stag = LoadBe32(p + 2);
  out.qn = LoadBe32(p + 6);
  out.msn = LoadBe32(p + 10);
  out.mo = LoadBe32(p + 14);
  if (out.qn != uint8_t(QueueFor(out.opcode))) return DdpError::BadQueue;
  return DdpError::Ok;
}

// ---- Read Request ------------------------------------------------------------------------------

size_t EncodeReadRequest(const ReadRequest& r, std::span<uint8_t> out) {
  if (out.size() < kReadRequestLen) return 0;
  uint8_t* p = out.data();
  StoreBe32(p, r.sink_stag);
  StoreBe64(p + 4, r.sink_to);
  StoreBe32(p + 12, r.size);
  StoreBe32(p + 16, r.src_stag);
  StoreBe64(p + 20, r.src_to);
  return kReadRequestLen;
}

bool DecodeReadRequest(std::span<const uint8_t> in, ReadRequest& out) {
  if (in.size() < kReadRequestLen) return false;
  const uint8_t* p = in.data();
  out.sink_stag = LoadBe32(p);
  out.sink_to = LoadBe64(p + 4);
  out.size = LoadBe32(p + 12);
  out.src_stag = LoadBe32(p + 16);
  out.src_to = LoadBe64(p + 20);
  return true;
}

// ---- Terminate ---------------------------------------------------------------------------------

namespace {

// Length of the DDP header whose control field starts `ddp` (needs 2 bytes).
size_t AttachedDdpHeaderLen(const uint8_t* ddp) {
  return (LoadBe16(ddp) & kDdpTagged) ? kDdpTaggedHeaderLen : kDdpUntaggedHeaderLen;
}

bool IsUntaggedReadRequest(const uint8_t* ddp) {
  const uint16_t ctrl = LoadBe16(ddp);
  return !(ctrl & kDdpTagged) && (ctrl & kRdmapOpcodeMask) == uint8_t(RdmapOpcode::ReadRequest);
}

}  // namespace

size_t TerminateMsg::length() const {
  return kTerminateCtrlLen + ((ctrl.m || ctrl.d) ? 2 : 0) + ddp_header.size() + rdmap_header.size();
}

DdpError DecodeTerminatePayload(std::span<const uint8_t> in, TerminateMsg& out) {
  out = TerminateMsg{};
  if (in.size() < kTerminateCtrlLen) return DdpError::Truncated;
  out.ctrl = DecodeTerminateCtrl(LoadBe32(in.data()));
  std::span<const uint8_t> rest = in.subspan(kTerminateCtrlLen);

  // RFC 5040: [DDP Segment Length (2)] [DDP header] [RDMAP header]. The length field comes
  // with the DDP header; M only says whether its value is valid.
  if (!out.ctrl.m && !out.ctrl.d) return DdpError::Ok;
  if (rest.size() < 2) return DdpError::BadTerminate;
  if (out.ctrl.m) out.ddp_segment_len = LoadBe16(rest.data());
  rest = rest.subspan(2);
  if (!out.ctrl.d) return DdpError::Ok;
  if (rest.size() < 2) return DdpError::BadTerminate;
  const size_t hlen = AttachedDdpHeaderLen(rest.data());
  if (rest.size() < hlen) return DdpError::BadTerminate;
  out.ddp_header = rest.first(hlen);
  if (out.ctrl.r && IsUntaggedReadRequest(rest.data())) {
    if (rest.size() < hlen + kReadRequestLen) return DdpError::BadTerminate;
    out.rdmap_header = rest.subspan(hlen, kReadRequestLen);
  }
  return DdpError::Ok;
}

size_t EncodeTerminate(std::span<uint8_t> out, TermCode code, uint32_t msn,
                       std::span<const uint8_t> offending, TermAttach attach) {
  // Work out what is really attached before writing anything.
  size_t ddp_part = 0, rdmap_part = 0;
  TerminateCtrl ctrl{code};
  if (attach != TermAttach::None && offending.size() >= 4) {
    const size_t hlen = 2 + AttachedDdpHeaderLen(offending.data() + 2);
    if (offending.size() >= hlen) {
      ddp_part = hlen;
      ctrl.m = ctrl.d = true;
      if (attach == TermAttach::DdpAndRdmap) {
        // Only a Read Request has an RDMAP header of its own; for the other opcodes the RDMAP
        // fields are inside the DDP header just copied.
        if (!IsUntaggedReadRequest(offending.data() + 2)) {
          ctrl.r = true;
        } else if (offending.size() >= hlen + kReadRequestLen) {
          rdmap_part = kReadRequestLen;
          ctrl.r = true;
        }
      }
    }
  }
  const size_t total = kTerminateHeaderLen + ddp_part + rdmap_part;
  if (out.size() < total) return 0;

  const size_t n = EncodeDdpHeader(DdpHeader::Untagged(RdmapOpcode::Terminate, msn, 0, true), out);
  StoreBe32(out.data() + n, EncodeTerminateCtrl(ctrl));
  if (ddp_part + rdmap_part > 0)
    std::memcpy(out.data() + kTerminateHeaderLen, offending.data(), ddp_part + rdmap_part);
  return total;
}

// ---- whole segment ---------------------------------------------------------------------------

DdpError DecodeDdpSegment(std::span<const uint8_t> ulpdu, DdpSegment& out, ReservedBits reserved) {
  const DdpError err = DecodeDdpHeader(ulpdu, out.hdr, reserved);
  if (err != DdpError::Ok) return err;
  std::span<const uint8_t> rest = ulpdu.subspan(out.hdr.length());
  out.read = ReadRequest{};
  out.term = TerminateMsg{};
  switch (out.hdr.opcode) {
    case RdmapOpcode::ReadRequest:
      if (!DecodeReadRequest(rest, out.read)) return DdpError::Truncated;
      rest = rest.subspan(kReadRequestLen);
      break;
    case RdmapOpcode::Terminate: {
      if (rest.size() < kTerminateCtrlLen) return DdpError::Truncated;
      const DdpError terr = DecodeTerminatePayload(rest, out.term);
      if (terr != DdpError::Ok) return terr;
      // Whatever follows the announced headers is left as payload.
      rest = rest.subspan(out.term.length());
      break;
    }
    default: break;
  }
  out.payload = rest;
  return DdpError::Ok;
}

}  // namespace ndwv::wire
