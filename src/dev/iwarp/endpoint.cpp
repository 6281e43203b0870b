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
#include <random>
#include <utility>

#include <ndwv/wvstatus.h>

#include "base/fork.h"
#include "base/log.h"
#include "base/settings.h"
#include "dev/address.h"

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;

using base::Config;

std::shared_ptr<ConnectEndpoint> CreateEndpoint() { return std::make_shared<Endpoint>(); }

Endpoint::Endpoint() {
  timer_.fire = &Endpoint::OnTimer;
  timer_.owner = this;
  accept_work_.run = [](WorkItem* item) {
    auto* work = static_cast<AcceptWork*>(item);
    auto endpoint = std::move(work->endpoint);
    auto qp = std::move(work->qp);
    // The RTR arrived: the QP may send now. Done here, not on the engine that saw the RTR.
    // The connection is established: if the peer already closed it (the QP went to Error
    // first), Accept still succeeded, and the close is reported after it.
    qp->Modify(QpState::Rts);
    AsyncOp* op;
    {
      std::lock_guard<std::mutex> lock(endpoint->mutex_);
      op = std::exchange(endpoint->accept_op_, nullptr);
    }
    if (op) op->Complete(WV_SUCCESS);
  };
}

Endpoint::~Endpoint() { CloseSocket(); }

const char* Endpoint::ToString(State s) {
  static const char* const names[] = {"Idle", "Bound", "Listening", "ActiveConnecting", "ActiveMpaSent",
                                      "ActiveReplied", "PassiveHandshake", "PassiveRequest",
                                      "PassiveAccepting", "Connected", "ActiveDisconnect",
                                      "PassiveDisconnect", "Disconnected", "Closed"};
  return names[int(s)];
}

void Endpoint::SetState(State s) {
  // State changes are when addresses and the QP become known: the name log lines use.
  identity_ = "iwarp cm qp " + std::to_string(qpn_) + " [" + Describe(local_) + " -> " + Describe(peer_) + "]";
  NDWV_LOG(Debug, "%s: %s -> %s", identity_.c_str(), ToString(state_), ToString(s));
  state_ = s;
}

void Endpoint::CloseSocket() {
  if (fd_ < 0) return;
  if (watching_) Engine::Get().Unwatch(fd_);
  watching_ = false;
  ReleaseTcpPort(fd_);
  base::CloseDescriptor(fd_);
  fd_ = -1;
  capture_.reset();
}

// ---------------------------------------------------------------------------- timers

void Endpoint::ArmTimer(uint32_t ms) {
  timer_self_ = shared_from_this();
  Engine::Get().Arm(&timer_, std::chrono::milliseconds(ms));
}

void Endpoint::DisarmTimer() {
  if (Engine::Get().Disarm(&timer_)) timer_self_.reset();  // else the firing drops it
}

void Endpoint::OnTimer(Timer* timer) {
  Endpoint* self = static_cast<Endpoint*>(timer->owner);
  std::shared_ptr<Endpoint> keep;  // released last, after the requests completed
  Finisher finish;
  std::shared_ptr<Stream> abort;
  {
    std::lock_guard<std::mutex> lock(self->mutex_);
    if (Engine::Get().IsArmed(timer)) return;  // armed again since it fell due: that one fires later
    keep = std::move(self->timer_self_);
    if (keep) abort = keep->HandleTimeoutLocked(finish);
  }
  if (abort) abort->Abort();
}

std::shared_ptr<Stream> Endpoint::HandleTimeoutLocked(Finisher& finish) {
  switch (state_) {
    case State::ActiveConnecting:
    case State::ActiveMpaSent:
      NDWV_LOG(Info, "%s: connect timed out", identity_.c_str());
      CloseSocket();
      SetState(State::Bound);
      finish.Add(std::exchange(connect_op_, nullptr), WV_IO_TIMEOUT);
      qp_.reset();
      break;
    case State::PassiveHandshake:
      CloseSocket();
      SetState(State::Closed);
      break;
    case State::PassiveAccepting:
      SetState(State::Disconnected);
      finish.Add(std::exchange(accept_op_, nullptr), WV_IO_TIMEOUT);
      return stream_;
    case State::ActiveDisconnect:
      NDWV_LOG(Info, "%s: peer did not close in time", identity_.c_str());
      FinishDisconnect(WV_TIMEOUT);
      break;
    case State::Listening:  // accepting paused (RefusePending): watch the queue again
      if (fd_ >= 0 && watching_) Engine::Get().Modify(fd_, EPOLLIN);
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

// A connection's socket: no Nagle delay; and a dead peer or link is found within
// NDWV_IWARP_TIMEOUT_MS, data outstanding or not (TCP_USER_TIMEOUT, and keepalives when idle).
void TuneConnectionSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  unsigned timeout = Config().iwarp_timeout_ms;
  if (timeout == 0) return;
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout);
  int idle = std::max(1, int(timeout / 2000)), interval = 1, count = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

}  // namespace

