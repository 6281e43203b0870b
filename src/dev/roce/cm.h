// The InfiniBand Communication Manager (design-facts §3) as a pure state machine: no sockets, no
// threads, no clock of its own. The UDP port feeds it MADs (OnMad) and timer expiries (OnTimer),
// the consumer (the RoCE connect endpoint) calls it, and it answers with MADs (CmEnv::SendMad)
// and with events the caller drains after each call (PopEvent). Nothing calls back into the
// consumer, so nothing re-enters; every race and timeout is a deterministic test.
//
// One CmAgent per UDP port. It owns every connection endpoint (CEP) of that port, named by its
// local communication ID; the service IDs listened on; and the CEPs in time-wait, which outlive
// the consumer's Destroy until their timer expires.
//
// States and transitions are those of §3.4, with two choices made where the sources differ:
//   * A duplicate REQ in REQ_RCVD is answered with an MRA ("delayed MRA", as Linux rdma_cm does:
//     the MRA costs nothing while the consumer decides quickly), and likewise a duplicate REP in
//     REP_RCVD while the active consumer has not sent its RTU yet.
//   * Crossing DREQs: a DREQ received in DREQ_SENT is answered with a DREP at once (our consumer
//     already asked to disconnect; WV forgot this DREP, pitfall 7), the CEP enters TIMEWAIT, and the
//     consumer sees that DREQ as its one disconnect event.
// A DREQ reaching an active CEP before its consumer sent the RTU is dropped, as Linux does: the
// peer retries it, and by then the RTU is out, so Connect's outcome still comes first.
//
// Every value in a peer's message is an attacker's (docs/security.md, "RoCE"): a REQ whose path MTU
// or transport the device cannot use is refused; the timeouts, retry counts, MRA waits, read
// limits and RNR retries a peer asks for are clamped to our own (CmLimit); a CEP answers only the
// UDP address and port of its peer (CmDrop::WrongSource); and a passive CEP that the consumer
// neither accepts nor rejects expires (RequestExpired), so that no peer holds state for long.
#pragma once
#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/keyed_hash.h"
#include "base/lazy_deque.h"
#include "base/log.h"
#include "base/object_pool.h"
#include "dev/address.h"
#include "dev/roce/ack_wait.h"
#include "wire/ib_cm.h"

