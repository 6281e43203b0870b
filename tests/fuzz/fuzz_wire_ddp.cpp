// libFuzzer target: DDP/RDMAP segment, Read Request and Terminate decoders, and the Terminate
// encoder fed with arbitrary "offending" bytes. Besides ASan's checks, whatever decodes cleanly
// must re-encode to the same bytes, and every Terminate we build must decode.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/bytes.h"
#include "wire/ddp.h"
#include "check.h"

using namespace ndwv::wire;


static bool Inside(std::span<const uint8_t> s, const uint8_t* data, size_t size) {
  return s.empty() || (s.data() >= data && s.data() + s.size() <= data + size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);

  for (ReservedBits rb : {ReservedBits::Reject, ReservedBits::Ignore}) {
    DdpSegment s;
    const DdpError err = DecodeDdpSegment(in, s, rb);
    DdpHeader h;
    const DdpError herr = DecodeDdpHeader(in, h, rb);
    if (herr != DdpError::Ok) {
      CHECK(err == herr);
      CHECK(TermCodeFor(err).layer <= TermLayer::Llp);
      continue;
    }
    const uint16_t ctrl = LoadBe16(data);
    CHECK(SegmentHeaderLength(ctrl) >= h.length() && size >= h.length());
    if (err != DdpError::Ok) {
      CHECK(err == DdpError::Truncated || err == DdpError::BadTerminate);
      CHECK(h.opcode == RdmapOpcode::ReadRequest || h.opcode == RdmapOpcode::Terminate);
      continue;
    }
    CHECK(Inside(s.payload, data, size) && Inside(s.term.ddp_header, data, size) &&
          Inside(s.term.rdmap_header, data, size));
    std::vector<uint8_t> out(kDdpUntaggedHeaderLen + kReadRequestLen);
    CHECK(EncodeDdpHeader(s.hdr, out) == s.hdr.length());
    const uint16_t mask = rb == ReservedBits::Reject ? 0xFFFF : ~(kDdpReserved | kRdmapReserved);
    CHECK((LoadBe16(out.data()) & mask) == (ctrl & mask));
    CHECK(std::memcmp(out.data() + 2, data + 2, s.hdr.length() - 2) == 0);
    if (s.hdr.opcode == RdmapOpcode::ReadRequest) {
      CHECK(EncodeReadRequest(s.read, std::span(out).subspan(s.hdr.length())) == kReadRequestLen);
      CHECK(std::memcmp(out.data(), data, SegmentHeaderLength(ctrl)) == 0 ||
            rb == ReservedBits::Ignore);
    }
    if (s.hdr.opcode == RdmapOpcode::Terminate) {
      const uint32_t w = LoadBe32(data + kDdpUntaggedHeaderLen);
      CHECK(EncodeTerminateCtrl(s.term.ctrl) == (w & ~kTermCtrlReserved));
    }
  }

  // Any bytes as the offending segment: the Terminate built from them decodes, and carries
  // exactly the head of them that its flags announce.
  const TermCode code = MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::BaseBounds);
  for (TermAttach a : {TermAttach::None, TermAttach::DdpHeader, TermAttach::DdpAndRdmap}) {
    std::vector<uint8_t> out(kTerminateMaxLen);
    const size_t n = EncodeTerminate(out, code, 1, in, a);
    CHECK(n >= kTerminateHeaderLen && n <= kTerminateMaxLen);
    DdpSegment s;
    CHECK(DecodeDdpSegment(std::span(out).first(n), s) == DdpError::Ok);
    CHECK(s.hdr.opcode == RdmapOpcode::Terminate && s.term.ctrl.code == code);
    CHECK(s.payload.empty());
    const size_t attached = n - kTerminateHeaderLen;
    CHECK(std::memcmp(out.data() + kTerminateHeaderLen, data, attached) == 0);
    if (a == TermAttach::None) CHECK(attached == 0);
    if (attached) {
      CHECK(s.term.ctrl.m && s.term.ctrl.d);
      CHECK(s.term.ddp_segment_len == LoadBe16(data));
      CHECK(2 + s.term.ddp_header.size() + s.term.rdmap_header.size() == attached);
    }
  }
  return 0;
}
