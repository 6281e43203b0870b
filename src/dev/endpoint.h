// Connection endpoint: the device's connection manager object (WinVerbs' kernel endpoint).
// Transport independent: iWARP implements it with TCP + MPA; RoCE will with the IB CM.
//
// Disconnect is one multi-phase request that carries both the endpoint and the QP (the two
// objects do not point at each other): the CM phase closes the connection; then the QP phase, on
// the work pool, moves the QP to Error, which flushes every outstanding request; then the request
// completes. The record (with its work item) is allocated by the caller when the request comes
// down, so the CM never allocates when it finishes it.
#pragma once
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <iterator>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <ndwv/wvstatus.h>

#include "base/mutex.h"
#include "dev/async.h"
#include "dev/counters.h"
#include "dev/engine.h"
#include "dev/qp.h"

namespace ndwv::dev {

inline constexpr size_t kMaxPrivateData = 56;

struct ConnectParams {
  uint32_t ird = 0;  // inbound RDMA Reads this side accepts
  uint32_t ord = 0;  // outbound RDMA Reads this side issues
  uint32_t data_length = 0;
  uint8_t data[kMaxPrivateData] = {};
};

struct ConnectionInfo {
  sockaddr_storage local{}, peer{};
  // What the peer sent, in its own terms (not swapped), once its request, reply or rejection came
  // (peer_heard); zeros before.
  ConnectParams peer_params;
  bool peer_heard = false;
};

// An endpoint's legal state changes: one row per state, in the enum's order, listing the states
// it may go to (itself only where the code sets it again). Written as the code behaves; a change
// not listed is a bug (ReportIllegalTransition). The rows are checked when the table is compiled.
template <class State, size_t kStates>
class TransitionTable {
  static_assert(kStates <= 32, "a row is a 32-bit set");

 public:
  struct Row {
    State from;
    std::initializer_list<State> to;
  };
  consteval TransitionTable(std::initializer_list<Row> rows) {
    if (rows.size() != kStates) throw "one row per state";
    size_t index = 0;
    for (const Row& row : rows) {
      if (size_t(row.from) != index++) throw "rows in the order of the enum";
      for (State to : row.to) allowed_[size_t(row.from)] |= uint32_t(1) << size_t(to);
    }
  }
  constexpr bool Allows(State from, State to) const { return (allowed_[size_t(from)] >> size_t(to)) & 1; }

 private:
  uint32_t allowed_[kStates] = {};
};

// A state change its endpoint's table does not list: aborts a checked build (base/checked.h) with
// both names; a release build logs it at Warn, counts it (illegal_endpoint_transitions) and lets
// it happen, as before the tables existed.
void ReportIllegalTransition(Transport transport, const std::string& identity, const char* from, const char* to);

struct DisconnectRequest : WorkItem {
  std::shared_ptr<QueuePair> qp;
  AsyncOp* op = nullptr;
  int32_t cm_status = 0;  // result of the CM phase

  DisconnectRequest() { run = &QpPhase; }
  // The CM phase is over with `status`: the QP phase (the flush) runs where no lock is held (the
  // work pool; the engine after its turn, when the engine ended the phase), then the request
  // completes with that status.
  void EndCmPhase(int32_t status) {
    cm_status = status;
    Engine::Get().Defer(this);
  }
  // The CM phase was over before the Disconnect began (the peer closed first), and the caller
  // may block and holds none of our locks: the QP phase runs here, sparing the work pool a hop.
  // On the engine, whose handlers never change a QP's state, it is deferred as usual.
  void EndCmPhaseHere(int32_t status) {
    if (Engine::Get().OnEngineThread()) return EndCmPhase(status);
    cm_status = status;
    QpPhase(this);
  }

 private:
  static void QpPhase(WorkItem* item) {
    auto* request = static_cast<DisconnectRequest*>(item);
    if (request->qp) request->qp->Modify(QpState::Error);
    request->op->Complete(request->cm_status);
  }
};

// A listener's connection requests and the GetRequest calls waiting for them, matched oldest to
// oldest, whichever comes first. Used under the listener's lock; the GetRequest target (a fresh
// endpoint, a friend) takes a request over with Adopt. A queued request can be taken out again
// in O(1) by the position Arrive gave (its peer left, or its time ran out).
template <class Endpoint>
class ListenQueue {
 public:
  using Position = typename std::list<std::shared_ptr<Endpoint>>::iterator;

