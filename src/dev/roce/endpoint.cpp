#include "dev/roce/endpoint.h"

#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <utility>

#include <ndwv/wvstatus.h>

#include "base/fork.h"
#include "base/log.h"
#include "base/object_pool.h"
#include "base/settings.h"
#include "dev/address.h"
#include "dev/counters.h"
#include "wire/ib_cm.h"

namespace ndwv::dev::roce {

using namespace ndwv::wire::ib;
using base::Config;

namespace {

// Set while deferred work retries a receive-path callback (Endpoint::LockOrRetry).
thread_local bool t_retrying = false;

struct Retry final : WorkItem {
  std::function<void()> again;
  static void Run(WorkItem* item) {
    std::unique_ptr<Retry> retry(static_cast<Retry*>(item));
    t_retrying = true;
    retry->again();
    t_retrying = false;
  }
};

uint32_t RandomPsn() {
  static thread_local std::minstd_rand random{std::random_device{}()};
  return uint32_t(random()) & kPsnMask;
}

// The IB path MTU code for a route of `ip_mtu` bytes: the largest whose packets, IP + UDP + BTH +
// RETH + payload + ICRC, fit without fragmentation.
uint8_t MtuCodeFor(int family, int ip_mtu) {
  size_t overhead = (family == AF_INET ? 20 : 40) + 8 + kBthLen + kRethLen + kIcrcLen;
  for (uint8_t code = 5; code > 1; --code)
    if (MtuBytes(code) + overhead <= size_t(ip_mtu)) return code;
  return 1;
}

// The code a route whose IP MTU is unknown is taken to have: 1024 bytes, which every IP path of
// RoCEv2 carries.
constexpr uint8_t kUnknownRouteMtuCode = 3;

// The route to `peer`, asked of a socket of its own: 0 and the IB path MTU code, or the errno of
// a host with no route there (ENETUNREACH...).
int ProbeRoute(const sockaddr_storage& peer, uint8_t* mtu_code) {
  int fd = base::OpenSocket(peer.ss_family, SOCK_DGRAM | SOCK_CLOEXEC);
  if (fd < 0) return errno;
  int ip_mtu = 1500, error = 0;
  socklen_t len = sizeof ip_mtu;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&peer), AddressLength(peer)) != 0)
    error = errno;
  else if (getsockopt(fd, peer.ss_family == AF_INET ? IPPROTO_IP : IPPROTO_IPV6,
                      peer.ss_family == AF_INET ? IP_MTU : IPV6_MTU, &ip_mtu, &len) != 0)
    ip_mtu = 1500;
  base::CloseDescriptor(fd);
  *mtu_code = MtuCodeFor(peer.ss_family, ip_mtu);
  return error;
}

// The largest IB MTU code for the route to `peer` in *code: found in `recent` (a shared port's),
// or asked of `connected`, a port's socket connected to `peer`, when there is one (else of a
// probe socket). 0, or the probe's errno for a host with no route there (ENETUNREACH...).
int FindPathMtu(const sockaddr_storage& peer, const Port* connected, RecentRoutes* recent, uint8_t* code) {
  if (recent)
    if (std::optional<uint8_t> known = recent->Find(peer)) {
      *code = *known;
      return 0;
    }
  if (int ip_mtu = connected ? connected->RouteMtu() : 0)
    *code = MtuCodeFor(peer.ss_family, ip_mtu);
  else if (int error = ProbeRoute(peer, code))
    return error;
  if (recent) recent->Remember(peer, *code);
  return 0;
}

ConnectParams PeerParams(uint8_t ird, uint8_t ord, const uint8_t* data) {
  // IB private data has no length: the peer's data comes padded to the ND maximum.
  ConnectParams p;
  p.ird = ird;
  p.ord = ord;
  p.data_length = kMaxPrivateData;
  memcpy(p.data, data, kMaxPrivateData);
  return p;
}

}  // namespace

std::shared_ptr<ConnectEndpoint> CreateEndpoint() { return base::MakePooled<Endpoint>(); }

Endpoint::Endpoint() = default;

Endpoint::~Endpoint() = default;

const char* Endpoint::ToString(State s) {
  static const char* const names[] = {"Idle", "Bound", "Listening", "Connecting", "Replied",
                                      "Requested", "Accepting", "Connected", "LinkFailed",
                                      "PeerClosing",      "Settling",      "Disconnecting", "PeerDisconnected", "Disconnected", "Closed"};
  return names[int(s)];
}