namespace ndwv::dev::roce {

struct CmConfig {
  uint32_t response_timeout_ms = 4295;  // this side's CM response timeout (IB time value 20)
  uint32_t max_retries = 15;            // 0..15; transmissions = 1 + retries
  uint32_t timewait_ms = 2000;
  uint64_t ca_guid = 0;
  // Added to every retransmit timeout twice (§3.5). A LAN's lifetime hides inside the response
  // timeout, so 0 is a fair default.
  uint32_t packet_lifetime_ms = 0;
  // Service timeout advertised in our MRAs (Linux rdma_cm: time value 24, about 69 s), and the
  // longest wait a peer's MRA may ask of us (both as the IB time value that covers it).
  uint32_t mra_timeout_ms = 68720;
  // MRAs honoured per exchange (REQ, REP), and sent per REQ: each extends the wait once.
  uint32_t max_mra_waits = 2;
  // The device's most inbound/outbound RDMA Reads: a peer's responder resources and initiator
  // depth are clamped to it before the consumer sees them.
  uint8_t max_read_limit = 128;
  // The most RNR retries a peer's REQ/REP may ask of our requester (7 = forever).
  uint8_t max_rnr_retry = 7;
  // Start of the transaction ID sequence, and what sets the agent's communication IDs apart from
  // other agents': random in production, so that a restarted process does not reuse the IDs its
  // peers may still hold in time-wait.
  uint32_t id_seed = 0;
};

// IB time values (4.096 us * 2^x) in milliseconds: ms -> the smallest x that covers it, and back
// (rounded up, at least 1 ms).
uint8_t TimeValueFromMs(uint32_t ms);
uint32_t TimeValueToMs(uint8_t x);

// What the UDP port does for the agent.
class CmEnv {
 public:
  virtual uint64_t NowMs() = 0;
  // Encodes msg (EncodeCm) and sends it to `to`.
  virtual void SendMad(const sockaddr_storage& to, const wire::ib::CmMessage& msg) = 0;
  // The process is dropping datagrams for want of time to read them: new connections yield to
  // the ones it has (CmLimit::Overloaded).
  virtual bool Overloaded() = 0;
 protected:
  ~CmEnv() = default;
};

enum class CmState : uint8_t {
  Idle,
  // active
  ReqSent, MraReqRcvd, RepRcvd, MraRepSent,
  // passive
  ReqRcvd, MraReqSent, RepSent, MraRepRcvd,
  // both
  Established, DreqSent, DreqRcvd, Timewait,
  NoSuchId,  // StateOf an ID the agent does not hold
};
const char* ToString(CmState s);

enum class CmEventKind : uint8_t {
  ReqReceived,   // new passive CEP; msg.req, peer = the REQ's source
  RepReceived,   // msg.rep; the consumer readies its QP, then SendRtu (or Reject)
  Established,   // passive: RTU received or Established() called; delivered once
  Rejected,      // msg.rej, reject_reason. After RepReceived/Established it ends the connection
  ReqTimeout,    // REQ retries exhausted (a REJ Timeout was sent)
  RepTimeout,    // REP retries exhausted (a REJ Timeout was sent)
  MraReceived,   // msg.mra: the peer needs more time; informational
  DreqReceived,  // msg.dreq. In DREQ_RCVD the consumer answers with Disconnect(); if it had
                 // sent its own DREQ (crossing), the DREP is already sent and the CEP is in TIMEWAIT
  DrepReceived,  // msg.drep: our DREQ was answered; TIMEWAIT
  DreqTimeout,   // DREQ retries exhausted; TIMEWAIT
  TimewaitExit,  // TIMEWAIT over: the QP may be reused (pitfall 15)
  RequestExpired,  // passive: neither accepted nor rejected in time; a REJ Timeout was sent, IDLE
};
const char* ToString(CmEventKind k);

struct CmEvent {
  uint32_t id = 0;
  CmEventKind kind = CmEventKind::ReqReceived;
  bool has_message = false;  // msg is the message that caused the event
  wire::ib::CmMessage msg;
  sockaddr_storage peer{};
  uint16_t reject_reason = 0;  // Rejected
  // ReqTimeout: the peer's CM answered the REQ with an MRA, so it is there, busy or without room
  // for the request (PostponeRequest): the Connect may be tried again (ND_TIMEOUT), where an
  // unanswered one means the peer is unresponsive (ND_IO_TIMEOUT).
  bool peer_busy = false;
};

enum class CmDrop : uint8_t {
  Truncated, BadVersion, NotCm, BadMethod, UnknownAttribute,  // the decoder refused it
  UnknownCommId,   // names no CEP of ours
  CommIdMismatch,  // names one of our CEPs but not its peer's ID
  QpnMismatch,     // DREQ for another QP
  WrongState,      // not expected in the CEP's state
  Duplicate,       // a repeat that needs no answer (late RTU, DREP in TIMEWAIT, ...)
  WrongSource,     // names a CEP (or its peer's QP) but comes from another address or port
  Count
};
const char* ToString(CmDrop d);

// A bound a peer ran into (docs/security.md, "RoCE"): counted, and logged at Warn once per
// connection and kind (at most one line a second per kind and agent).
enum class CmLimit : uint8_t {
  InvalidReq,       // REQ refused: path MTU code not 1..5 (REJ 26) or not RC (REJ 9)
  BacklogFull,      // REQ refused (RefuseRequest): the listener's backlog is full
  RequestExpired,   // REQ neither accepted nor rejected in time (REJ Timeout)
  ResponseTimeout,  // a CM response timeout above ours: clamped to ours
  Retries,          // Max CM Retries above ours: clamped to ours
  MraTimeout,       // an MRA's service timeout above mra_timeout_ms: clamped
  MraCount,         // an MRA beyond max_mra_waits in one exchange: ignored
  ReadLimits,       // responder resources / initiator depth above max_read_limit: clamped
  RnrRetry,         // RNR retry count above max_rnr_retry: clamped
  Overloaded,       // a new REQ dropped unanswered while CmEnv::Overloaded
  BacklogWait,      // REQ erased, its sender asked to repeat it (PostponeRequest): a Listen(0) listener's backlog is full
  Count
};
const char* ToString(CmLimit l);

struct CmCounters {
  static constexpr size_t kAttrs = 7;  // REQ .. DREP (attribute 0x10 + index)
  uint64_t sent[kAttrs] = {}, received[kAttrs] = {};
  uint64_t retransmits = 0;          // REQ/REP/DREQ resent by the timer
  uint64_t duplicate_answers = 0;    // REP/RTU/MRA/DREP resent because a duplicate came in
  uint64_t req_timeouts = 0, rep_timeouts = 0, dreq_timeouts = 0;
  uint64_t drops[size_t(CmDrop::Count)] = {};
  uint64_t dreqs_without_connection = 0;  // answered with a DREP built from the DREQ
  uint64_t stale_rejects_sent = 0;        // REJ stale connection (10)
  uint64_t invalid_service_rejects_sent = 0;  // REJ invalid service ID (8)
  uint64_t limits[size_t(CmLimit::Count)] = {};

