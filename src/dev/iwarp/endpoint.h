// The iWARP connection manager: a connection endpoint over TCP with the MPA rev 2 exchange
// (RFC 5044 / RFC 6581) in peer-to-peer mode, the RTR being a zero-length RDMA Write.
//
//   active:  Bind -> Connect: TCP connect, MPA Request -> Reply (Connect completes) ->
//            Accept(NULL) = CompleteConnect: QP to RTS, RTR sent -> Connected
//   passive: Listen; a TCP accept + MPA Request fills GetRequest's endpoint -> Accept: QP to RTS
//            (the stream holds what is posted until the RTR), MPA Reply -> RTR received (Accept
//            completes) -> Connected
//   close:   Disconnect: FIN after the queued data; the peer's FIN (or the timeout) ends the CM
//            phase; then the QP phase flushes (deferred work) and Disconnect completes.
//            A peer's FIN completes NotifyDisconnect; the stream then flushes the QP, whose close
//            is our FIN.
// Order comes from the stream itself: a close after the Reply is a close of an established
// connection, so the IB CM's races do not exist here.
#pragma once
#include <deque>
#include <list>
#include <memory>
#include <string>

#include "base/capture.h"
#include "base/object_pool.h"
#include "dev/address.h"
#include "dev/endpoint.h"
#include "dev/engine.h"
#include "dev/iwarp/negotiation.h"
#include "dev/iwarp/stream.h"
#include "wire/mpa.h"

