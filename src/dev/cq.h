// Completion queue: a ring of completions with Notify (arm) requests and overrun detection.
//
// Producers (transports, posting threads, the work pool) push under a mutex; the consumer's empty
// poll is one atomic load. Notify follows the ND rules: every armed request fires on one event
// (broadcast); entries that already fired a notification, or that a draining poll has seen, do not
// fire the next one; entries nobody has seen yet fire a Notify at once (no lost wake-up).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "base/mutex.h"
#include "dev/async.h"
#include "dev/ring.h"

namespace ndwv::dev {

// Mirror WV_WC_OPCODE / WV_WC_STATUS values so the verbs layer converts by cast.
enum class WrOpcode : uint8_t { Send = 0, Write = 1, Read = 2, Bind = 5, Invalidate = 6, Receive = 0x80 };
enum class WcStatus : uint8_t {
  Success, LocalLength, LocalOp, LocalProtection, Flushed, MwBind, RemoteAccess, RemoteOp,
  RnrRetry, TimeoutRetry, RemoteInvalidRequest, BadResponse, LocalAccess, Error
};

struct Completion {
  void* qp_context;
  uint64_t wr_id;
  uint32_t length;
  WrOpcode opcode;
  WcStatus status;
};

enum class NotifyType { Errors = 0, Any = 1, Solicited = 2 };

// Something that can make receive progress when a poller lends it its thread (a connected QP).
class ProgressSource {
 public:
  virtual void PollProgress() = 0;  // a poller found the CQ empty and lends its thread
  // A poller reaped completions; `peer_message`: one of them was a received message.
  virtual void Reaped(bool peer_message) = 0;
  // The application posted: its thread is active (it may still go on to wait without polling).
  virtual void StillPolled() = 0;
  // Progress must not need a poller from now on: someone waits for an event, or a CQ this source
  // feeds stopped lending its pollers.
  virtual void OnNotifyArmed() = 0;

  // Whether pollers may take this source from the engine: not while any CQ it feeds has too many
  // sources to lend its pollers to each (CompletionQueue::kMaxLendingSources).
  bool Lendable() const { return withheld_.load(std::memory_order_relaxed) == 0; }

 protected:
  ~ProgressSource() = default;

 private:
  friend class CompletionQueue;
  std::atomic<uint32_t> withheld_{0};  // CQs that withhold their pollers (their sources_mutex_)
};

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
//    likely, and the pollers take the socket back at once: left
//    with the engine, that answer would be read by a thread that needs a core the pollers spin
//    on (a 64 KiB RoCE ping-pong, whose Send completes before the answer comes, took 2-8 times
//    longer). Also when a Notify is armed, after which the pollers take the socket again only
//    once they end a wait themselves;
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

class CompletionQueue {
 public:
  explicit CompletionQueue(size_t entries);

  size_t capacity() const;
  size_t Count() const { return count_.load(std::memory_order_acquire); }
  int32_t Resize(size_t entries);  // WV_BUFFER_OVERFLOW if below the entries queued

  // Consumer side. An empty poll may drive receive progress of the attached QPs.
  size_t Poll(Completion* out, size_t max);

  // Producer side. solicited: a receive for a Send with the solicited-event flag.
  void Push(const Completion& completion, bool solicited);

  int32_t Notify(NotifyType type, AsyncOp* op);  // WV_PENDING, or an error if the CQ is broken
  void CancelNotifies();                         // armed requests complete WV_CANCELLED
  bool broken() const { return broken_.load(std::memory_order_acquire); }

  // A transport that feeds this CQ. It must be detached before it is destroyed.
  void AttachSource(ProgressSource* source);
  void DetachSource(ProgressSource* source);

  // A poller lends its thread to every source in turn: worth it while they are few (a ping-pong,
  // a few peers), a cost per empty poll when there are many. Past this count the CQ's sources
  // stay with the engine, which learns which sockets are ready from epoll, so that a poll or a
  // Notify costs the same for 10 QPs or 10,000; the CQ lends its pollers again once all its
  // sources are gone.
  static constexpr size_t kMaxLendingSources = 4;

 private:
  // None reaped (n = 0): PollProgress, the poller lends its thread; else Reaped.
  void TellSources(const Completion* reaped, size_t n);
  // A source that pollers of this CQ no longer visit: it goes back to the engine (sources_mutex_).
  static void Withhold(ProgressSource* source);
  void CompleteArmedLocked(int32_t status, AsyncOp** done) NDWV_REQUIRES(mutex_);
  static void Finish(AsyncOp* list, int32_t status);

  mutable base::Mutex mutex_{"CompletionQueue::mutex_"};
  Ring<Completion> ring_ NDWV_GUARDED_BY(mutex_);
  uint64_t head_ NDWV_GUARDED_BY(mutex_) = 0;  // position of the next to poll
  std::atomic<size_t> count_{0};  // written under mutex_ (no read-modify-write), read without it
  std::atomic<bool> broken_{false};
  uint64_t pushed_ NDWV_GUARDED_BY(mutex_) = 0;  // entries ever pushed
  // Entries that fired a notify or that a draining poll saw.
  uint64_t seen_ NDWV_GUARDED_BY(mutex_) = 0;
  // Solicited or error entries pushed after seen_.
  uint64_t solicited_unseen_ NDWV_GUARDED_BY(mutex_) = 0;
  std::atomic<bool> unseen_{false};  // pushed_ != seen_, readable without the lock
  AsyncOp* armed_ NDWV_GUARDED_BY(mutex_) = nullptr;  // outstanding Notify requests, oldest first
  NotifyType armed_type_ NDWV_GUARDED_BY(mutex_) = NotifyType::Errors;  // strongest type armed

  base::Mutex sources_mutex_{"CompletionQueue::sources_mutex_"};
  size_t sources_ NDWV_GUARDED_BY(sources_mutex_) = 0;  // attached
  // Every source while the CQ lends its pollers, else empty.
  std::vector<ProgressSource*> lenders_ NDWV_GUARDED_BY(sources_mutex_);
  // sources_ has not exceeded kMaxLendingSources since it was 0.
  bool lending_ NDWV_GUARDED_BY(sources_mutex_) = true;
};

}  // namespace ndwv::dev