  uint64_t Sent(wire::ib::CmAttr a) const { return sent[Index(a)]; }
  uint64_t Received(wire::ib::CmAttr a) const { return received[Index(a)]; }
  uint64_t Dropped(CmDrop d) const { return drops[size_t(d)]; }
  uint64_t Limited(CmLimit l) const { return limits[size_t(l)]; }
  static size_t Index(wire::ib::CmAttr a) { return size_t(a) - size_t(wire::ib::CmAttr::Req); }
};

struct ConnectArgs {
  uint64_t service_id = 0;
  uint32_t local_qpn = 0;
  uint32_t starting_psn = 0;  // the PSN we expect to receive (our RQ PSN, §3.9)
  uint8_t ird = 0;            // responder resources: inbound RDMA Reads we accept
  uint8_t ord = 0;            // initiator depth: outbound RDMA Reads we issue
  uint8_t path_mtu = 3;       // code: 1 = 256 .. 5 = 4096
  uint8_t retry_count = 7;
  uint8_t rnr_retry_count = 7;
  uint8_t local_ack_timeout = 0;  // time-value code for the QP's ACK timeout
  bool srq = false;
  uint8_t local_gid[16] = {}, remote_gid[16] = {};  // IP-derived GIDs of the path
  uint8_t hop_limit = 64, traffic_class = 0;
  std::span<const uint8_t> private_data;  // <= 92: the RDMA-CM IP header + user data
};

struct AcceptArgs {
  uint32_t local_qpn = 0;
  uint32_t starting_psn = 0;  // our RQ PSN
  // Our IRD/ORD as chosen by the consumer: ORD <= REQ.responder_resources, IRD covering
  // REQ.initiator_depth (§3.9); a consumer that cannot rejects with reason 27.
  uint8_t ird = 0, ord = 0;
  uint8_t rnr_retry_count = 7;
  bool srq = false;
  std::span<const uint8_t> private_data;  // <= 196
};

// The QP attributes that follow from a REQ/REP exchange (§3.9): each side advertised the PSN it
// expects to receive and its own IRD/ORD; here they are crossed.
struct QpAttributes {
  uint32_t dest_qpn = 0;
  uint32_t sq_psn = 0, rq_psn = 0;
  uint8_t max_dest_rd_atomic = 0;  // RTR: own IRD
  uint8_t max_rd_atomic = 0;       // RTS: own ORD, no more than the peer's IRD
  uint8_t path_mtu = 0, retry_count = 0, local_ack_timeout = 0;
  uint8_t rnr_retry_count = 0;     // from the peer's message
};
QpAttributes ActiveQpAttributes(const ConnectArgs& ours, const wire::ib::CmRep& rep);
QpAttributes PassiveQpAttributes(const wire::ib::CmReq& req, const AcceptArgs& ours);

// Calls return WV status codes: WV_SUCCESS, WV_NOT_FOUND (no such ID), WV_INVALID_DEVICE_STATE
// (not allowed in the CEP's state), WV_INVALID_PARAMETER (private data too long),
// WV_ADDRESS_ALREADY_EXISTS (service already listened on).
class CmAgent {
 public:
  CmAgent(CmEnv& env, const CmConfig& config);

  // Active side. Connect sends the REQ and returns the new CEP's ID (0 if the private data is
  // too long). SendRtu follows RepReceived, once the consumer's QP is in RTR/RTS. The RTU
  // carries no private data (neither ND's CompleteConnect nor RDMA-CM sends any).
  uint32_t Connect(const sockaddr_storage& to, const ConnectArgs& args);
  int32_t SendRtu(uint32_t id);

