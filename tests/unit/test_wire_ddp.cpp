// DDP/RDMAP headers, RDMA Read Request, Terminate (RFC 5040, RFC 5041).
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "wire/ddp.h"

namespace ndwv::wire {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes Cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---- literal vectors ---------------------------------------------------------------------------

// RDMA Write, last segment, STag 0x12345678, TO 0x0011223344556677.
const Bytes kWriteHdr = {0xC1, 0x40, 0x12, 0x34, 0x56, 0x78,
                         0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77};
// Send, last segment, QN 0, MSN 1, MO 0.
const Bytes kSendHdr = {0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0};
// Read Request: QN 1, MSN 1, MO 0; sink STag 0xA1B2C3D4 TO 0x1000, size 0x2000,
// source STag 0x0BADCAFE TO 0xFFFF000011112222.
const Bytes kReadReq = {0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0,
                        0xA1, 0xB2, 0xC3, 0xD4,                          // sink STag
                        0, 0, 0, 0, 0, 0, 0x10, 0x00,                    // sink TO
                        0, 0, 0x20, 0x00,                                // size
                        0x0B, 0xAD, 0xCA, 0xFE,                          // source STag
                        0xFF, 0xFF, 0x00, 0x00, 0x11, 0x11, 0x22, 0x22};  // source TO

TEST(WireDdp, ControlField) {
  EXPECT_EQ(MakeDdpCtrl(RdmapOpcode::RdmaWrite, true), 0xC140);
  EXPECT_EQ(MakeDdpCtrl(RdmapOpcode::RdmaWrite, false), 0x8140);
  EXPECT_EQ(MakeDdpCtrl(RdmapOpcode::ReadResponse, true), 0xC142);
  EXPECT_EQ(MakeDdpCtrl(RdmapOpcode::Send, true), 0x4143);
  EXPECT_EQ(MakeDdpCtrl(RdmapOpcode::SendSolicitedInvalidate, false), 0x0146);
  EXPECT_EQ(MakeDdpCtrl(RdmapOpcode::Terminate, true), 0x4147);
}

TEST(WireDdp, TaggedWriteLiteral) {
  Bytes out(14);
  EXPECT_EQ(EncodeDdpHeader(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, 0x12345678,
                                              0x0011223344556677, true),
                            out),
            14u);
  EXPECT_EQ(out, kWriteHdr);
  DdpHeader h;
  ASSERT_EQ(DecodeDdpHeader(kWriteHdr, h), DdpError::Ok);
  EXPECT_EQ(h.opcode, RdmapOpcode::RdmaWrite);
  EXPECT_TRUE(h.tagged());
  EXPECT_TRUE(h.last);
  EXPECT_EQ(h.stag, 0x12345678u);
  EXPECT_EQ(h.to, 0x0011223344556677u);
  EXPECT_EQ(SegmentHeaderLength(0xC140), 14u);
}

TEST(WireDdp, UntaggedSendLiteral) {
  Bytes out(18);
  EXPECT_EQ(EncodeDdpHeader(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), out), 18u);
  EXPECT_EQ(out, kSendHdr);
  DdpHeader h;
  ASSERT_EQ(DecodeDdpHeader(kSendHdr, h), DdpError::Ok);
  EXPECT_EQ(h.opcode, RdmapOpcode::Send);
  EXPECT_FALSE(h.tagged());
  EXPECT_TRUE(h.last);
  EXPECT_EQ(h.qn, 0u);
  EXPECT_EQ(h.msn, 1u);
  EXPECT_EQ(h.mo, 0u);
  EXPECT_EQ(h.inv_stag, 0u);
  EXPECT_EQ(SegmentHeaderLength(0x4143), 18u);
}

