// IB CM MADs (REQ, MRA, REJ, REP, RTU, DREQ, DREP) and the RDMA-CM IP header.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "wire/ib_cm.h"

namespace ndwv::wire::ib {
namespace {

using Bytes = std::vector<uint8_t>;

// A 256-byte MAD written field by field at the IBTA offsets: `at` takes MAD offsets, `cm`
// offsets within the CM payload (MAD offset 24 on).
struct Mad {
  Bytes b = Bytes(kMadLen, 0);
  void at(size_t off, Bytes v) { std::copy(v.begin(), v.end(), b.begin() + off); }
  void cm(size_t off, Bytes v) { at(kMadHeaderLen + off, std::move(v)); }
};

sockaddr_storage V4(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto& a = reinterpret_cast<sockaddr_in&>(ss);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return ss;
}
sockaddr_storage V6(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto& a = reinterpret_cast<sockaddr_in6&>(ss);
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  inet_pton(AF_INET6, ip, &a.sin6_addr);
  return ss;
}

const uint8_t kGidA[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 1, 10};
const uint8_t kGidB[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 192, 168, 1, 20};

// ---- REQ ---------------------------------------------------------------------------------------

// A REQ from 192.168.1.10:49152 to port 1234, every bit field set to a value whose bits tell
// a shifted or mis-sized field apart.
CmMessage SampleReq() {
  CmMessage m;
  m.mad.transaction_id = 0x0102030405060708;
  m.attr = CmAttr::Req;
  CmReq& r = m.req;
  r.local_comm_id = 0x11223344;
  r.service_id = TcpServiceId(1234);
  r.local_ca_guid = 0x0002C90300A1B2C3;
  r.local_qkey = 0x0000ABCD;
  r.local_qpn = 0x123456;
  r.responder_resources = 0x10;
  r.initiator_depth = 0x08;
  r.remote_cm_response_timeout = 0x13;  // 10011
  r.transport_service_type = 2;         // 10
  r.end_to_end_flow_control = true;
  r.starting_psn = 0xABCDEF;
  r.local_cm_response_timeout = 0x11;  // 10001
  r.retry_count = 5;                   // 101
  r.pkey = 0xFFFF;
  r.path_mtu = 5;         // 0101
  r.rnr_retry_count = 6;  // 110
  r.max_cm_retries = 15;
  r.srq = true;
  std::memcpy(r.primary_local_gid, kGidA, 16);
  std::memcpy(r.primary_remote_gid, kGidB, 16);
  r.primary_flow_label = 0xABCDE;
  r.primary_packet_rate = 0x2A;  // 101010
  r.primary_traffic_class = 0x60;
  r.primary_hop_limit = 0x40;
  r.primary_sl = 0xC;
  r.primary_subnet_local = true;
  r.primary_local_ack_timeout = 0x13;  // 10011
  IpHeader ip;
  ip.source = V4("192.168.1.10", 49152);
  ip.destination = V4("192.168.1.20", 0);
  EXPECT_TRUE(EncodeIpHeader(ip, std::span<uint8_t, kIpHeaderLen>(r.private_data, kIpHeaderLen)));
  std::memcpy(r.private_data + kIpHeaderLen, "ndwv", 4);
  r.private_data[kReqPrivateData - 1] = 0xEE;
  return m;
}

Bytes SampleReqBytes() {
  Mad m;
  m.at(0, {0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00,  // versions, class, method, status
           0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,  // TID
           0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00});  // attribute REQ, modifier 0
  m.cm(0, {0x11, 0x22, 0x33, 0x44});                          // local comm ID
  m.cm(8, {0x00, 0x00, 0x00, 0x00, 0x01, 0x06, 0x04, 0xD2});  // service ID: TCP port 1234
  m.cm(16, {0x00, 0x02, 0xC9, 0x03, 0x00, 0xA1, 0xB2, 0xC3});  // local CA GUID
  m.cm(28, {0x00, 0x00, 0xAB, 0xCD});                          // local Q_Key
  m.cm(32, {0x12, 0x34, 0x56, 0x10});  // local QPN, responder resources
  m.cm(36, {0x00, 0x00, 0x00, 0x08});  // local EECN, initiator depth
  m.cm(40, {0x00, 0x00, 0x00, 0x9D});  // remote EECN; 10011 10 1
  m.cm(44, {0xAB, 0xCD, 0xEF, 0x8D});  // starting PSN; 10001 101
  m.cm(48, {0xFF, 0xFF, 0x56, 0xF8});  // P_Key; 0101 0 110; 1111 1 000
  m.cm(56, Bytes(kGidA, kGidA + 16));
  m.cm(72, Bytes(kGidB, kGidB + 16));
  m.cm(88, {0xAB, 0xCD, 0xE0, 0x2A});  // flow label 20, reserved 6, packet rate 6
  m.cm(92, {0x60, 0x40, 0xC8, 0x98});  // TC, hop limit, SL 1100 subnet-local 1, ACK tmo 10011
  // Private data: the RDMA-CM IP header (IPv4), then the user's bytes.
  m.cm(140, {0x00, 0x40, 0xC0, 0x00});
  m.cm(140 + 4 + 12, {192, 168, 1, 10});
  m.cm(140 + 20 + 12, {192, 168, 1, 20});
  m.cm(140 + 36, {'n', 'd', 'w', 'v'});
  m.cm(231, {0xEE});
  return m.b;
}

TEST(WireIbCm, ReqLiteral) {
  Bytes out(kMadLen, 0x5A);
  EncodeCm(SampleReq(), std::span<uint8_t, kMadLen>(out.data(), kMadLen));
  const Bytes expect = SampleReqBytes();
  for (size_t i = 0; i < kMadLen; i++) EXPECT_EQ(out[i], expect[i]) << "MAD offset " << i;

  CmMessage m;
  ASSERT_EQ(DecodeCm(expect, m), CmError::Ok);
  EXPECT_EQ(m.attr, CmAttr::Req);
  EXPECT_EQ(m.mad.base_version, 1);
  EXPECT_EQ(m.mad.mgmt_class, kCmClass);
  EXPECT_EQ(m.mad.class_version, 2);
  EXPECT_EQ(m.mad.method, kMadMethodSend);
  EXPECT_EQ(m.mad.transaction_id, 0x0102030405060708u);
  EXPECT_EQ(m.mad.attribute_id, 0x10);
  const CmReq& r = m.req;
  EXPECT_EQ(r.local_comm_id, 0x11223344u);
  EXPECT_EQ(r.service_id, 0x00000000010604D2u);
  EXPECT_TRUE(IsTcpServiceId(r.service_id));
  EXPECT_EQ(r.local_ca_guid, 0x0002C90300A1B2C3u);
  EXPECT_EQ(r.local_qkey, 0xABCDu);
  EXPECT_EQ(r.local_qpn, 0x123456u);
  EXPECT_EQ(r.responder_resources, 0x10);
  EXPECT_EQ(r.initiator_depth, 0x08);
  EXPECT_EQ(r.remote_cm_response_timeout, 0x13);
  EXPECT_EQ(r.transport_service_type, 2);
  EXPECT_TRUE(r.end_to_end_flow_control);
  EXPECT_EQ(r.starting_psn, 0xABCDEFu);
  EXPECT_EQ(r.local_cm_response_timeout, 0x11);
  EXPECT_EQ(r.retry_count, 5);
  EXPECT_EQ(r.pkey, 0xFFFF);
  EXPECT_EQ(r.path_mtu, 5);
  EXPECT_EQ(r.rnr_retry_count, 6);
  EXPECT_EQ(r.max_cm_retries, 15);
  EXPECT_TRUE(r.srq);
  EXPECT_EQ(0, std::memcmp(r.primary_local_gid, kGidA, 16));
  EXPECT_EQ(0, std::memcmp(r.primary_remote_gid, kGidB, 16));
  EXPECT_EQ(r.primary_flow_label, 0xABCDEu);
  EXPECT_EQ(r.primary_packet_rate, 0x2A);
  EXPECT_EQ(r.primary_traffic_class, 0x60);
  EXPECT_EQ(r.primary_hop_limit, 0x40);
  EXPECT_EQ(r.primary_sl, 0xC);
  EXPECT_TRUE(r.primary_subnet_local);
  EXPECT_EQ(r.primary_local_ack_timeout, 0x13);
  EXPECT_EQ(0, std::memcmp(r.private_data, expect.data() + 24 + 140, kReqPrivateData));

  IpHeader ip;
  ASSERT_TRUE(DecodeIpHeader(std::span(r.private_data, kIpHeaderLen), ip));
  ASSERT_EQ(ip.source.ss_family, AF_INET);
  const auto& s = reinterpret_cast<const sockaddr_in&>(ip.source);
  const auto& d = reinterpret_cast<const sockaddr_in&>(ip.destination);
  EXPECT_EQ(ntohs(s.sin_port), 49152);
  EXPECT_EQ(ntohl(s.sin_addr.s_addr), 0xC0A8010Au);
  EXPECT_EQ(d.sin_port, 0);
  EXPECT_EQ(ntohl(d.sin_addr.s_addr), 0xC0A80114u);
}

// Bits the encoder never sets (EECNs, RDC exists, extended transport, LIDs, reserved bits,
// alternate path, SAP) are ignored on receipt and do not leak into neighbouring fields.
TEST(WireIbCm, ReqIgnoresUnusedBits) {
  Bytes b = SampleReqBytes();
  Mad extra;
  extra.b = b;
  extra.cm(36, {0xFF, 0xFF, 0xFF});  // local EECN
  extra.cm(40, {0xFF, 0xFF, 0xFF});  // remote EECN
  extra.b[24 + 50] |= 0x08;          // RDC exists
  extra.b[24 + 51] |= 0x07;          // extended transport type
  extra.cm(52, {0xFF, 0xFF, 0xFF, 0xFF});  // LIDs
  extra.b[24 + 90] |= 0x0F;                // reserved bits 11-8 of the flow-label word
  extra.b[24 + 91] |= 0xC0;                // reserved bits 7-6
  extra.b[24 + 94] |= 0x07;                // reserved
  extra.b[24 + 95] |= 0x07;                // reserved
  for (size_t i = 96; i < 140; i++) extra.b[24 + i] = 0xFF;  // alternate path
  CmMessage a, c;
  ASSERT_EQ(DecodeCm(b, a), CmError::Ok);
  ASSERT_EQ(DecodeCm(extra.b, c), CmError::Ok);
  Bytes ea(kMadLen), ec(kMadLen);
  EncodeCm(a, std::span<uint8_t, kMadLen>(ea.data(), kMadLen));
  EncodeCm(c, std::span<uint8_t, kMadLen>(ec.data(), kMadLen));
  EXPECT_EQ(ea, ec);
  EXPECT_EQ(ea, b);
}

// ---- DREQ --------------------------------------------------------------------------------------

TEST(WireIbCm, DreqLiteral) {
  CmMessage m;
  m.attr = CmAttr::Dreq;
  m.mad.transaction_id = 0xFEDCBA9876543210;
  m.mad.attribute_modifier = 0x01020304;  // not used by CM, but carried
  m.dreq = CmDreq{};
  m.dreq.local_comm_id = 0xA1A2A3A4;
  m.dreq.remote_comm_id = 0xB1B2B3B4;
  m.dreq.remote_qpn = 0xC1C2C3;
  std::memcpy(m.dreq.private_data, "bye", 3);
  m.dreq.private_data[kDreqPrivateData - 1] = 0x7E;

  Mad e;
  e.at(0, {0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00,
           0xFE, 0xDC, 0xBA, 0x98, 0x76, 0x54, 0x32, 0x10,
           0x00, 0x15, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04});
  e.cm(0, {0xA1, 0xA2, 0xA3, 0xA4, 0xB1, 0xB2, 0xB3, 0xB4, 0xC1, 0xC2, 0xC3, 0x00});
  e.cm(12, {'b', 'y', 'e'});
  e.cm(231, {0x7E});

  Bytes out(kMadLen, 0x5A);
  EncodeCm(m, std::span<uint8_t, kMadLen>(out.data(), kMadLen));
  EXPECT_EQ(out, e.b);

  CmMessage d;
  ASSERT_EQ(DecodeCm(e.b, d), CmError::Ok);
  EXPECT_EQ(d.attr, CmAttr::Dreq);
  EXPECT_EQ(d.mad.transaction_id, 0xFEDCBA9876543210u);
  EXPECT_EQ(d.mad.attribute_modifier, 0x01020304u);
  EXPECT_EQ(d.dreq.local_comm_id, 0xA1A2A3A4u);
  EXPECT_EQ(d.dreq.remote_comm_id, 0xB1B2B3B4u);
  EXPECT_EQ(d.dreq.remote_qpn, 0xC1C2C3u);
  EXPECT_EQ(0, std::memcmp(d.dreq.private_data, e.b.data() + 36, kDreqPrivateData));
  // The reserved byte after the QPN is ignored.
  e.b[24 + 11] = 0xFF;
  ASSERT_EQ(DecodeCm(e.b, d), CmError::Ok);
  EXPECT_EQ(d.dreq.remote_qpn, 0xC1C2C3u);
}

// ---- the other messages: bit-packed bytes, then round trips -------------------------------------

TEST(WireIbCm, MraRejRepBitFields) {
  Bytes out(kMadLen);
  auto enc = [&](const CmMessage& m) {
    EncodeCm(m, std::span<uint8_t, kMadLen>(out.data(), kMadLen));
    return out;
  };
  {
    CmMessage m;
    m.attr = CmAttr::Mra;
    m.mra = CmMra{};
    m.mra.local_comm_id = 1;
    m.mra.remote_comm_id = 2;
    m.mra.message_mraed = 1;      // REP: 01 in bits 7-6
    m.mra.service_timeout = 0x15;  // 10101 in bits 7-3
    enc(m);
    EXPECT_EQ(out[24 + 8], 0x40);
    EXPECT_EQ(out[24 + 9], 0xA8);
    out[24 + 8] |= 0x3F;  // reserved bits
    out[24 + 9] |= 0x07;
    CmMessage d;
    ASSERT_EQ(DecodeCm(out, d), CmError::Ok);
    EXPECT_EQ(d.mra.message_mraed, 1);
    EXPECT_EQ(d.mra.service_timeout, 0x15);
  }
  {
    CmMessage m;
    m.attr = CmAttr::Rej;
    m.rej = CmRej{};
    m.rej.message_rejected = RejectedMessage::Other;  // 10 in bits 7-6
    m.rej.reject_info_length = 0x55;                  // 1010101 in bits 7-1
    m.rej.reason = uint16_t(RejReason::ConsumerReject);
    enc(m);
    EXPECT_EQ(out[24 + 8], 0x80);
    EXPECT_EQ(out[24 + 9], 0xAA);
    EXPECT_EQ(out[24 + 10], 0x00);
    EXPECT_EQ(out[24 + 11], 28);
    out[24 + 8] |= 0x3F;
    out[24 + 9] |= 0x01;
    CmMessage d;
    ASSERT_EQ(DecodeCm(out, d), CmError::Ok);
    EXPECT_EQ(d.rej.message_rejected, RejectedMessage::Other);
    EXPECT_EQ(d.rej.reject_info_length, 0x55);
    EXPECT_EQ(d.rej.reason, 28);
  }
  {
    CmMessage m;
    m.attr = CmAttr::Rep;
    m.rep = CmRep{};
    m.rep.local_qpn = 0x123456;
    m.rep.starting_psn = 0x654321;
    m.rep.target_ack_delay = 0x13;  // 10011
    m.rep.failover_accepted = 2;    // 10
    m.rep.end_to_end_flow_control = true;
    m.rep.rnr_retry_count = 5;  // 101
    m.rep.srq = true;
    enc(m);
    EXPECT_EQ(Bytes(out.begin() + 24 + 12, out.begin() + 24 + 24),
              (Bytes{0x12, 0x34, 0x56, 0, 0, 0, 0, 0, 0x65, 0x43, 0x21, 0}));
    EXPECT_EQ(out[24 + 26], 0x9D);  // 10011 10 1
    EXPECT_EQ(out[24 + 27], 0xB0);  // 101 1 0000
    out[24 + 27] |= 0x0F;
    out[24 + 15] = 0xFF;
    out[24 + 23] = 0xFF;
    CmMessage d;
    ASSERT_EQ(DecodeCm(out, d), CmError::Ok);
    EXPECT_EQ(d.rep.local_qpn, 0x123456u);
    EXPECT_EQ(d.rep.starting_psn, 0x654321u);
    EXPECT_EQ(d.rep.target_ack_delay, 0x13);
    EXPECT_EQ(d.rep.failover_accepted, 2);
    EXPECT_TRUE(d.rep.end_to_end_flow_control);
    EXPECT_EQ(d.rep.rnr_retry_count, 5);
    EXPECT_TRUE(d.rep.srq);
  }
}

template <size_t N>
void Fill(uint8_t (&a)[N], std::mt19937& rng) {
  for (auto& b : a) b = uint8_t(rng());
}

// Random field values (within their widths) and private data survive encode and decode, and
// the bytes re-encode identically.
TEST(WireIbCm, RoundTripEveryMessage) {
  std::mt19937 rng(7);
  auto u = [&](int bits) { return uint32_t(rng()) & uint32_t((uint64_t(1) << bits) - 1); };
  for (int iter = 0; iter < 50; iter++) {
    for (CmAttr attr : {CmAttr::Req, CmAttr::Mra, CmAttr::Rej, CmAttr::Rep, CmAttr::Rtu,
                        CmAttr::Dreq, CmAttr::Drep}) {
      SCOPED_TRACE(ToString(attr));
      CmMessage m;
      m.attr = attr;
      m.mad.status = uint16_t(u(16));
      m.mad.class_specific = uint16_t(u(16));
      m.mad.transaction_id = uint64_t(rng()) << 32 | rng();
      m.mad.attribute_id = uint16_t(attr);
      m.mad.attribute_modifier = rng();
      switch (attr) {
        case CmAttr::Req: {
          CmReq& r = m.req;
          r.local_comm_id = rng();
          r.service_id = uint64_t(rng()) << 32 | rng();
          r.local_ca_guid = uint64_t(rng()) << 32 | rng();
          r.local_qkey = rng();
          r.local_qpn = u(24);
          r.responder_resources = uint8_t(u(8));
          r.initiator_depth = uint8_t(u(8));
          r.remote_cm_response_timeout = uint8_t(u(5));
          r.transport_service_type = uint8_t(u(2));
          r.end_to_end_flow_control = u(1);
          r.starting_psn = u(24);
          r.local_cm_response_timeout = uint8_t(u(5));
          r.retry_count = uint8_t(u(3));
          r.pkey = uint16_t(u(16));
          r.path_mtu = uint8_t(u(4));
          r.rnr_retry_count = uint8_t(u(3));
          r.max_cm_retries = uint8_t(u(4));
          r.srq = u(1);
          Fill(r.primary_local_gid, rng);
          Fill(r.primary_remote_gid, rng);
          r.primary_flow_label = u(20);
          r.primary_packet_rate = uint8_t(u(6));
          r.primary_traffic_class = uint8_t(u(8));
          r.primary_hop_limit = uint8_t(u(8));
          r.primary_sl = uint8_t(u(4));
          r.primary_subnet_local = u(1);
          r.primary_local_ack_timeout = uint8_t(u(5));
          Fill(r.private_data, rng);
          break;
        }
        case CmAttr::Mra:
          m.mra = CmMra{};
          m.mra.local_comm_id = rng();
          m.mra.remote_comm_id = rng();
          m.mra.message_mraed = uint8_t(u(2));
          m.mra.service_timeout = uint8_t(u(5));
          Fill(m.mra.private_data, rng);
          break;
        case CmAttr::Rej:
          m.rej = CmRej{};
          m.rej.local_comm_id = rng();
          m.rej.remote_comm_id = rng();
          m.rej.message_rejected = RejectedMessage(u(2));
          m.rej.reject_info_length = uint8_t(u(7));
          m.rej.reason = uint16_t(u(16));
          Fill(m.rej.reject_info, rng);
          Fill(m.rej.private_data, rng);
          break;
        case CmAttr::Rep:
          m.rep = CmRep{};
          m.rep.local_comm_id = rng();
          m.rep.remote_comm_id = rng();
          m.rep.local_qkey = rng();
          m.rep.local_qpn = u(24);
          m.rep.starting_psn = u(24);
          m.rep.responder_resources = uint8_t(u(8));
          m.rep.initiator_depth = uint8_t(u(8));
          m.rep.target_ack_delay = uint8_t(u(5));
          m.rep.failover_accepted = uint8_t(u(2));
          m.rep.end_to_end_flow_control = u(1);
          m.rep.rnr_retry_count = uint8_t(u(3));
          m.rep.srq = u(1);
          m.rep.local_ca_guid = uint64_t(rng()) << 32 | rng();
          Fill(m.rep.private_data, rng);
          break;
        case CmAttr::Rtu:
          m.rtu = CmRtu{};
          m.rtu.local_comm_id = rng();
          m.rtu.remote_comm_id = rng();
          Fill(m.rtu.private_data, rng);
          break;
        case CmAttr::Dreq:
          m.dreq = CmDreq{};
          m.dreq.local_comm_id = rng();
          m.dreq.remote_comm_id = rng();
          m.dreq.remote_qpn = u(24);
          Fill(m.dreq.private_data, rng);
          break;
        case CmAttr::Drep:
          m.drep = CmDrep{};
          m.drep.local_comm_id = rng();
          m.drep.remote_comm_id = rng();
          Fill(m.drep.private_data, rng);
          break;
        default: break;
      }
      Bytes b(kMadLen);
      EncodeCm(m, std::span<uint8_t, kMadLen>(b.data(), kMadLen));
      CmMessage d;
      ASSERT_EQ(DecodeCm(b, d), CmError::Ok);
      ASSERT_EQ(d.attr, attr);
      EXPECT_EQ(d.mad.status, m.mad.status);
      EXPECT_EQ(d.mad.class_specific, m.mad.class_specific);
      EXPECT_EQ(d.mad.transaction_id, m.mad.transaction_id);
      EXPECT_EQ(d.mad.attribute_modifier, m.mad.attribute_modifier);
      // Every field compared: the structs hold no padding a memcmp could trip on except at
      // the ends of bit-field groups, so compare by re-encoding and field by field below.
      Bytes b2(kMadLen);
      EncodeCm(d, std::span<uint8_t, kMadLen>(b2.data(), kMadLen));
      EXPECT_EQ(b, b2);
      switch (attr) {
        case CmAttr::Req: {
          const CmReq &x = m.req, &y = d.req;
          EXPECT_EQ(x.local_comm_id, y.local_comm_id);
          EXPECT_EQ(x.service_id, y.service_id);
          EXPECT_EQ(x.local_ca_guid, y.local_ca_guid);
          EXPECT_EQ(x.local_qkey, y.local_qkey);
          EXPECT_EQ(x.local_qpn, y.local_qpn);
          EXPECT_EQ(x.responder_resources, y.responder_resources);
          EXPECT_EQ(x.initiator_depth, y.initiator_depth);
          EXPECT_EQ(x.remote_cm_response_timeout, y.remote_cm_response_timeout);
          EXPECT_EQ(x.transport_service_type, y.transport_service_type);
          EXPECT_EQ(x.end_to_end_flow_control, y.end_to_end_flow_control);
          EXPECT_EQ(x.starting_psn, y.starting_psn);
          EXPECT_EQ(x.local_cm_response_timeout, y.local_cm_response_timeout);
          EXPECT_EQ(x.retry_count, y.retry_count);
          EXPECT_EQ(x.pkey, y.pkey);
          EXPECT_EQ(x.path_mtu, y.path_mtu);
          EXPECT_EQ(x.rnr_retry_count, y.rnr_retry_count);
          EXPECT_EQ(x.max_cm_retries, y.max_cm_retries);
          EXPECT_EQ(x.srq, y.srq);
          EXPECT_EQ(0, std::memcmp(x.primary_local_gid, y.primary_local_gid, 16));
          EXPECT_EQ(0, std::memcmp(x.primary_remote_gid, y.primary_remote_gid, 16));
          EXPECT_EQ(x.primary_flow_label, y.primary_flow_label);
          EXPECT_EQ(x.primary_packet_rate, y.primary_packet_rate);
          EXPECT_EQ(x.primary_traffic_class, y.primary_traffic_class);
          EXPECT_EQ(x.primary_hop_limit, y.primary_hop_limit);
          EXPECT_EQ(x.primary_sl, y.primary_sl);
          EXPECT_EQ(x.primary_subnet_local, y.primary_subnet_local);
          EXPECT_EQ(x.primary_local_ack_timeout, y.primary_local_ack_timeout);
          EXPECT_EQ(0, std::memcmp(x.private_data, y.private_data, kReqPrivateData));
          break;
        }
        case CmAttr::Mra:
          EXPECT_EQ(m.mra.local_comm_id, d.mra.local_comm_id);
          EXPECT_EQ(m.mra.remote_comm_id, d.mra.remote_comm_id);
          EXPECT_EQ(m.mra.message_mraed, d.mra.message_mraed);
          EXPECT_EQ(m.mra.service_timeout, d.mra.service_timeout);
          EXPECT_EQ(0, std::memcmp(m.mra.private_data, d.mra.private_data, kMraPrivateData));
          break;
        case CmAttr::Rej:
          EXPECT_EQ(m.rej.local_comm_id, d.rej.local_comm_id);
          EXPECT_EQ(m.rej.remote_comm_id, d.rej.remote_comm_id);
          EXPECT_EQ(m.rej.message_rejected, d.rej.message_rejected);
          EXPECT_EQ(m.rej.reject_info_length, d.rej.reject_info_length);
          EXPECT_EQ(m.rej.reason, d.rej.reason);
          EXPECT_EQ(0, std::memcmp(m.rej.reject_info, d.rej.reject_info, kRejInfoLen));
          EXPECT_EQ(0, std::memcmp(m.rej.private_data, d.rej.private_data, kRejPrivateData));
          break;
        case CmAttr::Rep:
          EXPECT_EQ(m.rep.local_comm_id, d.rep.local_comm_id);
          EXPECT_EQ(m.rep.remote_comm_id, d.rep.remote_comm_id);
          EXPECT_EQ(m.rep.local_qkey, d.rep.local_qkey);
          EXPECT_EQ(m.rep.local_qpn, d.rep.local_qpn);
          EXPECT_EQ(m.rep.starting_psn, d.rep.starting_psn);
          EXPECT_EQ(m.rep.responder_resources, d.rep.responder_resources);
          EXPECT_EQ(m.rep.initiator_depth, d.rep.initiator_depth);
          EXPECT_EQ(m.rep.target_ack_delay, d.rep.target_ack_delay);
          EXPECT_EQ(m.rep.failover_accepted, d.rep.failover_accepted);
          EXPECT_EQ(m.rep.end_to_end_flow_control, d.rep.end_to_end_flow_control);
          EXPECT_EQ(m.rep.rnr_retry_count, d.rep.rnr_retry_count);
          EXPECT_EQ(m.rep.srq, d.rep.srq);
          EXPECT_EQ(m.rep.local_ca_guid, d.rep.local_ca_guid);
          EXPECT_EQ(0, std::memcmp(m.rep.private_data, d.rep.private_data, kRepPrivateData));
          break;
        case CmAttr::Rtu:
          EXPECT_EQ(m.rtu.local_comm_id, d.rtu.local_comm_id);
          EXPECT_EQ(m.rtu.remote_comm_id, d.rtu.remote_comm_id);
          EXPECT_EQ(0, std::memcmp(m.rtu.private_data, d.rtu.private_data, kRtuPrivateData));
          break;
        case CmAttr::Dreq:
          EXPECT_EQ(m.dreq.local_comm_id, d.dreq.local_comm_id);
          EXPECT_EQ(m.dreq.remote_comm_id, d.dreq.remote_comm_id);
          EXPECT_EQ(m.dreq.remote_qpn, d.dreq.remote_qpn);
          EXPECT_EQ(0, std::memcmp(m.dreq.private_data, d.dreq.private_data, kDreqPrivateData));
          break;
        case CmAttr::Drep:
          EXPECT_EQ(m.drep.local_comm_id, d.drep.local_comm_id);
          EXPECT_EQ(m.drep.remote_comm_id, d.drep.remote_comm_id);
          EXPECT_EQ(0, std::memcmp(m.drep.private_data, d.drep.private_data, kDrepPrivateData));
          break;
        default: break;
      }
    }
  }
}

// Private data sits at the offset of design-facts §3.2 and fills the MAD to its end.
TEST(WireIbCm, PrivateDataOffsets) {
  struct Row {
    CmAttr attr;
    size_t off, len;
  };
  const Row rows[] = {{CmAttr::Req, 140, kReqPrivateData}, {CmAttr::Mra, 10, kMraPrivateData},
                      {CmAttr::Rej, 84, kRejPrivateData},  {CmAttr::Rep, 36, kRepPrivateData},
                      {CmAttr::Rtu, 8, kRtuPrivateData},   {CmAttr::Dreq, 12, kDreqPrivateData},
                      {CmAttr::Drep, 8, kDrepPrivateData}};
  for (const Row& r : rows) {
    SCOPED_TRACE(ToString(r.attr));
    EXPECT_EQ(r.off + r.len, kCmPayloadLen);
    CmMessage m;
    m.attr = r.attr;
    uint8_t* pd = nullptr;
    switch (r.attr) {
      case CmAttr::Req: m.req = CmReq{}; pd = m.req.private_data; break;
      case CmAttr::Mra: m.mra = CmMra{}; pd = m.mra.private_data; break;
      case CmAttr::Rej: m.rej = CmRej{}; pd = m.rej.private_data; break;
      case CmAttr::Rep: m.rep = CmRep{}; pd = m.rep.private_data; break;
      case CmAttr::Rtu: m.rtu = CmRtu{}; pd = m.rtu.private_data; break;
      case CmAttr::Dreq: m.dreq = CmDreq{}; pd = m.dreq.private_data; break;
      case CmAttr::Drep: m.drep = CmDrep{}; pd = m.drep.private_data; break;
      default: break;
    }
    if (r.attr == CmAttr::Req) m.req.pkey = 0;  // leave nothing but the private data
    for (size_t i = 0; i < r.len; i++) pd[i] = uint8_t(i + 1);
    Bytes b(kMadLen);
    EncodeCm(m, std::span<uint8_t, kMadLen>(b.data(), kMadLen));
    for (size_t i = 0; i < kCmPayloadLen; i++) {
      const uint8_t want = i >= r.off ? uint8_t(i - r.off + 1) : 0;
      ASSERT_EQ(b[kMadHeaderLen + i], want) << "CM offset " << i;
    }
  }
  // The REJ's additional reject information: 72 bytes at 12.
  CmMessage m;
  m.attr = CmAttr::Rej;
  m.rej = CmRej{};
  for (size_t i = 0; i < kRejInfoLen; i++) m.rej.reject_info[i] = uint8_t(0x80 + i);
  Bytes b(kMadLen);
  EncodeCm(m, std::span<uint8_t, kMadLen>(b.data(), kMadLen));
  EXPECT_EQ(b[24 + 11], 0);
  EXPECT_EQ(b[24 + 12], 0x80);
  EXPECT_EQ(b[24 + 83], 0x80 + 71);
  EXPECT_EQ(b[24 + 84], 0);
}

// ---- decode errors -----------------------------------------------------------------------------

TEST(WireIbCm, DecodeErrors) {
  const Bytes ok = SampleReqBytes();
  CmMessage m;
  ASSERT_EQ(DecodeCm(ok, m), CmError::Ok);
  auto with = [&](size_t off, uint8_t v) {
    Bytes b = ok;
    b[off] = v;
    return DecodeCm(b, m);
  };
  EXPECT_EQ(with(0, 2), CmError::BadBaseVersion);
  EXPECT_EQ(with(0, 0), CmError::BadBaseVersion);
  EXPECT_EQ(with(1, 0x03), CmError::NotCm);  // subnet administration
  EXPECT_EQ(with(1, 0x81), CmError::NotCm);
  EXPECT_EQ(with(2, 1), CmError::BadClassVersion);
  EXPECT_EQ(with(2, 3), CmError::BadClassVersion);
  EXPECT_EQ(with(3, 0x01), CmError::BadMethod);  // Get
  EXPECT_EQ(with(3, 0x83), CmError::BadMethod);  // a response bit on Send
  for (uint16_t attr : {0x0000, 0x0001, 0x000F, 0x0017, 0x0018, 0x0019, 0x001A, 0x001B, 0x0110,
                        0xFF10}) {
    Bytes b = ok;
    b[16] = uint8_t(attr >> 8);
    b[17] = uint8_t(attr);
    EXPECT_EQ(DecodeCm(b, m), CmError::UnknownAttribute) << attr;
  }
  // Checked in header order: base version before class before class version before method.
  Bytes b = ok;
  b[0] = 9, b[1] = 9, b[2] = 9, b[3] = 9, b[17] = 0;
  EXPECT_EQ(DecodeCm(b, m), CmError::BadBaseVersion);
  b[0] = 1;
  EXPECT_EQ(DecodeCm(b, m), CmError::NotCm);
  b[1] = kCmClass;
  EXPECT_EQ(DecodeCm(b, m), CmError::BadClassVersion);
  b[2] = kCmClassVersion;
  EXPECT_EQ(DecodeCm(b, m), CmError::BadMethod);
  b[3] = kMadMethodSend;
  EXPECT_EQ(DecodeCm(b, m), CmError::UnknownAttribute);

  for (CmError e : {CmError::Ok, CmError::Truncated, CmError::BadBaseVersion, CmError::NotCm,
                    CmError::BadClassVersion, CmError::BadMethod, CmError::UnknownAttribute})
    EXPECT_STRNE(ToString(e), "?");
  for (CmAttr a : {CmAttr::Req, CmAttr::Mra, CmAttr::Rej, CmAttr::Rep, CmAttr::Rtu, CmAttr::Dreq,
                   CmAttr::Drep, CmAttr::SidrReq, CmAttr::SidrRep, CmAttr::Lap, CmAttr::Apr})
    EXPECT_STRNE(ToString(a), "unknown CM attribute");
}

// Every length but 256 is refused, each in its own allocation so that ASan would see a read
// past the end; so is a MAD with trailing bytes.
TEST(WireIbCm, TruncationAtEveryLength) {
  const Bytes ok = SampleReqBytes();
  CmMessage m;
  for (size_t n = 0; n < kMadLen; n++) {
    const Bytes c(ok.begin(), ok.begin() + n);
    EXPECT_EQ(DecodeCm(c, m), CmError::Truncated) << n;
  }
  Bytes longer = ok;
  longer.push_back(0);
  EXPECT_EQ(DecodeCm(longer, m), CmError::Truncated);
}

TEST(WireIbCm, EncodeUnsupportedAttributeWritesHeaderOnly) {
  CmMessage m;
  m.attr = CmAttr::Lap;
  m.mad.transaction_id = 5;
  Bytes b(kMadLen, 0x5A);
  EncodeCm(m, std::span<uint8_t, kMadLen>(b.data(), kMadLen));
  EXPECT_EQ(b[17], 0x19);
  EXPECT_EQ(Bytes(b.begin() + 24, b.end()), Bytes(kCmPayloadLen, 0));
  CmMessage d;
  EXPECT_EQ(DecodeCm(b, d), CmError::UnknownAttribute);
}

// ---- RDMA-CM IP header -------------------------------------------------------------------------

TEST(WireIbCm, IpHeaderV4Literal) {
  IpHeader h;
  h.source = V4("10.1.2.3", 0x1234);
  h.destination = V4("10.4.5.6", 0);
  Bytes out(kIpHeaderLen, 0x5A);
  ASSERT_TRUE(EncodeIpHeader(h, std::span<uint8_t, kIpHeaderLen>(out.data(), kIpHeaderLen)));
  Bytes expect = {0x00, 0x40, 0x12, 0x34};
  expect.resize(4 + 12);
  expect.insert(expect.end(), {10, 1, 2, 3});
  expect.resize(20 + 12);
  expect.insert(expect.end(), {10, 4, 5, 6});
  EXPECT_EQ(out, expect);

  IpHeader d;
  ASSERT_TRUE(DecodeIpHeader(out, d));
  ASSERT_EQ(d.source.ss_family, AF_INET);
  ASSERT_EQ(d.destination.ss_family, AF_INET);
  EXPECT_EQ(0, std::memcmp(&d.source, &h.source, sizeof(sockaddr_in)));
  EXPECT_EQ(0, std::memcmp(&d.destination, &h.destination, sizeof(sockaddr_in)));
}

TEST(WireIbCm, IpHeaderV6Literal) {
  IpHeader h;
  h.source = V6("2001:db8::1", 0xBEEF);
  h.destination = V6("2001:db8::abcd", 0);
  Bytes out(kIpHeaderLen);
  ASSERT_TRUE(EncodeIpHeader(h, std::span<uint8_t, kIpHeaderLen>(out.data(), kIpHeaderLen)));
  const Bytes expect = {0x00, 0x60, 0xBE, 0xEF,
                        0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x00, 0x01,
                        0x20, 0x01, 0x0D, 0xB8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xAB, 0xCD};
  EXPECT_EQ(out, expect);
  IpHeader d;
  ASSERT_TRUE(DecodeIpHeader(out, d));
  ASSERT_EQ(d.source.ss_family, AF_INET6);
  const auto& s = reinterpret_cast<const sockaddr_in6&>(d.source);
  EXPECT_EQ(ntohs(s.sin6_port), 0xBEEF);
  EXPECT_EQ(0, std::memcmp(&s.sin6_addr, &reinterpret_cast<const sockaddr_in6&>(h.source).sin6_addr,
                           16));
  EXPECT_EQ(0, std::memcmp(&reinterpret_cast<const sockaddr_in6&>(d.destination).sin6_addr,
                           &reinterpret_cast<const sockaddr_in6&>(h.destination).sin6_addr, 16));
  // Longer input (the user data that follows) is fine.
  Bytes longer = out;
  longer.resize(kReqPrivateData, 0x11);
  EXPECT_TRUE(DecodeIpHeader(longer, d));
}

TEST(WireIbCm, IpHeaderErrors) {
  IpHeader h;
  h.source = V4("10.1.2.3", 1);
  h.destination = V6("2001:db8::1", 0);
  Bytes out(kIpHeaderLen);
  std::span<uint8_t, kIpHeaderLen> o(out.data(), kIpHeaderLen);
  EXPECT_FALSE(EncodeIpHeader(h, o));  // mixed families
  h.destination = sockaddr_storage{};
  EXPECT_FALSE(EncodeIpHeader(h, o));
  h.source.ss_family = AF_UNIX;
  h.destination.ss_family = AF_UNIX;
  EXPECT_FALSE(EncodeIpHeader(h, o));

  h.source = V4("10.1.2.3", 1);
  h.destination = V4("10.1.2.4", 0);
  ASSERT_TRUE(EncodeIpHeader(h, o));
  IpHeader d;
  for (size_t n = 0; n < kIpHeaderLen; n++) {
    const Bytes c(out.begin(), out.begin() + n);
    EXPECT_FALSE(DecodeIpHeader(c, d)) << n;
  }
  Bytes c = out;
  c[0] = 0x10;  // version 1.0
  EXPECT_FALSE(DecodeIpHeader(c, d));
  c = out;
  c[0] = 0x01;  // version 0.1
  EXPECT_FALSE(DecodeIpHeader(c, d));
  for (uint8_t ipv : {0x00, 0x50, 0x70, 0xF0}) {
    c = out;
    c[1] = ipv;
    EXPECT_FALSE(DecodeIpHeader(c, d)) << int(ipv);
  }
  c = out;
  c[1] = 0x4F;  // reserved nibble: ignored
  EXPECT_TRUE(DecodeIpHeader(c, d));
}

TEST(WireIbCm, ServiceIds) {
  EXPECT_EQ(TcpServiceId(0), 0x0000000001060000u);
  EXPECT_EQ(TcpServiceId(4791), 0x00000000010612B7u);
  EXPECT_TRUE(IsTcpServiceId(TcpServiceId(65535)));
  EXPECT_FALSE(IsTcpServiceId(0x0000000001110000));  // UDP port space
  EXPECT_FALSE(IsTcpServiceId(0x00000000013F0000));  // IB port space
  EXPECT_FALSE(IsTcpServiceId(0x1000000001060000));
  EXPECT_EQ(kReqUserData, 56u);
  EXPECT_EQ(kMadHeaderLen + kCmPayloadLen, kMadLen);
}

}  // namespace
}  // namespace ndwv::wire::ib