  // Passive side. REQs for a service nobody listens on are rejected with reason 8. A REQ the
  // consumer neither accepts nor rejects expires (RequestExpired) after the REQ's own budget
  // (its remote CM response timeout times 1 + its Max CM Retries, each clamped to ours), extended
  // by mra_timeout_ms for each MRA we send (at most max_mra_waits, in answer to repeats).
  int32_t Listen(uint64_t service_id);
  void StopListening(uint64_t service_id);
  int32_t Accept(uint32_t id, const AcceptArgs& args);
  // The consumer has no room for a new request (its backlog is full): a REJ (no resources) and
  // the CEP erased. The peer's Connect ends ND_CONNECTION_REFUSED at once, as nd2-spi names for
  // a full backlog and as an iWARP listener's closed connection does. (Linux's rdma_cm leaves the
  // REQ unanswered for the peer's CM to send again: under a connect storm every pending Connect
  // then repeated its REQ each response timeout, ~17,000 a second under Microsoft's ndconn.)
  int32_t RefuseRequest(uint32_t id);
  // A listener asked for no limit (Listen(0)) holds its whole backlog: the CEP is erased and the
  // sender is asked to repeat its REQ after our response timeout, by an MRA naming no CEP of ours
  // (local comm ID 0: the repeat is a new request). Its Connect waits for room as a SYN to a full
  // TCP listener does; if its budget ends first, it knows the listener was there (ND_TIMEOUT, try
  // again). (Left unanswered, as before, Microsoft's ndconn saw ND_IO_TIMEOUT, "peer unresponsive",
  // and never retried.)
  int32_t PostponeRequest(uint32_t id);
  // REJ consumer reject (28): passive before or after its REP, active after the REP.
  int32_t Reject(uint32_t id, std::span<const uint8_t> private_data = {});
  // The QP received its first packet in RTR: stands for a lost RTU (pitfall 8). Harmless once
  // established.
  int32_t Established(uint32_t id);

  // Teardown. ESTABLISHED: send DREQ; DREQ_RCVD: send DREP.
  int32_t Disconnect(uint32_t id, std::span<const uint8_t> private_data = {});
  // The consumer let go of the ID: no more events for it; the connection is closed as §3.4 says
  // and a TIMEWAIT record stays until its timer expires.
  void Destroy(uint32_t id);

  // Input.
  void OnMad(const sockaddr_storage& from, std::span<const uint8_t> mad);
  void OnTimer();                  // handles every deadline that is due
  uint64_t NextDeadlineMs() const;  // UINT64_MAX if none

  // Output, in order (per CEP and overall).
  bool PopEvent(CmEvent* out);

  CmState StateOf(uint32_t id) const;
  const CmCounters& counters() const { return counters_; }
  // Retransmit timeout of a CEP (REQ: 2 lifetimes + the response timeout we advertised; REP: the
  // REQ's local response timeout; DREQ: the CEP's own), 0 if no such ID. For tests and logs.
  uint32_t TimeoutMsOf(uint32_t id) const;
  // Which connection an ICMP error about a datagram we sent to `to` concerns, by what the error
  // quoted of it: a CM message names our communication ID, an RC packet the peer's QPN. 0 if no
  // connection of ours sends that to `to`: the error is stale or forged.
  uint32_t CmMessageSentTo(const sockaddr_storage& to, uint32_t id) const;
  uint32_t ConnectionTo(const sockaddr_storage& to, uint32_t peer_qpn) const;
  // The connections established with `peer` (its port), when one of them found it closed: each
  // probes it now, rather than when its own keepalive falls due (with many
  // connections, tens of seconds), and its own answer or retries decide. Empty if `peer`'s were
  // given out in the last kProbeQuietMs (their probes are running), or if kMaxProbedPeers others
  // were: what a failure costs stays bounded however many fail.
  std::vector<uint32_t> ConnectionsToProbe(const sockaddr_storage& peer);
  size_t size() const { return ceps_.size(); }  // CEPs held, time-wait records included
  // The deadline of a CEP's timer (retransmission, request lifetime, time-wait), UINT64_MAX if
  // none or no such ID. For tests.
  uint64_t DeadlineOf(uint32_t id) const;

