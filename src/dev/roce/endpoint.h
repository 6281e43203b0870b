// The RoCE connection endpoint: the device's connect endpoint over the IB CM (cm.h) and the RC
// transport (rc.h), on a RoCE port (port.h).
//
//   active:  Bind (a port of our own) -> Connect: REQ to the listener's UDP port, with the
//            RDMA-CM IP header and our user data -> REP (Connect completes) ->
//            Accept(NULL) = CompleteConnect: QP to RTS, link started, RTU -> Connected
//   passive: Listen: the bound UDP port, service ID 0x01060000|port. A REQ becomes a request for
//            GetRequest -> Accept: QP to RTS (the link holds what is posted until established),
//            link started, REP -> RTU or the first packet (a lost RTU): Accept completes -> Connected
//   close:   Disconnect: DREQ -> DREP received (ND_SUCCESS) or DREQ retries exhausted
//            (ND_TIMEOUT); only then the QP phase flushes (deferred work) and Disconnect
//            completes. A peer's DREQ is answered with a DREP once what we sent is
//            acknowledged (RcLink::SettleSent, bounded), which completes NotifyDisconnect and
//            flushes the QP (after the DREP was sent, never before).
// CM events arrive through the port outside its lock, one at a time, in order.
#pragma once
#include <deque>
#include <memory>
#include <string>

#include "dev/endpoint.h"
#include "dev/roce/cm.h"
#include "dev/roce/port.h"
#include "dev/roce/rc.h"