int32_t Endpoint::OpenSocket(int family) {
  fd_ = base::OpenSocket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd_ < 0) return WV_INSUFFICIENT_RESOURCES;
  TuneConnectionSocket(fd_);
  int32_t status = BindNdTcpPort(fd_, local_);
  if (status != WV_SUCCESS) CloseSocket();
  return status;
}

int32_t Endpoint::Bind(const sockaddr* address, socklen_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
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

int32_t Endpoint::Query(ConnectionInfo* info) {
  std::lock_guard<std::mutex> lock(mutex_);
  info->local = local_;
  info->peer = peer_;
  info->peer_params = peer_params_;
  return WV_SUCCESS;
}

// ---------------------------------------------------------------------------- listening

int32_t Endpoint::Listen(int backlog) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ == State::Listening) return WV_INVALID_DEVICE_STATE;
  if (state_ != State::Bound) return WV_INVALID_DEVICE_STATE;
  backlog_ = backlog > 0 ? backlog : SOMAXCONN;
  // Linux checks the port again at listen(): connections in TIME_WAIT that Bind took it over from
  // are accepted only with SO_REUSEADDR. Accepted connections inherit it, so that theirs never
  // keep a later listener off the port (the server killed and restarted, say).
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen(fd_, backlog_) != 0) return WV_INSUFFICIENT_RESOURCES;
  SpareDescriptor();  // reserved now, while descriptors are available
  SetState(State::Listening);
  watching_ = true;
  Engine::Get().Watch(fd_, EPOLLIN, weak_from_this());
  return WV_SUCCESS;
}

void Endpoint::OnListenReady() {
  for (;;) {
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = base::OpenDescriptor([&] {
      return accept4(fd_, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    });
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;  // the latter: that peer gave up
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) RefusePending();
      return;
    }
    // Handshakes that failed or timed out are over: they do not hold a backlog slot.
    std::erase_if(handshaking_, [](const std::shared_ptr<Endpoint>& child) {
      std::lock_guard<std::mutex> lock(child->mutex_);
      return child->state_ == State::Closed;
    });
    if (handshaking_.size() + requests_.queued() >= size_t(backlog_)) {
      base::CloseDescriptor(fd);  // backlog full: the peer's Connect is refused
      continue;
    }
    TuneConnectionSocket(fd);
    auto child = std::make_shared<Endpoint>();
    std::lock_guard<std::mutex> lock(child->mutex_);
    child->fd_ = fd;
    child->capture_ = base::TcpCapture::Start(fd);
    child->peer_ = peer;
    child->peer_len_ = len;
    child->local_len_ = sizeof child->local_;
    getsockname(fd, reinterpret_cast<sockaddr*>(&child->local_), &child->local_len_);
    child->listener_ = weak_from_this();
    child->SetState(State::PassiveHandshake);
    child->local_params_ = local_params_;
    child->ArmTimer(Config().cm_timeout_ms);
    child->watching_ = true;
    handshaking_.push_back(child);
    Engine::Get().Watch(fd, EPOLLIN | EPOLLRDHUP, child);
  }
}

void Endpoint::RefusePending() {
  // The queue's head would keep the socket readable: the engine would spin on it, and the peer
  // would wait for its timeout. Refused, the peer's Connect fails at once.
  int& spare = SpareDescriptor();
  int fd = -1, error = EMFILE;
  if (spare >= 0) {
    base::CloseDescriptor(spare);
    fd = base::OpenDescriptor([this] { return accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC); });
    error = errno;
    base::CloseDescriptor(fd);
    spare = OpenSpare();
  }
  if (fd >= 0) {
    AdapterCounters(Transport::Iwarp).AddShared(Counter::AcceptsRefused);
    NDWV_LOG(Warn, "%s: out of descriptors: a connection was refused", identity_.c_str());
    return;
  }
  if (error == EAGAIN || error == EWOULDBLOCK) return;  // nothing was pending
  // No spare (another thread took the one just freed): look again in a moment instead of spinning.
  NDWV_LOG(Warn, "%s: out of descriptors: accepting paused", identity_.c_str());
  Engine::Get().Modify(fd_, 0);
  ArmTimer(kAcceptPauseMs);
}

