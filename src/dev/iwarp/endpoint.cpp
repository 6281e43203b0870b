#include "dev/iwarp/endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include <ndwv/wvstatus.h>

#include "base/fork.h"
#include "base/log.h"
#include "base/object_pool.h"
#include "base/settings.h"
#include "dev/address.h"

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;

using base::Config;

std::shared_ptr<ConnectEndpoint> CreateEndpoint() { return base::MakePooled<Endpoint>(); }

Endpoint::Endpoint() = default;

Endpoint::~Endpoint() { CloseSocket(); }

const char* Endpoint::ToString(State s) {
  static const char* const names[] = {"Idle", "Bound", "Listening", "ActiveConnecting", "ActiveMpaSent",
                                      "ActiveReplied", "PassiveHandshake", "PassiveRequest",
                                      "PassiveAccepting", "Connected", "ActiveDisconnect",
                                      "PassiveDisconnect", "Disconnected", "Closed"};
  return names[int(s)];
}

std::string Endpoint::Identity() const {
  mutex_.AssertHeld();
  return "iwarp cm qp " + std::to_string(qpn_) + " [" + Describe(local_) + " -> " + Describe(peer_) + "]";
}

void Endpoint::SetState(State s) {
  mutex_.AssertHeld();
  NDWV_LOG(Debug, "%s: %s -> %s", Identity().c_str(), ToString(state_), ToString(s));
  if (!kTransitions.Allows(state_, s)) ReportIllegalTransition(Transport::Iwarp, Identity(), ToString(state_), ToString(s));
  state_ = s;
}

void Endpoint::CloseSocket() {
  if (fd_ < 0) return;
  if (!accepted_) ReleaseTcpPort(fd_);
  if (std::exchange(watching_, false)) Engine::Get().CloseWatched(fd_);
  else base::CloseDescriptor(fd_);
  fd_ = -1;
  capture_.reset();
}

// ---------------------------------------------------------------------------- timers

void Endpoint::ArmTimer(uint32_t ms) {
  timer_.Arm(shared_from_this(), std::chrono::milliseconds(ms));
}

void Endpoint::DisarmTimer() {
  timer_.Disarm();
}

void Endpoint::OnTimer(Timer* timer) {
  Endpoint* self = EndpointTimer::OwnerOf(timer);
  std::shared_ptr<Endpoint> keep;  // released last, after the requests completed
  Finisher finish;
  std::shared_ptr<Stream> abort;
  {
    base::MutexLock lock(self->mutex_);
    keep = self->timer_.TakeFiring();
    if (keep) abort = self->HandleTimeoutLocked(finish);  // keep is self: the lock names self
  }
  if (abort) abort->Abort();
}

std::shared_ptr<Stream> Endpoint::HandleTimeoutLocked(Finisher& finish) {
  mutex_.AssertHeld();
  switch (state_) {
    case State::ActiveConnecting:
    case State::ActiveMpaSent:
      NDWV_LOG(Info, "%s: connect timed out", Identity().c_str());
      CloseSocket();
      SetState(State::Bound);
      finish.Add(std::exchange(connect_op_, nullptr), WV_IO_TIMEOUT);
      qp_.reset();
      break;
    case State::PassiveAccepting:
      NDWV_LOG(Info, "%s: accept timed out: no RTR from the peer (%s)", Identity().c_str(),
               stream_->ReceiveState().c_str());
      SetState(State::Disconnected);
      finish.Add(std::exchange(accept_op_, nullptr), WV_IO_TIMEOUT);
      return stream_;
    case State::ActiveDisconnect:
      NDWV_LOG(Info, "%s: peer did not close in time", Identity().c_str());
      FinishDisconnect(WV_TIMEOUT);
      break;
    case State::Listening:
      if (accept_paused_ && Clock::now() >= accept_resume_) {  // RefusePending: watch the queue again
        accept_paused_ = false;
        WatchListenLocked();
      }
      ExpireLocked();
      BacklogSlotFreedLocked();
      ArmListenTimerLocked();
      break;
    default:
      break;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------- addresses

namespace {

// One descriptor held in reserve for a listener in a process out of descriptors: given up for a
// moment, it lets the listener take the pending connection off its queue and close it. Opened at
// the first Listen (when descriptors are surely available); used on the engine thread only.
int OpenSpare() { return base::OpenDescriptor([] { return open("/dev/null", O_RDONLY | O_CLOEXEC); }); }
int& SpareDescriptor() {
  static int spare = OpenSpare();
  return spare;
}

}  // namespace

// Never later than 2 s, and the default timeout is 10 s: connections that went quiet together
// (set up, or answered, in one burst) probe together, each probe and its answer a packet, and on
// one host such a burst can overflow the CPU's input backlog (net.core.netdev_max_backlog, 1,000
// packets), which drops the rest. Past ~2 s the kernel's timer wheel rounds deadlines to a
// quarter second, not 32 ms, and the bursts grow eightfold. The timeout leaves room for retries
// in the seconds between bursts: with 5 s a probe lost at 2 s had two (3 s, and 4 s with the next
// burst), and 474-523 of 10,000 idle connections were ended as dead in 2 of 14 runs
// (bench/README.md, "Keepalive bursts").
int KeepaliveIdleSeconds(unsigned timeout_ms) { return timeout_ms < 4000 ? 1 : 2; }

void TuneConnectionSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  unsigned timeout = Config().iwarp_timeout_ms;
  if (timeout == 0) return;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout);
  // An idle connection is probed after KeepaliveIdleSeconds of silence, then every second while
  // unanswered. No TCP_KEEPCNT: with TCP_USER_TIMEOUT set, the kernel ends a connection whose
  // probes go unanswered by that timeout, not by a count of probes (tcp(7)), and a system call
  // per connection is saved.
  int idle = KeepaliveIdleSeconds(timeout), interval = 1;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
}