std::string Endpoint::Identity() const {
  mutex_.AssertHeld();
  char id[16];
  snprintf(id, sizeof id, "%08x", comm_id_);
  return "roce cm qp " + std::to_string(qpn_) + " [" + Describe(local_) + " -> " + Describe(peer_) +
         (peer_qpn_ ? " qp " + std::to_string(peer_qpn_) : std::string()) + " id " + id + "]";
}

void Endpoint::SetState(State s) {
  mutex_.AssertHeld();
  NDWV_LOG(Debug, "%s: %s -> %s", Identity().c_str(), ToString(state_), ToString(s));
  if (!kTransitions.Allows(state_, s)) ReportIllegalTransition(Transport::Roce, Identity(), ToString(state_), ToString(s));
  state_ = s;
}

// ------------------------------------------------------------------------------ addressing

int32_t Endpoint::Bind(const sockaddr* address, socklen_t length) {
  base::MutexLock lock(mutex_);
  if (state_ != State::Idle) return WV_ADDRESS_ALREADY_ASSOCIATED;
  if (!address || (address->sa_family != AF_INET && address->sa_family != AF_INET6)) return WV_INVALID_ADDRESS;
  socklen_t need = address->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (length < need) return WV_INVALID_PARAMETER;
  sockaddr_storage local{};
  memcpy(&local, address, need);
  // Port 0: a port the process's connectors on this address share (NDWV_ROCE_PORT's, or the one
  // whose turn it is of those the kernel picked), as a NIC's port serves all its connections; a
  // given port: one of our own.
  bool shared = PortOf(local) == 0;
  if (shared) SetPort(local, Config().roce_port);
  int32_t status;
  port_ = Port::Open(local, shared, &status);
  if (!port_) return status;
  exclusive_port_ = !shared;
  local_ = port_->local();
  SetState(State::Bound);
  return WV_SUCCESS;
}

// ------------------------------------------------------------------------------- listening

void Endpoint::SetProtocol(uint8_t protocol) {
  base::MutexLock lock(mutex_);
  protocol_ = protocol;
}

int32_t Endpoint::Listen(int backlog) {
  base::MutexLock lock(mutex_);
  if (state_ != State::Bound) return WV_INVALID_DEVICE_STATE;
  if (!exclusive_port_ && Config().roce_port == 0) {
    // Bound to port 0, the connectors' port: a listener takes one of its own, as a TCP listener
    // does (two would otherwise share one service ID). Its address is asked only from here on.
    sockaddr_storage local = local_;
    SetPort(local, 0);
    int32_t status;
    std::shared_ptr<Port> own = Port::Open(local, false, &status);
    if (!own) return status;
    port_ = std::move(own);
    local_ = port_->local();
  }
  exclusive_port_ = false;  // the port takes requests from anyone
  backlog_ = ListenBound(backlog);
  wait_beyond_backlog_ = backlog == 0;
  service_id_ = IpServiceId(protocol_, PortOf(local_));
  int32_t status = port_->AddListener(service_id_, weak_from_this());
  if (status != WV_SUCCESS) return status;
  SetState(State::Listening);
  return WV_SUCCESS;
}

