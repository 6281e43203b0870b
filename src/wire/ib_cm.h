// InfiniBand Communication Manager messages (design-facts §3): 256-byte MADs (24-byte common
// header + 232-byte CM payload) carried on QP 1 as UD SEND ONLY with a DETH (see wire/ib.h), and
// the RDMA-CM IP header (IBTA Annex A11) at the front of a REQ's private data.
//
// Decoders take exactly the 256 MAD bytes and check base version, class, class version, method
// (SEND) and attribute, in that order; every field is decoded into host order. Bit fields sit
// where Linux's ib_cm (ibta_vol1_c12.h) puts them: the field listed first in a byte or word
// takes its most significant bits (ib_cm.cpp names the bits of each). Fields ndwv does not use
// (alternate path, LIDs, EECNs, RDC, extended transport) are encoded as zero and ignored when
// decoded. Encoders write all 256 bytes (reserved bytes zero).
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace ndwv::wire::ib {

inline constexpr size_t kMadLen = 256, kMadHeaderLen = 24, kCmPayloadLen = 232;
inline constexpr uint8_t kMadBaseVersion = 1, kCmClass = 0x07, kCmClassVersion = 2,
                         kMadMethodSend = 0x03;

enum class CmAttr : uint16_t {
  Req = 0x10, Mra = 0x11, Rej = 0x12, Rep = 0x13, Rtu = 0x14, Dreq = 0x15, Drep = 0x16,
  SidrReq = 0x17, SidrRep = 0x18, Lap = 0x19, Apr = 0x1A,
};
const char* ToString(CmAttr attr);

struct MadHeader {
  uint8_t base_version = kMadBaseVersion;
  uint8_t mgmt_class = kCmClass;
  uint8_t class_version = kCmClassVersion;
  uint8_t method = kMadMethodSend;
  uint16_t status = 0;
  uint16_t class_specific = 0;
  uint64_t transaction_id = 0;
  uint16_t attribute_id = 0;
  uint32_t attribute_modifier = 0;
};

inline constexpr size_t kReqPrivateData = 92, kMraPrivateData = 222, kRejPrivateData = 148,
                        kRepPrivateData = 196, kRtuPrivateData = 224, kDreqPrivateData = 220,
                        kDrepPrivateData = 224, kRejInfoLen = 72;

struct CmReq {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;               // 24
  uint8_t responder_resources = 0;      // sender's IRD
  uint8_t initiator_depth = 0;          // sender's ORD
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  uint8_t transport_service_type = 0;   // 2 bits, 0 = RC
  bool end_to_end_flow_control = false;
  uint32_t starting_psn = 0;            // 24: the PSN the sender expects to receive
  uint8_t local_cm_response_timeout = 0;   // 5
  uint8_t retry_count = 0;              // 3
  uint16_t pkey = 0xFFFF;
  uint8_t path_mtu = 0;                 // 4 (code)
  uint8_t rnr_retry_count = 0;          // 3
  uint8_t max_cm_retries = 0;           // 4
  bool srq = false;
  uint8_t primary_local_gid[16] = {};
  uint8_t primary_remote_gid[16] = {};
  uint32_t primary_flow_label = 0;      // 20
  uint8_t primary_packet_rate = 0;      // 6
  uint8_t primary_traffic_class = 0;
  uint8_t primary_hop_limit = 0;
  uint8_t primary_sl = 0;               // 4
  bool primary_subnet_local = false;
  uint8_t primary_local_ack_timeout = 0;  // 5
  uint8_t private_data[kReqPrivateData] = {};
};

struct CmMra {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t message_mraed = 0;  // 0 REQ, 1 REP, 2 LAP
  uint8_t service_timeout = 0;  // 5
  uint8_t private_data[kMraPrivateData] = {};
};

enum class RejectedMessage : uint8_t { Req = 0, Rep = 1, Other = 2 };
enum class RejReason : uint16_t {
  NoQp = 1, NoResources = 3, Timeout = 4, UnsupportedRequest = 5, InvalidCommId = 6,
  InvalidCommInstance = 7, InvalidServiceId = 8, InvalidTransportType = 9, StaleConnection = 10,
  InvalidGid = 12, InvalidMtu = 26, InsufficientResponderResources = 27, ConsumerReject = 28,
  InvalidRnrRetry = 29, DuplicateLocalCommId = 30, InvalidClassVersion = 31,
};
struct CmRej {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  RejectedMessage message_rejected = RejectedMessage::Req;
  uint8_t reject_info_length = 0;  // 7
  uint16_t reason = 0;
  uint8_t reject_info[kRejInfoLen] = {};
  uint8_t private_data[kRejPrivateData] = {};
};

struct CmRep {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;           // 24
  uint32_t starting_psn = 0;        // 24
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;     // 5
  uint8_t failover_accepted = 0;    // 2
  bool end_to_end_flow_control = false;
  uint8_t rnr_retry_count = 0;      // 3
  bool srq = false;
  uint64_t local_ca_guid = 0;
  uint8_t private_data[kRepPrivateData] = {};
};

struct CmRtu {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t private_data[kRtuPrivateData] = {};
};

struct CmDreq {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // 24
  uint8_t private_data[kDreqPrivateData] = {};
};

struct CmDrep {
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint8_t private_data[kDrepPrivateData] = {};
};

// One decoded CM MAD. `attr` says which member is valid.
struct CmMessage {
  MadHeader mad;
  CmAttr attr = CmAttr::Req;
  union {
    CmReq req;
    CmMra mra;
    CmRej rej;
    CmRep rep;
    CmRtu rtu;
    CmDreq dreq;
    CmDrep drep;
  };
  CmMessage() : req() {}
};

enum class CmError : uint8_t {
  Ok = 0,
  Truncated,         // not exactly 256 bytes: shorter, or longer (a GSI receive buffer holds one
                     // MAD; a NIC drops a longer datagram, so trailing bytes are not ignored)
  BadBaseVersion,
  NotCm,             // management class is not CM
  BadClassVersion,
  BadMethod,
  UnknownAttribute,  // not one of REQ, MRA, REJ, REP, RTU, DREQ, DREP (LAP/APR/SIDR are refused)
};
const char* ToString(CmError e);

// Writes the 256-byte MAD (header from msg.mad with attribute_id set from msg.attr).
void EncodeCm(const CmMessage& msg, std::span<uint8_t, kMadLen> out);
CmError DecodeCm(std::span<const uint8_t> mad, CmMessage& out);
// The sender's communication ID (its Local Communication ID), of a message of any kind.
uint32_t SenderCommId(const CmMessage& m);

// ---- RDMA-CM IP addressing (Annex A11) ---------------------------------------------------------

inline constexpr size_t kIpHeaderLen = 36;
inline constexpr size_t kReqUserData = kReqPrivateData - kIpHeaderLen;  // 56
inline constexpr uint64_t kTcpServiceIdBase = 0x0000000001060000ull;
constexpr uint64_t TcpServiceId(uint16_t port) { return kTcpServiceIdBase | port; }
constexpr bool IsTcpServiceId(uint64_t id) { return (id & ~0xFFFFull) == kTcpServiceIdBase; }
// The service ID of an IP service of any IANA protocol (Annex A11: 0x0000000001PPpppp, the
// protocol in the port-space byte; TCP's is the RDMA-CM ID above). ND v1 names the protocol.
constexpr uint64_t IpServiceId(uint8_t protocol, uint16_t port) {
  return 0x0000000001000000ull | uint64_t(protocol) << 16 | port;
}
static_assert(IpServiceId(6, 80) == TcpServiceId(80));

// Source and destination are AF_INET or AF_INET6 (of one family); the source port is stored.
struct IpHeader {
  sockaddr_storage source{};       // with the port
  sockaddr_storage destination{};  // port 0 (the service ID carries it)
};
// Writes the 36-byte header; false if the families are unsupported or differ.
bool EncodeIpHeader(const IpHeader& h, std::span<uint8_t, kIpHeaderLen> out);
// False if shorter than 36 bytes, the version byte is not 0 or the IP version is neither 4 nor 6
// (the reserved low nibble of byte 1 and the zero prefix of an IPv4 slot are not checked).
// The destination's port is 0.
bool DecodeIpHeader(std::span<const uint8_t> in, IpHeader& out);

}  // namespace ndwv::wire::ib