namespace ndwv::dev::roce {

std::shared_ptr<ConnectEndpoint> CreateEndpoint();

class Endpoint final : public EndpointBase<Endpoint>,
                       public CmUser,
                       public RcObserver,
                       public std::enable_shared_from_this<Endpoint> {
 public:
  Endpoint();
  ~Endpoint() override;

  int32_t Bind(const sockaddr* address, socklen_t length) override;
  void SetProtocol(uint8_t protocol) override;
  int32_t Listen(int backlog) override;
  int32_t Connect(std::shared_ptr<QueuePair> qp, const sockaddr* peer, socklen_t length,
                  const ConnectParams& params, AsyncOp* op) override;
  int32_t Accept(std::shared_ptr<QueuePair> qp, const ConnectParams& params, AsyncOp* op) override;
  int32_t Reject(const void* data, size_t length) override;

  void OnCmEvent(const CmEvent& event) override;
  void OnUnreachable(const Unreachable& what) override;
  void ProbePeer() override;
  void OnFirstPacket() override;
  void OnLinkFailed() override;
  void OnSentSettled() override;

  // The endpoint's states, and where each may go (SetState checks; public for the tests, and
  // docs/teardown.md shows the table).
  enum class State {
    Idle, Bound, Listening,
    Connecting, Replied,     // active: REQ sent; REP received (Connect completed)
    Requested, Accepting,    // passive: REQ received; REP sent
    Connected, LinkFailed,   // LinkFailed: the QP failed (retries, peer gone); CM still up
    PeerClosing,             // the peer's DREQ came; our DREP waits for what we sent to settle
    Settling,                // our Disconnect came; our DREQ (or DREP) waits for what we sent to settle
    Disconnecting, PeerDisconnected, Disconnected, Closed
  };
  static constexpr size_t kStates = size_t(State::Closed) + 1;
  static const char* ToString(State s);
  // Every state may be closed (the owner released the endpoint). Idle goes to Requested as a
  // listener's new request, Idle and Bound as a GetRequest target. A refused or timed-out
  // Connect goes back to Bound, to be retried. A DREQ that overtakes the RTU finds Accepting.
  static constexpr TransitionTable<State, kStates> kTransitions{{
      {State::Idle, {State::Bound, State::Connecting, State::Requested, State::Closed}},
      {State::Bound, {State::Listening, State::Connecting, State::Requested, State::Closed}},
      {State::Listening, {State::Closed}},
      {State::Connecting, {State::Replied, State::Bound, State::Closed}},
      {State::Replied, {State::Connected, State::Closed}},
      {State::Requested, {State::Accepting, State::Disconnected, State::Closed}},
      {State::Accepting, {State::Connected, State::LinkFailed, State::PeerClosing, State::Disconnecting,
                          State::PeerDisconnected, State::Disconnected, State::Closed}},
      {State::Connected, {State::LinkFailed, State::PeerClosing, State::Settling, State::Disconnecting,
                          State::PeerDisconnected, State::Closed}},
      {State::LinkFailed, {State::Disconnecting, State::PeerDisconnected, State::Closed}},
      {State::PeerClosing, {State::Settling, State::PeerDisconnected, State::Closed}},
      {State::Settling, {State::Disconnecting, State::Disconnected, State::Closed}},
      {State::Disconnecting, {State::Disconnected, State::Closed}},
      {State::PeerDisconnected, {State::Disconnected, State::Closed}},
      {State::Disconnected, {State::Disconnected, State::Closed}},
      {State::Closed, {State::Closed}},
  }};

 private:
  friend class EndpointBase<Endpoint>;
  static constexpr ConnectionPhase PhaseOf(State s) {
    switch (s) {
      case State::Connected:
      case State::Accepting:
      case State::PeerClosing: return ConnectionPhase::Connected;  // NotifyDisconnect comes with our DREP
      case State::LinkFailed: return ConnectionPhase::Failed;
      case State::PeerDisconnected: return ConnectionPhase::PeerClosed;
      case State::Settling:
      case State::Disconnecting: return ConnectionPhase::Closing;
      case State::Disconnected: return ConnectionPhase::Disconnected;
      default: return ConnectionPhase::NotConnected;
    }
  }
  // Our Disconnect: what we sent settles (Settling), then the coalesced ACKs and the DREQ (or the
  // DREP the peer's DREQ waits for); the DREP (or the DREQ's timeout) ends it. All of it under the
  // lock or from the link's reports: nothing is left for after it.
  struct Closing {
    void Start() {}
  };
  Closing StartCloseLocked() NDWV_REQUIRES(mutex_);
  void SendCloseLocked() NDWV_REQUIRES(mutex_);  // Settling is over: the DREQ or DREP goes
  // A settle is over (acknowledged, its bound passed, or the link failed): the close it held goes
  // on (PeerClosing: our DREP; Settling: SendCloseLocked). False in any other state.
  bool CloseAfterSettleLocked(Finisher& finish) NDWV_REQUIRES(mutex_);
  // Under mutex_: the pending Connect ends with `status` (its CEP destroyed); the endpoint is
  // Bound again, to be retried.
  void FailConnect(Finisher& finish, int32_t status) NDWV_REQUIRES(mutex_);
  // A request beyond a Listen(0) backlog was postponed: its sender repeats it. Nothing to do.
  void BacklogSlotFreedLocked() NDWV_REQUIRES(mutex_) {}
  // Close, under mutex_: the listener, the CEP and the link go; a connected link fails once the
  // lock is released (End).
  struct Connection {
    std::shared_ptr<RcLink> link;
    void End() {
      if (link) link->Fail();
    }
  };
  Connection DropConnectionLocked(std::deque<std::shared_ptr<Endpoint>>& children) NDWV_REQUIRES(mutex_);

  // The lock for a callback from a port's receive path or a link (OnFirstPacket, OnLinkFailed,
  // OnSentSettled, OnUnreachable, ProbePeer): true when it was taken (the caller adopts it), else
  // `again` runs as deferred work (endpoint.cpp says why).
  template <typename Again>
  bool LockOrRetry(Again&& again) NDWV_TRY_ACQUIRE(true, mutex_);
  void SetState(State s) NDWV_REQUIRES(mutex_);

  void OnRequest(const CmEvent& event) NDWV_REQUIRES(mutex_);  // listener: a REQ for our service
  // The GetRequest target takes the request (ListenQueue, under the listener's lock): this
  // target's lock, then the child's.
  void Adopt(Endpoint& child);
  // The request went away before it was accepted (expired, or its peer gave up): a queued one
  // leaves its listener's queue. Called without mutex_.
  void RequestGone();
  void Withdraw(const Endpoint* request);  // listener: takes a gone request off the queue
  // The link sends and receives through `data_port` (null: port_).
  // False if the QP failed meanwhile (the link is not started).
  [[nodiscard]] bool StartLink(const RcParams& params, std::shared_ptr<Port> data_port = nullptr)
      NDWV_REQUIRES(mutex_);
  // Passive: the RTU, the first packet or a DREQ came; the QP is in RTS since Accept.
  void Establish(Finisher& finish) NDWV_REQUIRES(mutex_);
  void AnswerDreq(Finisher& finish) NDWV_REQUIRES(mutex_);  // the DREP, then PeerDisconnected
  void PeerDisconnected(Finisher& finish) NDWV_REQUIRES(mutex_);  // the close exchange is over: flush and tell
  RcParams BaseLinkParams() const NDWV_REQUIRES(mutex_);

  State state_ NDWV_GUARDED_BY(mutex_) = State::Idle;
  // local_: as bound (the ND address); peer_: Connect's, or where the REQ came from.
  // The peer's UDP port: where CM answers and data go.
  sockaddr_storage peer_port_ NDWV_GUARDED_BY(mutex_){};
  std::shared_ptr<Port> port_ NDWV_GUARDED_BY(mutex_);
  // port_ serves this endpoint alone (bound by it, not shared).
  bool exclusive_port_ NDWV_GUARDED_BY(mutex_) = false;
  uint32_t comm_id_ NDWV_GUARDED_BY(mutex_) = 0;
  // Once known (Connect/Accept; the REQ or REP).
  uint32_t qpn_ NDWV_GUARDED_BY(mutex_) = 0;
  uint32_t peer_qpn_ NDWV_GUARDED_BY(mutex_) = 0;
  // "roce cm qp 5 [local -> peer qp 7 id ...]", for log lines: made when one is written, not at
  // every state change (it showed in the profile of a connection setup, logged or not).
  std::string Identity() const NDWV_REQUIRES(mutex_);
  uint32_t mtu_ NDWV_GUARDED_BY(mutex_) = 1024;  // payload bytes per packet on this path
  uint32_t rq_psn_ NDWV_GUARDED_BY(mutex_) = 0;  // the PSN we expect first
  ConnectParams local_params_ NDWV_GUARDED_BY(mutex_);
  // What the link takes from the peer's REQ (passive) or REP (active): the messages themselves
  // (432 bytes) would stay with the connection for its life.
  struct PeerOffer {
    uint32_t starting_psn = 0;         // the PSN the peer expects first
    uint8_t responder_resources = 0;   // the peer's IRD
    uint8_t rnr_retry_count = 0;
    uint8_t path_mtu = 0;              // REQ: its path MTU code
  };
  PeerOffer offer_ NDWV_GUARDED_BY(mutex_);
  std::shared_ptr<QueuePair> qp_ NDWV_GUARDED_BY(mutex_);  // from Connect/Accept until the link takes it
  std::shared_ptr<RcLink> link_ NDWV_GUARDED_BY(mutex_);

  // Listening.
  int backlog_ NDWV_GUARDED_BY(mutex_) = 0;
  bool wait_beyond_backlog_ NDWV_GUARDED_BY(mutex_) = false;  // Listen(0)
  uint64_t service_id_ NDWV_GUARDED_BY(mutex_) = 0;
  // Of the service (the service ID's port space): TCP unless ND v1 says.
  uint8_t protocol_ NDWV_GUARDED_BY(mutex_) = 6;
  friend class ListenQueue<Endpoint>;
  // A request not yet taken: the listener that queued it.
  std::weak_ptr<Endpoint> listener_ NDWV_GUARDED_BY(mutex_);
};

}  // namespace ndwv::dev::roce
