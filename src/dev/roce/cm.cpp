#include "dev/roce/cm.h"

#include <algorithm>
#include <iterator>

#include <ndwv/wvstatus.h>

#include "base/log.h"
#include "dev/address.h"
#include "wire/bytes.h"
#include "wire/ib.h"

namespace ndwv::dev::roce {

using wire::ib::CmAttr;
using wire::ib::CmError;
using wire::ib::CmMessage;
using wire::ib::RejectedMessage;
using wire::ib::RejReason;

namespace {

// Within an exchange's budget each repeat waits twice as long as the one before (RFC 6298 5.5,
// as TCP's SYN): under a load that delays every answer, repeats at a fixed interval pile onto it.
constexpr uint32_t kMaxBackoffShift = 3;

// Copies private data into a message's fixed field (the rest stays zero).
template <size_t N>
bool CopyPrivateData(uint8_t (&field)[N], std::span<const uint8_t> data) {
  if (data.size() > N) return false;
  std::copy(data.begin(), data.end(), field);
  return true;
}

CmDrop DropFor(CmError e) {
  switch (e) {
    case CmError::BadBaseVersion:
    case CmError::BadClassVersion: return CmDrop::BadVersion;
    case CmError::NotCm: return CmDrop::NotCm;
    case CmError::BadMethod: return CmDrop::BadMethod;
    case CmError::UnknownAttribute: return CmDrop::UnknownAttribute;
    default: return CmDrop::Truncated;
  }
}

}  // namespace

// Compares in whole milliseconds so that the two conversions round-trip (20 <-> 4295 ms).
uint8_t TimeValueFromMs(uint32_t ms) {
  for (uint8_t x = 0; x < 31; x++)
    if (TimeValueToMs(x) >= ms) return x;
  return 31;
}

uint32_t TimeValueToMs(uint8_t x) {
  uint64_t ms = (wire::ib::TimeValueMicros(x) + 999) / 1000;
  return uint32_t(std::clamp<uint64_t>(ms, 1, UINT32_MAX));
}

const char* ToString(CmState s) {
  static const char* const names[] = {"IDLE",     "REQ_SENT",     "MRA_REQ_RCVD", "REP_RCVD",
                                      "MRA_REP_SENT", "REQ_RCVD", "MRA_REQ_SENT", "REP_SENT",
                                      "MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT",  "DREQ_RCVD",
                                      "TIMEWAIT", "NO_SUCH_ID"};
  static_assert(std::size(names) == size_t(CmState::NoSuchId) + 1);
  return names[size_t(s)];
}

const char* ToString(CmEventKind k) {
  static const char* const names[] = {"ReqReceived", "RepReceived",  "Established", "Rejected",
                                      "ReqTimeout",  "RepTimeout",   "MraReceived", "DreqReceived",
                                      "DrepReceived", "DreqTimeout", "TimewaitExit"};
  static_assert(std::size(names) == size_t(CmEventKind::TimewaitExit) + 1);
  return names[size_t(k)];
}

const char* ToString(CmDrop d) {
  static const char* const names[] = {"truncated", "bad version", "not CM", "bad method",
                                      "unknown attribute", "unknown comm ID", "comm ID mismatch",
                                      "QPN mismatch", "wrong state", "duplicate", "wrong source"};
  static_assert(std::size(names) == size_t(CmDrop::Count));
  return d < CmDrop::Count ? names[size_t(d)] : "?";
}

const char* ToString(CmLimit l) {
  static const char* const names[] = {"invalid REQ", "backlog full", "request expired",
                                      "CM response timeout clamped", "CM retries clamped",
                                      "MRA service timeout clamped", "MRA ignored",
                                      "read limits clamped", "RNR retry count clamped",
                                      "new connection shed (overloaded)",
                                      "REQ postponed (backlog full)"};
  static_assert(std::size(names) == size_t(CmLimit::Count));
  return l < CmLimit::Count ? names[size_t(l)] : "?";
}

// §3.9: each side advertised the PSN it expects to receive and its own IRD/ORD.
QpAttributes ActiveQpAttributes(const ConnectArgs& ours, const wire::ib::CmRep& rep) {
  QpAttributes a;
  a.dest_qpn = rep.local_qpn;
  a.sq_psn = rep.starting_psn;
  a.rq_psn = ours.starting_psn & wire::ib::kPsnMask;
  a.max_dest_rd_atomic = ours.ird;
  a.max_rd_atomic = std::min(ours.ord, rep.responder_resources);
  a.path_mtu = ours.path_mtu;
  a.retry_count = ours.retry_count;
  a.local_ack_timeout = ours.local_ack_timeout;
  a.rnr_retry_count = rep.rnr_retry_count;
  return a;
}

QpAttributes PassiveQpAttributes(const wire::ib::CmReq& req, const AcceptArgs& ours) {
  QpAttributes a;
  a.dest_qpn = req.local_qpn;
  a.sq_psn = req.starting_psn;
  a.rq_psn = ours.starting_psn & wire::ib::kPsnMask;
  a.max_dest_rd_atomic = ours.ird;
  a.max_rd_atomic = std::min(ours.ord, req.responder_resources);
  a.path_mtu = req.path_mtu;
  a.retry_count = req.retry_count;
  a.local_ack_timeout = req.primary_local_ack_timeout;
  a.rnr_retry_count = req.rnr_retry_count;
  return a;
}

CmAgent::CmAgent(CmEnv& env, const CmConfig& config) : env_(env), config_(config) {
  config_.max_retries = std::min<uint32_t>(config_.max_retries, 15);  // a 4-bit field
  response_timeout_ = TimeValueFromMs(config_.response_timeout_ms);
  mra_timeout_ = TimeValueFromMs(config_.mra_timeout_ms);
  next_tid_ = uint64_t(config_.id_seed) << 32;
}

// ---------------------------------------------------------------------------- bookkeeping

// A communication ID that recurs only after 2^32 connections of this agent, so that a retried
// connection never looks like a duplicate of the one before, and that nobody can predict from
// the IDs it saw (those of its own connections): a forged CM message (a DREQ) must guess it.
// The agent's counter goes through a keyed permutation of the 32-bit numbers: a Feistel network
// whose round function is the process's keyed hash (secret), salted with the agent's seed.
// Eight rounds, as format-preserving ciphers on such small blocks use.
uint32_t CmAgent::NewCommId() {
  for (;;) {
    uint32_t left = ++id_counter_ >> 16, right = id_counter_ & 0xFFFF;
    for (uint32_t round = 0; round < 8; ++round) {
      const uint32_t input[3] = {config_.id_seed, round, right};
      const uint32_t mixed = left ^ (uint32_t(base::KeyedHash(input, sizeof input)) & 0xFFFF);
      left = right;
      right = mixed;
    }
    uint32_t id = left << 16 | right;
    if (id != 0 && !ceps_.contains(id)) return id;  // 0 means "no ID" in a REJ
  }
}

uint64_t CmAgent::NewTid() { return ++next_tid_; }

CmAgent::Cep* CmAgent::Find(uint32_t id) {
  auto it = ceps_.find(id);
  return it == ceps_.end() ? nullptr : &it->second;
}

const CmAgent::Cep* CmAgent::Find(uint32_t id) const {
  auto it = ceps_.find(id);
  return it == ceps_.end() ? nullptr : &it->second;
}

bool CmAgent::RemoteKey::operator==(const RemoteKey& o) const {
  return ca_guid == o.ca_guid && comm_id == o.comm_id && SameAddress(from, o.from);
}

size_t CmAgent::RemoteKeyHash::operator()(const RemoteKey& k) const {
  struct {
    uint64_t ca_guid, from;
    uint32_t comm_id, zero;
  } bytes{k.ca_guid, AddressHash(k.from), k.comm_id, 0};
  return base::KeyedHasher()(bytes);
}

size_t CmAgent::QpKeyHash::operator()(const std::pair<uint64_t, uint32_t>& k) const {
  struct {
    uint64_t ca_guid;
    uint32_t qpn, zero;
  } bytes{k.first, k.second, 0};
  return base::KeyedHasher()(bytes);
}

CmAgent::Cep* CmAgent::Lookup(const sockaddr_storage& from, uint32_t ours, uint32_t theirs) {
  Cep* cep = Find(ours);
  if (!cep) {
    Drop(CmDrop::UnknownCommId);
    return nullptr;
  }
  if (cep->remote_id != 0 && cep->remote_id != theirs) {
    Drop(CmDrop::CommIdMismatch);
    return nullptr;
  }
  return FromPeer(*cep, from) ? cep : nullptr;
}

bool CmAgent::FromPeer(const Cep& cep, const sockaddr_storage& from) {
  if (SameAddress(from, cep.peer)) return true;
  Drop(CmDrop::WrongSource);
  if (warn_wrong_source_.Allow(env_.NowMs())) {
    NDWV_LOG(Warn, "roce cm id %08x: a message for the connection with %s came from %s: dropped",
             cep.local_id, Describe(cep.peer).c_str(), Describe(from).c_str());
  }
  return false;
}

CmAgent::Cep* CmAgent::FindByRemote(uint64_t ca_guid, uint32_t remote_id, const sockaddr_storage& from) {
  auto it = by_remote_.find({ca_guid, remote_id, from});
  return it == by_remote_.end() ? nullptr : Find(it->second);
}

void CmAgent::IndexQp(const Cep& cep) {
  if (cep.remote_ca_guid || cep.remote_qpn) by_qp_[{cep.remote_ca_guid, cep.remote_qpn}] = cep.local_id;
  by_peer_qp_[{PackedAddress::Of(cep.peer), cep.remote_qpn}] = cep.local_id;
}

uint32_t CmAgent::CmMessageSentTo(const sockaddr_storage& to, uint32_t id) const {
  const Cep* cep = Find(id);
  return cep && SameAddress(cep->peer, to) ? id : 0;
}

uint32_t CmAgent::ConnectionTo(const sockaddr_storage& to, uint32_t peer_qpn) const {
  auto it = by_peer_qp_.find({PackedAddress::Of(to), peer_qpn});
  return it == by_peer_qp_.end() ? 0 : it->second;
}

std::vector<uint32_t> CmAgent::ConnectionsToProbe(const sockaddr_storage& peer) {
  const uint64_t now = env_.NowMs();
  const PackedAddress key = PackedAddress::Of(peer);
  std::erase_if(probed_peers_, [&](const auto& entry) { return now - entry.second >= kProbeQuietMs; });
  if (probed_peers_.contains(key) || probed_peers_.size() >= kMaxProbedPeers) return {};
  probed_peers_[key] = now;
  // A scan of this port's CEPs (connectors spread theirs over NDWV_ROCE_CONNECTOR_PORTS ports),
  // at most kMaxProbedPeers times per kProbeQuietMs: cheaper than an index kept up at every
  // connection's setup and teardown for an event this rare.
  std::vector<uint32_t> ids;
  for (const auto& [id, cep] : ceps_)
    if (cep.state == CmState::Established && SameAddress(cep.peer, peer)) ids.push_back(id);
  return ids;
}

void CmAgent::Limit(CmLimit limit, Cep* cep, const sockaddr_storage& peer, const char* detail) {
  counters_.limits[size_t(limit)]++;
  if (cep) {
    uint32_t bit = 1u << size_t(limit);
    if (cep->warned & bit) return;
    cep->warned |= bit;
  }
  if (!warn_limits_[size_t(limit)].Allow(env_.NowMs())) return;
  NDWV_LOG(Warn, "roce cm id %08x peer %s: %s (%s)", cep ? cep->local_id : 0, Describe(peer).c_str(),
           ToString(limit), detail);
}

uint64_t CmAgent::DeadlineOf(uint32_t id) const {
  const Cep* cep = Find(id);
  return cep ? cep->deadline : UINT64_MAX;
}

CmState CmAgent::StateOf(uint32_t id) const {
  const Cep* cep = Find(id);
  return cep ? cep->state : CmState::NoSuchId;
}

uint32_t CmAgent::TimeoutMsOf(uint32_t id) const {
  const Cep* cep = Find(id);
  return cep ? cep->timeout_ms : 0;
}

void CmAgent::Arm(Cep& cep, uint64_t deadline) {
  Disarm(cep);
  cep.deadline = deadline;
  deadlines_.insert({deadline, cep.local_id});
}

void CmAgent::Disarm(Cep& cep) {
  if (cep.deadline == UINT64_MAX) return;
  deadlines_.erase({cep.deadline, cep.local_id});
  cep.deadline = UINT64_MAX;
}

uint64_t CmAgent::NextDeadlineMs() const {
  return deadlines_.empty() ? UINT64_MAX : deadlines_.begin()->first;
}

void CmAgent::EnterTimewait(Cep& cep) {
  SetState(cep, CmState::Timewait);
  IndexQp(cep);
  Arm(cep, env_.NowMs() + config_.timewait_ms);
}

void CmAgent::EnterIdle(Cep& cep) {
  Disarm(cep);
  SetState(cep, CmState::Idle);
  if (cep.destroyed) Erase(cep);
}

void CmAgent::Erase(Cep& cep) {
  Disarm(cep);
  if (cep.passive) by_remote_.erase({cep.remote_ca_guid, cep.remote_id, cep.peer});
  auto qp = by_qp_.find({cep.remote_ca_guid, cep.remote_qpn});
  if (qp != by_qp_.end() && qp->second == cep.local_id) by_qp_.erase(qp);
  auto peer_qp = by_peer_qp_.find({PackedAddress::Of(cep.peer), cep.remote_qpn});
  if (peer_qp != by_peer_qp_.end() && peer_qp->second == cep.local_id) by_peer_qp_.erase(peer_qp);
  ceps_.erase(cep.local_id);
}

void CmAgent::Emit(const Cep& cep, CmEventKind kind, const CmMessage* msg, uint16_t reason) {
  if (cep.destroyed) return;
  CmEvent& e = events_.emplace_back();
  e.id = cep.local_id;
  e.kind = kind;
  e.has_message = msg != nullptr;
  if (msg) e.msg = *msg;
  e.peer = cep.peer;
  e.reject_reason = reason;
  e.peer_busy = kind == CmEventKind::ReqTimeout && cep.peer_busy;
}

bool CmAgent::PopEvent(CmEvent* out) {
  if (events_.empty()) return false;
  *out = events_.front();
  events_.pop_front();
  events_.ReleaseIfEmpty();
  return true;
}

// ---------------------------------------------------------------------------- sending

void CmAgent::Send(const sockaddr_storage& to, CmMessage m) {
  m.mad.attribute_id = uint16_t(m.attr);
  counters_.sent[CmCounters::Index(m.attr)]++;
  env_.SendMad(to, m);
}

bool CmAgent::AwaitsAnswer(CmState state) {
  return state == CmState::ReqSent || state == CmState::MraReqRcvd || state == CmState::RepSent ||
         state == CmState::MraRepRcvd || state == CmState::DreqSent;
}

void CmAgent::SetState(Cep& cep, CmState state) {
  cep.state = state;
  if (!AwaitsAnswer(state)) cep.outstanding.reset();
}

void CmAgent::SendOutstanding(Cep& cep, CmMessage m) {
  cep.outstanding = std::make_unique<CmMessage>(m);
  cep.transmissions = 1;
  cep.mra_waits = 0;  // a new exchange
  cep.sent_ms = env_.NowMs();
  cep.resent_ms = 0;
  Send(cep.peer, m);
  const uint64_t wait = AnswerWaitMs(cep);
  cep.give_up_ms = cep.sent_ms + (1 + cep.max_retries) * wait;
  Arm(cep, cep.sent_ms + wait);
}

uint64_t CmAgent::AnswerWaitMs(const Cep& cep) const {
  auto wait = answer_wait_.For(std::chrono::milliseconds(cep.timeout_ms));
  return uint64_t(std::chrono::ceil<std::chrono::milliseconds>(wait).count());
}

void CmAgent::NoteAnswer(const Cep& cep) {
  if (!AwaitsAnswer(cep.state) || cep.mra_waits != 0) return;
  using Time = std::chrono::steady_clock::time_point;
  auto at = [](uint64_t ms) { return Time(std::chrono::milliseconds(ms)); };
  answer_wait_.Acknowledged(at(cep.sent_ms), cep.resent_ms ? at(cep.resent_ms) : Time{}, at(env_.NowMs()),
                            std::chrono::milliseconds(cep.timeout_ms));
}

void CmAgent::SendRej(Cep& cep, RejReason reason, RejectedMessage which,
                      std::span<const uint8_t> private_data) {
  CmMessage m;
  m.attr = CmAttr::Rej;
  m.mad.transaction_id = cep.tid;
  m.rej.local_comm_id = cep.local_id;
  m.rej.remote_comm_id = cep.remote_id;
  m.rej.message_rejected = which;
  m.rej.reason = uint16_t(reason);
  if (reason == RejReason::Timeout) {  // carries our CA GUID, by which the peer finds its CEP
    wire::StoreBe64(m.rej.reject_info, config_.ca_guid);
    m.rej.reject_info_length = 8;
  }
  CopyPrivateData(m.rej.private_data, private_data);
  Send(cep.peer, m);
}

void CmAgent::RejectReq(const sockaddr_storage& to, const CmMessage& req, RejReason reason) {
  CmMessage m;
  m.attr = CmAttr::Rej;
  m.mad.transaction_id = req.mad.transaction_id;
  m.rej.local_comm_id = 0;
  m.rej.remote_comm_id = req.req.local_comm_id;
  m.rej.message_rejected = RejectedMessage::Req;
  m.rej.reason = uint16_t(reason);
  Send(to, m);
}

void CmAgent::RejectStaleRep(const sockaddr_storage& to, const CmMessage& rep) {
  CmMessage m;
  m.attr = CmAttr::Rej;
  m.mad.transaction_id = rep.mad.transaction_id;
  m.rej.local_comm_id = rep.rep.remote_comm_id;
  m.rej.remote_comm_id = rep.rep.local_comm_id;
  m.rej.message_rejected = RejectedMessage::Rep;
  m.rej.reason = uint16_t(RejReason::InvalidCommId);
  Send(to, m);
}

void CmAgent::SendMra(Cep& cep, MraFor what) {
  CmMessage m;
  m.attr = CmAttr::Mra;
  m.mad.transaction_id = cep.tid;
  m.mra.local_comm_id = cep.local_id;
  m.mra.remote_comm_id = cep.remote_id;
  m.mra.message_mraed = what;
  m.mra.service_timeout = mra_timeout_;
  Send(cep.peer, m);
}

void CmAgent::SendPostpone(const sockaddr_storage& to, uint64_t tid, uint32_t remote_id) {
  CmMessage m;
  m.attr = CmAttr::Mra;
  m.mad.transaction_id = tid;
  m.mra.local_comm_id = 0;  // we keep nothing: the repeat is a new request
  m.mra.remote_comm_id = remote_id;
  m.mra.message_mraed = kMraForReq;
  m.mra.service_timeout = response_timeout_;
  Send(to, m);
}

void CmAgent::SendDreq(Cep& cep, std::span<const uint8_t> private_data) {
  CmMessage m;
  m.attr = CmAttr::Dreq;
  m.mad.transaction_id = NewTid();
  m.dreq.local_comm_id = cep.local_id;
  m.dreq.remote_comm_id = cep.remote_id;
  m.dreq.remote_qpn = cep.remote_qpn;
  CopyPrivateData(m.dreq.private_data, private_data);
  SetState(cep, CmState::DreqSent);
  SendOutstanding(cep, m);
}

void CmAgent::SendDrep(const sockaddr_storage& to, uint32_t local_id, uint32_t remote_id,
                       uint64_t tid, std::span<const uint8_t> private_data) {
  CmMessage m;
  m.attr = CmAttr::Drep;
  m.mad.transaction_id = tid;
  m.drep.local_comm_id = local_id;
  m.drep.remote_comm_id = remote_id;
  CopyPrivateData(m.drep.private_data, private_data);
  Send(to, m);
}

// ---------------------------------------------------------------------------- consumer calls

uint32_t CmAgent::Connect(const sockaddr_storage& to, const ConnectArgs& args) {
  if (args.private_data.size() > wire::ib::kReqPrivateData) return 0;
  uint32_t id = NewCommId();
  Cep& cep = ceps_[id];
  cep.local_id = id;
  cep.peer = to;
  cep.local_qpn = args.local_qpn & wire::ib::kQpnMask;
  cep.tid = NewTid();
  // §3.5: 2 packet lifetimes + the response time we asked of the peer.
  cep.timeout_ms = 2 * config_.packet_lifetime_ms + TimeValueToMs(response_timeout_);
  cep.max_retries = config_.max_retries;
  SetState(cep, CmState::ReqSent);

  CmMessage m;
  m.attr = CmAttr::Req;
  m.mad.transaction_id = cep.tid;
  wire::ib::CmReq& r = m.req;
  r.local_comm_id = id;
  r.service_id = args.service_id;
  r.local_ca_guid = config_.ca_guid;
  r.local_qpn = cep.local_qpn;
  r.responder_resources = args.ird;
  r.initiator_depth = args.ord;
  r.remote_cm_response_timeout = response_timeout_;
  r.local_cm_response_timeout = response_timeout_;
  r.starting_psn = args.starting_psn & wire::ib::kPsnMask;
  r.retry_count = args.retry_count;
  r.path_mtu = args.path_mtu;
  r.rnr_retry_count = args.rnr_retry_count;
  r.max_cm_retries = uint8_t(config_.max_retries);
  r.srq = args.srq;
  std::copy(std::begin(args.local_gid), std::end(args.local_gid), r.primary_local_gid);
  std::copy(std::begin(args.remote_gid), std::end(args.remote_gid), r.primary_remote_gid);
  r.primary_hop_limit = args.hop_limit;
  r.primary_traffic_class = args.traffic_class;
  r.primary_local_ack_timeout = args.local_ack_timeout;
  CopyPrivateData(r.private_data, args.private_data);
  SendOutstanding(cep, m);
  return id;
}

CmMessage CmAgent::RtuOf(const Cep& cep) {
  CmMessage m;
  m.attr = CmAttr::Rtu;
  m.mad.transaction_id = cep.tid;
  m.rtu.local_comm_id = cep.local_id;
  m.rtu.remote_comm_id = cep.remote_id;
  return m;
}

int32_t CmAgent::SendRtu(uint32_t id) {
  Cep* cep = Find(id);
  if (!cep) return WV_NOT_FOUND;
  if (cep->state != CmState::RepRcvd && cep->state != CmState::MraRepSent)
    return WV_INVALID_DEVICE_STATE;
  SetState(*cep, CmState::Established);
  cep->established_reported = true;  // the active consumer knows: it sent the RTU
  IndexQp(*cep);
  Send(cep->peer, RtuOf(*cep));  // made again if the REP comes again (the RTU was lost)
  return WV_SUCCESS;
}

int32_t CmAgent::Listen(uint64_t service_id) {
  return services_.insert(service_id).second ? WV_SUCCESS : WV_ADDRESS_ALREADY_EXISTS;
}

void CmAgent::StopListening(uint64_t service_id) { services_.erase(service_id); }

int32_t CmAgent::Accept(uint32_t id, const AcceptArgs& args) {
  Cep* cep = Find(id);
  if (!cep) return WV_NOT_FOUND;
  if (cep->state != CmState::ReqRcvd && cep->state != CmState::MraReqSent)
    return WV_INVALID_DEVICE_STATE;
  CmMessage m;
  m.attr = CmAttr::Rep;
  m.mad.transaction_id = cep->tid;
  wire::ib::CmRep& r = m.rep;
  if (!CopyPrivateData(r.private_data, args.private_data)) return WV_INVALID_PARAMETER;
  cep->local_qpn = args.local_qpn & wire::ib::kQpnMask;
  r.local_comm_id = cep->local_id;
  r.remote_comm_id = cep->remote_id;
  r.local_qpn = cep->local_qpn;
  r.starting_psn = args.starting_psn & wire::ib::kPsnMask;
  r.responder_resources = args.ird;
  r.initiator_depth = args.ord;
  r.rnr_retry_count = args.rnr_retry_count;
  r.srq = args.srq;
  r.local_ca_guid = config_.ca_guid;
  SetState(*cep, CmState::RepSent);
  SendOutstanding(*cep, m);
  return WV_SUCCESS;
}

int32_t CmAgent::RefuseRequest(uint32_t id) { return DropRequest(id, true); }

int32_t CmAgent::PostponeRequest(uint32_t id) { return DropRequest(id, false); }

int32_t CmAgent::DropRequest(uint32_t id, bool refuse) {
  Cep* cep = Find(id);
  if (!cep) return WV_NOT_FOUND;
  if (cep->state != CmState::ReqRcvd && cep->state != CmState::MraReqSent) return WV_INVALID_DEVICE_STATE;
  Limit(refuse ? CmLimit::BacklogFull : CmLimit::BacklogWait, nullptr, cep->peer,
        refuse ? "REQ refused" : "REQ postponed");
  events_.EraseIf([id](const CmEvent& e) { return e.id == id; });
  if (refuse) SendRej(*cep, RejReason::NoResources, RejectedMessage::Req);
  else SendPostpone(cep->peer, cep->tid, cep->remote_id);
  Erase(*cep);
  return WV_SUCCESS;
}

int32_t CmAgent::Reject(uint32_t id, std::span<const uint8_t> private_data) {
  Cep* cep = Find(id);
  if (!cep) return WV_NOT_FOUND;
  if (private_data.size() > wire::ib::kRejPrivateData) return WV_INVALID_PARAMETER;
  switch (cep->state) {
    case CmState::ReqRcvd:
    case CmState::MraReqSent:
      SendRej(*cep, RejReason::ConsumerReject, RejectedMessage::Req, private_data);
      EnterIdle(*cep);
      return WV_SUCCESS;
    case CmState::RepRcvd:
    case CmState::MraRepSent:
      SendRej(*cep, RejReason::ConsumerReject, RejectedMessage::Rep, private_data);
      EnterIdle(*cep);
      return WV_SUCCESS;
    case CmState::RepSent:
    case CmState::MraRepRcvd:  // the peer may have readied its QP: time-wait
      SendRej(*cep, RejReason::ConsumerReject, RejectedMessage::Other, private_data);
      EnterTimewait(*cep);
      return WV_SUCCESS;
    default:
      return WV_INVALID_DEVICE_STATE;
  }
}

void CmAgent::ReportEstablished(Cep& cep, const CmMessage* rtu) {
  NoteAnswer(cep);
  Disarm(cep);  // the REP is answered
  SetState(cep, CmState::Established);
  IndexQp(cep);
  if (cep.established_reported) return;
  cep.established_reported = true;
  Emit(cep, CmEventKind::Established, rtu);
}

int32_t CmAgent::Established(uint32_t id) {
  Cep* cep = Find(id);
  if (!cep) return WV_NOT_FOUND;
  switch (cep->state) {
    case CmState::RepSent:
    case CmState::MraRepRcvd:
      ReportEstablished(*cep, nullptr);
      return WV_SUCCESS;
    case CmState::Established:
    case CmState::DreqSent:
    case CmState::DreqRcvd:
    case CmState::Timewait:
      return WV_SUCCESS;  // a late first packet: already past it
    default:
      return WV_INVALID_DEVICE_STATE;
  }
}

int32_t CmAgent::Disconnect(uint32_t id, std::span<const uint8_t> private_data) {
  Cep* cep = Find(id);
  if (!cep) return WV_NOT_FOUND;
  switch (cep->state) {
    case CmState::Established:
      if (private_data.size() > wire::ib::kDreqPrivateData) return WV_INVALID_PARAMETER;
      SendDreq(*cep, private_data);
      return WV_SUCCESS;
    case CmState::DreqRcvd:
      if (private_data.size() > wire::ib::kDrepPrivateData) return WV_INVALID_PARAMETER;
      SendDrep(cep->peer, cep->local_id, cep->remote_id, cep->dreq_tid, private_data);
      EnterTimewait(*cep);
      return WV_SUCCESS;
    default:
      return WV_INVALID_DEVICE_STATE;
  }
}

// §3.4, "Destroying an id".
void CmAgent::Destroy(uint32_t id) {
  Cep* cep = Find(id);
  if (!cep) return;
  cep->destroyed = true;
  events_.EraseIf([id](const CmEvent& e) { return e.id == id; });
  switch (cep->state) {
    case CmState::Established:  // one DREQ, not retried: nobody waits for its answer
      SendDreq(*cep);
      EnterTimewait(*cep);
      break;
    case CmState::DreqSent:
      EnterTimewait(*cep);
      break;
    case CmState::DreqRcvd:
      SendDrep(cep->peer, cep->local_id, cep->remote_id, cep->dreq_tid);
      EnterTimewait(*cep);
      break;
    case CmState::ReqSent:
    case CmState::MraReqRcvd:
      SendRej(*cep, RejReason::Timeout, RejectedMessage::Other);
      EnterIdle(*cep);
      break;
    case CmState::ReqRcvd:
    case CmState::MraReqSent:
    case CmState::RepRcvd:
    case CmState::MraRepSent:
    case CmState::RepSent:
    case CmState::MraRepRcvd:
      Reject(id, {});  // to IDLE, where a destroyed CEP is erased, or to TIMEWAIT
      break;
    case CmState::Timewait:  // the record stays until its timer
      break;
    default:
      Erase(*cep);
      break;
  }
}

// ---------------------------------------------------------------------------- timers

void CmAgent::OnTimer() {
  uint64_t now = env_.NowMs();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Cep& cep = ceps_.at(deadlines_.begin()->second);
    Disarm(cep);
    OnDeadline(cep);
  }
}