TEST(WireDdp, SendInvalidateCarriesStag) {
  Bytes out(18);
  ASSERT_EQ(EncodeDdpHeader(
                DdpHeader::Untagged(RdmapOpcode::SendInvalidate, 7, 4096, false, 0xDEADBEEF), out),
            18u);
  EXPECT_EQ(out, (Bytes{0x01, 0x44, 0xDE, 0xAD, 0xBE, 0xEF, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0x10, 0}));
  DdpHeader h;
  ASSERT_EQ(DecodeDdpHeader(out, h), DdpError::Ok);
  EXPECT_EQ(h.inv_stag, 0xDEADBEEFu);
  EXPECT_FALSE(h.last);
  EXPECT_EQ(h.mo, 4096u);
}

TEST(WireDdp, ReadRequestLiteral) {
  Bytes out(46);
  ASSERT_EQ(EncodeDdpHeader(DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true), out), 18u);
  ReadRequest r{0xA1B2C3D4, 0x1000, 0x2000, 0x0BADCAFE, 0xFFFF000011112222};
  ASSERT_EQ(EncodeReadRequest(r, std::span(out).subspan(18)), 28u);
  EXPECT_EQ(out, kReadReq);
  EXPECT_EQ(SegmentHeaderLength(0x4141), 46u);

  DdpSegment s;
  ASSERT_EQ(DecodeDdpSegment(kReadReq, s), DdpError::Ok);
  EXPECT_EQ(s.hdr.opcode, RdmapOpcode::ReadRequest);
  EXPECT_EQ(s.hdr.qn, 1u);
  EXPECT_EQ(s.hdr.msn, 1u);
  EXPECT_EQ(s.read.sink_stag, 0xA1B2C3D4u);
  EXPECT_EQ(s.read.sink_to, 0x1000u);
  EXPECT_EQ(s.read.size, 0x2000u);
  EXPECT_EQ(s.read.src_stag, 0x0BADCAFEu);
  EXPECT_EQ(s.read.src_to, 0xFFFF000011112222u);
  EXPECT_TRUE(s.payload.empty());

  ReadRequest d;
  EXPECT_FALSE(DecodeReadRequest(std::span(kReadReq).subspan(18, 27), d));
  EXPECT_EQ(EncodeReadRequest(r, std::span(out).first(27)), 0u);
}

// The responder found the Read Request's source STag invalid: RDMAP remote protection /
// invalid STag, with the request's ULPDU_Length, DDP header and RDMAP header attached.
TEST(WireDdp, TerminateInvalidStagLiteral) {
  const Bytes offending = Cat({{0x00, 0x2E}, kReadReq});  // ULPDU_Length 46
  const Bytes expect = Cat({{0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0},
                            {0x01, 0x00, 0xE0, 0x00},  // layer 0, type 1, code 0, M D R
                            offending});
  const TermCode code = MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::InvalidStag);
  EXPECT_EQ(DefaultTermAttach(code), TermAttach::DdpAndRdmap);
  Bytes out(kTerminateMaxLen);
  ASSERT_EQ(EncodeTerminate(out, code, 1, offending, DefaultTermAttach(code)), 70u);
  out.resize(70);
  EXPECT_EQ(out, expect);
  EXPECT_EQ(SegmentHeaderLength(0x4147), 22u);

  DdpSegment s;
  ASSERT_EQ(DecodeDdpSegment(expect, s), DdpError::Ok);
  EXPECT_EQ(s.hdr.opcode, RdmapOpcode::Terminate);
  EXPECT_EQ(s.hdr.qn, 2u);
  EXPECT_EQ(s.term.ctrl.code, code);
  EXPECT_TRUE(s.term.ctrl.m && s.term.ctrl.d && s.term.ctrl.r);
  EXPECT_EQ(s.term.ddp_segment_len, 46u);
  ASSERT_EQ(s.term.ddp_header.size(), 18u);
  EXPECT_TRUE(std::equal(s.term.ddp_header.begin(), s.term.ddp_header.end(), kReadReq.begin()));
  ASSERT_EQ(s.term.rdmap_header.size(), 28u);
  ReadRequest r;
  ASSERT_TRUE(DecodeReadRequest(s.term.rdmap_header, r));
  EXPECT_EQ(r.src_stag, 0x0BADCAFEu);
  EXPECT_TRUE(s.payload.empty());
  EXPECT_STREQ(Describe(s.term.ctrl.code), "RDMAP remote protection: invalid STag");
}