namespace ndwv::dev::iwarp {

std::shared_ptr<ConnectEndpoint> CreateEndpoint();

// The options of every connection's socket: no Nagle delay; and a dead peer or link is found
// within NDWV_IWARP_TIMEOUT_MS, data outstanding or not (TCP_USER_TIMEOUT, and keepalives when
// idle). Set on every socket at Bind; the sockets a listener accepts inherit them from its own
// (six system calls fewer per accepted connection; a unit test checks that the kernel does).
void TuneConnectionSocket(int fd);
// The seconds of silence after which an idle connection is first probed under a dead-peer bound
// of `timeout_ms`: 2, or 1 below 4 s (endpoint.cpp says why never later).
int KeepaliveIdleSeconds(unsigned timeout_ms);

class Endpoint final : public EndpointBase<Endpoint>,
                       public StreamObserver,
                       public IoHandler,
                       public std::enable_shared_from_this<Endpoint> {
 public:
  Endpoint();
  ~Endpoint() override;

  int32_t Bind(const sockaddr* address, socklen_t length) override;
  int32_t Listen(int backlog) override;
  int32_t Connect(std::shared_ptr<QueuePair> qp, const sockaddr* peer, socklen_t length,
                  const ConnectParams& params, AsyncOp* op) override;
  int32_t Accept(std::shared_ptr<QueuePair> qp, const ConnectParams& params, AsyncOp* op) override;
  int32_t Reject(const void* data, size_t length) override;

  void OnRtr() override;
  void OnPeerClosed() override;
  void OnStreamError(bool timed_out) override;
  void OnClosedHere() override;
  void OnIo(uint32_t events) override;

  // The connection manager's states, and where each may go (SetState checks; public for the
  // tests, and docs/teardown.md shows the table).
  enum class State {
    Idle, Bound, Listening,
    ActiveConnecting, ActiveMpaSent, ActiveReplied,      // active setup
    PassiveHandshake, PassiveRequest, PassiveAccepting,  // passive setup
    Connected, ActiveDisconnect, PassiveDisconnect, Disconnected, Closed
  };
  static constexpr size_t kStates = size_t(State::Closed) + 1;
  static const char* ToString(State s);
  // Every state may be closed (the owner released the endpoint). Idle and Bound go to
  // PassiveRequest as a GetRequest target; Idle to PassiveHandshake as a listener's new child.
  // A refused or timed-out Connect goes back to Bound, to be retried.
  static constexpr TransitionTable<State, kStates> kTransitions{{
      {State::Idle, {State::Bound, State::ActiveConnecting, State::PassiveHandshake, State::PassiveRequest, State::Closed}},
      {State::Bound, {State::Listening, State::ActiveConnecting, State::PassiveRequest, State::Closed}},
      {State::Listening, {State::Closed}},
      {State::ActiveConnecting, {State::ActiveMpaSent, State::Bound, State::Closed}},
      {State::ActiveMpaSent, {State::ActiveReplied, State::Bound, State::Closed}},
      {State::ActiveReplied, {State::Connected, State::Closed}},
      {State::PassiveHandshake, {State::PassiveRequest, State::Closed}},
      {State::PassiveRequest, {State::PassiveAccepting, State::Disconnected, State::Closed}},
      {State::PassiveAccepting, {State::Connected, State::Disconnected, State::Closed}},
      {State::Connected, {State::ActiveDisconnect, State::PassiveDisconnect, State::Disconnected, State::Closed}},
      {State::ActiveDisconnect, {State::Disconnected, State::Closed}},
      {State::PassiveDisconnect, {State::Disconnected, State::Closed}},
      {State::Disconnected, {State::Disconnected, State::Closed}},
      {State::Closed, {State::Closed}},
  }};

 private:
  friend class EndpointBase<Endpoint>;
  static constexpr ConnectionPhase PhaseOf(State s) {
    switch (s) {
      case State::Connected: return ConnectionPhase::Connected;
      case State::PassiveDisconnect: return ConnectionPhase::PeerClosed;
      case State::ActiveDisconnect: return ConnectionPhase::Closing;
      case State::Disconnected: return ConnectionPhase::Disconnected;
      default: return ConnectionPhase::NotConnected;
    }
  }
  // Our Disconnect: the FIN after the queued data; the peer's FIN (or the timeout) ends it. The
  // FIN is sent after the lock (Closing::Start): the stream reports to us under its own locks.
  struct Closing {
    std::shared_ptr<Stream> stream;
    void Start() { stream->CloseSend(); }
  };
  Closing StartCloseLocked() NDWV_REQUIRES(mutex_);
  // Close, under mutex_: the socket and timer go, queued and handshaking children are handed
  // out; a connection not yet disconnected is aborted once the lock is released (End).
  struct Connection {
    std::shared_ptr<Stream> abort, released;  // released: dropped after the lock
    void End() {
      if (abort) abort->Abort();
    }
  };
  Connection DropConnectionLocked(std::deque<std::shared_ptr<Endpoint>>& children) NDWV_REQUIRES(mutex_);

  int32_t OpenSocket(int family) NDWV_REQUIRES(mutex_);  // a socket bound to local_ (port chosen if 0)
  void SetState(State s) NDWV_REQUIRES(mutex_);
  void ArmTimer(uint32_t ms) NDWV_REQUIRES(mutex_);
  void DisarmTimer() NDWV_REQUIRES(mutex_);
  static void OnTimer(Timer* timer);
  // The end of the stream, as each state takes it (OnPeerClosed, OnStreamError, OnClosedHere).
  void StreamEnded(State connected_becomes, int32_t disconnect_status, int32_t accept_status) NDWV_EXCLUDES(mutex_);
  // The phase's time is up (mutex_ held). Returns a stream to abort once mutex_ is released:
  // the abort reports to OnStreamError, which takes mutex_.
  std::shared_ptr<Stream> HandleTimeoutLocked(Finisher& finish) NDWV_REQUIRES(mutex_);

  void OnListenReady(Finisher& finish) NDWV_REQUIRES(mutex_);
  // Out of descriptors: refuse the queue's head, or pause accepting.
  void RefusePending() NDWV_REQUIRES(mutex_);
  static constexpr uint32_t kAcceptPauseMs = 100;
  // Listener, under mutex_: the bounds on what accepted connections hold (docs/security.md).
  bool BacklogFullLocked() const NDWV_REQUIRES(mutex_);
  // The listen socket watched, unless accepting is paused (out of descriptors, or the backlog full).
  void WatchListenLocked() NDWV_REQUIRES(mutex_);
  // A connection or request left the backlog: a listener paused with it full accepts again.
  void BacklogSlotFreedLocked() NDWV_REQUIRES(mutex_);
  void ExpireLocked() NDWV_REQUIRES(mutex_);          // handshakes and requests past their time
  void ArmListenTimerLocked() NDWV_REQUIRES(mutex_);  // for the next expiry, or the end of an accept pause
  void OnConnectReady(Finisher& finish) NDWV_REQUIRES(mutex_);
  // Sends the MPA request: false, with nothing changed, while TCP is still connecting (EAGAIN);
  // true when sent or failed (the Connect ended, the socket closed).
  bool SendMpaRequest(Finisher& finish) NDWV_REQUIRES(mutex_);
  static int32_t ConnectFailure(int error);  // a connect's (or its first send's) errno as a status
  bool ReadMpaFrame(wire::MpaKind kind) NDWV_REQUIRES(mutex_);  // true when mpa_ holds a whole frame
  void OnMpaReply(Finisher& finish) NDWV_REQUIRES(mutex_);
  // Reads the MPA request: Pending until it is whole; Request when it is one we serve; Ended
  // when it was refused or the connection failed (the socket is closed then).
  enum class Handshake { Pending, Request, Ended };
  Handshake ReadRequest() NDWV_REQUIRES(mutex_);
  // Both release mutex_ while they report to the listener, whose lock comes first.
  void OnMpaRequest() NDWV_REQUIRES(mutex_);
  void OnQueuedEvent(uint32_t events) NDWV_REQUIRES(mutex_);  // a request waiting for GetRequest: its peer left?
  // Child -> listener, called without the child's lock: its handshake ended (a whole Request
  // arrived, or it failed); or, queued, its peer closed.
  void HandshakeOver(const std::shared_ptr<Endpoint>& child, bool request);
  // Listener, under mutex_: a child's request is whole. To the oldest GetRequest, or queued and
  // watched for its peer leaving.
  void RequestArrivedLocked(const std::shared_ptr<Endpoint>& child, Finisher& finish) NDWV_REQUIRES(mutex_);
  void RequestGone(const std::shared_ptr<Endpoint>& child);
  // Target of GetRequest takes the child's connection (ListenQueue, under the listener's lock):
  // this target's lock, then the child's.
  void Adopt(Endpoint& child);
  // Passive side: refuses the request (MPA Reply with R and the private data), then FIN.
  void RefuseRequest(const void* data, size_t length) NDWV_REQUIRES(mutex_);
  // Under mutex_: the pending Connect ends with `status` (completed by `finish`, after the lock).
  void FailConnect(Finisher& finish, int32_t status) NDWV_REQUIRES(mutex_);
  // The base's, with the timer disarmed first.
  void FinishDisconnect(int32_t status) NDWV_REQUIRES(mutex_);
  // Under mutex_, but for the destructor (nobody else holds a reference then).
  void CloseSocket() NDWV_REQUIRES(mutex_);
  int SendMpaFrame(const wire::MpaFrame& frame) NDWV_REQUIRES(mutex_);  // 0, or the send's errno
  StreamParams MakeStreamParams(bool passive) const NDWV_REQUIRES(mutex_);

  State state_ NDWV_GUARDED_BY(mutex_) = State::Idle;
  int fd_ NDWV_GUARDED_BY(mutex_) = -1;
  // With fd_ once connected, when capturing.
  std::unique_ptr<base::TcpCapture> capture_ NDWV_GUARDED_BY(mutex_);
  bool watching_ NDWV_GUARDED_BY(mutex_) = false;
  socklen_t local_len_ NDWV_GUARDED_BY(mutex_) = 0;  // of local_
  socklen_t peer_len_ NDWV_GUARDED_BY(mutex_) = 0;   // of peer_
  uint32_t qpn_ NDWV_GUARDED_BY(mutex_) = 0;  // the QP being connected, once Connect or Accept named it
  // "iwarp cm qp 5 [local -> peer]", for log lines: made when one is written.
  std::string Identity() const NDWV_REQUIRES(mutex_);
  bool bound_ NDWV_GUARDED_BY(mutex_) = false;
  // The port is the kernel's to choose (bound to 0, or not bound).
  bool ephemeral_ NDWV_GUARDED_BY(mutex_) = false;
  PortClaim port_claim_ NDWV_GUARDED_BY(mutex_);  // an explicit port, held from Bind for the endpoint's life
  ConnectParams local_params_ NDWV_GUARDED_BY(mutex_);
  bool peer_crc_ NDWV_GUARDED_BY(mutex_) = false;
  std::shared_ptr<QueuePair> qp_ NDWV_GUARDED_BY(mutex_);  // between Connect/Accept and the stream taking it
  std::shared_ptr<Stream> stream_ NDWV_GUARDED_BY(mutex_);

  // Listening. Every connection accepted takes a backlog slot until the application takes its
  // request; it may spend NDWV_CM_TIMEOUT_MS reading its MPA Request, and as long again waiting
  // for GetRequest. Each list is in arrival order, so its head is always the first to expire.
  using Children = std::list<std::shared_ptr<Endpoint>>;
  int backlog_ NDWV_GUARDED_BY(mutex_) = 0;
  std::weak_ptr<Endpoint> listener_ NDWV_GUARDED_BY(mutex_);  // child: who accepted us
  // A child's socket inherits its listener's options, SO_REUSEADDR among them (ReleaseTcpPort).
  // Set before the child is shared.
  bool accepted_ = false;
  Children handshaking_ NDWV_GUARDED_BY(mutex_);  // reading their MPA Request (then in requests_)
  friend class ListenQueue<Endpoint>;
  bool accept_paused_ NDWV_GUARDED_BY(mutex_) = false;  // out of descriptors (RefusePending)
  // Listen(0): beyond the backlog a connection waits in the kernel's queue (accepting pauses)
  // instead of being refused (ConnectEndpoint::Listen).
  bool wait_beyond_backlog_ NDWV_GUARDED_BY(mutex_) = false;
  bool backlog_paused_ NDWV_GUARDED_BY(mutex_) = false;
  Clock::time_point accept_resume_ NDWV_GUARDED_BY(mutex_){};
  // Child: where it is listed by its listener, since when. Under the listener's mutex_, not this
  // endpoint's: not annotated, the analysis cannot name another object's lock here.
  enum class ListedIn : uint8_t { Nothing, Handshakes, Requests } listed_in_ = ListedIn::Nothing;
  Children::iterator listed_at_;
  Clock::time_point listed_since_{};

  // The MPA frame being read: from the socket's connect or accept until the frame is taken
  // (600 bytes a connection would otherwise keep for its life).
  base::PoolPtr<MpaFrameReader> mpa_ NDWV_GUARDED_BY(mutex_);
  void StartReadingMpa(wire::MpaKind kind) NDWV_REQUIRES(mutex_);

  using EndpointTimer = OwnedTimer<Endpoint>;
  EndpointTimer timer_ NDWV_GUARDED_BY(mutex_){&Endpoint::OnTimer, this};
};

}  // namespace ndwv::dev::iwarp