void CmAgent::OnDeadline(Cep& cep) {
  if (cep.state == CmState::Timewait) {
    Emit(cep, CmEventKind::TimewaitExit);
    EnterIdle(cep);
    return;
  }
  if (cep.state == CmState::ReqRcvd || cep.state == CmState::MraReqSent) {
    // The consumer neither accepted nor rejected in time: the peer is told, as after REP retries.
    Limit(CmLimit::RequestExpired, nullptr, cep.peer, "REJ timeout sent");
    SendRej(cep, RejReason::Timeout, RejectedMessage::Req);
    Emit(cep, CmEventKind::RequestExpired);
    EnterIdle(cep);
    return;
  }
  if (!AwaitsAnswer(cep.state)) return;
  const uint64_t now = env_.NowMs();
  if (now < cep.give_up_ms && cep.transmissions < 1 + cep.max_retries) {
    const uint64_t wait = AnswerWaitMs(cep) << std::min(cep.transmissions, kMaxBackoffShift);
    cep.transmissions++;
    counters_.retransmits++;
    cep.resent_ms = now;
    Send(cep.peer, *cep.outstanding);
    Arm(cep, std::min(now + wait, cep.give_up_ms));
    return;
  }
  switch (cep.state) {
    case CmState::ReqSent:
    case CmState::MraReqRcvd:  // WinOFED tells the peer, which may hold a CEP for our REQ
      counters_.req_timeouts++;
      SendRej(cep, RejReason::Timeout, RejectedMessage::Other);
      Emit(cep, CmEventKind::ReqTimeout);
      EnterIdle(cep);
      break;
    case CmState::RepSent:
    case CmState::MraRepRcvd:
      counters_.rep_timeouts++;
      SendRej(cep, RejReason::Timeout, RejectedMessage::Other);
      Emit(cep, CmEventKind::RepTimeout);
      EnterIdle(cep);
      break;
    default:  // DREQ_SENT (§3.6)
      counters_.dreq_timeouts++;
      Emit(cep, CmEventKind::DreqTimeout);
      EnterTimewait(cep);
      break;
  }
}