// An RDMA Write to an invalid STag, caught by DDP: DDP tagged buffer / invalid STag, M D.
TEST(WireDdp, TerminateDdpTaggedInvalidStagLiteral) {
  const Bytes offending = Cat({{0x00, 0x20}, kWriteHdr, Bytes(18, 0xAA)});  // 32-byte Write
  const TermCode code = MakeTerm(DdpTaggedCode::InvalidStag);
  EXPECT_EQ(DefaultTermAttach(code), TermAttach::DdpHeader);
  Bytes out(kTerminateMaxLen);
  const size_t n = EncodeTerminate(out, code, 1, offending, TermAttach::DdpHeader);
  ASSERT_EQ(n, 22u + 16u);
  out.resize(n);
  EXPECT_EQ(out, Cat({{0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0},
                      {0x11, 0x00, 0xC0, 0x00},
                      {0x00, 0x20},
                      kWriteHdr}));
  DdpSegment s;
  ASSERT_EQ(DecodeDdpSegment(out, s), DdpError::Ok);
  EXPECT_EQ(s.term.ctrl.code, code);
  EXPECT_FALSE(s.term.ctrl.r);
  EXPECT_EQ(s.term.ddp_segment_len, 32u);
  EXPECT_EQ(s.term.ddp_header.size(), 14u);
  EXPECT_TRUE(s.term.rdmap_header.empty());
}

// ---- the opcode table --------------------------------------------------------------------------

// kRdmapOpcodes row by row against RFC 5040 §4.3 (opcode values), RFC 5040 §5 and RFC 5041 §5
// (which opcodes use the tagged model, and the queue numbers: 0 Send, 1 Read Request,
// 2 Terminate) and the header layouts of §4 (14 tagged, 18 untagged, +28 Read Request, +4
// Terminate).
TEST(WireDdp, OpcodeTable) {
  struct Fact {
    uint8_t value;
    RdmapOpcode opcode;
    bool tagged;
    uint8_t qn;
    size_t header_length;
    bool send, solicited, invalidates;
  };
  const Fact facts[] = {
      {0, RdmapOpcode::RdmaWrite, true, 0, 14, false, false, false},
      {1, RdmapOpcode::ReadRequest, false, 1, 46, false, false, false},
      {2, RdmapOpcode::ReadResponse, true, 0, 14, false, false, false},
      {3, RdmapOpcode::Send, false, 0, 18, true, false, false},
      {4, RdmapOpcode::SendInvalidate, false, 0, 18, true, false, true},
      {5, RdmapOpcode::SendSolicited, false, 0, 18, true, true, false},
      {6, RdmapOpcode::SendSolicitedInvalidate, false, 0, 18, true, true, true},
      {7, RdmapOpcode::Terminate, false, 2, 22, false, false, false},
  };
  ASSERT_EQ(kRdmapOpcodeCount, std::size(facts));
  std::set<std::string> names;
  for (const Fact& f : facts) {
    SCOPED_TRACE(int(f.value));
    EXPECT_EQ(uint8_t(f.opcode), f.value);
    const RdmapOpcodeInfo& info = InfoFor(f.opcode);
    EXPECT_EQ(&info, &kRdmapOpcodes[f.value]);
    EXPECT_EQ(info.opcode, f.opcode);
    EXPECT_EQ(info.tagged, f.tagged);
    if (!f.tagged) {
      EXPECT_EQ(uint8_t(info.queue), f.qn);
    }
    EXPECT_EQ(info.header_length, f.header_length);
    EXPECT_EQ(info.is_send, f.send);
    EXPECT_EQ(info.solicited, f.solicited);
    EXPECT_EQ(info.invalidates, f.invalidates);
    EXPECT_STREQ(ToString(f.opcode), info.name);
    names.insert(info.name);
    // What the control field ndwv sends says of it.
    const uint16_t ctrl = MakeDdpCtrl(f.opcode, true);
    EXPECT_EQ(bool(ctrl & kDdpTagged), f.tagged);
    EXPECT_EQ(ctrl & kRdmapOpcodeMask, f.value);
    EXPECT_EQ(SegmentHeaderLength(ctrl), f.header_length);
  }
  EXPECT_EQ(names.size(), std::size(facts));
  for (int op = 8; op <= 15; op++) EXPECT_FALSE(IsKnownOpcode(uint8_t(op)));
}