int32_t Endpoint::OpenSocket(int family) {
  mutex_.AssertHeld();
  fd_ = base::OpenSocket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd_ < 0) return WV_INSUFFICIENT_RESOURCES;
  TuneConnectionSocket(fd_);
  int32_t status = BindTcpPort(fd_, local_, port_claim_);
  if (status != WV_SUCCESS) CloseSocket();
  return status;
}

int32_t Endpoint::Bind(const sockaddr* address, socklen_t length) {
  base::MutexLock lock(mutex_);
  if (bound_ || state_ != State::Idle) return WV_ADDRESS_ALREADY_ASSOCIATED;
  if (!address || (address->sa_family != AF_INET && address->sa_family != AF_INET6)) return WV_INVALID_ADDRESS;
  socklen_t need = address->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (length < need) return WV_INVALID_PARAMETER;
  memcpy(&local_, address, need);
  local_len_ = need;
  ephemeral_ = PortOf(local_) == 0;
  int32_t status = OpenSocket(address->sa_family);
  if (status != WV_SUCCESS) return status;
  bound_ = true;
  SetState(State::Bound);
  return WV_SUCCESS;
}

// ---------------------------------------------------------------------------- listening

int32_t Endpoint::Listen(int backlog) {
  base::MutexLock lock(mutex_);
  if (state_ == State::Listening) return WV_INVALID_DEVICE_STATE;
  if (state_ != State::Bound) return WV_INVALID_DEVICE_STATE;
  backlog_ = ListenBound(backlog);
  wait_beyond_backlog_ = backlog == 0;
  // Accepted connections inherit SO_REUSEADDR: their TIME_WAIT never keeps a later listener off
  // the port, however this process ends (an explicit port's socket has it already).
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen(fd_, backlog_) != 0) {
    if (errno != EADDRINUSE) return WV_INSUFFICIENT_RESOURCES;
    return ephemeral_ ? WV_TOO_MANY_ADDRESSES : WV_SHARING_VIOLATION;
  }
  if (ephemeral_) {  // the kernel chose the port just now
    local_len_ = sizeof local_;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&local_), &local_len_);
  }
  SpareDescriptor();  // reserved now, while descriptors are available
  SetState(State::Listening);
  watching_ = true;
  Engine::Get().Watch(fd_, EPOLLIN, weak_from_this());
  return WV_SUCCESS;
}