// ---------------------------------------------------------------------------- input

void CmAgent::OnMad(const sockaddr_storage& from, std::span<const uint8_t> mad) {
  CmMessage m;
  if (CmError e = wire::ib::DecodeCm(mad, m); e != CmError::Ok) {
    Drop(DropFor(e));
    return;
  }
  counters_.received[CmCounters::Index(m.attr)]++;
  switch (m.attr) {
    case CmAttr::Req: OnReq(from, m); break;
    case CmAttr::Mra: OnMra(from, m); break;
    case CmAttr::Rej: OnRej(from, m); break;
    case CmAttr::Rep: OnRep(from, m); break;
    case CmAttr::Rtu: OnRtu(from, m); break;
    case CmAttr::Dreq: OnDreq(from, m); break;
    case CmAttr::Drep: OnDrep(from, m); break;
    default: Drop(CmDrop::UnknownAttribute); break;
  }
}

void CmAgent::OnReq(const sockaddr_storage& from, const CmMessage& received) {
  CmMessage m = received;
  wire::ib::CmReq& req = m.req;
  if (Cep* dup = FindByRemote(req.local_ca_guid, req.local_comm_id, from)) return OnDuplicateReq(*dup);
  // A process dropping datagrams sheds new connections before the ones it has, as a kernel drops
  // SYNs to a full listen queue: unanswered, the REQ comes again (each time after twice the wait).
  // (Not postponed with an MRA as a full backlog's are: the answer would cost the overloaded
  // process a send per REQ, and a sender told to try again keeps the load up.)
  if (env_.Overloaded()) {
    Limit(CmLimit::Overloaded, nullptr, from, "REQ dropped");
    return;
  }
  if (!services_.contains(req.service_id)) {
    counters_.invalid_service_rejects_sent++;
    RejectReq(from, m, RejReason::InvalidServiceId);
    return;
  }
  if (!CheckReq(from, m)) return;
  // The peer's QP is still bound to a connection of ours: that one is stale. A live one is told
  // so with a DREQ; one in time-wait keeps the QP number out of use until the timer (pitfall 15).
  // Only the connection's own peer may say so: a REQ from elsewhere claiming its QP is dropped.
  if (auto it = by_qp_.find({req.local_ca_guid, req.local_qpn}); it != by_qp_.end()) {
    Cep& old = ceps_.at(it->second);
    if (old.state == CmState::Timewait || old.state == CmState::Established) {
      if (!FromPeer(old, from)) return;
      counters_.stale_rejects_sent++;
      RejectReq(from, m, RejReason::StaleConnection);
      if (old.state == CmState::Established) SendDreq(old);
      return;
    }
  }

  uint32_t id = NewCommId();
  Cep& cep = ceps_[id];
  cep.local_id = id;
  cep.remote_id = req.local_comm_id;
  cep.passive = true;
  cep.peer = from;
  cep.remote_ca_guid = req.local_ca_guid;
  cep.remote_qpn = req.local_qpn;
  cep.tid = m.mad.transaction_id;
  // §3.5: the active side promised to answer our REP within its local response timeout. We
  // wait for a peer no longer than for ourselves: its timeouts and retries are clamped to ours.
  uint32_t ours = TimeValueToMs(response_timeout_);
  uint32_t rep_timeout = TimeValueToMs(req.local_cm_response_timeout);
  uint32_t req_timeout = TimeValueToMs(req.remote_cm_response_timeout);
  if (rep_timeout > ours || req_timeout > ours)
    Limit(CmLimit::ResponseTimeout, &cep, from, "REQ response timeouts above ours");
  cep.timeout_ms = std::min(rep_timeout, ours);
  if (req.max_cm_retries > config_.max_retries) Limit(CmLimit::Retries, &cep, from, "REQ Max CM Retries");
  cep.max_retries = std::min<uint32_t>(req.max_cm_retries, config_.max_retries);
  ClampReadLimits(cep, req.responder_resources, req.initiator_depth);
  ClampRnrRetry(cep, req.rnr_retry_count);
  SetState(cep, CmState::ReqRcvd);
  by_remote_[{cep.remote_ca_guid, cep.remote_id, cep.peer}] = id;
  // The request lives as long as its sender waits for our REP unanswered (what it asked of us
  // per transmission, times its transmissions); MRAs we send extend it (OnDuplicateReq).
  Arm(cep, env_.NowMs() + uint64_t(std::min(req_timeout, ours)) * (1 + cep.max_retries) +
               2 * config_.packet_lifetime_ms);
  Emit(cep, CmEventKind::ReqReceived, &m);
}