// ---- round trips ------------------------------------------------------------------------------

TEST(WireDdp, RoundTripEveryOpcode) {
  for (int op = 0; op <= 7; op++)
    for (int last = 0; last < 2; last++) {
      const RdmapOpcode o = RdmapOpcode(op);
      const DdpHeader h = IsTagged(o) ? DdpHeader::Tagged(o, 0x80000001u + op, ~0ull - op, last)
                                      : DdpHeader::Untagged(o, 0xFFFFFFF0u + op, 0x7FFFu * op,
                                                            last, CarriesInvalidateStag(o) ? 99 : 0);
      Bytes out(18, 0xEE);
      const size_t n = EncodeDdpHeader(h, out);
      ASSERT_EQ(n, IsTagged(o) ? 14u : 18u);
      EXPECT_EQ(n, h.length());
      const uint16_t ctrl = uint16_t(out[0] << 8 | out[1]);
      EXPECT_EQ(ctrl, MakeDdpCtrl(o, last));
      if (o != RdmapOpcode::ReadRequest && o != RdmapOpcode::Terminate) {
        EXPECT_EQ(SegmentHeaderLength(ctrl), n);
      }
      for (size_t short_len = 0; short_len < n; short_len++)
        EXPECT_EQ(EncodeDdpHeader(h, std::span(out).first(short_len)), 0u);

      DdpHeader d;
      ASSERT_EQ(DecodeDdpHeader(std::span(out).first(n), d), DdpError::Ok) << op;
      EXPECT_EQ(d.opcode, h.opcode);
      EXPECT_EQ(d.last, h.last);
      EXPECT_EQ(d.stag, h.stag);
      EXPECT_EQ(d.to, h.to);
      EXPECT_EQ(d.inv_stag, h.inv_stag);
      EXPECT_EQ(d.qn, h.qn);
      EXPECT_EQ(d.msn, h.msn);
      EXPECT_EQ(d.mo, h.mo);
    }
}

TEST(WireDdp, SegmentPayload) {
  const Bytes write = Cat({kWriteHdr, {1, 2, 3, 4, 5}});
  DdpSegment s;
  ASSERT_EQ(DecodeDdpSegment(write, s), DdpError::Ok);
  ASSERT_EQ(s.payload.size(), 5u);
  EXPECT_EQ(s.payload.data(), write.data() + 14);
  const Bytes send = Cat({kSendHdr, {9}});
  ASSERT_EQ(DecodeDdpSegment(send, s), DdpError::Ok);
  ASSERT_EQ(s.payload.size(), 1u);
  EXPECT_EQ(s.payload[0], 9);
  // Zero-length Write: the RTR of RFC 6581.
  ASSERT_EQ(DecodeDdpSegment(kWriteHdr, s), DdpError::Ok);
  EXPECT_TRUE(s.payload.empty());
}

// ---- errors -----------------------------------------------------------------------------------

Bytes WithCtrl(Bytes b, uint16_t ctrl) {
  b[0] = uint8_t(ctrl >> 8);
  b[1] = uint8_t(ctrl);
  return b;
}

TEST(WireDdp, BadDdpVersion) {
  DdpHeader h;
  for (uint16_t dv : {0, 2, 3}) {
    const uint16_t v = uint16_t(dv << 8);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kWriteHdr, (0xC140 & ~kDdpVersionMask) | v), h),
              DdpError::BadDdpVersionTagged);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kSendHdr, (0x4143 & ~kDdpVersionMask) | v), h),
              DdpError::BadDdpVersionUntagged);
  }
  EXPECT_EQ(TermCodeFor(DdpError::BadDdpVersionTagged), (TermCode{TermLayer::Ddp, 1, 4}));
  EXPECT_EQ(TermCodeFor(DdpError::BadDdpVersionUntagged), (TermCode{TermLayer::Ddp, 2, 6}));
  // Reported from the control field alone.
  EXPECT_EQ(DecodeDdpHeader(Bytes{0x80, 0x40}, h), DdpError::BadDdpVersionTagged);
}