void Endpoint::OnListenReady(Finisher& finish) {
  mutex_.AssertHeld();
  const int listen_fd = fd_;  // for the lambda: the analysis does not see our lock inside it
  for (;;) {
    if (wait_beyond_backlog_ && BacklogFullLocked()) {
      // No limit was asked: what comes now waits in the kernel's queue, its connect unanswered
      // (TCP repeats it), until a request leaves ours (BacklogSlotFreedLocked).
      AdapterCounters(Transport::Iwarp).AddShared(Counter::ListenBacklogWaits);
      backlog_paused_ = true;
      WatchListenLocked();
      break;
    }
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = base::OpenDescriptor([&] {
      return accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    });
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;  // the latter: that peer gave up
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) RefusePending();
      break;
    }
    if (BacklogFullLocked()) {
      // Counted first: whoever sees the connection end sees the count.
      AdapterCounters(Transport::Iwarp).AddShared(Counter::ListenBacklogFull);
      NDWV_LOG(Warn, "%s: backlog of %d full: connection from %s refused", Identity().c_str(), backlog_,
               Describe(peer).c_str());
      base::CloseDescriptor(fd);  // the peer's Connect is refused
      continue;
    }
    // A reserve lost to another thread while out of descriptors (RefusePending) is taken again.
    if (int& spare = SpareDescriptor(); spare < 0) spare = OpenSpare();
    auto child = base::MakePooled<Endpoint>();
    base::UniqueLock lock(child->mutex_);
    child->fd_ = fd;
    child->capture_ = base::TcpCapture::Start(fd);
    child->peer_ = peer;
    child->peer_len_ = len;
    // A listener bound to an address accepts on it; on a wildcard, the peer chose which.
    child->local_ = local_;
    child->local_len_ = local_len_;
    if (IsWildcard(local_)) {
      child->local_len_ = sizeof child->local_;
      getsockname(fd, reinterpret_cast<sockaddr*>(&child->local_), &child->local_len_);
    }
    child->listener_ = weak_from_this();
    child->accepted_ = true;
    child->SetState(State::PassiveHandshake);
    child->local_params_ = local_params_;
    child->StartReadingMpa(MpaKind::Request);
    // A near peer's request is here already (its Connect sends it right after the TCP
    // handshake): read at once, a request that came whole is never watched for.
    const Handshake read = child->ReadRequest();
    if (read == Handshake::Pending) {
      child->watching_ = true;
      child->listed_in_ = ListedIn::Handshakes;
      child->listed_since_ = Clock::now();
      child->listed_at_ = handshaking_.insert(handshaking_.end(), child);
      Engine::Get().Watch(fd, EPOLLIN | EPOLLRDHUP, child);
    } else if (read == Handshake::Request) {
      lock.unlock();  // a GetRequest's target locks itself, then the child (Adopt)
      RequestArrivedLocked(child, finish);
    }
    // One connection per event: the listener's watch is level-triggered, so the engine's next
    // look reports any other, where accepting until EAGAIN cost a failed accept4 per event.
    break;
  }
  ArmListenTimerLocked();
}

bool Endpoint::BacklogFullLocked() const {
  mutex_.AssertHeld();
  return handshaking_.size() + requests_.queued() >= size_t(backlog_);
}

void Endpoint::WatchListenLocked() {
  mutex_.AssertHeld();
  if (fd_ >= 0 && watching_ && state_ == State::Listening)
    Engine::Get().Modify(fd_, accept_paused_ || backlog_paused_ ? 0u : uint32_t(EPOLLIN));
}

void Endpoint::BacklogSlotFreedLocked() {
  mutex_.AssertHeld();
  if (!backlog_paused_ || BacklogFullLocked()) return;
  backlog_paused_ = false;
  WatchListenLocked();
}

void Endpoint::ExpireLocked() {
  mutex_.AssertHeld();
  const auto now = Clock::now();
  const auto lifetime = std::chrono::milliseconds(Config().cm_timeout_ms);
  while (!handshaking_.empty() && handshaking_.front()->listed_since_ + lifetime <= now) {
    std::shared_ptr<Endpoint> child = std::move(handshaking_.front());
    handshaking_.pop_front();
    base::MutexLock lock(child->mutex_);
    child->listed_in_ = ListedIn::Nothing;
    AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestTimeouts);
    NDWV_LOG(Warn, "%s: no MPA Request within %u ms: connection closed", child->Identity().c_str(),
             Config().cm_timeout_ms);
    child->CloseSocket();
    child->SetState(State::Closed);
  }
  for (const std::shared_ptr<Endpoint>* oldest; (oldest = requests_.Oldest()) && (*oldest)->listed_since_ + lifetime <= now;) {
    std::shared_ptr<Endpoint> child = *oldest;
    requests_.Remove(child->listed_at_);
    base::MutexLock lock(child->mutex_);
    child->listed_in_ = ListedIn::Nothing;
    AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestsExpired);
    NDWV_LOG(Warn, "%s: connection request not taken (GetConnectionRequest) within %u ms: rejected",
             child->Identity().c_str(), Config().cm_timeout_ms);
    child->RefuseRequest(nullptr, 0);
  }
}

void Endpoint::ArmListenTimerLocked() {
  mutex_.AssertHeld();
  const auto lifetime = std::chrono::milliseconds(Config().cm_timeout_ms);
  auto next = Clock::time_point::max();
  if (!handshaking_.empty()) next = handshaking_.front()->listed_since_ + lifetime;
  if (const std::shared_ptr<Endpoint>* oldest = requests_.Oldest()) next = std::min(next, (*oldest)->listed_since_ + lifetime);
  if (accept_paused_) next = std::min(next, accept_resume_);
  if (next == Clock::time_point::max()) return;  // an armed timer finds nothing to do
  auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now());
  ArmTimer(uint32_t(std::max<int64_t>(0, wait.count())));
}