// A REQ we hold already: its sender did not hear from us.
void CmAgent::OnDuplicateReq(Cep& dup) {
  switch (dup.state) {
    case CmState::ReqRcvd:
    case CmState::MraReqSent:
      // The consumer is slow: ask for time (delayed MRA), a bounded number of times; each MRA
      // promises an answer within its service timeout, so the request lives that much longer.
      if (dup.mra_waits >= config_.max_mra_waits) {
        Drop(CmDrop::Duplicate);
        return;
      }
      dup.mra_waits++;
      if (dup.state == CmState::ReqRcvd) SetState(dup, CmState::MraReqSent);
      else counters_.duplicate_answers++;  // the same MRA again
      SendMra(dup, kMraForReq);
      // The peer waits out the MRA's service timeout (and 2 packet lifetimes) before it repeats
      // itself; the repeat then has a response time of ours to arrive in.
      Arm(dup, std::max(dup.deadline, env_.NowMs() + TimeValueToMs(mra_timeout_) +
                                          2 * config_.packet_lifetime_ms + TimeValueToMs(response_timeout_)));
      return;
    case CmState::RepSent:
    case CmState::MraRepRcvd:  // our REP was lost
      counters_.duplicate_answers++;
      Send(dup.peer, *dup.outstanding);
      return;
    case CmState::Timewait:
      counters_.stale_rejects_sent++;
      SendRej(dup, RejReason::StaleConnection, RejectedMessage::Req);
      return;
    default:
      Drop(CmDrop::Duplicate);
      return;
  }
}

