// MPA Request/Reply frames (RFC 5044, RFC 6581) and FPDU framing.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <vector>

#include "wire/crc.h"
#include "wire/mpa.h"

namespace ndwv::wire {
namespace {

using Bytes = std::vector<uint8_t>;

Bytes Encode(const MpaFrame& f) {
  Bytes out(MpaFrameLength(f));
  EXPECT_EQ(EncodeMpaFrame(f, out), out.size());
  return out;
}

// "MPA ID Req Frame" / "MPA ID Rep Frame" in ASCII.
constexpr uint8_t kReqKey[16] = {0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,
                                 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65};
constexpr uint8_t kRepKey[16] = {0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52,
                                 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6D, 0x65};

Bytes WithKey(const uint8_t (&key)[16], std::initializer_list<uint8_t> rest) {
  Bytes b(key, key + 16);
  b.insert(b.end(), rest);
  return b;
}

// Rev 2 request: CRC + enhanced, PD_Length 7 = IRD/ORD word + "abc"; P2P, IRD 4, Write RTR,
// ORD 8.
const Bytes kRequestV2 = WithKey(kReqKey, {0x50, 0x02, 0x00, 0x07,  //
                                           0x80, 0x04, 0x80, 0x08,  //
                                           0x61, 0x62, 0x63});

TEST(WireMpa, EncodeRequestRev2Literal) {
  const uint8_t pd[] = {'a', 'b', 'c'};
  MpaFrame f;
  f.reply = false;
  f.crc = true;
  f.revision = 2;
  f.enhanced = true;
  f.p2p = true;
  f.rtr_write = true;
  f.ird = 4;
  f.ord = 8;
  f.private_data = pd;
  EXPECT_EQ(MpaFrameLength(f), 27u);
  EXPECT_EQ(Encode(f), kRequestV2);
}

TEST(WireMpa, DecodeRequestRev2Literal) {
  size_t frame_len = 0;
  EXPECT_EQ(DecodeMpaHeader(kRequestV2, MpaKind::Request, frame_len), MpaError::Ok);
  EXPECT_EQ(frame_len, 27u);

  MpaFrame f;
  ASSERT_EQ(DecodeMpaFrame(kRequestV2, MpaKind::Request, f), MpaError::Ok);
  EXPECT_FALSE(f.reply);
  EXPECT_FALSE(f.reject);
  EXPECT_FALSE(f.markers);
  EXPECT_TRUE(f.crc);
  EXPECT_EQ(f.revision, 2);
  EXPECT_TRUE(f.enhanced);
  EXPECT_TRUE(f.p2p);
  EXPECT_FALSE(f.rtr_send);
  EXPECT_TRUE(f.rtr_write);
  EXPECT_FALSE(f.rtr_read);
  EXPECT_EQ(f.ird, 4);
  EXPECT_EQ(f.ord, 8);
  ASSERT_EQ(f.private_data.size(), 3u);
  EXPECT_EQ(std::memcmp(f.private_data.data(), "abc", 3), 0);
  EXPECT_EQ(f.private_data.data(), kRequestV2.data() + 24);  // a view, not a copy
}

// Rev 1 reply that rejects, no CRC, 2 bytes of private data.
TEST(WireMpa, RejectReplyRev1Literal) {
  const Bytes wire = WithKey(kRepKey, {0x20, 0x01, 0x00, 0x02, 0xAB, 0xCD});
  const uint8_t pd[] = {0xAB, 0xCD};
  MpaFrame f;
  f.reply = true;
  f.reject = true;
  f.crc = false;
  f.revision = 1;
  f.enhanced = false;
  f.private_data = pd;
  EXPECT_EQ(Encode(f), wire);

  MpaFrame d;
  ASSERT_EQ(DecodeMpaFrame(wire, MpaKind::Reply, d), MpaError::Ok);
  EXPECT_TRUE(d.reply);
  EXPECT_TRUE(d.reject);
  EXPECT_FALSE(d.crc);
  EXPECT_EQ(d.revision, 1);
  EXPECT_FALSE(d.enhanced);
  EXPECT_EQ(d.ird, 0);
  ASSERT_EQ(d.private_data.size(), 2u);
  EXPECT_EQ(d.private_data[1], 0xCD);
}

TEST(WireMpa, RoundTripAllShapes) {
  Bytes pd(512);
  for (size_t i = 0; i < pd.size(); i++) pd[i] = uint8_t(i * 7);
  for (int reply = 0; reply < 2; reply++)
    for (int rev = 1; rev <= 2; rev++)
      for (int enh = 0; enh < (rev == 2 ? 2 : 1); enh++)
        for (int bits = 0; bits < 64; bits++)
          for (size_t pd_len : {size_t(0), size_t(1), size_t(56), size_t(enh ? 508 : 512)}) {
            MpaFrame f;
            f.reply = reply;
            f.revision = uint8_t(rev);
            f.enhanced = enh;
            f.markers = bits & 1;
            f.crc = bits & 2;
            f.reject = reply && (bits & 4);
            f.p2p = bits & 8;
            f.rtr_send = bits & 16;
            f.rtr_write = bits & 32;
            f.rtr_read = !(bits & 32);
            f.ird = enh ? uint16_t(0x3FFF - bits) : 0;
            f.ord = enh ? uint16_t(bits * 3) : 0;
            f.private_data = std::span<const uint8_t>(pd).first(pd_len);
            const Bytes wire = Encode(f);

            MpaFrame d;
            const MpaKind kind = reply ? MpaKind::Reply : MpaKind::Request;
            ASSERT_EQ(DecodeMpaFrame(wire, kind, d), MpaError::Ok);
            EXPECT_EQ(d.reply, f.reply);
            EXPECT_EQ(d.reject, f.reject);
            EXPECT_EQ(d.markers, f.markers);
            EXPECT_EQ(d.crc, f.crc);
            EXPECT_EQ(d.revision, f.revision);
            EXPECT_EQ(d.enhanced, f.enhanced);
            if (enh) {
              EXPECT_EQ(d.p2p, f.p2p);
              EXPECT_EQ(d.rtr_send, f.rtr_send);
              EXPECT_EQ(d.rtr_write, f.rtr_write);
              EXPECT_EQ(d.rtr_read, f.rtr_read);
              EXPECT_EQ(d.ird, f.ird);
              EXPECT_EQ(d.ord, f.ord);
            }
            ASSERT_EQ(d.private_data.size(), pd_len);
            EXPECT_TRUE(std::equal(d.private_data.begin(), d.private_data.end(), pd.begin()));
          }
}

TEST(WireMpa, TrailingBytesAreNotPartOfTheFrame) {
  Bytes wire = kRequestV2;
  wire.insert(wire.end(), {0x00, 0x12, 0xC1, 0x40});  // the first bytes of an FPDU
  MpaFrame f;
  ASSERT_EQ(DecodeMpaFrame(wire, MpaKind::Request, f), MpaError::Ok);
  EXPECT_EQ(MpaFrameLength(f), kRequestV2.size());
  EXPECT_EQ(f.private_data.size(), 3u);
}

TEST(WireMpa, EncodeRefusals) {
  Bytes pd(513);
  Bytes out(2048);
  MpaFrame f;
  f.revision = 1;
  f.enhanced = false;
  f.private_data = std::span<const uint8_t>(pd).first(512);
  EXPECT_EQ(EncodeMpaFrame(f, out), 532u);
  f.private_data = pd;  // 513
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);