void Endpoint::OnRequest(const CmEvent& event) {
  mutex_.AssertHeld();
  // Under mutex_ (listener). Beyond the backlog a request is refused (CmAgent::RefuseRequest
  // says why), or with no limit asked postponed: its sender repeats it (ConnectEndpoint::Listen).
  if (int(requests_.queued()) >= backlog_) {
    const bool wait = wait_beyond_backlog_;  // for the lambda: the analysis does not see our lock inside it
    port_->Cm([&](CmAgent& agent) { return wait ? agent.PostponeRequest(event.id) : agent.RefuseRequest(event.id); });
    return;
  }
  // The request becomes an endpoint of its own until a GetRequest target adopts it; its CM
  // events go to whoever holds it.
  const CmReq& req = event.msg.req;
  auto child = base::MakePooled<Endpoint>();
  {
    // Fresh, and not yet known to anyone, but its fields are its lock's (listener, then child).
    base::MutexLock child_lock(child->mutex_);
    child->port_ = port_;
    child->local_ = port_->AddressFor(event.peer);  // a wildcard listener's: the address the peer reached
    child->comm_id_ = event.id;
    child->offer_ = {req.starting_psn, req.responder_resources, req.rnr_retry_count, req.path_mtu};
    child->peer_qpn_ = req.local_qpn;
    // The peer is where the REQ came from. The RDMA-CM IP header's source is the sender's claim
    // (an honest one differs behind a NAT): a mismatch is counted and logged, not refused.
    child->peer_port_ = event.peer;
    child->peer_ = event.peer;
    IpHeader ip;
    if (DecodeIpHeader({req.private_data, kIpHeaderLen}, ip) && !SameAddress(ip.source, event.peer)) {
      AdapterCounters(Transport::Roce).AddShared(Counter::CmPeerAddressMismatches);
      static base::LogRateLimit warnings;
      if (warnings.Allow(port_->NowMs()))
        NDWV_LOG(Warn, "roce cm id %08x: a REQ from %s claims to come from %s (the peer is where it came from)",
                 event.id, Describe(event.peer).c_str(), Describe(ip.source).c_str());
    }
    child->peer_params_ = PeerParams(req.responder_resources, req.initiator_depth, req.private_data + kIpHeaderLen);
    child->listener_ = weak_from_this();
    child->SetState(State::Requested);
  }
  port_->AddUser(event.id, child);
  Finisher finish;  // completes under our lock: its owner does not call back into the listener
  requests_.Arrive(std::move(child), finish);
}

void Endpoint::RequestGone() {
  std::shared_ptr<Endpoint> listener;
  {
    base::MutexLock lock(mutex_);
    if (state_ == State::Requested) listener = listener_.lock();
  }
  if (!listener) return;  // taken by a GetRequest: its Accept will find it gone
  listener->Withdraw(this);
  Close();  // the CEP is erased
}

void Endpoint::Withdraw(const Endpoint* request) {
  base::MutexLock lock(mutex_);
  requests_.Withdraw(request);
}

void Endpoint::Adopt(Endpoint& child) {
  // The target's lock, then the child's (the listener's is held: endpoint.h). The child may be
  // handling a CM event meanwhile.
  base::MutexLock lock(mutex_);
  base::MutexLock child_lock(child.mutex_);
  port_ = child.port_;  // a target that was bound gives its own port up
  exclusive_port_ = false;
  local_ = child.local_;
  comm_id_ = child.comm_id_;
  offer_ = child.offer_;
  peer_qpn_ = child.peer_qpn_;
  peer_ = child.peer_;
  peer_port_ = child.peer_port_;
  peer_params_ = child.peer_params_;
  child.comm_id_ = 0;
  child.SetState(State::Closed);
  port_->AddUser(comm_id_, weak_from_this());
  SetState(State::Requested);
}

// ----------------------------------------------------------------------------- connecting

// The calls handed to Port::Cm take comm_id_ by value: the thread-safety analysis does not see
// mutex_ held inside a lambda.

RcParams Endpoint::BaseLinkParams() const {
  mutex_.AssertHeld();
  RcParams p;
  p.peer = peer_port_;
  p.local = local_;
  p.mtu = mtu_;
  p.ack_timeout_ms = Config().roce_ack_timeout_ms;
  p.retry_count = Config().roce_retry_count;
  p.rnr_timer = Config().roce_rnr_timer;
  p.keepalive_ms = Config().roce_keepalive_ms;
  return p;
}

bool Endpoint::StartLink(const RcParams& params, std::shared_ptr<Port> data_port) {
  mutex_.AssertHeld();
  link_ = base::MakePooled<RcLink>(data_port ? std::move(data_port) : port_, qp_, params, weak_from_this());
  if (link_->Start()) return true;
  link_.reset();  // the QP failed (Flush) while its connection was being set up
  return false;
}