bool CmAgent::CheckReq(const sockaddr_storage& from, CmMessage& m) {
  // An HCA cannot run a QP on an MTU it does not have, nor a service it does not offer: the REQ
  // is refused with the reason IBA gives for each (an invalid MTU code would reach the
  // transport's arithmetic as 0 bytes).
  RejReason reason;
  const char* detail;
  char text[48];
  if (wire::ib::MtuBytes(m.req.path_mtu) == 0) {
    reason = RejReason::InvalidMtu;
    snprintf(text, sizeof text, "path MTU code %u", unsigned(m.req.path_mtu));
    detail = text;
  } else if (m.req.transport_service_type != 0) {  // RC
    reason = RejReason::InvalidTransportType;
    snprintf(text, sizeof text, "transport service type %u", unsigned(m.req.transport_service_type));
    detail = text;
  } else {
    return true;
  }
  Limit(CmLimit::InvalidReq, nullptr, from, detail);
  RejectReq(from, m, reason);
  return false;
}

void CmAgent::ClampReadLimits(Cep& cep, uint8_t& responder_resources, uint8_t& initiator_depth) {
  if (responder_resources <= config_.max_read_limit && initiator_depth <= config_.max_read_limit) return;
  Limit(CmLimit::ReadLimits, &cep, cep.peer, "responder resources / initiator depth");
  responder_resources = std::min(responder_resources, config_.max_read_limit);
  initiator_depth = std::min(initiator_depth, config_.max_read_limit);
}