  // GetRequest: the oldest request goes to `target` and `op` completes, or the call waits.
  void Take(std::shared_ptr<Endpoint> target, AsyncOp* op, Finisher& finish) {
    if (arrived_.empty()) {
      waiting_.push_back({std::move(target), op});
      return;
    }
    Hand(*arrived_.front(), *target);
    arrived_.pop_front();
    finish.Add(op, WV_SUCCESS);
  }
  // A request arrived: to the oldest waiting GetRequest, else queued (its position returned).
  std::optional<Position> Arrive(std::shared_ptr<Endpoint> request, Finisher& finish) {
    if (waiting_.empty()) {
      arrived_.push_back(std::move(request));
      return std::prev(arrived_.end());
    }
    Hand(*request, *waiting_.front().target);
    finish.Add(waiting_.front().op, WV_SUCCESS);
    waiting_.pop_front();
    return std::nullopt;
  }
  void Remove(Position at) { arrived_.erase(at); }
  // The request queued longest, or null.
  const std::shared_ptr<Endpoint>* Oldest() const { return arrived_.empty() ? nullptr : &arrived_.front(); }
  size_t queued() const { return arrived_.size(); }
  // A queued request went away before anyone took it (its peer gave up, or it expired): it no
  // longer counts against the backlog. Linear in the queue, which the backlog bounds.
  void Withdraw(const Endpoint* request) {
    std::erase_if(arrived_, [request](const std::shared_ptr<Endpoint>& e) { return e.get() == request; });
  }
  void CancelWaiting(Finisher& finish) {
    for (const Waiting& w : waiting_) {
      w.target->awaiting_request_ = false;  // free again, for a Connect or another GetRequest
      finish.Add(w.op, WV_CANCELLED);
    }
    waiting_.clear();
  }
  std::deque<std::shared_ptr<Endpoint>> TakeQueued() {
    std::deque<std::shared_ptr<Endpoint>> queued(arrived_.begin(), arrived_.end());
    arrived_.clear();
    return queued;
  }

 private:
  struct Waiting {
    std::shared_ptr<Endpoint> target;
    AsyncOp* op;
  };
  // The target takes the request over and is no longer awaited (after the Adopt: its state then
  // says it is taken, so it is never free in between).
  static void Hand(Endpoint& request, Endpoint& target) {
    target.Adopt(request);
    target.awaiting_request_ = false;
  }
  std::list<std::shared_ptr<Endpoint>> arrived_;  // requests not yet taken
  // GetRequests not yet answered. A list, not a deque: every endpoint has a queue, connectors
  // too, and an empty deque already holds half a kilobyte.
  std::list<Waiting> waiting_;
};

// The host's bound on a listener's queue (the kernel's somaxconn), read once; 4096 (the kernel's
// default) where it cannot be read. Every request a listener holds costs memory and, on iWARP, a
// socket: a careful administrator's bound, not a number a peer could exploit.
int HostBacklog();
// What a listener holds for Listen(backlog).
inline int ListenBound(int backlog) { return backlog > 0 ? std::min(backlog, HostBacklog()) : HostBacklog(); }

class ConnectEndpoint {
 public:
  virtual ~ConnectEndpoint() = default;