 private:
  struct Cep {
    uint32_t local_id = 0, remote_id = 0;
    CmState state = CmState::Idle;
    bool passive = false;
    bool destroyed = false;  // the consumer let go: no events; erased once Idle
    bool established_reported = false;
    sockaddr_storage peer{};
    uint64_t remote_ca_guid = 0;
    uint32_t local_qpn = 0, remote_qpn = 0;
    uint64_t tid = 0;             // of the REQ exchange (REP, RTU, REJ, MRA reuse it)
    uint64_t dreq_tid = 0;        // of the peer's DREQ, which our DREP reuses
    uint32_t timeout_ms = 0;      // retransmit timeout (§3.5): the floor of the wait (AnswerWaitMs)
    uint32_t max_retries = 0;
    uint32_t transmissions = 0;   // of `outstanding`
    uint64_t sent_ms = 0, resent_ms = 0;  // `outstanding`'s first and (0: none) latest transmission
    uint64_t give_up_ms = 0;              // ... and when the exchange ends unanswered
    uint64_t deadline = UINT64_MAX;
    uint32_t mra_waits = 0;       // MRAs honoured (or, passive in REQ_RCVD, sent) this exchange
    bool peer_busy = false;       // active: an MRA answered our REQ (CmEvent::peer_busy)
    uint32_t warned = 0;          // CmLimit bits already logged for this connection
    // The REQ, REP or DREQ awaiting its answer, held only while it may be sent again (a message
    // is 272 bytes; an established connection needs none). The RTU or MRA we resend when the
    // peer repeats itself is made again from the fields above (RtuOf, SendMra).
    std::unique_ptr<wire::ib::CmMessage> outstanding;
  };

  // A peer's request as the passive CEP knows it again: its CA GUID, its communication ID and
  // the UDP address it came from (a REQ repeated from elsewhere is another request).
  struct RemoteKey {
    uint64_t ca_guid;
    uint32_t comm_id;
    sockaddr_storage from;
    bool operator==(const RemoteKey& o) const;
  };
  struct RemoteKeyHash {
    size_t operator()(const RemoteKey& k) const;
  };
  // A peer's QP: its CA GUID and QPN (the stale-connection rule).
  struct QpKeyHash {
    size_t operator()(const std::pair<uint64_t, uint32_t>& k) const;
  };
  // A peer's QP as our datagrams reach it: its port's address and its QPN.
  struct PeerQp {
    PackedAddress peer;
    uint32_t qpn;
    bool operator==(const PeerQp&) const = default;
  };