void CmAgent::ClampRnrRetry(Cep& cep, uint8_t& rnr_retry_count) {
  if (rnr_retry_count <= config_.max_rnr_retry) return;  // 7 (forever) is the largest
  Limit(CmLimit::RnrRetry, &cep, cep.peer, "RNR retry count");
  rnr_retry_count = config_.max_rnr_retry;
}

void CmAgent::OnMra(const sockaddr_storage& from, const CmMessage& m) {
  Cep* cep = Lookup(from, m.mra.remote_comm_id, m.mra.local_comm_id);
  if (!cep) return;
  bool for_req = m.mra.message_mraed == kMraForReq &&
                 (cep->state == CmState::ReqSent || cep->state == CmState::MraReqRcvd);
  bool for_rep = m.mra.message_mraed == kMraForRep &&
                 (cep->state == CmState::RepSent || cep->state == CmState::MraRepRcvd);
  if (!for_req && !for_rep) {
    Drop(CmDrop::WrongState);
    return;
  }
  if (for_req) cep->peer_busy = true;  // honoured or not, the MRA says the listener is there
  // A peer may not hold our exchange open as long and as often as it likes: a bounded number
  // of MRAs, each for at most our own service timeout.
  if (cep->mra_waits >= config_.max_mra_waits) {
    Limit(CmLimit::MraCount, cep, from, "more MRAs than we honour per exchange");
    return;
  }
  NoteAnswer(*cep);
  cep->mra_waits++;
  uint32_t service = TimeValueToMs(m.mra.service_timeout);
  if (m.mra.service_timeout > mra_timeout_) {
    Limit(CmLimit::MraTimeout, cep, from, "MRA service timeout");
    service = TimeValueToMs(mra_timeout_);
  }
  if (for_req) {
    cep->remote_id = m.mra.local_comm_id;
    SetState(*cep, CmState::MraReqRcvd);
  } else {
    SetState(*cep, CmState::MraRepRcvd);
  }
  // §3.5: wait the service time the peer asked for before retransmitting; the exchange's budget
  // then has a wait left for each transmission left.
  const uint64_t resume = env_.NowMs() + service + 2 * config_.packet_lifetime_ms;
  Arm(*cep, resume);
  cep->give_up_ms = resume + (1 + cep->max_retries - cep->transmissions) * AnswerWaitMs(*cep);
  Emit(*cep, CmEventKind::MraReceived, &m);
}