int32_t Endpoint::GetRequest(std::shared_ptr<ConnectEndpoint> target, AsyncOp* op) {
  auto endpoint = std::dynamic_pointer_cast<Endpoint>(target);
  if (!endpoint) return WV_INVALID_PARAMETER;
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::Listening) return WV_INVALID_DEVICE_STATE;
  requests_.Take(std::move(endpoint), op, finish);
  return WV_PENDING;
}

void Endpoint::RequestReady(const std::shared_ptr<Endpoint>& child) {
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = handshaking_.begin(); it != handshaking_.end(); ++it) {
    if (*it == child) {
      handshaking_.erase(it);
      break;
    }
  }
  if (state_ != State::Listening) return;
  requests_.Arrive(child, finish);
}

void Endpoint::Adopt(Endpoint& child) {
  std::scoped_lock lock(mutex_, child.mutex_);
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

bool Endpoint::SendMpaFrame(const MpaFrame& frame) {
  uint8_t buffer[kMpaHeaderLen + kMpaMaxPrivateData];
  size_t length = EncodeMpaFrame(frame, buffer);
  // A fresh socket's buffer always has room for one small frame.
  if (!length) return false;
  auto send_call = [&] { return send(fd_, buffer, length, MSG_NOSIGNAL | MSG_DONTWAIT); };
  ssize_t n = capture_ ? capture_->SendAndRecord(send_call, [&](ssize_t sent) { capture_->Sent(buffer, sent); })
                       : send_call();
  return n == ssize_t(length);
}

bool Endpoint::ReadMpaFrame(MpaKind kind) {
  for (;;) {
    ssize_t n = recv(fd_, mpa_buffer_ + mpa_have_, mpa_need_ - mpa_have_, MSG_DONTWAIT);
    if (capture_) [[unlikely]] capture_->Received(mpa_buffer_ + mpa_have_, n);
    if (n > 0) {
      mpa_have_ += size_t(n);
      if (mpa_have_ < mpa_need_) continue;
      if (mpa_need_ == kMpaHeaderLen) {
        size_t frame_len = 0;
        MpaError error = DecodeMpaHeader({mpa_buffer_, mpa_have_}, kind, frame_len);
        if (error != MpaError::Ok) {
          NDWV_LOG(Info, "%s: bad MPA frame (%s)", identity_.c_str(), wire::ToString(error));
          AdapterCounters(Transport::Iwarp).AddShared(Counter::DropsBadMpa);
          errno = EPROTO;
          return false;
        }
        mpa_need_ = frame_len;  // exactly the frame: what follows belongs to the stream
        if (mpa_have_ < mpa_need_) continue;
      }
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    if (n == 0) errno = ECONNRESET;
    return false;
  }
}

StreamParams Endpoint::MakeStreamParams(bool passive) const {
  StreamParams params;
  params.crc = Config().mpa_crc || peer_crc_;
  params.confirm_writes = Config().confirm != base::Settings::Confirm::None;
  params.confirm_sends = Config().confirm == base::Settings::Confirm::All;
  params.ird = local_params_.ird;
  params.ord = std::min(local_params_.ord, peer_params_.ird);
  params.max_ulpdu = Config().mpa_max_ulpdu;
  params.expect_rtr = passive;
  return params;
}

// ---------------------------------------------------------------------------- active side

int32_t Endpoint::Connect(std::shared_ptr<QueuePair> qp, const sockaddr* peer, socklen_t length,
                          const ConnectParams& params, AsyncOp* op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::Idle && state_ != State::Bound) return WV_CONNECTION_ACTIVE;
  if (qp->state() != QpState::Reset && qp->state() != QpState::Init) return WV_CONNECTION_ACTIVE;
  if (!peer || (peer->sa_family != AF_INET && peer->sa_family != AF_INET6)) return WV_INVALID_ADDRESS;
  socklen_t need = peer->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (length < need) return WV_INVALID_PARAMETER;
  memcpy(&peer_, peer, need);
  peer_len_ = need;
  if (fd_ < 0) {
    if (!bound_) {  // not bound: an ephemeral port on the address the route chooses
      local_ = {};
      local_.ss_family = peer->sa_family;
      local_len_ = need;
      ephemeral_ = true;
    }
    // A retry picks a fresh ephemeral port: the last attempt's address pair may linger in TCP.
    if (ephemeral_) SetPort(local_, 0);
    int32_t status = OpenSocket(peer->sa_family);
    if (status != WV_SUCCESS) return status;
    bound_ = true;
  }
  local_params_ = params;
  if (connect(fd_, peer, need) != 0 && errno != EINPROGRESS) {
    int error = errno;
    CloseSocket();
    return error == ENETUNREACH     ? WV_NETWORK_UNREACHABLE
           : error == ECONNREFUSED  ? WV_CONNECTION_REFUSED
           : error == EADDRNOTAVAIL ? WV_ADDRESS_ALREADY_EXISTS  // this address pair is in use
                                    : WV_HOST_UNREACHABLE;
  }
  qpn_ = qp->qpn();
  qp_ = std::move(qp);
  connect_op_ = op;
  mpa_have_ = 0;
  mpa_need_ = kMpaHeaderLen;
  SetState(State::ActiveConnecting);
  ArmTimer(Config().cm_timeout_ms);
  watching_ = true;
  Engine::Get().Watch(fd_, EPOLLOUT | EPOLLIN | EPOLLRDHUP, weak_from_this());
  return WV_PENDING;
}

void Endpoint::FailConnect(Finisher& finish, int32_t status) {
  finish.Add(std::exchange(connect_op_, nullptr), status);
  CloseSocket();
  DisarmTimer();
  qp_.reset();
  SetState(State::Bound);  // a refused or unreachable Connect may be retried
}

void Endpoint::OnConnectReady(Finisher& finish) {
  int error = 0;
  socklen_t len = sizeof error;
  getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error, &len);
  if (error) {
    FailConnect(finish, error == ECONNREFUSED ? WV_CONNECTION_REFUSED
                        : error == ENETUNREACH ? WV_NETWORK_UNREACHABLE
                                               : WV_HOST_UNREACHABLE);
    return;
  }
  local_len_ = sizeof local_;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&local_), &local_len_);
  capture_ = base::TcpCapture::Start(fd_);
  MpaFrame request;
  request.reply = false;
  request.crc = Config().mpa_crc;
  request.p2p = true;
  request.rtr_write = true;
  request.ird = uint16_t(std::min<uint32_t>(local_params_.ird, kMpaIrdOrdMask));
  request.ord = uint16_t(std::min<uint32_t>(local_params_.ord, kMpaIrdOrdMask));
  request.private_data = {local_params_.data, local_params_.data_length};
  Engine::Get().Modify(fd_, EPOLLIN | EPOLLRDHUP);
  SetState(State::ActiveMpaSent);
  if (!SendMpaFrame(request)) {
    FailConnect(finish, WV_CONNECTION_REFUSED);
    return;
  }
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestsSent);
  // The request is with the peer: from here a Connect waits for its application's Accept or
  // Reject however long it takes (nd2-spi 14.1: not timed out for a slow Accept), as the IB CM
  // waits on MRAs. A dead peer or link still ends it: keepalives and TCP_USER_TIMEOUT
  // (NDWV_IWARP_TIMEOUT_MS) close the socket, and a released listener resets it.
  DisarmTimer();
}