void Endpoint::RefusePending() {
  mutex_.AssertHeld();
  // The queue's head would keep the socket readable: the engine would spin on it, and the peer
  // would wait for its timeout. Refused, the peer's Connect fails at once.
  int& spare = SpareDescriptor();
  int fd = -1, error = EMFILE;
  if (spare >= 0) {
    base::CloseDescriptor(spare);
    const int listen_fd = fd_;  // for the lambda: the analysis does not see our lock inside it
    fd = base::OpenDescriptor([listen_fd] { return accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC); });
    error = errno;
    base::CloseDescriptor(fd);
    spare = OpenSpare();
  }
  if (fd >= 0) {
    AdapterCounters(Transport::Iwarp).AddShared(Counter::AcceptsRefused);
    NDWV_LOG(Warn, "%s: out of descriptors: a connection was refused", Identity().c_str());
    return;
  }
  if (error == EAGAIN || error == EWOULDBLOCK) return;  // nothing was pending
  // No spare (another thread took the one just freed): look again in a moment instead of spinning.
  NDWV_LOG(Warn, "%s: out of descriptors: accepting paused", Identity().c_str());
  accept_paused_ = true;
  WatchListenLocked();
  accept_resume_ = Clock::now() + std::chrono::milliseconds(kAcceptPauseMs);
}

void Endpoint::HandshakeOver(const std::shared_ptr<Endpoint>& child, bool request) {
  Finisher finish;
  base::MutexLock lock(mutex_);
  if (child->listed_in_ == ListedIn::Handshakes) handshaking_.erase(child->listed_at_);
  child->listed_in_ = ListedIn::Nothing;
  if (request) RequestArrivedLocked(child, finish);
  BacklogSlotFreedLocked();  // a failed handshake, or a request a waiting GetRequest took
  ArmListenTimerLocked();
}

void Endpoint::RequestArrivedLocked(const std::shared_ptr<Endpoint>& child, Finisher& finish) {
  mutex_.AssertHeld();
  if (state_ == State::Listening) {  // else Close has it, and closes it
    if (auto at = requests_.Arrive(child, finish)) {
      child->listed_in_ = ListedIn::Requests;
      child->listed_at_ = *at;
      child->listed_since_ = Clock::now();
    }
  }
  // Until the application takes it, the request is watched only for its peer leaving (which
  // releases its socket at once); what the peer sends meanwhile belongs to the stream. One a
  // waiting GetRequest took at once is no longer watched (Adopt): no change to make.
  base::MutexLock child_lock(child->mutex_);
  if (child->watching_) {
    Engine::Get().Modify(child->fd_, EPOLLRDHUP);
  } else if (child->listed_in_ == ListedIn::Requests) {  // read when accepted: not watched yet
    child->watching_ = true;
    Engine::Get().Watch(child->fd_, EPOLLRDHUP, child);
  }
}

void Endpoint::RequestGone(const std::shared_ptr<Endpoint>& child) {
  base::MutexLock lock(mutex_);
  if (child->listed_in_ != ListedIn::Requests) return;  // taken by a GetRequest, or expired, meanwhile
  requests_.Remove(child->listed_at_);
  child->listed_in_ = ListedIn::Nothing;
  BacklogSlotFreedLocked();
  ArmListenTimerLocked();
  base::MutexLock child_lock(child->mutex_);
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestsAbandoned);
  NDWV_LOG(Warn, "%s: peer left before its connection request was taken: closed", child->Identity().c_str());
  child->CloseSocket();
  child->SetState(State::Closed);
}

void Endpoint::Adopt(Endpoint& child) {
  // The target's lock, then the child's (the listener's is held: endpoint.h).
  base::MutexLock lock(mutex_);
  base::MutexLock child_lock(child.mutex_);
  if (child.watching_) Engine::Get().Unwatch(child.fd_);  // queued, it was watched for its peer leaving
  child.listed_in_ = ListedIn::Nothing;  // the caller holds the listener's lock
  CloseSocket();  // a target that was bound gives its own socket and port up
  port_claim_.Drop();
  fd_ = std::exchange(child.fd_, -1);
  capture_ = std::move(child.capture_);
  watching_ = false;
  child.watching_ = false;
  local_ = child.local_;
  local_len_ = child.local_len_;
  peer_ = child.peer_;
  peer_len_ = child.peer_len_;
  peer_params_ = child.peer_params_;
  peer_crc_ = child.peer_crc_;
  bound_ = true;
  child.SetState(State::Closed);
  SetState(State::PassiveRequest);
}

// ---------------------------------------------------------------------------- MPA frames

int Endpoint::SendMpaFrame(const MpaFrame& frame) {
  mutex_.AssertHeld();
  uint8_t buffer[kMpaHeaderLen + kMpaMaxPrivateData];
  size_t length = EncodeMpaFrame(frame, buffer);
  if (!length) return EINVAL;
  // Copied for the lambdas: the analysis does not see our lock inside them.
  const int fd = fd_;
  base::TcpCapture* const capture = capture_.get();
  auto send_call = [&] { return send(fd, buffer, length, MSG_NOSIGNAL | MSG_DONTWAIT); };
  ssize_t n = capture ? capture->SendAndRecord(send_call, [&](ssize_t sent) { capture->Sent(buffer, sent); })
                      : send_call();
  if (n < 0) return errno;
  // A connected socket's empty buffer always has room for one small frame.
  return n == ssize_t(length) ? 0 : EMSGSIZE;
}