  virtual int32_t Bind(const sockaddr* address, socklen_t length) = 0;
  // The IANA protocol of the service the endpoint listens or connects for (default TCP, 6), where
  // the transport's wire carries one (RoCE: the service ID); ignored where it does not (iWARP).
  virtual void SetProtocol(uint8_t /*protocol*/) {}
  // `backlog`: how many requests the listener holds for GetRequest (on iWARP with the connections
  // still reading theirs), cut to HostBacklog(); beyond it a request is refused (nd2-spi: full
  // backlog, ND_CONNECTION_REFUSED). 0, ND's "no limit": HostBacklog() held, and a request beyond
  // it is not refused but left to wait (in the kernel's accept queue, or postponed for its
  // sender to repeat) until there is room, as a TCP listener's full queue makes connects wait.
  virtual int32_t Listen(int backlog) = 0;
  // Completes when a connection request was attached to `target` (a fresh endpoint).
  virtual int32_t GetRequest(std::shared_ptr<ConnectEndpoint> target, AsyncOp* op) = 0;
  virtual int32_t Connect(std::shared_ptr<QueuePair> qp, const sockaddr* peer, socklen_t length,
                          const ConnectParams& params, AsyncOp* op) = 0;
  // Passive: qp is the QP to connect. Active, after Connect completed: qp is NULL.
  virtual int32_t Accept(std::shared_ptr<QueuePair> qp, const ConnectParams& params, AsyncOp* op) = 0;
  virtual int32_t Reject(const void* data, size_t length) = 0;
  virtual int32_t Disconnect(DisconnectRequest* request) = 0;
  virtual int32_t NotifyDisconnect(AsyncOp* op) = 0;
  virtual int32_t Query(ConnectionInfo* info) = 0;
  // Completes every parked request (GetRequest, Connect, Accept, NotifyDisconnect) WV_CANCELLED.
  // A Disconnect in progress is not canceled: it always ends with the flush (see teardown docs).
  virtual void CancelRequests() = 0;
  // The owner released the endpoint: cancel what is parked and drop the connection (abortive if
  // it was never disconnected).
  virtual void Close() = 0;
};

// Where a connection is, as the teardown contract sees it (docs/teardown.md): each transport's
// endpoint maps its states onto these, and the shared NotifyDisconnect and Disconnect act on them.
enum class ConnectionPhase {
  NotConnected,  // setting up, listening, or closed: nothing to notify or disconnect
  Connected,     // NotifyDisconnect waits; Disconnect closes
  Failed,        // the QP failed, the CM is still up: NotifyDisconnect done; Disconnect closes
  PeerClosed,    // the peer closed: NotifyDisconnect done; Disconnect only flushes
  Closing,       // our Disconnect is closing it
  Disconnected,  // over: Disconnect only flushes
};

// What both transports' endpoints have in common: the requests parked on them, the addresses and
// peer parameters Query reports, the listen queue, and the transport-independent part of
// GetRequest, Query, NotifyDisconnect, Disconnect, CancelRequests and Close. `Endpoint`, the
// transport's class deriving from this (a friend of it), supplies:
//   State, with Listening, Disconnected and Closed; state_ and SetState (under mutex_);
//   static ConnectionPhase PhaseOf(State);
//   StartCloseLocked(): the transport's part of a Disconnect of a connected endpoint, under the
//     lock; it returns a Closing whose Start() runs after the lock, as the Disconnect's last step
//     (the close may complete the request at once: nothing of ours is touched after it);
//   FailConnect(finish, status): the parked Connect ends with `status`;
//   BacklogSlotFreedLocked(): a GetRequest may have taken a queued request (a listener that let
//     connections wait beyond its backlog takes them again);
//   FinishDisconnect(status), where the transport does more than this class's;
//   DropConnectionLocked(children): Close's part under the lock; it returns a Connection whose
//     End() runs after the lock (the transport's link reports to us).
// The transport's members under mutex_ name it (NDWV_GUARDED_BY, NDWV_REQUIRES). This class
// reaches them through a cast of this, which the thread-safety analysis sees through (through a
// function returning the reference, it could not tell that the lock is this object's).
//
// Two endpoints' locks: a listener's before its requests' and before a GetRequest target's; a
// target's before the request it adopts (Adopt, called under the listener's lock).
template <class Endpoint>
class EndpointBase : public ConnectEndpoint {
 public:
  int32_t GetRequest(std::shared_ptr<ConnectEndpoint> target, AsyncOp* op) final {
    auto endpoint = std::dynamic_pointer_cast<Endpoint>(target);
    if (!endpoint) return WV_INVALID_PARAMETER;
    if (endpoint.get() == static_cast<Endpoint*>(this)) return WV_INVALID_PARAMETER;
    Finisher finish;
    base::MutexLock lock(mutex_);
    if (static_cast<Endpoint&>(*this).state_ != Endpoint::State::Listening) return WV_INVALID_DEVICE_STATE;
    {
      // A fresh endpoint, or one only bound (it gives its own address up for the request's): one
      // that connects, listens, awaits or took a request, or was closed cannot take one. The
      // listener's lock, then the target's, as in Adopt.
      base::MutexLock target_lock(endpoint->mutex_);
      if (!endpoint->FreeLocked()) return WV_CONNECTION_ACTIVE;
      endpoint->awaiting_request_ = true;
    }
    requests_.Take(std::move(endpoint), op, finish);
    static_cast<Endpoint&>(*this).BacklogSlotFreedLocked();
    return WV_PENDING;
  }

  int32_t Query(ConnectionInfo* info) final {
    base::MutexLock lock(mutex_);
    info->local = local_;
    info->peer = peer_;
    info->peer_heard = peer_params_.has_value();
    info->peer_params = peer_params_.value_or(ConnectParams{});
    return WV_SUCCESS;
  }

  int32_t NotifyDisconnect(AsyncOp* op) final {
    Finisher finish;
    base::MutexLock lock(mutex_);
    switch (Endpoint::PhaseOf(static_cast<Endpoint&>(*this).state_)) {
      case ConnectionPhase::Connected:
        op->next = notify_ops_;
        notify_ops_ = op;
        return WV_PENDING;
      case ConnectionPhase::Failed:
      case ConnectionPhase::PeerClosed:
        finish.Add(op, WV_SUCCESS);
        return WV_PENDING;
      case ConnectionPhase::Closing:
      case ConnectionPhase::Disconnected:
        return WV_CONNECTION_DISCONNECTED;
      default:
        return WV_CONNECTION_INVALID;
    }
  }