void Endpoint::OnMpaReply(Finisher& finish) {
  if (!ReadMpaFrame(MpaKind::Reply)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // Reset before any reply: nobody took the request; or the peer stopped answering.
    FailConnect(finish, errno == ETIMEDOUT ? WV_IO_TIMEOUT : WV_CONNECTION_REFUSED);
    return;
  }
  MpaFrame reply;
  DecodeMpaFrame({mpa_buffer_, mpa_have_}, MpaKind::Reply, reply);
  AdapterCounters(Transport::Iwarp).AddShared(reply.reject ? Counter::MpaRejectsReceived : Counter::MpaRepliesReceived);
  peer_params_ = {};
  size_t data = std::min(reply.private_data.size(), kMaxPrivateData);
  memcpy(peer_params_.data, reply.private_data.data(), data);
  peer_params_.data_length = uint32_t(data);
  peer_params_.ird = reply.ird;
  peer_params_.ord = reply.ord;
  peer_crc_ = reply.crc;
  if (reply.reject || reply.markers || !reply.enhanced || !reply.p2p || !reply.rtr_write) {
    // Rejected by the peer's application, or a peer we cannot talk to (markers, no RTR Write).
    FailConnect(finish, WV_CONNECTION_REFUSED);
    return;
  }
  DisarmTimer();
  Engine::Get().Unwatch(fd_);  // the stream watches it from CompleteConnect on
  watching_ = false;
  SetState(State::ActiveReplied);
  finish.Add(std::exchange(connect_op_, nullptr), WV_SUCCESS);
}