int32_t Endpoint::Connect(std::shared_ptr<QueuePair> qp, const sockaddr* peer, socklen_t length,
                          const ConnectParams& params, AsyncOp* op) {
  base::MutexLock lock(mutex_);
  if (!FreeLocked()) return WV_CONNECTION_ACTIVE;
  if (!peer || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)) return WV_INVALID_ADDRESS;
  if (length < (peer->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6))) return WV_INVALID_PARAMETER;
  sockaddr_storage to{};
  memcpy(&to, peer, peer->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (state_ == State::Idle) {  // not bound: the route's source address, as Bind to port 0
    sockaddr_storage local;
    if (!RouteSource(to, &local)) return WV_HOST_UNREACHABLE;
    SetPort(local, Config().roce_port);
    int32_t status;
    port_ = Port::Open(local, true, &status);
    if (!port_) return status;
    exclusive_port_ = false;
    local_ = port_->local();
  }
  if (local_.ss_family != to.ss_family) return WV_INVALID_ADDRESS;
  if (qp->state() != QpState::Reset && qp->state() != QpState::Init) return WV_CONNECTION_ACTIVE;
  if (port_->wildcard()) local_ = port_->AddressFor(to);  // bound to every address: the one it leaves from
  // A port of our own serves this connection alone: connected to the listener's port, where the
  // CM exchange and the data all go, its socket knows the route (else a probe socket asks). On a
  // shared port, a route found within the last second serves (RecentRoutes).
  const bool connected = exclusive_port_ && port_->ConnectTo(to);
  uint8_t mtu_code;
  if (int error = FindPathMtu(to, connected ? port_.get() : nullptr,
                              exclusive_port_ ? nullptr : &port_->recent_routes(), &mtu_code))
    return error == ENETUNREACH ? WV_NETWORK_UNREACHABLE : WV_HOST_UNREACHABLE;  // as a TCP connect at once
  peer_ = to;
  peer_port_ = to;  // until the REP says where the passive side's port is
  peer_params_.reset();
  local_params_ = params;
  rq_psn_ = RandomPsn();
  mtu_ = MtuBytes(mtu_code);

  uint8_t private_data[kReqPrivateData] = {};
  IpHeader ip;
  ip.source = local_;
  ip.destination = to;
  SetPort(ip.destination, 0);
  EncodeIpHeader(ip, std::span<uint8_t, kIpHeaderLen>(private_data, kIpHeaderLen));
  memcpy(private_data + kIpHeaderLen, params.data, std::min<size_t>(params.data_length, kReqUserData));
  ConnectArgs args;
  args.service_id = IpServiceId(protocol_, PortOf(to));
  args.local_qpn = qp->qpn();
  args.starting_psn = rq_psn_;
  args.ird = uint8_t(std::min<uint32_t>(params.ird, 255));
  args.ord = uint8_t(std::min<uint32_t>(params.ord, 255));
  args.path_mtu = mtu_code;
  args.retry_count = Config().roce_retry_count;
  args.rnr_retry_count = Config().roce_rnr_retry;
  args.private_data = private_data;
  qpn_ = qp->qpn();
  qp_ = std::move(qp);
  connect_op_ = op;
  SetState(State::Connecting);
  comm_id_ = port_->Connect(to, args, weak_from_this());
  if (!comm_id_) {
    connect_op_ = nullptr;
    qp_.reset();
    SetState(State::Bound);
    return WV_INSUFFICIENT_RESOURCES;
  }
  return WV_PENDING;
}