  f = MpaFrame{};  // rev 2 enhanced: the IRD/ORD word counts against the 512
  f.private_data = std::span<const uint8_t>(pd).first(508);
  EXPECT_EQ(EncodeMpaFrame(f, out), 532u);
  f.private_data = std::span<const uint8_t>(pd).first(509);
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);

  f = MpaFrame{};
  f.revision = 3;
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);
  f.revision = 1;  // enhanced needs rev 2
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);

  f = MpaFrame{};
  f.reject = true;  // in a request
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);
  f.reply = true;
  EXPECT_EQ(EncodeMpaFrame(f, out), 24u);

  f = MpaFrame{};
  f.ird = 0x4000;
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);
  f.ird = 0x3FFF;
  f.ord = 0x4000;
  EXPECT_EQ(EncodeMpaFrame(f, out), 0u);

  // Too small a buffer, at every size below the frame.
  const uint8_t abc[] = {1, 2, 3};
  f = MpaFrame{};
  f.private_data = abc;
  for (size_t n = 0; n < 27; n++) EXPECT_EQ(EncodeMpaFrame(f, std::span(out).first(n)), 0u) << n;
  EXPECT_EQ(EncodeMpaFrame(f, std::span(out).first(27)), 27u);
}

TEST(WireMpa, BadAndWrongKey) {
  MpaFrame f;
  size_t len = 0;
  EXPECT_EQ(DecodeMpaFrame(kRequestV2, MpaKind::Reply, f), MpaError::WrongKey);
  EXPECT_EQ(DecodeMpaHeader(kRequestV2, MpaKind::Reply, len), MpaError::WrongKey);
  Bytes reply = kRequestV2;
  reply[9] = 'p';  // "Rep"
  EXPECT_EQ(DecodeMpaFrame(reply, MpaKind::Request, f), MpaError::WrongKey);
  EXPECT_EQ(DecodeMpaFrame(reply, MpaKind::Reply, f), MpaError::Ok);

  for (size_t i = 0; i < 16; i++) {
    Bytes bad = kRequestV2;
    bad[i] ^= 0x20;
    EXPECT_EQ(DecodeMpaFrame(bad, MpaKind::Request, f), MpaError::BadKey) << i;
    EXPECT_EQ(DecodeMpaFrame(bad, MpaKind::Reply, f), MpaError::BadKey) << i;
  }
}