  int32_t Disconnect(DisconnectRequest* request) final {
    Finisher finish;
    base::UniqueLock lock(mutex_);
    if (disconnect_called_) return WV_CONNECTION_INVALID;  // a connector disconnects once
    switch (Endpoint::PhaseOf(static_cast<Endpoint&>(*this).state_)) {
      case ConnectionPhase::Connected:
      case ConnectionPhase::Failed: {
        disconnect_ = request;
        disconnect_called_ = true;
        finish.AddList(notify_ops_, WV_CONNECTION_DISCONNECTED);
        typename Endpoint::Closing closing = static_cast<Endpoint&>(*this).StartCloseLocked();
        lock.unlock();
        closing.Start();  // last: the close may complete the request at once
        return WV_PENDING;
      }
      case ConnectionPhase::PeerClosed:
      case ConnectionPhase::Disconnected:
        // The peer closed already (or the connection failed): only the flush is left.
        static_cast<Endpoint&>(*this).SetState(Endpoint::State::Disconnected);
        disconnect_called_ = true;
        lock.unlock();
        request->EndCmPhaseHere(WV_SUCCESS);
        return WV_PENDING;
      default:
        return WV_CONNECTION_INVALID;
    }
  }

  void CancelRequests() final {
    Finisher finish;
    base::MutexLock lock(mutex_);
    if (connect_op_) static_cast<Endpoint&>(*this).FailConnect(finish, WV_CANCELLED);
    finish.AddList(notify_ops_, WV_CANCELLED);
    requests_.CancelWaiting(finish);
  }

  void Close() final {
    CancelRequests();
    Finisher finish;
    typename Endpoint::Connection connection;  // ended after the lock: it reports to us
    std::deque<std::shared_ptr<Endpoint>> children;
    {
      base::MutexLock lock(mutex_);
      finish.Add(std::exchange(accept_op_, nullptr), WV_CANCELLED);
      children = requests_.TakeQueued();
      connection = static_cast<Endpoint&>(*this).DropConnectionLocked(children);
      if (disconnect_) static_cast<Endpoint&>(*this).FinishDisconnect(WV_CANCELLED);  // released mid-close: the request still ends
      static_cast<Endpoint&>(*this).SetState(Endpoint::State::Closed);
    }
    connection.End();
    for (auto& child : children) child->Close();
  }

 protected:
  // Neither connecting, listening nor closed, and not the target of a GetRequest: a Connect or a
  // GetRequest may make something of it.
  bool FreeLocked() const NDWV_REQUIRES(mutex_) {
    auto state = static_cast<const Endpoint&>(*this).state_;
    return (state == Endpoint::State::Idle || state == Endpoint::State::Bound) && !awaiting_request_;
  }

  // The CM phase is over (mutex_ held): the QP phase runs as deferred work. A transport that
  // does more at that point hides this with its own, which calls it.
  void FinishDisconnect(int32_t status) NDWV_REQUIRES(mutex_) {
    mutex_.AssertHeld();
    static_cast<Endpoint&>(*this).SetState(Endpoint::State::Disconnected);
    if (DisconnectRequest* request = std::exchange(disconnect_, nullptr)) request->EndCmPhase(status);
  }

  base::Mutex mutex_{"EndpointBase::mutex_"};
  sockaddr_storage local_ NDWV_GUARDED_BY(mutex_){};  // ours as bound
  sockaddr_storage peer_ NDWV_GUARDED_BY(mutex_){};   // the peer's ND address
  // What the peer sent (Query), from its request, reply or rejection; a Connect forgets it.
  std::optional<ConnectParams> peer_params_ NDWV_GUARDED_BY(mutex_);

  // The requests parked until an event ends them.
  AsyncOp* connect_op_ NDWV_GUARDED_BY(mutex_) = nullptr;
  AsyncOp* accept_op_ NDWV_GUARDED_BY(mutex_) = nullptr;
  AsyncOp* notify_ops_ NDWV_GUARDED_BY(mutex_) = nullptr;
  DisconnectRequest* disconnect_ NDWV_GUARDED_BY(mutex_) = nullptr;
  bool disconnect_called_ NDWV_GUARDED_BY(mutex_) = false;  // a second Disconnect is ND_CONNECTION_INVALID

  // Listening: requests not yet taken, and GetRequests.
  ListenQueue<Endpoint> requests_ NDWV_GUARDED_BY(mutex_);
  // The target of a listener's GetRequest that no request has reached yet: set under both
  // endpoints' locks, cleared under the listener's (after the Adopt that takes the target, which
  // changes its state, or when the GetRequest is canceled).
  std::atomic<bool> awaiting_request_{false};
};

}  // namespace ndwv::dev