void Endpoint::StartReadingMpa(MpaKind kind) {
  mutex_.AssertHeld();
  mpa_ = base::MakePoolUnique<MpaFrameReader>();
  mpa_->Reset(kind);
}

bool Endpoint::ReadMpaFrame(MpaKind kind) {
  mutex_.AssertHeld();
  if (!mpa_) {  // taken already: an event after the frame (the caller's state changes next)
    errno = EAGAIN;
    return false;
  }
  for (;;) {
    std::span<uint8_t> space = mpa_->Space();
    ssize_t n = recv(fd_, space.data(), space.size(), MSG_DONTWAIT);
    if (capture_) [[unlikely]] capture_->Received(space.data(), n);
    if (n > 0) {
      switch (mpa_->Took(size_t(n))) {
        case MpaFrameReader::Status::More: continue;
        case MpaFrameReader::Status::Whole: return true;
        case MpaFrameReader::Status::Bad:
          NDWV_LOG(Info, "%s: bad MPA frame (%s)", Identity().c_str(), wire::ToString(mpa_->error()));
          AdapterCounters(Transport::Iwarp).AddShared(Counter::DropsBadMpa);
          errno = EPROTO;
          return false;
      }
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n == 0) errno = ECONNRESET;
    return false;
  }
}

StreamParams Endpoint::MakeStreamParams(bool passive) const {
  mutex_.AssertHeld();
  StreamParams params;
  params.crc = Config().mpa_crc || peer_crc_;
  params.confirm_writes = Config().confirm != base::Settings::Confirm::None;
  params.confirm_sends = Config().confirm == base::Settings::Confirm::All;
  params.ird = local_params_.ird;
  params.ord = std::min(local_params_.ord, peer_params_->ird);  // heard: a request or a reply came
  params.max_ulpdu = Config().mpa_max_ulpdu;
  params.expect_rtr = passive;
  params.port_released = passive;  // accepted: SO_REUSEADDR from the listener (Listen)
  return params;
}

// ---------------------------------------------------------------------------- active side

int32_t Endpoint::Connect(std::shared_ptr<QueuePair> qp, const sockaddr* peer, socklen_t length,
                          const ConnectParams& params, AsyncOp* op) {
  Finisher finish;  // a request that cannot be sent at once completes the Connect after the lock
  base::MutexLock lock(mutex_);
  if (!FreeLocked()) return WV_CONNECTION_ACTIVE;
  if (qp->state() != QpState::Reset && qp->state() != QpState::Init) return WV_CONNECTION_ACTIVE;
  if (!peer || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)) return WV_INVALID_ADDRESS;
  socklen_t need = peer->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (length < need) return WV_INVALID_PARAMETER;
  memcpy(&peer_, peer, need);
  peer_len_ = need;
  peer_params_.reset();
  if (fd_ < 0) {
    if (!bound_) {  // not bound: an ephemeral port on the address the route chooses
      local_ = {};
      local_.ss_family = peer->sa_family;
      local_len_ = need;
      ephemeral_ = true;
    }
    // A retry lets the kernel pick again: the last attempt's address pair may linger in TCP.
    if (ephemeral_) SetPort(local_, 0);
    int32_t status = OpenSocket(peer->sa_family);
    if (status != WV_SUCCESS) return status;
    bound_ = true;
  }
  local_params_ = params;
  if (connect(fd_, peer, need) != 0 && errno != EINPROGRESS) {
    int error = errno;
    CloseSocket();
    if (error == EADDRNOTAVAIL)  // no port left for this peer, or this address pair is in use
      return ephemeral_ ? WV_TOO_MANY_ADDRESSES : WV_ADDRESS_ALREADY_EXISTS;
    return error == ENETUNREACH    ? WV_NETWORK_UNREACHABLE
           : error == ECONNREFUSED ? WV_CONNECTION_REFUSED
                                   : WV_HOST_UNREACHABLE;
  }
  // The address the kernel chose (port, or source address of a wildcard bind) is fixed now.
  local_len_ = sizeof local_;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&local_), &local_len_);
  qpn_ = qp->qpn();
  qp_ = std::move(qp);
  connect_op_ = op;
  StartReadingMpa(MpaKind::Reply);
  SetState(State::ActiveConnecting);
  // To a near peer (this host) the TCP handshake is over when connect() returns: the MPA request
  // goes now, from this thread, and the engine is not woken for a writable socket. A socket still
  // connecting refuses it (EAGAIN), and the engine sends it once the socket is writable.
  const bool sent = SendMpaRequest(finish);
  if (fd_ < 0) return WV_PENDING;  // failed (refused at once): the Connect has ended
  if (!sent) ArmTimer(Config().cm_timeout_ms);
  watching_ = true;
  Engine::Get().Watch(fd_, EPOLLIN | EPOLLRDHUP | (sent ? 0u : uint32_t(EPOLLOUT)), weak_from_this());
  return WV_PENDING;
}