TEST(WireMpa, BadRevision) {
  for (uint8_t rev : {0, 3, 0x81, 0xFF}) {
    Bytes b = kRequestV2;
    b[17] = rev;
    MpaFrame f;
    EXPECT_EQ(DecodeMpaFrame(b, MpaKind::Request, f), MpaError::BadRevision);
    EXPECT_EQ(f.revision, rev);  // kept, to answer with
    size_t len = 0;
    EXPECT_EQ(DecodeMpaHeader(b, MpaKind::Request, len), MpaError::BadRevision);
    EXPECT_EQ(len, 27u);
  }
}

TEST(WireMpa, ReservedBits) {
  MpaFrame f;
  // Rev 2: 0x0F reserved; rev 1: 0x1F (the enhanced bit too); R in a request.
  for (uint8_t bit : {0x01, 0x02, 0x04, 0x08, 0x20}) {
    Bytes b = kRequestV2;
    b[16] |= bit;
    EXPECT_EQ(DecodeMpaFrame(b, MpaKind::Request, f), MpaError::ReservedBits) << int(bit);
    EXPECT_EQ(DecodeMpaFrame(b, MpaKind::Request, f, ReservedBits::Ignore), MpaError::Ok);
    EXPECT_FALSE(f.reject);
    EXPECT_TRUE(f.enhanced);
  }
  const Bytes rev1 = WithKey(kReqKey, {0x50, 0x01, 0x00, 0x00});
  EXPECT_EQ(DecodeMpaFrame(rev1, MpaKind::Request, f), MpaError::ReservedBits);
  // Ignored, the enhanced bit means nothing in rev 1.
  ASSERT_EQ(DecodeMpaFrame(rev1, MpaKind::Request, f, ReservedBits::Ignore), MpaError::Ok);
  EXPECT_FALSE(f.enhanced);
  EXPECT_TRUE(f.crc);
}

TEST(WireMpa, PrivateDataTooLong) {
  Bytes b = WithKey(kRepKey, {0x40, 0x01, 0x02, 0x01});  // PD_Length 513
  b.resize(20 + 513);
  MpaFrame f;
  EXPECT_EQ(DecodeMpaFrame(b, MpaKind::Reply, f), MpaError::PrivateDataTooLong);
  size_t len = 0;
  EXPECT_EQ(DecodeMpaHeader(b, MpaKind::Reply, len), MpaError::PrivateDataTooLong);
  EXPECT_EQ(len, 533u);
  b[18] = 0x02, b[19] = 0x00;  // 512 is fine
  b.resize(20 + 512);
  EXPECT_EQ(DecodeMpaFrame(b, MpaKind::Reply, f), MpaError::Ok);
}

TEST(WireMpa, MissingIrdOrd) {
  for (uint8_t pd_len = 0; pd_len < 4; pd_len++) {
    Bytes b = WithKey(kReqKey, {0x50, 0x02, 0x00, pd_len});
    b.resize(20 + pd_len);
    MpaFrame f;
    EXPECT_EQ(DecodeMpaFrame(b, MpaKind::Request, f), MpaError::MissingIrdOrd) << int(pd_len);
  }
  // Rev 2 without the enhanced flag needs no IRD/ORD word.
  const Bytes plain = WithKey(kReqKey, {0x40, 0x02, 0x00, 0x01, 0x7F});
  MpaFrame f;
  ASSERT_EQ(DecodeMpaFrame(plain, MpaKind::Request, f), MpaError::Ok);
  EXPECT_FALSE(f.enhanced);
  EXPECT_EQ(f.private_data.size(), 1u);
}