int32_t Endpoint::Accept(std::shared_ptr<QueuePair> qp, const ConnectParams& params, AsyncOp* op) {
  Finisher finish;
  base::MutexLock lock(mutex_);
  if (!qp) {  // active side: CompleteConnect
    if (state_ != State::Replied) return WV_CONNECTION_INVALID;
    int32_t status = qp_->state() == QpState::Reset ? qp_->Modify(QpState::Init) : WV_SUCCESS;
    if (status == WV_SUCCESS) status = qp_->Modify(QpState::Rtr);
    if (status == WV_SUCCESS) status = qp_->Modify(QpState::Rts);
    if (status != WV_SUCCESS) return WV_CONNECTION_INVALID;
    RcParams link = BaseLinkParams();
    link.dest_qpn = peer_qpn_;
    link.sq_psn = offer_.starting_psn;  // the PSN the passive side expects
    link.rq_psn = rq_psn_;
    link.ird = local_params_.ird;  // 0: the peer may not Read from us
    link.ord = std::max<uint32_t>(std::min<uint32_t>(local_params_.ord, offer_.responder_resources), 1);
    link.rnr_retry = offer_.rnr_retry_count;
    // An own port is connected to the peer's already; on the shared port the data travels
    // through a flow to the peer's port, as an accepted connection's does.
    if (!StartLink(link, exclusive_port_ ? nullptr : Port::OpenFlow(port_, peer_port_))) return WV_CONNECTION_INVALID;
    qp_.reset();
    port_->Cm([id = comm_id_](CmAgent& agent) { return agent.SendRtu(id); });
    SetState(State::Connected);
    finish.Add(op, WV_SUCCESS);
    return WV_PENDING;
  }
  if (state_ != State::Requested) return WV_CONNECTION_INVALID;
  if (qp->state() != QpState::Reset && qp->state() != QpState::Init) return WV_CONNECTION_ACTIVE;
  // The request may have expired, or its peer given up, since it was taken.
  CmState request = port_->Cm([id = comm_id_](CmAgent& agent) { return agent.StateOf(id); });
  if (request != CmState::ReqRcvd && request != CmState::MraReqSent) return WV_CONNECTION_ABORTED;
  // The data travels through a flow to the peer's port (port.h), opened before the REP: the
  // peer's first packets follow it. Its socket is connected there: it knows the route.
  std::shared_ptr<Port> flow = Port::OpenFlow(port_, peer_port_);
  // The path MTU: the REQ's (a valid code: the CM refuses others), at most what the route takes.
  uint8_t route_mtu;
  if (FindPathMtu(peer_port_, flow.get(), &port_->recent_routes(), &route_mtu) != 0) route_mtu = kUnknownRouteMtuCode;
  mtu_ = MtuBytes(std::min<uint8_t>(offer_.path_mtu, route_mtu));
  local_params_ = params;
  if (qp->state() == QpState::Reset) qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);  // the link holds what is posted until established (Link)
  qpn_ = qp->qpn();
  qp_ = qp;
  rq_psn_ = RandomPsn();
  RcParams link = BaseLinkParams();
  link.dest_qpn = peer_qpn_;
  link.sq_psn = offer_.starting_psn;  // the PSN the active side expects
  link.probes_first = false;
  link.held_until_established = true;
  link.rq_psn = rq_psn_;
  // Our IRD covers what the requester may issue (0: no Reads); our ORD stays within what it
  // accepts (§3.9).
  link.ird = params.ird;
  link.ord = std::max<uint32_t>(std::min<uint32_t>(params.ord, offer_.responder_resources), 1);
  link.rnr_retry = offer_.rnr_retry_count;
  if (!StartLink(link, std::move(flow))) {
    qp_.reset();
    return WV_CONNECTION_ABORTED;
  }
  qp_.reset();
  uint8_t private_data[kMaxPrivateData] = {};
  memcpy(private_data, params.data, std::min<size_t>(params.data_length, kMaxPrivateData));
  AcceptArgs args;
  args.local_qpn = qp->qpn();
  args.starting_psn = rq_psn_;
  // The CM carries the consumer's limits as given (0 included); the link issues at least one
  // Read at a time (a Read posted against a limit of 0 waits rather than hangs the queue forever:
  // the peer refuses it).
  args.ird = uint8_t(std::min<uint32_t>(params.ird, 255));
  args.ord = uint8_t(std::min<uint32_t>({params.ord, offer_.responder_resources, 255}));
  args.rnr_retry_count = Config().roce_rnr_retry;
  args.private_data = private_data;
  int32_t status = port_->Cm([&, id = comm_id_](CmAgent& agent) { return agent.Accept(id, args); });
  if (status != WV_SUCCESS) {
    qp->Modify(QpState::Error);
    SetState(State::Disconnected);
    return WV_CONNECTION_ABORTED;
  }
  accept_op_ = op;
  SetState(State::Accepting);
  return WV_PENDING;
}

int32_t Endpoint::Reject(const void* data, size_t length) {
  base::MutexLock lock(mutex_);
  if (length > kMaxPrivateData) return WV_INVALID_BUFFER_SIZE;
  if (state_ != State::Requested && state_ != State::Replied) return WV_CONNECTION_INVALID;
  uint8_t private_data[kMaxPrivateData] = {};
  if (length) memcpy(private_data, data, length);
  port_->Cm([&, id = comm_id_](CmAgent& agent) { return agent.Reject(id, private_data); });
  qp_.reset();
  SetState(State::Closed);
  return WV_SUCCESS;
}

void Endpoint::OnFirstPacket() {
  // A lost RTU: the first packet on the QP establishes the connection (design-facts §6 item 8).
  if (!LockOrRetry([self = weak_from_this()] {
        if (auto endpoint = self.lock()) endpoint->OnFirstPacket();
      }))
    return;
  base::MutexLock lock(mutex_, std::adopt_lock);
  if (state_ == State::Accepting)
    port_->Cm([id = comm_id_](CmAgent& agent) { return agent.Established(id); });
}