void CmAgent::OnRej(const sockaddr_storage& from, const CmMessage& m) {
  const wire::ib::CmRej& rej = m.rej;
  Cep* cep = nullptr;
  if (rej.remote_comm_id != 0) {
    cep = Lookup(from, rej.remote_comm_id, rej.local_comm_id);
  } else if (rej.reason == uint16_t(RejReason::Timeout) && rej.reject_info_length >= 8) {
    // An active side that timed out before learning our ID names itself by its CA GUID.
    cep = FindByRemote(wire::LoadBe64(rej.reject_info), rej.local_comm_id, from);
    if (!cep) Drop(CmDrop::UnknownCommId);
  } else {
    Drop(CmDrop::UnknownCommId);
  }
  if (!cep) return;
  switch (cep->state) {
    case CmState::ReqRcvd:
    case CmState::MraReqSent:  // no QP was readied for the request: nothing to wait out
      Disarm(*cep);
      Emit(*cep, CmEventKind::Rejected, &m, rej.reason);
      EnterIdle(*cep);
      return;
    case CmState::ReqSent:
    case CmState::MraReqRcvd:
    case CmState::RepSent:
    case CmState::MraRepRcvd:
      NoteAnswer(*cep);
      Disarm(*cep);
      Emit(*cep, CmEventKind::Rejected, &m, rej.reason);
      if (rej.reason == uint16_t(RejReason::StaleConnection)) EnterTimewait(*cep);
      else EnterIdle(*cep);
      return;
    case CmState::RepRcvd:
    case CmState::MraRepSent:
    case CmState::Established:
    case CmState::DreqSent:  // the connection is gone
      Disarm(*cep);
      Emit(*cep, CmEventKind::Rejected, &m, rej.reason);
      EnterTimewait(*cep);
      return;
    default:
      Drop(CmDrop::WrongState);
      return;
  }
}