TEST(WireMpa, TruncatedAtEveryLength) {
  for (size_t n = 0; n < kRequestV2.size(); n++) {
    const std::span<const uint8_t> part(kRequestV2.data(), n);
    MpaFrame f;
    EXPECT_EQ(DecodeMpaFrame(part, MpaKind::Request, f), MpaError::Truncated) << n;
    size_t len = 0;
    EXPECT_EQ(DecodeMpaHeader(part, MpaKind::Request, len),
              n < kMpaHeaderLen ? MpaError::Truncated : MpaError::Ok)
        << n;
  }
}

TEST(WireMpa, ErrorNames) {
  for (int e = 0; e <= int(MpaError::BytesAfterFrame); e++)
    EXPECT_STRNE(ToString(MpaError(e)), "?");
  for (int e = 0; e <= int(FpduError::BadCrc); e++) EXPECT_STRNE(ToString(FpduError(e)), "?");
}

// ---- FPDU --------------------------------------------------------------------------------------

TEST(WireFpdu, PadAndLengths) {
  const size_t pads[] = {2, 1, 0, 3, 2, 1, 0, 3};
  for (size_t u = 0; u < 8; u++) {
    EXPECT_EQ(FpduPad(u), pads[u]) << u;
    EXPECT_EQ((2 + u + FpduPad(u)) % 4, 0u);
    EXPECT_EQ(FpduLength(u), 2 + u + pads[u] + 4);
  }
  static_assert(FpduLength(0) == kFpduMinLen);
  static_assert(FpduLength(65535) == 65544);
  static_assert(FpduPad(65535) == 3);

  EXPECT_EQ(MaxUlpduFor(7), 0u);
  EXPECT_EQ(MaxUlpduFor(8), 2u);
  EXPECT_EQ(MaxUlpduFor(1460), 1454u);
  EXPECT_EQ(MaxUlpduFor(1461), 1454u);
  EXPECT_EQ(MaxUlpduFor(1 << 20), 65535u);
  for (size_t budget = 8; budget < 200; budget++) {
    const size_t u = MaxUlpduFor(budget);
    EXPECT_LE(FpduLength(u), budget);
    EXPECT_GT(FpduLength(u + 1), budget);
  }
}

TEST(WireFpdu, EncodeDecodeRoundTrip) {
  Bytes ulpdu(65535);
  for (size_t i = 0; i < ulpdu.size(); i++) ulpdu[i] = uint8_t(i ^ (i >> 8));
  Bytes out(FpduLength(65535) + 8);
  for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(3), size_t(4), size_t(18), size_t(1454),
                   size_t(65535)}) {
    const auto u = std::span<const uint8_t>(ulpdu).first(n);
    const size_t len = EncodeFpdu(u, true, out);
    ASSERT_EQ(len, FpduLength(n));
    EXPECT_EQ(out[0], uint8_t(n >> 8));
    EXPECT_EQ(out[1], uint8_t(n));
    for (size_t i = 0; i < FpduPad(n); i++) EXPECT_EQ(out[2 + n + i], 0);
    // A CRC stored least-significant byte first leaves the CRC-32C residue over the FPDU.
    EXPECT_EQ(Crc32c(out.data(), len), 0x48674BC7u);

    FpduView v;
    ASSERT_EQ(DecodeFpdu(std::span(out).first(len), true, v), FpduError::Ok);
    EXPECT_EQ(v.length, len);
    EXPECT_EQ(v.ulpdu.size(), n);
    EXPECT_EQ(v.ulpdu.data(), out.data() + 2);
    EXPECT_EQ(v.crc, Crc32c(out.data(), len - 4));
  }
  EXPECT_EQ(EncodeFpdu(std::span<const uint8_t>(out.data(), 65536), true, out), 0u);
}