int32_t Endpoint::Accept(std::shared_ptr<QueuePair> qp, const ConnectParams& params, AsyncOp* op) {
  Finisher finish;
  std::unique_lock<std::mutex> lock(mutex_);
  if (!qp) {  // active side: CompleteConnect
    if (state_ != State::ActiveReplied) return WV_CONNECTION_INVALID;
    std::shared_ptr<QueuePair> active = std::move(qp_);
    int32_t status = active->state() == QpState::Reset ? active->Modify(QpState::Init) : WV_SUCCESS;
    if (status == WV_SUCCESS) status = active->Modify(QpState::Rtr);
    if (status == WV_SUCCESS) status = active->Modify(QpState::Rts);
    if (status != WV_SUCCESS) return WV_CONNECTION_INVALID;
    stream_ = std::make_shared<Stream>(std::exchange(fd_, -1), active, MakeStreamParams(false),
                                       weak_from_this(), std::move(capture_));
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
  if (!SendMpaFrame(reply)) {
    SetState(State::Disconnected);
    qp->Modify(QpState::Error);
    return WV_CONNECTION_ABORTED;
  }
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRepliesSent);
  accept_op_ = op;
  SetState(State::PassiveAccepting);
  stream_ = std::make_shared<Stream>(std::exchange(fd_, -1), qp, MakeStreamParams(true), weak_from_this(),
                                     std::move(capture_));
  accept_work_.qp = std::move(qp);
  // A peer that never completes the connection must not hold the Accept forever.
  ArmTimer(6 * Config().cm_timeout_ms);
  std::shared_ptr<Stream> stream = stream_;
  lock.unlock();
  stream->Start();
  return WV_PENDING;
}

int32_t Endpoint::Reject(const void* data, size_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (length > kMaxPrivateData) return WV_INVALID_BUFFER_SIZE;
  if (state_ == State::PassiveRequest) {
    MpaFrame reply;
    reply.reply = true;
    reply.reject = true;
    reply.crc = false;
    reply.private_data = {static_cast<const uint8_t*>(data), length};
    if (SendMpaFrame(reply)) AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRejectsSent);
    ReleaseTcpPort(fd_);
    shutdown(fd_, SHUT_WR);
    if (capture_) capture_->SentFin();
    CloseSocket();
    SetState(State::Closed);
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

void Endpoint::OnMpaRequest() {
  auto listener = listener_.lock();
  if (!ReadMpaFrame(MpaKind::Request)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    CloseSocket();  // a malformed request or a peer that went away: nothing to answer
    SetState(State::Closed);
    DisarmTimer();
    return;
  }
  MpaFrame request;
  DecodeMpaFrame({mpa_buffer_, mpa_have_}, MpaKind::Request, request);
  AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRequestsReceived);
  if (request.markers || !request.enhanced || !request.p2p || !request.rtr_write ||
      request.private_data.size() > kMaxPrivateData) {
    NDWV_LOG(Info, "%s: MPA request we cannot serve, rejected", identity_.c_str());
    MpaFrame reply;
    reply.reply = true;
    reply.reject = true;
    if (SendMpaFrame(reply)) AdapterCounters(Transport::Iwarp).AddShared(Counter::MpaRejectsSent);
    CloseSocket();
    SetState(State::Closed);
    DisarmTimer();
    return;
  }
  peer_params_ = {};
  memcpy(peer_params_.data, request.private_data.data(), request.private_data.size());
  peer_params_.data_length = uint32_t(request.private_data.size());
  peer_params_.ird = request.ird;
  peer_params_.ord = request.ord;
  peer_crc_ = request.crc;
  DisarmTimer();
  Engine::Get().Unwatch(fd_);
  watching_ = false;
  SetState(State::PassiveRequest);
  if (listener) {
    mutex_.unlock();
    listener->RequestReady(shared_from_this());
    mutex_.lock();
  } else {
    CloseSocket();
  }
}

// ---------------------------------------------------------------------------- engine events

void Endpoint::OnIo(uint32_t events) {
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0 || !watching_) return;  // a late event for a socket we no longer watch
  switch (state_) {
    case State::Listening: OnListenReady(); break;
    case State::ActiveConnecting: OnConnectReady(finish); break;
    case State::ActiveMpaSent: OnMpaReply(finish); break;
    case State::PassiveHandshake: OnMpaRequest(); break;
    default: break;
  }
}