// ------------------------------------------------------------------------------- CM events

void Endpoint::OnCmEvent(const CmEvent& event) {
  if (event.kind == CmEventKind::RequestExpired || event.kind == CmEventKind::Rejected) RequestGone();
  Finisher finish;
  base::MutexLock lock(mutex_);
  NDWV_LOG(Debug, "%s: %s (id %08x) in %s", Identity().c_str(), roce::ToString(event.kind), event.id,
           ToString(state_));
  switch (event.kind) {
    case CmEventKind::ReqReceived:
      if (state_ == State::Listening) OnRequest(event);
      return;
    case CmEventKind::RepReceived: {
      if (state_ != State::Connecting) return;
      const CmRep& rep = event.msg.rep;
      offer_ = {rep.starting_psn, rep.responder_resources, rep.rnr_retry_count};
      peer_qpn_ = rep.local_qpn;
      peer_port_ = event.peer;  // the passive side's port: the CM and the data go there now
      peer_params_ = PeerParams(rep.responder_resources, rep.initiator_depth, rep.private_data);
      SetState(State::Replied);
      finish.Add(std::exchange(connect_op_, nullptr), WV_SUCCESS);
      return;
    }
    case CmEventKind::Established:
      if (state_ != State::Accepting) return;
      SetState(State::Connected);
      Establish(finish);
      return;
    case CmEventKind::Rejected:
      if (state_ == State::Connecting) {
        peer_params_ = PeerParams(0, 0, event.msg.rej.private_data);
        FailConnect(finish, WV_CONNECTION_REFUSED);
      } else if (state_ == State::Accepting) {
        // The active side refused our REP (it Rejected, or released its connector), or its
        // Connect gave up before our REP reached it (timed out: at once, or when the REP came
        // to a CEP no longer there): the peer gave up (nd2-spi: Accept ND_CONNECTION_ABORTED;
        // Microsoft's ndconn counts that, and exits on REFUSED).
        const bool gave_up = event.reject_reason == uint16_t(RejReason::Timeout) ||
                             event.reject_reason == uint16_t(RejReason::InvalidCommId);
        SetState(State::Disconnected);
        link_->Fail();
        finish.Add(std::exchange(accept_op_, nullptr), gave_up ? WV_CONNECTION_ABORTED : WV_CONNECTION_REFUSED);
      } else if (state_ == State::Connected || state_ == State::LinkFailed || state_ == State::PeerClosing) {
        PeerDisconnected(finish);
      } else if (state_ == State::Disconnecting || state_ == State::Settling) {
        FinishDisconnect(WV_SUCCESS);
      }
      return;
    case CmEventKind::ReqTimeout:
      // A listener that asked us to wait had no room: try again (ND_TIMEOUT); silence: ND_IO_TIMEOUT.
      if (state_ != State::Connecting) return;
      NDWV_LOG(Info, "%s: connect timed out: %s", Identity().c_str(),
               event.peer_busy ? "the listener asked us to wait, and had no room" : "no answer to the REQ");
      FailConnect(finish, event.peer_busy ? WV_TIMEOUT : WV_IO_TIMEOUT);
      return;
    case CmEventKind::RepTimeout:
      if (state_ != State::Accepting) return;
      NDWV_LOG(Info, "%s: accept timed out: no RTU, nor a packet, from the peer", Identity().c_str());
      SetState(State::Disconnected);
      link_->Fail();
      finish.Add(std::exchange(accept_op_, nullptr), WV_IO_TIMEOUT);
      return;
    case CmEventKind::DreqReceived:
      if (state_ == State::Disconnecting) {  // crossing DREQs: the agent sent our DREP
        finish.AddList(notify_ops_, WV_SUCCESS);
        FinishDisconnect(WV_SUCCESS);
        return;
      }
      if (state_ == State::Settling) {  // our close, once settled, is the DREP
        if (link_) link_->FlushAcks();
        return;
      }
      if (state_ != State::Connected && state_ != State::Accepting && state_ != State::LinkFailed) return;
      if (state_ == State::Accepting) Establish(finish);  // a DREQ implies the REP arrived (the agent reported it)
      if (link_) link_->FlushAcks();
      if (state_ != State::LinkFailed && link_ && link_->SettleSent()) {
        SetState(State::PeerClosing);  // OnSentSettled or OnLinkFailed answers
        return;
      }
      AnswerDreq(finish);
      return;
    case CmEventKind::DrepReceived:
      if (state_ == State::Disconnecting) FinishDisconnect(WV_SUCCESS);
      return;
    case CmEventKind::DreqTimeout:
      if (state_ == State::Disconnecting) FinishDisconnect(WV_TIMEOUT);
      return;
    case CmEventKind::MraReceived:
    case CmEventKind::TimewaitExit:
    case CmEventKind::RequestExpired:  // a request taken but not accepted: Accept finds it gone
      return;
  }
}