void CmAgent::OnRep(const sockaddr_storage& from, const CmMessage& received) {
  const wire::ib::CmRep& rep = received.rep;
  Cep* cep = Lookup(from, rep.remote_comm_id, rep.local_comm_id);
  if (!cep) {
    // A REP for a Connect that gave up (timed out, refused or released: its CEP is gone) is
    // answered, as a DREQ for no connection is: its REJ may have been lost, and the passive side
    // would otherwise hold the request through all its REP retries, then fail its Accept with a
    // timeout instead of learning that the peer gave up. One REJ per REP: nothing amplified.
    if (!Find(rep.remote_comm_id)) RejectStaleRep(from, received);
    return;
  }
  switch (cep->state) {
    case CmState::Idle:  // the same, the CEP still held by its endpoint
      Drop(CmDrop::WrongState);
      RejectStaleRep(from, received);
      return;
    case CmState::ReqSent:
    case CmState::MraReqRcvd: {
      NoteAnswer(*cep);
      Disarm(*cep);
      cep->remote_id = rep.local_comm_id;
      cep->remote_qpn = rep.local_qpn;
      cep->remote_ca_guid = rep.local_ca_guid;
      SetState(*cep, CmState::RepRcvd);
      cep->mra_waits = 0;  // a new exchange: the REP's
      CmMessage m = received;
      ClampReadLimits(*cep, m.rep.responder_resources, m.rep.initiator_depth);
      ClampRnrRetry(*cep, m.rep.rnr_retry_count);
      Emit(*cep, CmEventKind::RepReceived, &m);
      return;
    }
    case CmState::RepRcvd:  // the consumer has not sent its RTU yet: ask for time
      SendMra(*cep, kMraForRep);
      SetState(*cep, CmState::MraRepSent);
      return;
    case CmState::MraRepSent:
    case CmState::Established:  // resend the MRA, or the RTU that was lost
      if (!cep->passive) {
        counters_.duplicate_answers++;
        if (cep->state == CmState::MraRepSent) SendMra(*cep, kMraForRep);
        else Send(cep->peer, RtuOf(*cep));
        return;
      }
      Drop(CmDrop::WrongState);
      return;
    case CmState::DreqSent:
    case CmState::DreqRcvd:
    case CmState::Timewait:
      Drop(CmDrop::Duplicate);
      return;
    default:
      Drop(CmDrop::WrongState);
      return;
  }
}

void CmAgent::OnRtu(const sockaddr_storage& from, const CmMessage& m) {
  Cep* cep = Lookup(from, m.rtu.remote_comm_id, m.rtu.local_comm_id);
  if (!cep) return;
  switch (cep->state) {
    case CmState::RepSent:
    case CmState::MraRepRcvd:
      ReportEstablished(*cep, &m);
      return;
    case CmState::Established:  // Established() came first (lost or late RTU)
    case CmState::DreqSent:
    case CmState::DreqRcvd:
    case CmState::Timewait:
      Drop(CmDrop::Duplicate);
      return;
    default:
      Drop(CmDrop::WrongState);
      return;
  }
}

void CmAgent::OnDreq(const sockaddr_storage& from, const CmMessage& m) {
  const wire::ib::CmDreq& dreq = m.dreq;
  Cep* cep = Find(dreq.remote_comm_id);
  if (!cep || cep->remote_id != dreq.local_comm_id) {
    // No such connection (any more): answer, so that the peer's Disconnect ends now instead of
    // after all its retries.
    counters_.dreqs_without_connection++;
    SendDrep(from, dreq.remote_comm_id, dreq.local_comm_id, m.mad.transaction_id);
    return;
  }
  if (!FromPeer(*cep, from)) return;  // a third party may not close our connection
  if (dreq.remote_qpn != cep->local_qpn) {
    Drop(CmDrop::QpnMismatch);
    return;
  }
  switch (cep->state) {
    case CmState::RepSent:
    case CmState::MraRepRcvd:  // the peer got our REP, so it is established (pitfall 7)
      ReportEstablished(*cep, nullptr);
      [[fallthrough]];
    case CmState::Established:
      cep->dreq_tid = m.mad.transaction_id;
      SetState(*cep, CmState::DreqRcvd);
      Emit(*cep, CmEventKind::DreqReceived, &m);
      return;
    case CmState::DreqSent:  // crossing DREQs: ours needs no answer now, theirs does
      cep->dreq_tid = m.mad.transaction_id;
      SendDrep(cep->peer, cep->local_id, cep->remote_id, cep->dreq_tid);
      EnterTimewait(*cep);
      Emit(*cep, CmEventKind::DreqReceived, &m);
      return;
    case CmState::Timewait:  // our DREP was lost
    case CmState::Idle:      // ... and time-wait is over: the peer still waits for it
      counters_.duplicate_answers++;
      SendDrep(cep->peer, cep->local_id, cep->remote_id, m.mad.transaction_id);
      return;
    case CmState::DreqRcvd:  // the consumer has not answered yet
      Drop(CmDrop::Duplicate);
      return;
    default:
      Drop(CmDrop::WrongState);
      return;
  }
}

void CmAgent::OnDrep(const sockaddr_storage& from, const CmMessage& m) {
  Cep* cep = Lookup(from, m.drep.remote_comm_id, m.drep.local_comm_id);
  if (!cep) return;
  switch (cep->state) {
    case CmState::DreqSent:
      NoteAnswer(*cep);
      EnterTimewait(*cep);
      Emit(*cep, CmEventKind::DrepReceived, &m);
      return;
    case CmState::Timewait:
      Drop(CmDrop::Duplicate);
      return;
    default:
      Drop(CmDrop::WrongState);
      return;
  }
}

}  // namespace ndwv::dev::roce