void Endpoint::OnRtr() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::PassiveAccepting) return;
  DisarmTimer();
  SetState(State::Connected);
  accept_work_.endpoint = shared_from_this();
  Engine::Get().Defer(&accept_work_);
}

void Endpoint::OnPeerClosed() {
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  switch (state_) {
    case State::Connected:
      SetState(State::PassiveDisconnect);
      finish.AddList(notify_ops_, WV_SUCCESS);
      break;
    case State::ActiveDisconnect:  // the peer's close answers ours (or crossed it)
      FinishDisconnect(WV_SUCCESS);
      break;
    case State::PassiveAccepting:  // the active side gave up before CompleteConnect
      DisarmTimer();
      SetState(State::Disconnected);
      finish.Add(std::exchange(accept_op_, nullptr), WV_CONNECTION_REFUSED);
      break;
    default:
      break;
  }
}

void Endpoint::OnStreamError(bool timed_out) {
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  switch (state_) {
    case State::Connected:
      SetState(State::Disconnected);
      finish.AddList(notify_ops_, WV_SUCCESS);
      break;
    case State::ActiveDisconnect:  // a reset ends the close; a dead peer never answered it
      FinishDisconnect(timed_out ? WV_TIMEOUT : WV_SUCCESS);
      break;
    case State::PassiveAccepting:
      DisarmTimer();
      SetState(State::Disconnected);
      finish.Add(std::exchange(accept_op_, nullptr), WV_CONNECTION_REFUSED);
      break;
    default:
      break;
  }
}

// ---------------------------------------------------------------------------- teardown

int32_t Endpoint::Disconnect(DisconnectRequest* request) {
  Finisher finish;
  std::unique_lock<std::mutex> lock(mutex_);
  if (disconnect_called_) return WV_CONNECTION_INVALID;  // a connector disconnects once
  switch (state_) {
    case State::Connected:
      SetState(State::ActiveDisconnect);
      disconnect_ = request;
      finish.AddList(notify_ops_, WV_CONNECTION_DISCONNECTED);
      ArmTimer(Config().disconnect_timeout_ms);
      lock.unlock();
      stream_->CloseSend();
      disconnect_called_ = true;
      return WV_PENDING;
    case State::PassiveDisconnect:
    case State::Disconnected:
      // The peer closed already (or the connection died): only the flush is left.
      SetState(State::Disconnected);
      request->EndCmPhase(WV_SUCCESS);
      disconnect_called_ = true;
      return WV_PENDING;
    default:
      return WV_CONNECTION_INVALID;
  }
}

void Endpoint::FinishDisconnect(int32_t status) {
  DisarmTimer();
  SetState(State::Disconnected);
  if (DisconnectRequest* request = std::exchange(disconnect_, nullptr)) {
    request->EndCmPhase(status);
  }
}

int32_t Endpoint::NotifyDisconnect(AsyncOp* op) {
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  switch (state_) {
    case State::Connected:
      op->next = notify_ops_;
      notify_ops_ = op;
      return WV_PENDING;
    case State::PassiveDisconnect:
      finish.Add(op, WV_SUCCESS);
      return WV_PENDING;
    case State::ActiveDisconnect:
    case State::Disconnected:
      return WV_CONNECTION_DISCONNECTED;
    default:
      return WV_CONNECTION_INVALID;
  }
}

void Endpoint::CancelRequests() {
  Finisher finish;
  std::lock_guard<std::mutex> lock(mutex_);
  if (connect_op_) FailConnect(finish, WV_CANCELLED);
  finish.AddList(notify_ops_, WV_CANCELLED);
  requests_.CancelWaiting(finish);
}

void Endpoint::Close() {
  CancelRequests();
  Finisher finish;
  std::shared_ptr<Stream> stream, released;  // dropped after the lock: the stream reports to us
  std::deque<std::shared_ptr<Endpoint>> children;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finish.Add(std::exchange(accept_op_, nullptr), WV_CANCELLED);
    DisarmTimer();
    CloseSocket();
    if (state_ != State::Disconnected && state_ != State::ActiveDisconnect) stream = stream_;
    released = std::move(stream_);
    qp_.reset();
    children.swap(handshaking_);
    for (auto& c : requests_.TakeQueued()) children.push_back(std::move(c));
    SetState(State::Closed);
  }
  if (stream) stream->Abort();  // released while connected: abortive close, the QP is flushed
  for (auto& child : children) child->Close();
}

}  // namespace ndwv::dev::iwarp