void Endpoint::OnUnreachable(const Unreachable& what) {
  // ECONNREFUSED: the peer's port is closed, its process is gone (ports are per process), like a
  // TCP reset. No way to the host: a Connect fails as a TCP connect would; an established
  // connection leaves that to its retry budget (the route may come back). The port matched the
  // error to this connection; an RC request's PSN is the link's to check.
  Finisher finish;
  std::shared_ptr<RcLink> link;
  {
    if (!LockOrRetry([self = weak_from_this(), what] {
          if (auto endpoint = self.lock()) endpoint->OnUnreachable(what);
        }))
      return;
    base::MutexLock lock(mutex_, std::adopt_lock);
    const int error = what.error;
    if (error != ECONNREFUSED && state_ != State::Connecting) return;
    switch (state_) {
      case State::Connecting:  // our REQ was refused, or cannot reach the host
        FailConnect(finish, error == ECONNREFUSED   ? WV_CONNECTION_REFUSED
                            : error == ENETUNREACH ? WV_NETWORK_UNREACHABLE
                                                   : WV_HOST_UNREACHABLE);
        return;
      case State::Disconnecting:  // nobody will answer our DREQ: the connection is over
        if (!what.request_psn) FinishDisconnect(WV_SUCCESS);  // (the DREQ's own error says so)
        return;
      case State::Accepting:
      case State::Connected:
      case State::LinkFailed:
      case State::PeerClosing:
      case State::Settling:
        link = link_;  // its requests fail as if retries ran out, now rather than later
        break;
      default:
        return;
    }
  }
  if (link) link->PeerGone(what.request_psn);
}

// A port's receive path runs on the engine or on a poller lending its thread under its CQ's
// sources_mutex_, which is above this lock in the order: Accept and CompleteConnect hold this
// lock while they attach the link to its CQs (docs/architecture.md, "Locking"). A callback from
// there must not wait for this lock: it takes it if free, otherwise it runs again as deferred
// work, where no lock is held and it may wait. These events are rare (once per connection or
// fault), so the retry's allocation costs nothing that matters.
template <typename Again>
bool Endpoint::LockOrRetry(Again&& again) {
  if (t_retrying) {
    mutex_.lock();
    return true;
  }
  if (mutex_.try_lock()) return true;
  auto* retry = new Retry;
  retry->run = &Retry::Run;
  retry->again = std::forward<Again>(again);
  Engine::Get().Defer(retry);
  return false;
}

void Endpoint::OnLinkFailed() {
  // Retries ran out, or the peer is gone: the QP is in Error. NotifyDisconnect learns of it; a
  // Disconnect still closes the CM connection (the peer, if alive, must hear of it).
  Finisher finish;
  if (!LockOrRetry([self = weak_from_this()] {
        if (auto endpoint = self.lock()) endpoint->OnLinkFailed();
      }))
    return;
  base::MutexLock lock(mutex_, std::adopt_lock);
  if (CloseAfterSettleLocked(finish)) return;  // nothing more will settle; a live peer must hear of it
  if (state_ == State::Accepting) {
    finish.Add(std::exchange(accept_op_, nullptr), WV_CONNECTION_ABORTED);
  } else if (state_ != State::Connected) {
    return;
  }
  SetState(State::LinkFailed);
  finish.AddList(notify_ops_, WV_SUCCESS);
}

void Endpoint::ProbePeer() {
  std::shared_ptr<RcLink> link;
  {
    // From another connection's report, on a port's receive path or a timer.
    if (!LockOrRetry([self = weak_from_this()] {
          if (auto endpoint = self.lock()) endpoint->ProbePeer();
        }))
      return;
    base::MutexLock lock(mutex_, std::adopt_lock);
    if (state_ == State::Connected) link = link_;
  }
  if (link) link->ProbeNow();
}