TEST(WireDdp, BadRdmapVersion) {
  DdpHeader h;
  for (uint16_t rv : {0, 2, 3}) {
    const uint16_t v = uint16_t(rv << 6);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kSendHdr, (0x4143 & ~kRdmapVersionMask) | v), h),
              DdpError::BadRdmapVersion);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kWriteHdr, (0xC140 & ~kRdmapVersionMask) | v), h),
              DdpError::BadRdmapVersion);
  }
  EXPECT_EQ(TermCodeFor(DdpError::BadRdmapVersion), (TermCode{TermLayer::Rdmap, 2, 5}));
}

TEST(WireDdp, BadOpcode) {
  DdpHeader h;
  for (uint16_t op = 8; op <= 15; op++) {
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kSendHdr, 0x4140 | op), h), DdpError::BadOpcode) << op;
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kWriteHdr, 0xC140 | op), h), DdpError::BadOpcode) << op;
    EXPECT_EQ(SegmentHeaderLength(uint16_t(0x4140 | op)), 18u);
    EXPECT_EQ(SegmentHeaderLength(uint16_t(0xC140 | op)), 14u);
  }
  EXPECT_EQ(TermCodeFor(DdpError::BadOpcode), (TermCode{TermLayer::Rdmap, 2, 6}));
}

TEST(WireDdp, OpcodeModelMismatch) {
  DdpHeader h;
  Bytes big(18);
  for (int op = 0; op <= 7; op++) {
    const bool tagged = IsTagged(RdmapOpcode(op));
    // Flip the T bit against the opcode.
    const uint16_t ctrl = uint16_t((tagged ? 0 : kDdpTagged) | kDdpLast | 0x0140 | op);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(big, ctrl), h), DdpError::OpcodeModelMismatch) << op;
    EXPECT_EQ(SegmentHeaderLength(ctrl), tagged ? 18u : 14u);
  }
  EXPECT_EQ(TermCodeFor(DdpError::OpcodeModelMismatch), (TermCode{TermLayer::Rdmap, 2, 6}));
}

TEST(WireDdp, BadQueue) {
  DdpHeader h;
  struct Case {
    RdmapOpcode op;
    uint32_t good;
  } cases[] = {{RdmapOpcode::Send, 0},           {RdmapOpcode::SendInvalidate, 0},
               {RdmapOpcode::SendSolicited, 0},  {RdmapOpcode::SendSolicitedInvalidate, 0},
               {RdmapOpcode::ReadRequest, 1},    {RdmapOpcode::Terminate, 2}};
  for (const auto& c : cases)
    for (uint32_t qn : {0u, 1u, 2u, 3u, 0xFFFFFFFFu}) {
      DdpHeader e = DdpHeader::Untagged(c.op, 1, 0, true);
      e.qn = qn;
      Bytes out(18);
      ASSERT_EQ(EncodeDdpHeader(e, out), 18u);
      EXPECT_EQ(DecodeDdpHeader(out, h), qn == c.good ? DdpError::Ok : DdpError::BadQueue)
          << int(c.op) << " " << qn;
    }
  EXPECT_EQ(TermCodeFor(DdpError::BadQueue), MakeTerm(DdpUntaggedCode::InvalidQn));
}