int32_t Endpoint::ConnectFailure(int error) {
  switch (error) {
    case ECONNREFUSED:
    case ECONNRESET:
    case EPIPE:
      return WV_CONNECTION_REFUSED;
    case ENETUNREACH:
      return WV_NETWORK_UNREACHABLE;
    default:
      return WV_HOST_UNREACHABLE;
  }
}

void Endpoint::FailConnect(Finisher& finish, int32_t status) {
  mutex_.AssertHeld();
  finish.Add(std::exchange(connect_op_, nullptr), status);
  CloseSocket();
  DisarmTimer();
  qp_.reset();
  SetState(State::Bound);  // a refused or unreachable Connect may be retried
}

void Endpoint::OnConnectReady(Finisher& finish) {
  mutex_.AssertHeld();
  int error = 0;
  socklen_t len = sizeof error;
  getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error) {
    FailConnect(finish, ConnectFailure(error));
    return;
  }
  if (!SendMpaRequest(finish) || fd_ < 0) return;  // not yet (the next EPOLLOUT), or failed
  DisarmTimer();
  Engine::Get().Modify(fd_, EPOLLIN | EPOLLRDHUP);
}

bool Endpoint::SendMpaRequest(Finisher& finish) {
  mutex_.AssertHeld();
  capture_ = base::TcpCapture::Start(fd_);  // nullptr while connecting (no peer name yet)
  MpaFrame request;
  request.reply = false;
  request.crc = Config().mpa_crc;
  request.p2p = true;
  request.rtr_write = true;
  request.ird = uint16_t(std::min<uint32_t>(local_params_.ird, kMpaIrdOrdMask));
  request.ord = uint16_t(std::min<uint32_t>(local_params_.ord, kMpaIrdOrdMask));
  request.private_data = {local_params_.data, local_params_.data_length};
  if (int error = SendMpaFrame(request)) {
    if (error == EAGAIN || error == EWOULDBLOCK) return false;
    FailConnect(finish, ConnectFailure(error));
    return true;
  }
  SetState(State::ActiveMpaSent);
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestsSent);
  // The request is with the peer: from here a Connect waits for its application's Accept or
  // Reject however long it takes (nd2-spi 14.1: not timed out for a slow Accept), as the IB CM
  // waits on MRAs. A dead peer or link still ends it: keepalives and TCP_USER_TIMEOUT
  // (NDWV_IWARP_TIMEOUT_MS) close the socket, and a released listener resets it.
  return true;
}

void Endpoint::OnMpaReply(Finisher& finish) {
  mutex_.AssertHeld();
  if (!ReadMpaFrame(MpaKind::Reply)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // Reset before any reply: nobody took the request; or the peer stopped answering.
    FailConnect(finish, errno == ETIMEDOUT ? WV_IO_TIMEOUT : WV_CONNECTION_REFUSED);
    return;
  }
  const MpaFrame& reply = mpa_->frame();
  AdapterCounters(Transport::Iwarp).AddShared(reply.reject ? Counter::MpaRejectsReceived : Counter::MpaRepliesReceived);
  peer_params_ = PeerParams(reply);
  peer_crc_ = reply.crc;
  const bool usable = Usable(reply);
  mpa_.reset();  // the frame is taken
  if (!usable) {
    // Rejected by the peer's application, or a peer we cannot talk to (markers, no RTR Write).
    FailConnect(finish, WV_CONNECTION_REFUSED);
    return;
  }
  DisarmTimer();
  // Still watched: the stream takes the watch over at CompleteConnect (Engine::Watch).
  SetState(State::ActiveReplied);
  finish.Add(std::exchange(connect_op_, nullptr), WV_SUCCESS);
}