  // One handler per incoming message type.
  void OnReq(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnMra(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnRej(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnRep(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnRtu(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnDreq(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnDrep(const sockaddr_storage& from, const wire::ib::CmMessage& m);
  void OnDuplicateReq(Cep& dup);
  void OnDeadline(Cep& cep);  // may erase cep

  // Every state change: leaving the states that await an answer drops the message awaiting it.
  static bool AwaitsAnswer(CmState state);
  static void SetState(Cep& cep, CmState state);
  uint32_t NewCommId();
  uint64_t NewTid();
  Cep* Find(uint32_t id);
  const Cep* Find(uint32_t id) const;
  // The CEP a message from `from` names: `ours` is its remote_comm_id field, `theirs` its
  // local_comm_id. theirs is checked only once we know the peer's ID. Counts the drop when none
  // matches, or when the message does not come from the CEP's peer.
  Cep* Lookup(const sockaddr_storage& from, uint32_t ours, uint32_t theirs);
  Cep* FindByRemote(uint64_t ca_guid, uint32_t remote_id, const sockaddr_storage& from);
  bool FromPeer(const Cep& cep, const sockaddr_storage& from);  // counts and warns if not
  // The peer's QP is now bound to this CEP (ESTABLISHED or TIMEWAIT): the stale rule finds it,
  // and so does an ICMP error about our RC packets to it (ConnectionTo).
  void IndexQp(const Cep& cep);

  // Validation: false if the REQ is refused (a REJ was sent). Clamps `req` to our limits.
  bool CheckReq(const sockaddr_storage& from, wire::ib::CmMessage& m);
  void ClampReadLimits(Cep& cep, uint8_t& responder_resources, uint8_t& initiator_depth);
  void ClampRnrRetry(Cep& cep, uint8_t& rnr_retry_count);
  // A peer ran into `limit`: counted; a Warn line names the peer (once per CEP and kind).
  void Limit(CmLimit limit, Cep* cep, const sockaddr_storage& peer, const char* detail);

  void Send(const sockaddr_storage& to, wire::ib::CmMessage m);
  void SendOutstanding(Cep& cep, wire::ib::CmMessage m);  // first transmission, timer armed
  // How long `outstanding` first waits for its answer: the CEP's timeout, stretched while answers
  // are measured to take longer (NoteAnswer). The exchange's budget is 1 + retries such waits,
  // within which each repeat waits twice as long as the one before.
  uint64_t AnswerWaitMs(const Cep& cep) const;
  // The peer answered `outstanding` (an answer after an MRA is no sample: it includes the
  // service time the peer asked for).
  void NoteAnswer(const Cep& cep);
  void SendRej(Cep& cep, wire::ib::RejReason reason, wire::ib::RejectedMessage which,
               std::span<const uint8_t> private_data = {});
  void SendDreq(Cep& cep, std::span<const uint8_t> private_data = {});
  void SendDrep(const sockaddr_storage& to, uint32_t local_id, uint32_t remote_id, uint64_t tid,
                std::span<const uint8_t> private_data = {});
  enum MraFor : uint8_t { kMraForReq = 0, kMraForRep = 1 };  // the MRA's Message MRAed
  void SendMra(Cep& cep, MraFor what);
  // An MRA for a REQ we keep no CEP for (PostponeRequest): local comm ID 0, service timeout our
  // response timeout.
  void SendPostpone(const sockaddr_storage& to, uint64_t tid, uint32_t remote_id);
  static wire::ib::CmMessage RtuOf(const Cep& cep);
  void RejectReq(const sockaddr_storage& to, const wire::ib::CmMessage& req,
                 wire::ib::RejReason reason);  // a REQ we gave no CEP
  // A REJ (invalid communication ID) built from a REP that names no live connection of ours.
  void RejectStaleRep(const sockaddr_storage& to, const wire::ib::CmMessage& rep);
  void Arm(Cep& cep, uint64_t deadline);
  void Disarm(Cep& cep);
  void EnterTimewait(Cep& cep);
  void EnterIdle(Cep& cep);  // erases a destroyed CEP
  int32_t DropRequest(uint32_t id, bool refuse);  // RefuseRequest, PostponeRequest
  void Erase(Cep& cep);
  void ReportEstablished(Cep& cep, const wire::ib::CmMessage* rtu);
  void Emit(const Cep& cep, CmEventKind kind, const wire::ib::CmMessage* msg = nullptr,
            uint16_t reason = 0);
  void Drop(CmDrop reason) { counters_.drops[size_t(reason)]++; }

  CmEnv& env_;
  CmConfig config_;
  uint8_t response_timeout_ = 0;  // config_.response_timeout_ms as an IB time value
  uint8_t mra_timeout_ = 0;       // config_.mra_timeout_ms as an IB time value
  // How long this port's peers take to answer (ack_wait.h's rule): under load, queues of seconds
  // hold every answer past a fixed timeout, and repeats at that timeout multiplied the load that
  // delayed them (Microsoft's ndconn on RoCE: a million CM retransmissions a minute).
  AckWait answer_wait_;
  uint32_t id_counter_ = 0;  // communication IDs made (NewCommId permutes it)
  uint64_t next_tid_ = 0;
  base::PooledHashMap<uint32_t, Cep, base::KeyedHasher> ceps_;
  base::PooledHashMap<RemoteKey, uint32_t, RemoteKeyHash> by_remote_;  // passive CEPs
  base::PooledHashMap<std::pair<uint64_t, uint32_t>, uint32_t, QpKeyHash> by_qp_;
  base::PooledHashMap<PeerQp, uint32_t, base::KeyedHasher> by_peer_qp_;
  static constexpr uint64_t kProbeQuietMs = 2000;  // the shortest keepalive interval
  static constexpr size_t kMaxProbedPeers = 64;
  base::PooledHashMap<PackedAddress, uint64_t, base::KeyedHasher> probed_peers_;  // -> when
  base::PooledHashSet<uint64_t> services_;
  base::PooledSet<std::pair<uint64_t, uint32_t>> deadlines_;  // (deadline, local id)
  base::LazyDeque<CmEvent> events_;
  CmCounters counters_;
  base::LogRateLimit warn_limits_[size_t(CmLimit::Count)], warn_wrong_source_;
};

}  // namespace ndwv::dev::roce
