#include "wire/mpa.h"

#include <cstring>

#include "wire/bytes.h"
#include "wire/crc.h"

namespace ndwv::wire {

const char* ToString(MpaError e) {
  switch (e) {
    case MpaError::Ok: return "ok";
    case MpaError::Truncated: return "truncated MPA frame";
    case MpaError::BadKey: return "not an MPA key";
    case MpaError::WrongKey: return "MPA key of the wrong direction";
    case MpaError::BadRevision: return "unsupported MPA revision";
    case MpaError::ReservedBits: return "reserved MPA flag bits set";
    case MpaError::PrivateDataTooLong: return "MPA private data over 512 bytes";
    case MpaError::MissingIrdOrd: return "enhanced MPA frame without IRD/ORD";
    case MpaError::BytesAfterFrame: return "bytes after the MPA frame";
  }
  return "?";
}

const char* ToString(FpduError e) {
  switch (e) {
    case FpduError::Ok: return "ok";
    case FpduError::Truncated: return "truncated FPDU";
    case FpduError::BadCrc: return "FPDU CRC mismatch";
  }
  return "?";
}

size_t EncodeMpaFrame(const MpaFrame& f, std::span<uint8_t> out) {
  const size_t pd_len = (f.enhanced ? kMpaIrdOrdLen : 0) + f.private_data.size();
  if (pd_len > kMpaMaxPrivateData) return 0;
  if (f.revision != kMpaRevision1 && f.revision != kMpaRevision2) return 0;
  if (f.enhanced && f.revision != kMpaRevision2) return 0;
  if (f.reject && !f.reply) return 0;
  if (f.enhanced && (f.ird > kMpaIrdOrdMask || f.ord > kMpaIrdOrdMask)) return 0;
  const size_t total = kMpaHeaderLen + pd_len;
  if (out.size() < total) return 0;

  uint8_t* p = out.data();
  std::memcpy(p, f.reply ? kMpaKeyReply : kMpaKeyRequest, kMpaKeyLen);
  p[16] = uint8_t((f.markers ? kMpaFlagMarkers : 0) | (f.crc ? kMpaFlagCrc : 0) |
                  (f.reject ? kMpaFlagReject : 0) | (f.enhanced ? kMpaFlagEnhanced : 0));
  p[17] = f.revision;
  StoreBe16(p + 18, uint16_t(pd_len));
  p += kMpaHeaderLen;
  if (f.enhanced) {
    StoreBe16(p, uint16_t((f.p2p ? kMpaP2p : 0) | (f.rtr_send ? kMpaRtrSend : 0) | f.ird));
    StoreBe16(p + 2, uint16_t((f.rtr_write ? kMpaRtrWrite : 0) | (f.rtr_read ? kMpaRtrRead : 0) |
                              f.ord));
    p += kMpaIrdOrdLen;
  }
  if (!f.private_data.empty()) std::memcpy(p, f.private_data.data(), f.private_data.size());
  return total;
}

namespace {

// Header checks shared by both decoders; fills the header fields of `f`.
MpaError ParseHeader(std::span<const uint8_t> in, MpaKind kind, ReservedBits reserved,
                     MpaFrame& f, size_t& frame_len) {
  if (in.size() < kMpaHeaderLen) return MpaError::Truncated;
  const uint8_t* p = in.data();
  const uint16_t pd_len = LoadBe16(p + 18);
  frame_len = kMpaHeaderLen + pd_len;

  const bool want_reply = kind == MpaKind::Reply;
  const char* want = want_reply ? kMpaKeyReply : kMpaKeyRequest;
  const char* other = want_reply ? kMpaKeyRequest : kMpaKeyReply;
  if (std::memcmp(p, want, kMpaKeyLen) != 0) {
    return std::memcmp(p, other, kMpaKeyLen) == 0 ? MpaError::WrongKey : MpaError::BadKey;
  }
  f.reply = want_reply;

  const uint8_t flags = p[16];
  f.revision = p[17];
  f.markers = flags & kMpaFlagMarkers;
  f.crc = flags & kMpaFlagCrc;
  f.reject = want_reply && (flags & kMpaFlagReject);
  f.enhanced = false;
  if (f.revision != kMpaRevision1 && f.revision != kMpaRevision2) return MpaError::BadRevision;

  uint8_t reserved_mask =
      f.revision == kMpaRevision1 ? kMpaFlagsReservedRev1 : kMpaFlagsReservedRev2;
  if (!want_reply) reserved_mask |= kMpaFlagReject;
  if ((flags & reserved_mask) && reserved == ReservedBits::Reject) return MpaError::ReservedBits;

  if (pd_len > kMpaMaxPrivateData) return MpaError::PrivateDataTooLong;
  f.enhanced = f.revision == kMpaRevision2 && (flags & kMpaFlagEnhanced);
  if (f.enhanced && pd_len < kMpaIrdOrdLen) return MpaError::MissingIrdOrd;
  return MpaError::Ok;
}

}  // namespace

MpaError DecodeMpaHeader(std::span<const uint8_t> in, MpaKind kind, size_t& frame_len,
                         ReservedBits reserved) {
  MpaFrame f;
  return ParseHeader(in, kind, reserved, f, frame_len);
}

MpaError DecodeMpaFrame(std::span<const uint8_t> in, MpaKind kind, MpaFrame& out,
                        ReservedBits reserved) {
  out.p2p = out.rtr_send = out.rtr_write = out.rtr_read = false;
  out.ird = out.ord = 0;
  out.private_data = {};
  size_t frame_len = 0;
  const MpaError err = ParseHeader(in, kind, reserved, out, frame_len);
  if (err != MpaError::Ok) return err;
  if (in.size() < frame_len) return MpaError::Truncated;

  std::span<const uint8_t> pd = in.subspan(kMpaHeaderLen, frame_len - kMpaHeaderLen);
  if (out.enhanced) {
    const uint16_t w1 = LoadBe16(pd.data());
    const uint16_t w2 = LoadBe16(pd.data() + 2);
    out.p2p = w1 & kMpaP2p;
    out.rtr_send = w1 & kMpaRtrSend;
    out.ird = w1 & kMpaIrdOrdMask;
    out.rtr_write = w2 & kMpaRtrWrite;
    out.rtr_read = w2 & kMpaRtrRead;
    out.ord = w2 & kMpaIrdOrdMask;
    pd = pd.subspan(kMpaIrdOrdLen);
  }
  out.private_data = pd;
  return MpaError::Ok;
}

// ---- FPDU --------------------------------------------------------------------------------------

FpduCrcBuilder& FpduCrcBuilder::Add(std::span<const uint8_t> bytes) {
  crc_ = Crc32c(bytes.data(), bytes.size(), crc_);
  len_ += bytes.size();
  return *this;
}

uint32_t FpduCrcBuilder::Finish() const {
  static constexpr uint8_t kZeros[3] = {};
  const size_t pad = (4 - (len_ & 3)) & 3;
  return Crc32c(kZeros, pad, crc_);
}

uint32_t FpduCrc(std::span<const std::span<const uint8_t>> pieces) {
  FpduCrcBuilder b;
  for (const auto& piece : pieces) b.Add(piece);
  return b.Finish();
}

size_t EncodeFpduTrailer(std::span<uint8_t> out, size_t ulpdu_len, uint32_t crc) {
  const size_t pad = FpduPad(ulpdu_len);
  if (out.size() < pad + kFpduCrcLen) return 0;
  std::memset(out.data(), 0, pad);
  StoreFpduCrc(out.data() + pad, crc);
  return pad + kFpduCrcLen;
}

size_t EncodeFpdu(std::span<const uint8_t> ulpdu, bool with_crc, std::span<uint8_t> out) {
  if (ulpdu.size() > kFpduMaxUlpdu) return 0;
  const size_t total = FpduLength(ulpdu.size());
  if (out.size() < total) return 0;
  StoreBe16(out.data(), uint16_t(ulpdu.size()));
  if (!ulpdu.empty()) std::memcpy(out.data() + kFpduLengthLen, ulpdu.data(), ulpdu.size());
  const size_t body = kFpduLengthLen + ulpdu.size();
  const uint32_t crc = with_crc ? FpduCrcBuilder().Add(out.first(body)).Finish() : 0;
  EncodeFpduTrailer(out.subspan(body), ulpdu.size(), crc);
  return total;
}

FpduError DecodeFpdu(std::span<const uint8_t> in, bool check_crc, FpduView& out) {
  if (in.size() < kFpduLengthLen) return FpduError::Truncated;
  const size_t ulpdu_len = LoadBe16(in.data());
  const size_t total = FpduLength(ulpdu_len);
  if (in.size() < total) return FpduError::Truncated;
  out.ulpdu = in.subspan(kFpduLengthLen, ulpdu_len);
  out.length = total;
  out.crc = LoadFpduCrc(in.data() + total - kFpduCrcLen);
  if (check_crc && Crc32c(in.data(), total - kFpduCrcLen) != out.crc) return FpduError::BadCrc;
  return FpduError::Ok;
}

}  // namespace ndwv::wire