int32_t Endpoint::Accept(std::shared_ptr<QueuePair> qp, const ConnectParams& params, AsyncOp* op) {
  Finisher finish;
  base::UniqueLock lock(mutex_);
  if (!qp) {  // active side: CompleteConnect
    if (state_ != State::ActiveReplied) return WV_CONNECTION_INVALID;
    std::shared_ptr<QueuePair> active = std::move(qp_);
    int32_t status = active->state() == QpState::Reset ? active->Modify(QpState::Init) : WV_SUCCESS;
    if (status == WV_SUCCESS) status = active->Modify(QpState::Rtr);
    if (status == WV_SUCCESS) status = active->Modify(QpState::Rts);
    if (status != WV_SUCCESS) return WV_CONNECTION_INVALID;
    stream_ = base::MakePooled<Stream>(std::exchange(fd_, -1), active, MakeStreamParams(false),
                                       weak_from_this(), std::move(capture_), &local_, &peer_);
    watching_ = false;  // the stream's from its Start
    SetState(State::Connected);
    std::shared_ptr<Stream> stream = stream_;
    lock.unlock();  // the stream reports to us: it must not find our lock held by its starter
    stream->Start();
    stream->SendRtr();
    finish.Add(op, WV_SUCCESS);
    return WV_PENDING;
  }
  if (state_ != State::PassiveRequest) return WV_CONNECTION_INVALID;
  if (qp->state() != QpState::Reset && qp->state() != QpState::Init) return WV_CONNECTION_ACTIVE;
  local_params_ = params;
  qpn_ = qp->qpn();
  MpaFrame reply;
  reply.reply = true;
  reply.crc = Config().mpa_crc || peer_crc_;
  reply.p2p = true;
  reply.rtr_write = true;
  reply.ird = uint16_t(std::min<uint32_t>(params.ird, kMpaIrdOrdMask));
  reply.ord = uint16_t(std::min<uint32_t>(params.ord, kMpaIrdOrdMask));
  reply.private_data = {params.data, params.data_length};
  if (qp->state() == QpState::Reset) qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);  // the stream holds what is posted until the RTR (Link)
  if (SendMpaFrame(reply) != 0) {
    SetState(State::Disconnected);
    qp->Modify(QpState::Error);
    return WV_CONNECTION_ABORTED;
  }
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRepliesSent);
  accept_op_ = op;
  SetState(State::PassiveAccepting);
  stream_ = base::MakePooled<Stream>(std::exchange(fd_, -1), qp, MakeStreamParams(true), weak_from_this(),
                                     std::move(capture_), &local_, &peer_);
  // A peer that never completes the connection must not hold the Accept forever.
  ArmTimer(6 * Config().cm_timeout_ms);
  std::shared_ptr<Stream> stream = stream_;
  lock.unlock();
  stream->Start();
  return WV_PENDING;
}

int32_t Endpoint::Reject(const void* data, size_t length) {
  base::MutexLock lock(mutex_);
  if (length > kMaxPrivateData) return WV_INVALID_BUFFER_SIZE;
  if (state_ == State::PassiveRequest) {
    RefuseRequest(data, length);
    return WV_SUCCESS;
  }
  if (state_ == State::ActiveReplied) {
    // No MPA message for this: the passive side's Accept sees the stream end before the RTR.
    linger abort{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
    CloseSocket();
    qp_.reset();
    SetState(State::Closed);
    return WV_SUCCESS;
  }
  return WV_CONNECTION_INVALID;
}

// ---------------------------------------------------------------------------- passive setup

void Endpoint::RefuseRequest(const void* data, size_t length) {
  mutex_.AssertHeld();
  MpaFrame reply;
  reply.reply = true;
  reply.reject = true;
  reply.crc = false;
  reply.private_data = {static_cast<const uint8_t*>(data), length};
  if (SendMpaFrame(reply) == 0) AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRejectsSent);
  shutdown(fd_, SHUT_WR);  // an accepted socket: its port is the listener's (accepted_)
  if (capture_) capture_->SentFin();
  CloseSocket();
  SetState(State::Closed);
}

Endpoint::Handshake Endpoint::ReadRequest() {
  mutex_.AssertHeld();
  if (!ReadMpaFrame(MpaKind::Request)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Handshake::Pending;
    CloseSocket();  // a malformed request or a peer that went away: nothing to answer
    SetState(State::Closed);
    mpa_.reset();
    return Handshake::Ended;
  }
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestsReceived);
  Handshake read = Handshake::Request;
  if (const MpaFrame& frame = mpa_->frame(); !Servable(frame)) {
    NDWV_LOG(Info, "%s: MPA request we cannot serve, rejected", Identity().c_str());
    RefuseRequest(nullptr, 0);
    read = Handshake::Ended;
  } else {
    peer_params_ = PeerParams(frame);
    peer_crc_ = frame.crc;
    SetState(State::PassiveRequest);  // the listener changes its watch (RequestArrivedLocked)
  }
  mpa_.reset();  // the frame is taken (or refused)
  return read;
}

void Endpoint::OnMpaRequest() {
  mutex_.AssertHeld();
  const Handshake read = ReadRequest();
  if (read == Handshake::Pending) return;
  auto listener = listener_.lock();
  if (!listener) {
    CloseSocket();
    return;
  }
  mutex_.unlock();  // the listener locks its children after itself
  listener->HandshakeOver(shared_from_this(), read == Handshake::Request);
  mutex_.lock();
}