TEST(WireDdp, ReservedBits) {
  DdpHeader h;
  for (uint16_t bit : {0x2000, 0x1000, 0x0800, 0x0400}) {
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kWriteHdr, 0xC140 | bit), h), DdpError::DdpReservedBits);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kSendHdr, 0x4143 | bit), h), DdpError::DdpReservedBits);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kSendHdr, 0x4143 | bit), h, ReservedBits::Ignore),
              DdpError::Ok);
  }
  for (uint16_t bit : {0x0020, 0x0010}) {
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kWriteHdr, 0xC140 | bit), h), DdpError::RdmapReservedBits);
    EXPECT_EQ(DecodeDdpHeader(WithCtrl(kWriteHdr, 0xC140 | bit), h, ReservedBits::Ignore),
              DdpError::Ok);
    EXPECT_EQ(h.opcode, RdmapOpcode::RdmaWrite);
  }
  EXPECT_EQ(TermCodeFor(DdpError::DdpReservedBits), kTermDdpCatastrophic);
  EXPECT_EQ(TermCodeFor(DdpError::RdmapReservedBits), (TermCode{TermLayer::Rdmap, 2, 0xFF}));
}

TEST(WireDdp, BadTerminate) {
  Bytes out(kTerminateMaxLen);
  ASSERT_EQ(EncodeTerminate(out, kTermRdmapCatastrophic), 22u);
  // Set D, but attach nothing / only part of a header.
  for (size_t extra : {0, 1, 2, 3, 10}) {
    Bytes t(out.begin(), out.begin() + 22);
    t[20] = 0x40;  // D
    for (size_t i = 0; i < extra; i++) t.push_back(i == 2 ? 0x41 : 0);
    DdpSegment s;
    EXPECT_EQ(DecodeDdpSegment(t, s), DdpError::BadTerminate) << extra;
  }
  // R on an attached Read Request without its 28 bytes.
  Bytes t = Cat({Bytes(out.begin(), out.begin() + 22), {0x00, 0x2E}, kSendHdr});
  t[21 - 1] = 0x60;  // D R
  t[22 + 2 + 1] = 0x41;  // the attached header is a Read Request
  t[22 + 2 + 9] = 1;     // on QN 1
  DdpSegment s;
  EXPECT_EQ(DecodeDdpSegment(t, s), DdpError::BadTerminate);
  EXPECT_EQ(TermCodeFor(DdpError::BadTerminate), (TermCode{TermLayer::Rdmap, 2, 0xFF}));
}

TEST(WireDdp, TruncatedAtEveryLength) {
  Bytes out(kTerminateMaxLen);
  const Bytes offending = Cat({{0x00, 0x2E}, kReadReq});
  const size_t tn = EncodeTerminate(out, MakeTerm(RdmapErrorType::RemoteProtection,
                                                  RdmapErrorCode::AccessRights),
                                    1, offending, TermAttach::DdpAndRdmap);
  ASSERT_EQ(tn, 70u);
  const Bytes term(out.begin(), out.begin() + tn);
  for (const Bytes* seg : {&kWriteHdr, &kSendHdr, &kReadReq, &term}) {
    DdpSegment s;
    ASSERT_EQ(DecodeDdpSegment(*seg, s), DdpError::Ok);
    // Headers shorter than the control field asks for.
    const size_t need = SegmentHeaderLength(uint16_t((*seg)[0] << 8 | (*seg)[1]));
    for (size_t n = 0; n < need; n++) {
      const std::span<const uint8_t> part(seg->data(), n);
      EXPECT_EQ(DecodeDdpSegment(part, s), DdpError::Truncated) << n;
      DdpHeader h;
      const DdpError e = DecodeDdpHeader(part, h);
      const size_t ddp_len = ((*seg)[0] & 0x80) ? kDdpTaggedHeaderLen : kDdpUntaggedHeaderLen;
      EXPECT_EQ(e, n < ddp_len ? DdpError::Truncated : DdpError::Ok) << n;
    }
    // A Terminate cut inside its attached headers is malformed, not truncated: its ULPDU
    // length is all there is.
    for (size_t n = need; n < seg->size(); n++) {
      const std::span<const uint8_t> part(seg->data(), n);
      const DdpError e = DecodeDdpSegment(part, s);
      EXPECT_EQ(e, seg == &term ? DdpError::BadTerminate : DdpError::Ok) << n;
    }
  }
  EXPECT_EQ(TermCodeFor(DdpError::Truncated), kTermDdpCatastrophic);
}

// ---- Terminate ----------------------------------------------------------------------------