void Endpoint::OnSentSettled() {
  Finisher finish;
  if (!LockOrRetry([self = weak_from_this()] {
        if (auto endpoint = self.lock()) endpoint->OnSentSettled();
      }))
    return;
  base::MutexLock lock(mutex_, std::adopt_lock);
  CloseAfterSettleLocked(finish);
}

bool Endpoint::CloseAfterSettleLocked(Finisher& finish) {
  mutex_.AssertHeld();
  if (state_ == State::PeerClosing) AnswerDreq(finish);
  else if (state_ == State::Settling) SendCloseLocked();
  else return false;
  return true;
}

// -------------------------------------------------------------------------------- teardown

void Endpoint::Establish(Finisher& finish) {
  mutex_.AssertHeld();
  if (link_) link_->Established();
  finish.Add(std::exchange(accept_op_, nullptr), WV_SUCCESS);
}

void Endpoint::AnswerDreq(Finisher& finish) {
  mutex_.AssertHeld();
  port_->Cm([id = comm_id_](CmAgent& agent) { return agent.Disconnect(id); });  // the DREP
  PeerDisconnected(finish);
}

void Endpoint::PeerDisconnected(Finisher& finish) {
  mutex_.AssertHeld();
  // The close exchange is over (our DREP went out): flush the QP, tell NotifyDisconnect.
  SetState(State::PeerDisconnected);
  finish.AddList(notify_ops_, WV_SUCCESS);
  if (link_) link_->Fail();
}

Endpoint::Closing Endpoint::StartCloseLocked() {
  mutex_.AssertHeld();
  // What we sent is acknowledged first, as before our DREP (PeerClosing): UDP may have lost the
  // peer's ACK of our last Send, which the peer has (it answered it: the application saw the
  // answer and disconnects), and flushing it now would end it ND_CANCELED. The peer's QP answers
  // until our DREQ, so the retransmission is acknowledged. Bounded as PeerClosing is (its settle
  // goes on); a failed link has nothing to settle, a held one (Accepting) sent nothing.
  if (state_ == State::PeerClosing || (state_ == State::Connected && link_ && link_->SettleSent())) {
    SetState(State::Settling);  // OnSentSettled or OnLinkFailed goes on
    return {};
  }
  SendCloseLocked();
  return {};
}

void Endpoint::SendCloseLocked() {
  mutex_.AssertHeld();
  SetState(State::Disconnecting);
  if (link_) link_->FlushAcks();
  // While the peer's DREQ waits for our DREP, the agent's Disconnect is that DREP: the close
  // exchange ends with it (the requests still unacknowledged are flushed, as the caller asked).
  const bool await_drep = port_->Cm([id = comm_id_](CmAgent& agent) {
    const bool answering = agent.StateOf(id) == CmState::DreqRcvd;
    return agent.Disconnect(id) == WV_SUCCESS && !answering;
  });
  if (!await_drep) FinishDisconnect(WV_SUCCESS);  // nothing left to wait for (or the agent was already closing)
}

void Endpoint::FailConnect(Finisher& finish, int32_t status) {
  mutex_.AssertHeld();
  port_->Cm([id = comm_id_](CmAgent& agent) { agent.Destroy(id); });
  port_->RemoveUser(comm_id_);
  comm_id_ = 0;
  qp_.reset();
  SetState(State::Bound);  // a refused or unreachable Connect may be retried
  finish.Add(std::exchange(connect_op_, nullptr), status);
}

Endpoint::Connection Endpoint::DropConnectionLocked(std::deque<std::shared_ptr<Endpoint>>& /*children*/) {
  mutex_.AssertHeld();
  Connection connection;
  if (state_ == State::Listening) port_->RemoveListener(service_id_);
  if (comm_id_) {
    // The agent closes what is open (DREQ, or REJ) and keeps the time-wait record.
    port_->Cm([id = comm_id_](CmAgent& agent) { agent.Destroy(id); });
    port_->RemoveUser(comm_id_);
  }
  // Released while connected: the QP fails and is flushed (its link stops now).
  if (state_ == State::Connected || state_ == State::Accepting || state_ == State::LinkFailed ||
      state_ == State::PeerClosing || state_ == State::Settling)
    connection.link = link_;
  link_.reset();
  qp_.reset();
  return connection;
}

}  // namespace ndwv::dev::roce