void Endpoint::OnQueuedEvent(uint32_t events) {
  mutex_.AssertHeld();
  if (!(events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) return;
  auto listener = listener_.lock();
  if (!listener) {
    CloseSocket();
    SetState(State::Closed);
    return;
  }
  mutex_.unlock();
  listener->RequestGone(shared_from_this());
  mutex_.lock();
}

// ---------------------------------------------------------------------------- engine events

void Endpoint::OnIo(uint32_t events) {
  Finisher finish;
  base::MutexLock lock(mutex_);
  if (fd_ < 0 || !watching_) return;  // a late event for a socket we no longer watch
  switch (state_) {
    case State::Listening: OnListenReady(finish); break;
    case State::ActiveConnecting: OnConnectReady(finish); break;
    case State::ActiveMpaSent: OnMpaReply(finish); break;
    case State::PassiveHandshake: OnMpaRequest(); break;
    case State::PassiveRequest: OnQueuedEvent(events); break;
    case State::ActiveReplied:
      // The peer sent or closed before our RTR: the stream sees it when it takes the watch over
      // (epoll reports what is pending then); till then the socket leaves the set.
      Engine::Get().Modify(fd_, 0);
      break;
    default: break;
  }
}

void Endpoint::OnRtr() {
  Finisher finish;
  base::MutexLock lock(mutex_);
  if (state_ != State::PassiveAccepting) return;
  DisarmTimer();
  SetState(State::Connected);
  finish.Add(std::exchange(accept_op_, nullptr), WV_SUCCESS);
}

// The peer's close (OnPeerClosed), a stream that failed (OnStreamError) or one closed here with its
// QP (OnClosedHere): what each state makes of the end of the stream. A connection goes to
// `connected_becomes` and NotifyDisconnect completes; our own close ends with `disconnect_status`;
// a pending Accept with `accept_status`.
void Endpoint::StreamEnded(State connected_becomes, int32_t disconnect_status, int32_t accept_status) {
  Finisher finish;
  base::MutexLock lock(mutex_);
  switch (state_) {
    case State::Connected:
      SetState(connected_becomes);
      finish.AddList(notify_ops_, WV_SUCCESS);
      break;
    case State::ActiveDisconnect:
      FinishDisconnect(disconnect_status);
      break;
    case State::PassiveAccepting:
      NDWV_LOG(Info, "%s: accept ended before the RTR: %s", Identity().c_str(),
               accept_status == WV_IO_TIMEOUT            ? "the peer stopped answering"
               : accept_status == WV_CONNECTION_REFUSED ? "the peer closed or reset the connection"
                                                        : "closed here");
      DisarmTimer();
      SetState(State::Disconnected);
      finish.Add(std::exchange(accept_op_, nullptr), accept_status);
      break;
    default:
      break;
  }
}

// The peer's close answers ours (or crossed it); before CompleteConnect, the active side gave up.
void Endpoint::OnPeerClosed() { StreamEnded(State::PassiveDisconnect, WV_SUCCESS, WV_CONNECTION_REFUSED); }

// A reset ends our close, a dead peer never answered it. Before the RTR, TCP giving up on an
// unanswered peer (a cut link, a dead host) means the connection never completed, as the Accept's
// own timer would say (nd2-spi 14.1: ND_IO_TIMEOUT); a reset is the active side dropping the
// connection: refused, as when it closes.
void Endpoint::OnStreamError(bool timed_out) {
  StreamEnded(State::Disconnected, timed_out ? WV_TIMEOUT : WV_SUCCESS, timed_out ? WV_IO_TIMEOUT : WV_CONNECTION_REFUSED);
}

// Our close went with the socket's (the peer hears of the connection's end by it), and the peer's
// will not be read.
void Endpoint::OnClosedHere() { StreamEnded(State::Disconnected, WV_SUCCESS, WV_CONNECTION_ABORTED); }

// ---------------------------------------------------------------------------- teardown

Endpoint::Closing Endpoint::StartCloseLocked() {
  mutex_.AssertHeld();
  SetState(State::ActiveDisconnect);
  ArmTimer(Config().disconnect_timeout_ms);
  // The FIN goes after the lock, and nothing of ours is touched then: the close may complete
  // the Disconnect at once, and the application release the connector on another thread.
  return Closing{stream_};
}

void Endpoint::FinishDisconnect(int32_t status) {
  mutex_.AssertHeld();
  DisarmTimer();
  EndpointBase::FinishDisconnect(status);
}

Endpoint::Connection Endpoint::DropConnectionLocked(std::deque<std::shared_ptr<Endpoint>>& children) {
  mutex_.AssertHeld();
  Connection connection;
  DisarmTimer();
  CloseSocket();
  // Released while connected: abortive close, the QP is flushed.
  if (state_ != State::Disconnected && state_ != State::ActiveDisconnect) connection.abort = stream_;
  connection.released = std::move(stream_);
  qp_.reset();
  children.insert(children.begin(), handshaking_.begin(), handshaking_.end());
  handshaking_.clear();
  for (auto& c : children) c->listed_in_ = ListedIn::Nothing;
  return connection;
}

}  // namespace ndwv::dev::iwarp