TEST(WireDdp, TerminateCtrlWord) {
  TerminateCtrl c{MakeTerm(LlpErrorCode::NoMatchingRtr), false, false, false};
  EXPECT_EQ(EncodeTerminateCtrl(c), 0x20070000u);
  c = {MakeTerm(DdpUntaggedCode::MessageTooLong), true, true, false};
  EXPECT_EQ(EncodeTerminateCtrl(c), 0x1205C000u);
  c = {MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::Unspecified), false, false, true};
  EXPECT_EQ(EncodeTerminateCtrl(c), 0x02FF2000u);

  const TerminateCtrl d = DecodeTerminateCtrl(0x1205C000u | kTermCtrlReserved);
  EXPECT_EQ(d.code, MakeTerm(DdpUntaggedCode::MessageTooLong));
  EXPECT_TRUE(d.m);
  EXPECT_TRUE(d.d);
  EXPECT_FALSE(d.r);
  for (uint32_t w : {0u, 0xFFFFE000u, 0x12345678u & ~kTermCtrlReserved})
    EXPECT_EQ(EncodeTerminateCtrl(DecodeTerminateCtrl(w)), w);
}

TEST(WireDdp, TerminateAttachments) {
  Bytes out(kTerminateMaxLen);
  DdpSegment s;
  const TermCode code = MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer);
  const Bytes send = Cat({{0x00, 0x19}, kSendHdr, {1, 2, 3, 4, 5, 6, 7}});

  // None.
  ASSERT_EQ(EncodeTerminate(out, code, 5, send, TermAttach::None), 22u);
  ASSERT_EQ(DecodeDdpSegment(std::span(out).first(22), s), DdpError::Ok);
  EXPECT_EQ(s.hdr.msn, 5u);
  EXPECT_EQ(s.hdr.mo, 0u);
  EXPECT_TRUE(s.hdr.last);
  EXPECT_EQ(s.term.ctrl.code, code);
  EXPECT_FALSE(s.term.ctrl.m || s.term.ctrl.d || s.term.ctrl.r);
  EXPECT_TRUE(s.term.ddp_header.empty());

  // DDP header of a Send: ULPDU_Length + 18 bytes, payload not copied.
  ASSERT_EQ(EncodeTerminate(out, code, 1, send, TermAttach::DdpHeader), 42u);
  ASSERT_EQ(DecodeDdpSegment(std::span(out).first(42), s), DdpError::Ok);
  EXPECT_TRUE(s.term.ctrl.m && s.term.ctrl.d && !s.term.ctrl.r);
  EXPECT_EQ(s.term.ddp_segment_len, 0x19u);
  EXPECT_EQ(Bytes(s.term.ddp_header.begin(), s.term.ddp_header.end()), kSendHdr);

  // DDP and RDMAP for a Send: R set, nothing more (its RDMAP fields are in the DDP header).
  ASSERT_EQ(EncodeTerminate(out, code, 1, send, TermAttach::DdpAndRdmap), 42u);
  ASSERT_EQ(DecodeDdpSegment(std::span(out).first(42), s), DdpError::Ok);
  EXPECT_TRUE(s.term.ctrl.r);
  EXPECT_TRUE(s.term.rdmap_header.empty());

  // A Read Request cut short: its DDP header goes, its RDMAP header cannot, so no R.
  const Bytes rreq = Cat({{0x00, 0x2E}, kReadReq});
  ASSERT_EQ(EncodeTerminate(out, code, 1, std::span(rreq).first(40), TermAttach::DdpAndRdmap),
            42u);
  ASSERT_EQ(DecodeDdpSegment(std::span(out).first(42), s), DdpError::Ok);
  EXPECT_TRUE(s.term.ctrl.d && !s.term.ctrl.r);

  // Too little of the offending segment for its DDP header: nothing attached.
  for (size_t n : {0, 1, 3, 4, 19}) {
    ASSERT_EQ(EncodeTerminate(out, code, 1, std::span(send).first(n), TermAttach::DdpAndRdmap),
              22u)
        << n;
    ASSERT_EQ(DecodeDdpSegment(std::span(out).first(22), s), DdpError::Ok);
    EXPECT_FALSE(s.term.ctrl.m || s.term.ctrl.d || s.term.ctrl.r);
  }

  // Output too small, at every size below what is needed.
  for (size_t n = 0; n < 70; n++)
    EXPECT_EQ(EncodeTerminate(std::span(out).first(n), code, 1, rreq, TermAttach::DdpAndRdmap),
              0u)
        << n;
}