// A Send of "hi": hand-laid FPDU, CRC bytes LSB first.
TEST(WireFpdu, LiteralFpdu) {
  const Bytes ulpdu = {0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 'h', 'i'};
  Bytes body = {0x00, 0x16};
  body.insert(body.end(), ulpdu.begin(), ulpdu.end());  // 24 bytes: no pad
  const uint32_t crc = Crc32c(body.data(), body.size());
  Bytes wire = body;
  wire.insert(wire.end(), {uint8_t(crc), uint8_t(crc >> 8), uint8_t(crc >> 16), uint8_t(crc >> 24)});
  Bytes out(wire.size());
  ASSERT_EQ(EncodeFpdu(ulpdu, true, out), wire.size());
  EXPECT_EQ(out, wire);
  uint8_t b[4];
  StoreFpduCrc(b, 0x11223344);
  EXPECT_EQ(b[0], 0x44);
  EXPECT_EQ(b[3], 0x11);
  EXPECT_EQ(LoadFpduCrc(b), 0x11223344u);
}

TEST(WireFpdu, CrcFromPieces) {
  Bytes ulpdu(45);
  for (size_t i = 0; i < ulpdu.size(); i++) ulpdu[i] = uint8_t(3 * i + 1);
  Bytes fpdu(FpduLength(ulpdu.size()));
  ASSERT_EQ(EncodeFpdu(ulpdu, true, fpdu), fpdu.size());
  const uint32_t expect = LoadFpduCrc(fpdu.data() + fpdu.size() - 4);
  const std::span<const uint8_t> f(fpdu);

  // Sender: length + header in one buffer, payload in another, no pad given.
  const std::span<const uint8_t> send_pieces[] = {f.first(20), f.subspan(20, 27)};
  EXPECT_EQ(FpduCrc(send_pieces), expect);
  // Receiver: what it read, pad included, in arbitrary chunks.
  const std::span<const uint8_t> recv_pieces[] = {f.first(1), f.subspan(1, 30), f.subspan(31, 17)};
  EXPECT_EQ(FpduCrc(recv_pieces), expect);
  FpduCrcBuilder b;
  for (size_t i = 0; i < 47; i++) b.Add(f.subspan(i, 1));
  EXPECT_EQ(b.length(), 47u);
  EXPECT_EQ(b.Finish(), expect);

  // The trailer helper writes the pad and the CRC.
  uint8_t trailer[7];
  std::memset(trailer, 0xEE, sizeof trailer);
  EXPECT_EQ(EncodeFpduTrailer(std::span(trailer).first(4), 45, expect), 0u);
  ASSERT_EQ(EncodeFpduTrailer(trailer, 45, expect), 5u);
  EXPECT_EQ(std::memcmp(trailer, fpdu.data() + 47, 5), 0);
}

TEST(WireFpdu, BadCrcAndNoCrc) {
  const Bytes ulpdu = {1, 2, 3, 4, 5};
  Bytes fpdu(FpduLength(ulpdu.size()));
  ASSERT_EQ(EncodeFpdu(ulpdu, true, fpdu), fpdu.size());
  FpduView v;
  for (size_t i = 0; i < fpdu.size(); i++) {
    if (i < 2) continue;  // the length field changes the framing instead
    Bytes bad = fpdu;
    bad[i] ^= 0x01;
    EXPECT_EQ(DecodeFpdu(bad, true, v), FpduError::BadCrc) << i;
    EXPECT_EQ(DecodeFpdu(bad, false, v), FpduError::Ok) << i;
  }
  ASSERT_EQ(EncodeFpdu(ulpdu, false, fpdu), fpdu.size());
  EXPECT_EQ(LoadFpduCrc(fpdu.data() + fpdu.size() - 4), 0u);
  EXPECT_EQ(DecodeFpdu(fpdu, false, v), FpduError::Ok);
  EXPECT_EQ(DecodeFpdu(fpdu, true, v), FpduError::BadCrc);
}

TEST(WireFpdu, TruncatedAtEveryLength) {
  const Bytes ulpdu = {9, 8, 7, 6, 5, 4, 3};
  Bytes fpdu(FpduLength(ulpdu.size()));
  ASSERT_EQ(EncodeFpdu(ulpdu, true, fpdu), fpdu.size());
  Bytes out(fpdu.size());
  for (size_t n = 0; n < fpdu.size(); n++) {
    FpduView v;
    EXPECT_EQ(DecodeFpdu(std::span(fpdu).first(n), true, v), FpduError::Truncated) << n;
    EXPECT_EQ(EncodeFpdu(ulpdu, true, std::span(out).first(n)), 0u) << n;
  }
}

}  // namespace
}  // namespace ndwv::wire
