// Who reads a transport's socket, the engine or the application's CQ pollers, and the hand-over
// between them: the rule (PollerRule) and its use (PollerHandoff), written once for every
// transport (an iWARP stream's socket, a RoCE port's).
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "base/mutex.h"
#include "dev/engine.h"

namespace ndwv::dev {

// Who reads a transport's socket: the engine, or the application's threads while they poll. A
// poller that finds its CQ empty drives the receive path itself, and while it does the engine
// should keep away: on a busy machine a wake-up per packet costs more than the packet (the woken
// engine preempts a poller, or holds the socket while preempted). But nothing reads a socket the
// engine left while the application waits without polling, and an application that waits on
// memory for the peer's RDMA Write (MPI's eager protocols, Microsoft's ndrpingpong) polls its CQ
// only to reap its own requests. So the evidence is what the pollers receive and reap:
//  * the engine leaves when a poller's receive has placed a message the peer started (a Send, an
//    RDMA Write with data, a Read Request for data): the application polls while the peer talks;
//  * it comes back when a wait (empty polls) ends in a poll that reaps, if neither a peer's
//    message was placed during the wait nor a received message reaped at its end: what the
//    application waited for was its own request, and it may wait for the peer's next message
//    without polling. If it polls again instead (an empty poll next) and has ever ended a wait
//    by reaping a received message, it waits by polling after all, for the peer's answer most
//    likely, and the pollers take the socket back at once: left with the engine, that answer
//    would be read by a thread that needs a core the pollers spin on (a 64 KiB RoCE ping-pong,
//    whose Send completes before the answer comes, took 2-8 times longer). Also when a Notify
//    is armed, after which the pollers take the socket again only once they end a wait
//    themselves;
//  * and by timer, when polls and posts have stopped: the first look kFirstIdleLook after the
//    engine left, then each look twice as late, up to kPollIdle, while the pollers go on. A
//    memory waiter the evidence missed so waits kFirstIdleLook more, not kPollIdle.
// The counts are hints (plain loads and stores, no read-modify-write): two pollers may count once.
// Milliseconds: the engine's timer resolution (epoll_wait), which also lets timers due close
// together fire in one wake-up.
inline constexpr std::chrono::milliseconds kFirstIdleLook{1};
inline constexpr std::chrono::milliseconds kPollIdle{10};

class PollerRule {
 public:
  // An empty poll that drove the receive path; `placed_peer_message`: it placed one. True if the
  // pollers should now take the socket from the engine: it did, or it is the first empty poll
  // since a reaping poll gave the engine the socket; and the application has not armed a Notify
  // since the pollers last ended a wait themselves (one that waits for its own requests by
  // events, and for the peer on memory, would find nobody reading the socket).
  bool EmptyPoll(bool placed_peer_message) {
    Bump(active_);
    if (!waiting_.load(std::memory_order_relaxed)) waiting_.store(true, std::memory_order_relaxed);
    bool polls_again = left_on_reap_.load(std::memory_order_relaxed);
    if (polls_again) left_on_reap_.store(false, std::memory_order_relaxed);
    if (placed_peer_message) peer_in_wait_.store(true, std::memory_order_relaxed);
    return (placed_peer_message || polls_again) && !notified_.load(std::memory_order_relaxed);
  }
  // A poll that reaped completions (`peer_message`: a received message among them): true if it
  // ends a wait that was for the application's own request.
  bool Reaped(bool peer_message) {
    Bump(active_);
    if (!waiting_.load(std::memory_order_relaxed)) return false;
    waiting_.store(false, std::memory_order_relaxed);
    if (notified_.load(std::memory_order_relaxed)) notified_.store(false, std::memory_order_relaxed);
    bool peer = peer_in_wait_.load(std::memory_order_relaxed);
    if (peer) peer_in_wait_.store(false, std::memory_order_relaxed);
    if (peer_message && !receives_polled_.load(std::memory_order_relaxed))
      receives_polled_.store(true, std::memory_order_relaxed);
    bool own = !peer && !peer_message;
    // An application that polls for its receives polls for the answer next, most likely; one
    // that never did waits on memory, and taking the socket back from the engine at each of its
    // waits would cost a wake-up of the engine each time (the pollers' idle timer).
    if (own && receives_polled_.load(std::memory_order_relaxed)) left_on_reap_.store(true, std::memory_order_relaxed);
    return own;
  }
  void Posted() { Bump(active_); }
  // A Notify was armed: the wait ends by an event, and the engine watches.
  void Notified() {
    waiting_.store(false, std::memory_order_relaxed);
    peer_in_wait_.store(false, std::memory_order_relaxed);
    active_.store(0, std::memory_order_relaxed);
    notified_.store(true, std::memory_order_relaxed);
    left_on_reap_.store(false, std::memory_order_relaxed);
  }
  // The owner's idle timer, under the owner's lock: when to look first after the engine left,
  // and, at each look, whether polls or posts went on since the last (a new count) and when to
  // look next.
  std::chrono::milliseconds FirstLook() {
    active_.store(0, std::memory_order_relaxed);
    return look_ = kFirstIdleLook;
  }
  bool StillActive() { return active_.exchange(0, std::memory_order_relaxed) >= kStillActive; }
  std::chrono::milliseconds NextLook() { return look_ = std::min(2 * look_, kPollIdle); }