TEST(WireDdp, DefaultTermAttach) {
  using A = TermAttach;
  EXPECT_EQ(DefaultTermAttach(MakeTerm(LlpErrorCode::CrcError)), A::None);
  EXPECT_EQ(DefaultTermAttach(kTermDdpCatastrophic), A::None);
  EXPECT_EQ(DefaultTermAttach(kTermRdmapCatastrophic), A::None);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(DdpTaggedCode::BadVersion)), A::None);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(DdpUntaggedCode::BadVersion)), A::None);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(DdpTaggedCode::BaseBounds)), A::DdpHeader);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(DdpUntaggedCode::InvalidQn)), A::DdpHeader);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(RdmapErrorType::RemoteOperation,
                                       RdmapErrorCode::BadVersion)),
            A::None);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(RdmapErrorType::RemoteOperation,
                                       RdmapErrorCode::UnexpectedOpcode)),
            A::None);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(RdmapErrorType::RemoteOperation,
                                       RdmapErrorCode::CannotInvalidate)),
            A::DdpHeader);
  EXPECT_EQ(DefaultTermAttach(MakeTerm(RdmapErrorType::RemoteProtection,
                                       RdmapErrorCode::AccessRights)),
            A::DdpAndRdmap);
}

// Every code of design-facts §4.7 has a name of its own; combinations outside it have none.
TEST(WireDdp, DescribeEveryCode) {
  std::vector<TermCode> codes;
  for (int c : {0, 1, 2, 3, 4, 9, 0xFF})
    codes.push_back(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode(c)));
  for (int c : {5, 6, 7, 8, 9, 0xFF})
    codes.push_back(MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode(c)));
  for (int c = 0; c <= 4; c++) codes.push_back(MakeTerm(DdpTaggedCode(c)));
  for (int c = 1; c <= 6; c++) codes.push_back(MakeTerm(DdpUntaggedCode(c)));
  for (int c = 1; c <= 7; c++) codes.push_back(MakeTerm(LlpErrorCode(c)));
  codes.push_back(kTermDdpCatastrophic);
  codes.push_back(kTermRdmapCatastrophic);
  std::set<std::string> names;
  for (const TermCode& c : codes) {
    const std::string name = Describe(c);
    EXPECT_NE(name, "unknown") << int(c.layer) << "/" << int(c.type) << "/" << int(c.code);
    names.insert(name);
  }
  EXPECT_EQ(names.size(), codes.size());
  EXPECT_STREQ(Describe(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::BadVersion)),
               "unknown");
  EXPECT_STREQ(Describe(TermCode{TermLayer::Ddp, 2, 0}), "unknown");
  EXPECT_STREQ(Describe(TermCode{TermLayer::Ddp, 3, 0}), "unknown");
  EXPECT_STREQ(Describe(TermCode{TermLayer::Llp, 0, 0}), "unknown");
  EXPECT_STREQ(Describe(TermCode{TermLayer::Llp, 1, 2}), "unknown");
  EXPECT_STREQ(Describe(TermCode{TermLayer(7), 0, 0}), "unknown");
}

TEST(WireDdp, Names) {
  std::set<std::string> names;
  for (int e = 0; e <= int(DdpError::BadTerminate); e++) names.insert(ToString(DdpError(e)));
  EXPECT_EQ(names.size(), size_t(DdpError::BadTerminate) + 1);
  for (int op = 0; op <= 7; op++) EXPECT_STRNE(ToString(RdmapOpcode(op)), "unknown opcode");
  EXPECT_STREQ(ToString(RdmapOpcode(9)), "unknown opcode");
}

}  // namespace
}  // namespace ndwv::wire
