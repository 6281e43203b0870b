#include "wire/ib_cm.h"

#include <netinet/in.h>

#include <cstring>

#include "wire/bytes.h"

// Bit fields follow the IBTA tables as Linux's ib_cm (ibta_vol1_c12.h) and Wireshark's dissector
// read them: a field listed first in a byte or word takes its most significant bits. Offsets in
// the comments are within the CM payload (MAD offset 24 on), bits numbered 7..0 within a byte.

namespace ndwv::wire::ib {

const char* ToString(CmAttr attr) {
  switch (attr) {
    case CmAttr::Req: return "REQ";
    case CmAttr::Mra: return "MRA";
    case CmAttr::Rej: return "REJ";
    case CmAttr::Rep: return "REP";
    case CmAttr::Rtu: return "RTU";
    case CmAttr::Dreq: return "DREQ";
    case CmAttr::Drep: return "DREP";
    case CmAttr::SidrReq: return "SIDR_REQ";
    case CmAttr::SidrRep: return "SIDR_REP";
    case CmAttr::Lap: return "LAP";
    case CmAttr::Apr: return "APR";
  }
  return "unknown CM attribute";
}

const char* ToString(CmError e) {
  switch (e) {
    case CmError::Ok: return "ok";
    case CmError::Truncated: return "CM MAD is not 256 bytes";
    case CmError::BadBaseVersion: return "bad MAD base version";
    case CmError::NotCm: return "MAD class is not CM";
    case CmError::BadClassVersion: return "bad CM class version";
    case CmError::BadMethod: return "bad CM MAD method";
    case CmError::UnknownAttribute: return "unsupported CM attribute";
  }
  return "?";
}

namespace {

// A 32-bit word holding a 24-bit field in its high bits and 8 bits below it.
void Store24_8(uint8_t* p, uint32_t hi24, uint8_t lo8) {
  StoreBe32(p, (hi24 & 0xFFFFFF) << 8 | lo8);
}
uint32_t Load24(const uint8_t* p) { return LoadBe32(p) >> 8; }

template <size_t N>
void PutBytes(uint8_t* p, const uint8_t (&a)[N]) { std::memcpy(p, a, N); }
template <size_t N>
void GetBytes(uint8_t (&a)[N], const uint8_t* p) { std::memcpy(a, p, N); }

void EncodeReq(const CmReq& m, uint8_t* p) {
  StoreBe32(p + 0, m.local_comm_id);
  StoreBe64(p + 8, m.service_id);
  StoreBe64(p + 16, m.local_ca_guid);
  StoreBe32(p + 28, m.local_qkey);
  Store24_8(p + 32, m.local_qpn, m.responder_resources);
  Store24_8(p + 36, 0, m.initiator_depth);  // local EECN 0
  // 40: remote EECN (24, zero) | 43: remote CM response timeout 7-3, transport service type
  // 2-1, end-to-end flow control 0.
  Store24_8(p + 40, 0,
            uint8_t((m.remote_cm_response_timeout & 0x1F) << 3 |
                    (m.transport_service_type & 3) << 1 | (m.end_to_end_flow_control ? 1 : 0)));
  // 44: starting PSN (24) | 47: local CM response timeout 7-3, retry count 2-0.
  Store24_8(p + 44, m.starting_psn,
            uint8_t((m.local_cm_response_timeout & 0x1F) << 3 | (m.retry_count & 7)));
  StoreBe16(p + 48, m.pkey);
  // 50: path MTU 7-4, RDC exists 3 (0), RNR retry count 2-0.
  p[50] = uint8_t((m.path_mtu & 0xF) << 4 | (m.rnr_retry_count & 7));
  // 51: max CM retries 7-4, SRQ 3, extended transport type 2-0 (0).
  p[51] = uint8_t((m.max_cm_retries & 0xF) << 4 | (m.srq ? 0x08 : 0));
  // 52, 54: primary local and remote LIDs: zero (no LIDs on RoCE).
  PutBytes(p + 56, m.primary_local_gid);
  PutBytes(p + 72, m.primary_remote_gid);
  // 88: flow label 31-12 of the word, reserved 11-6, packet rate 5-0.
  StoreBe32(p + 88, (m.primary_flow_label & 0xFFFFF) << 12 | (m.primary_packet_rate & 0x3F));
  p[92] = m.primary_traffic_class;
  p[93] = m.primary_hop_limit;
  // 94: SL 7-4, subnet local 3; 95: local ACK timeout 7-3.
  p[94] = uint8_t((m.primary_sl & 0xF) << 4 | (m.primary_subnet_local ? 0x08 : 0));
  p[95] = uint8_t((m.primary_local_ack_timeout & 0x1F) << 3);
  // 96..139: alternate path, zero.
  PutBytes(p + 140, m.private_data);
}

void DecodeReq(const uint8_t* p, CmReq& m) {
  m.local_comm_id = LoadBe32(p + 0);
  m.service_id = LoadBe64(p + 8);
  m.local_ca_guid = LoadBe64(p + 16);
  m.local_qkey = LoadBe32(p + 28);
  m.local_qpn = Load24(p + 32);
  m.responder_resources = p[35];
  m.initiator_depth = p[39];
  m.remote_cm_response_timeout = p[43] >> 3;
  m.transport_service_type = (p[43] >> 1) & 3;
  m.end_to_end_flow_control = p[43] & 1;
  m.starting_psn = Load24(p + 44);
  m.local_cm_response_timeout = p[47] >> 3;
  m.retry_count = p[47] & 7;
  m.pkey = LoadBe16(p + 48);
  m.path_mtu = p[50] >> 4;
  m.rnr_retry_count = p[50] & 7;
  m.max_cm_retries = p[51] >> 4;
  m.srq = p[51] & 0x08;
  GetBytes(m.primary_local_gid, p + 56);
  GetBytes(m.primary_remote_gid, p + 72);
  m.primary_flow_label = LoadBe32(p + 88) >> 12;
  m.primary_packet_rate = p[91] & 0x3F;
  m.primary_traffic_class = p[92];
  m.primary_hop_limit = p[93];
  m.primary_sl = p[94] >> 4;
  m.primary_subnet_local = p[94] & 0x08;
  m.primary_local_ack_timeout = p[95] >> 3;
  GetBytes(m.private_data, p + 140);
}

void EncodeMra(const CmMra& m, uint8_t* p) {
  StoreBe32(p + 0, m.local_comm_id);
  StoreBe32(p + 4, m.remote_comm_id);
  p[8] = uint8_t((m.message_mraed & 3) << 6);     // 8: message MRAed 7-6
  p[9] = uint8_t((m.service_timeout & 0x1F) << 3);  // 9: service timeout 7-3
  PutBytes(p + 10, m.private_data);
}

void DecodeMra(const uint8_t* p, CmMra& m) {
  m.local_comm_id = LoadBe32(p + 0);
  m.remote_comm_id = LoadBe32(p + 4);
  m.message_mraed = p[8] >> 6;
  m.service_timeout = p[9] >> 3;
  GetBytes(m.private_data, p + 10);
}

void EncodeRej(const CmRej& m, uint8_t* p) {
  StoreBe32(p + 0, m.local_comm_id);
  StoreBe32(p + 4, m.remote_comm_id);
  p[8] = uint8_t((uint8_t(m.message_rejected) & 3) << 6);  // 8: message rejected 7-6
  p[9] = uint8_t((m.reject_info_length & 0x7F) << 1);      // 9: reject info length 7-1
  StoreBe16(p + 10, m.reason);
  PutBytes(p + 12, m.reject_info);
  PutBytes(p + 84, m.private_data);
}

void DecodeRej(const uint8_t* p, CmRej& m) {
  m.local_comm_id = LoadBe32(p + 0);
  m.remote_comm_id = LoadBe32(p + 4);
  m.message_rejected = RejectedMessage(p[8] >> 6);
  m.reject_info_length = p[9] >> 1;
  m.reason = LoadBe16(p + 10);
  GetBytes(m.reject_info, p + 12);
  GetBytes(m.private_data, p + 84);
}

void EncodeRep(const CmRep& m, uint8_t* p) {
  StoreBe32(p + 0, m.local_comm_id);
  StoreBe32(p + 4, m.remote_comm_id);
  StoreBe32(p + 8, m.local_qkey);
  Store24_8(p + 12, m.local_qpn, 0);
  Store24_8(p + 16, 0, 0);  // local EECN
  Store24_8(p + 20, m.starting_psn, 0);
  p[24] = m.responder_resources;
  p[25] = m.initiator_depth;
  // 26: target ACK delay 7-3, failover accepted 2-1, end-to-end flow control 0.
  p[26] = uint8_t((m.target_ack_delay & 0x1F) << 3 | (m.failover_accepted & 3) << 1 |
                  (m.end_to_end_flow_control ? 1 : 0));
  // 27: RNR retry count 7-5, SRQ 4.
  p[27] = uint8_t((m.rnr_retry_count & 7) << 5 | (m.srq ? 0x10 : 0));
  StoreBe64(p + 28, m.local_ca_guid);
  PutBytes(p + 36, m.private_data);
}

void DecodeRep(const uint8_t* p, CmRep& m) {
  m.local_comm_id = LoadBe32(p + 0);
  m.remote_comm_id = LoadBe32(p + 4);
  m.local_qkey = LoadBe32(p + 8);
  m.local_qpn = Load24(p + 12);
  m.starting_psn = Load24(p + 20);
  m.responder_resources = p[24];
  m.initiator_depth = p[25];
  m.target_ack_delay = p[26] >> 3;
  m.failover_accepted = (p[26] >> 1) & 3;
  m.end_to_end_flow_control = p[26] & 1;
  m.rnr_retry_count = p[27] >> 5;
  m.srq = p[27] & 0x10;
  m.local_ca_guid = LoadBe64(p + 28);
  GetBytes(m.private_data, p + 36);
}

void EncodeDreq(const CmDreq& m, uint8_t* p) {
  StoreBe32(p + 0, m.local_comm_id);
  StoreBe32(p + 4, m.remote_comm_id);
  Store24_8(p + 8, m.remote_qpn, 0);  // 8: remote QPN/EECN (24), reserved (8)
  PutBytes(p + 12, m.private_data);
}

void DecodeDreq(const uint8_t* p, CmDreq& m) {
  m.local_comm_id = LoadBe32(p + 0);
  m.remote_comm_id = LoadBe32(p + 4);
  m.remote_qpn = Load24(p + 8);
  GetBytes(m.private_data, p + 12);
}

// RTU and DREP: the two IDs and private data.
template <typename M>
void EncodeIds(const M& m, uint8_t* p) {
  StoreBe32(p + 0, m.local_comm_id);
  StoreBe32(p + 4, m.remote_comm_id);
  PutBytes(p + 8, m.private_data);
}
template <typename M>
void DecodeIds(const uint8_t* p, M& m) {
  m.local_comm_id = LoadBe32(p + 0);
  m.remote_comm_id = LoadBe32(p + 4);
  GetBytes(m.private_data, p + 8);
}

bool Supported(uint16_t attr) {
  return attr >= uint16_t(CmAttr::Req) && attr <= uint16_t(CmAttr::Drep);
}

}  // namespace

void EncodeCm(const CmMessage& msg, std::span<uint8_t, kMadLen> out) {
  uint8_t* p = out.data();
  std::memset(p, 0, kMadLen);
  const MadHeader& h = msg.mad;
  p[0] = h.base_version;
  p[1] = h.mgmt_class;
  p[2] = h.class_version;
  p[3] = h.method;
  StoreBe16(p + 4, h.status);
  StoreBe16(p + 6, h.class_specific);
  StoreBe64(p + 8, h.transaction_id);
  StoreBe16(p + 16, uint16_t(msg.attr));
  // 18: reserved
  StoreBe32(p + 20, h.attribute_modifier);

  uint8_t* c = p + kMadHeaderLen;
  switch (msg.attr) {
    case CmAttr::Req: EncodeReq(msg.req, c); break;
    case CmAttr::Mra: EncodeMra(msg.mra, c); break;
    case CmAttr::Rej: EncodeRej(msg.rej, c); break;
    case CmAttr::Rep: EncodeRep(msg.rep, c); break;
    case CmAttr::Rtu: EncodeIds(msg.rtu, c); break;
    case CmAttr::Dreq: EncodeDreq(msg.dreq, c); break;
    case CmAttr::Drep: EncodeIds(msg.drep, c); break;
    default: break;  // LAP, APR, SIDR: header only (ndwv never sends them)
  }
}

uint32_t SenderCommId(const CmMessage& m) {
  switch (m.attr) {
    case CmAttr::Req: return m.req.local_comm_id;
    case CmAttr::Mra: return m.mra.local_comm_id;
    case CmAttr::Rej: return m.rej.local_comm_id;
    case CmAttr::Rep: return m.rep.local_comm_id;
    case CmAttr::Rtu: return m.rtu.local_comm_id;
    case CmAttr::Dreq: return m.dreq.local_comm_id;
    case CmAttr::Drep: return m.drep.local_comm_id;
    default: return 0;
  }
}

CmError DecodeCm(std::span<const uint8_t> mad, CmMessage& out) {
  // Exactly one MAD: a GSI receive buffer holds 256 bytes, so a longer datagram is one a NIC
  // would drop (local length error), and a shorter one is cut.
  if (mad.size() != kMadLen) return CmError::Truncated;
  const uint8_t* p = mad.data();
  MadHeader& h = out.mad;
  h.base_version = p[0];
  h.mgmt_class = p[1];
  h.class_version = p[2];
  h.method = p[3];
  h.status = LoadBe16(p + 4);
  h.class_specific = LoadBe16(p + 6);
  h.transaction_id = LoadBe64(p + 8);
  h.attribute_id = LoadBe16(p + 16);
  h.attribute_modifier = LoadBe32(p + 20);
  if (h.base_version != kMadBaseVersion) return CmError::BadBaseVersion;
  if (h.mgmt_class != kCmClass) return CmError::NotCm;
  if (h.class_version != kCmClassVersion) return CmError::BadClassVersion;
  if (h.method != kMadMethodSend) return CmError::BadMethod;
  if (!Supported(h.attribute_id)) return CmError::UnknownAttribute;

  out.attr = CmAttr(h.attribute_id);
  const uint8_t* c = p + kMadHeaderLen;
  switch (out.attr) {
    case CmAttr::Req: out.req = CmReq{}; DecodeReq(c, out.req); break;
    case CmAttr::Mra: out.mra = CmMra{}; DecodeMra(c, out.mra); break;
    case CmAttr::Rej: out.rej = CmRej{}; DecodeRej(c, out.rej); break;
    case CmAttr::Rep: out.rep = CmRep{}; DecodeRep(c, out.rep); break;
    case CmAttr::Rtu: out.rtu = CmRtu{}; DecodeIds(c, out.rtu); break;
    case CmAttr::Dreq: out.dreq = CmDreq{}; DecodeDreq(c, out.dreq); break;
    case CmAttr::Drep: out.drep = CmDrep{}; DecodeIds(c, out.drep); break;
    default: return CmError::UnknownAttribute;
  }
  return CmError::Ok;
}

// ---- RDMA-CM IP header -------------------------------------------------------------------------

namespace {

// IPv4 sits in the last 4 bytes of a 16-byte slot whose first 12 are zero.
void PutIp(uint8_t* slot, const sockaddr_storage& ss) {
  std::memset(slot, 0, 16);
  if (ss.ss_family == AF_INET)
    std::memcpy(slot + 12, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, 4);
  else
    std::memcpy(slot, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, 16);
}

}  // namespace

bool EncodeIpHeader(const IpHeader& h, std::span<uint8_t, kIpHeaderLen> out) {
  const sa_family_t fam = h.source.ss_family;
  if ((fam != AF_INET && fam != AF_INET6) || h.destination.ss_family != fam) return false;
  uint8_t* p = out.data();
  p[0] = 0x00;                        // major 0, minor 0
  p[1] = fam == AF_INET ? 0x40 : 0x60;  // IP version 7-4, reserved 3-0
  const in_port_t port = fam == AF_INET
                             ? reinterpret_cast<const sockaddr_in&>(h.source).sin_port
                             : reinterpret_cast<const sockaddr_in6&>(h.source).sin6_port;
  std::memcpy(p + 2, &port, 2);  // already network order
  PutIp(p + 4, h.source);
  PutIp(p + 20, h.destination);
  return true;
}

bool DecodeIpHeader(std::span<const uint8_t> in, IpHeader& out) {
  if (in.size() < kIpHeaderLen) return false;
  const uint8_t* p = in.data();
  if (p[0] != 0x00) return false;
  const uint8_t ipv = p[1] >> 4;
  if (ipv != 4 && ipv != 6) return false;
  out = IpHeader{};
  if (ipv == 4) {
    auto& s = reinterpret_cast<sockaddr_in&>(out.source);
    auto& d = reinterpret_cast<sockaddr_in&>(out.destination);
    s.sin_family = d.sin_family = AF_INET;
    std::memcpy(&s.sin_port, p + 2, 2);
    std::memcpy(&s.sin_addr, p + 4 + 12, 4);
    std::memcpy(&d.sin_addr, p + 20 + 12, 4);
  } else {
    auto& s = reinterpret_cast<sockaddr_in6&>(out.source);
    auto& d = reinterpret_cast<sockaddr_in6&>(out.destination);
    s.sin6_family = d.sin6_family = AF_INET6;
    std::memcpy(&s.sin6_port, p + 2, 2);
    std::memcpy(&s.sin6_addr, p + 4, 16);
    std::memcpy(&d.sin6_addr, p + 20, 16);
  }
  return true;
}

}  // namespace ndwv::wire::ib