 private:
  static constexpr uint32_t kStillActive = 4;  // polls and posts between two looks
  static void Bump(std::atomic<uint32_t>& counter) {
    counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  std::atomic<bool> waiting_{false};       // empty polls since the last reaping poll
  std::atomic<bool> peer_in_wait_{false};  // ... of which one placed a peer's message
  std::atomic<bool> notified_{false};      // a Notify armed since the pollers last ended a wait
  std::atomic<bool> left_on_reap_{false};  // the last reaping poll gave the engine the socket
  std::atomic<bool> receives_polled_{false};  // a wait ended by reaping a received message
  std::atomic<uint32_t> active_{0};        // polls and posts since the timer last looked
  std::chrono::milliseconds look_{kFirstIdleLook};
};

// The hand-over itself. The owner (an iWARP stream, a RoCE port) keeps the socket, its epoll
// interest and its receive path, and gives this class three things (a friend, it may call them
// privately):
//   std::shared_ptr<Owner> shared_from_this();
//   void ApplyWatchLocked(), under mutex(): set the socket's epoll interest, the receive side
//     from engine_reads();
//   void EngineReturned(bool by_timer): the engine watches again; read what arrived meanwhile
//     (`by_timer`: because the pollers stopped).
// The owner's PollProgress, Reaped, StillPolled and OnNotifyArmed (ProgressSource, dev/cq.h)
// forward here; the owner's shutdown calls Close.
template <class Owner>
class PollerHandoff {
 public:
  explicit PollerHandoff(Owner* owner) : timer_(&PollerHandoff::OnTimer, owner) {}
  PollerHandoff(const PollerHandoff&) = delete;
  PollerHandoff& operator=(const PollerHandoff&) = delete;

  // Also guards what the owner's ApplyWatchLocked reads besides engine_reads().
  base::Mutex& mutex() NDWV_RETURN_CAPABILITY(mutex_) { return mutex_; }
  // A hint read on the data path (written under mutex()): a stale answer costs at most one more
  // read of the socket.
  bool engine_reads() const { return engine_reads_.load(std::memory_order_relaxed); }

  // A poller found its CQ empty and drove the owner's receive path; `placed_peer_message`: it
  // placed a message the peer started; `lendable`: its CQ lends pollers (ProgressSource).
  void EmptyPoll(Owner& owner, bool placed_peer_message, bool lendable) NDWV_EXCLUDES(mutex_) {
    if (!rule_.EmptyPoll(placed_peer_message) || !lendable || !engine_reads()) return;
    base::MutexLock lock(mutex_);
    if (closed_ || !engine_reads_) return;
    engine_reads_ = false;
    owner.ApplyWatchLocked();
    timer_.Arm(owner.shared_from_this(), rule_.FirstLook());
  }
  // A poll reaped completions (`peer_message`: a received message among them). True if that gave
  // the engine the socket back.
  bool Reaped(Owner& owner, bool peer_message) NDWV_EXCLUDES(mutex_) {
    return rule_.Reaped(peer_message) && !engine_reads() && EngineWatches(owner, false);
  }
  void Posted() { rule_.Posted(); }
  // Someone will wait for an event (a CQ Notify): the engine must watch.
  void NotifyArmed(Owner& owner) NDWV_EXCLUDES(mutex_) {
    rule_.Notified();
    EngineWatches(owner, false);
  }
  // The owner shuts down: no more hand-overs, and the timer lets the owner go.
  void Close() NDWV_EXCLUDES(mutex_) {
    base::MutexLock lock(mutex_);
    closed_ = true;
    timer_.Disarm();
  }

 private:
  // True if the engine did not watch before.
  bool EngineWatches(Owner& owner, bool by_timer) NDWV_EXCLUDES(mutex_) {
    {
      base::MutexLock lock(mutex_);
      if (closed_ || engine_reads_) return false;
      engine_reads_ = true;
      owner.ApplyWatchLocked();
      timer_.Disarm();
    }
    owner.EngineReturned(by_timer);
    return true;
  }

  static void OnTimer(Timer* timer) {
    Owner* owner = OwnedTimer<Owner>::OwnerOf(timer);
    PollerHandoff& self = owner->handoff_;
    std::shared_ptr<Owner> keep;
    {
      base::MutexLock lock(self.mutex_);
      keep = self.timer_.TakeFiring();
      if (!keep || self.closed_) return;
      if (self.rule_.StillActive()) {
        self.timer_.Arm(keep, self.rule_.NextLook());  // still polling: look later
        return;
      }
    }
    self.EngineWatches(*keep, true);
  }

  base::Mutex mutex_{"PollerHandoff::mutex_"};
  std::atomic<bool> engine_reads_{true};  // written under mutex_
  bool closed_ NDWV_GUARDED_BY(mutex_) = false;
  PollerRule rule_;
  OwnedTimer<Owner> timer_ NDWV_GUARDED_BY(mutex_);
};

}  // namespace ndwv::dev
