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
  virtual void PollProgress() = 0;    // a poller found the CQ empty and lends its thread
  // A poller reaped completions, or the application posted: its thread is active, but it may go
  // on to wait without polling (on memory, for an RDMA Write): not a reason to leave the engine.
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

// While a poller lends its thread, the transport keeps its socket from the engine: on a busy
// machine a wake-up per packet costs more than the packet (the woken engine preempts a poller, or
// holds the socket while preempted). kSpinningPolls empty polls in a row mean "a poller spins":
// only an empty poll drives receive progress, so only a run of them proves a thread will go on
// driving it. Posts and polls that reap completions do not count: an application that waits on
// memory for an RDMA Write posts and reaps between its waits, and nothing would read its socket
// while it waits. Once the engine is away, any polling or posting keeps it away; fewer than half
// kSpinningPolls of them within kPollIdle and the engine watches again.
inline constexpr uint32_t kSpinningPolls = 8;
inline constexpr std::chrono::milliseconds kPollIdle{10};

// The polls a transport counts for that rule. Hints, not exact counts: a plain load and store per
// poll (no read-modify-write), so two pollers may count once.
class SpinCount {
 public:
  // Counts an empty poll; true at the one that makes the pollers spinning.
  bool CountEmptyPoll() {
    Bump(active_);
    return Bump(empty_run_) == kSpinningPolls;
  }
  // A poll that reaped completions, or a post: ends a run of empty polls.
  void CountActivity() {
    Bump(active_);
    if (empty_run_.load(std::memory_order_relaxed)) empty_run_.store(0, std::memory_order_relaxed);
  }
  void Reset() {
    empty_run_.store(0, std::memory_order_relaxed);
    active_.store(0, std::memory_order_relaxed);
  }
  // Every kPollIdle while the engine keeps away: whether the polling went on, and a new count.
  bool StillSpinning() { return active_.exchange(0, std::memory_order_relaxed) >= kSpinningPolls / 2; }

 private:
  static uint32_t Bump(std::atomic<uint32_t>& counter) {
    uint32_t value = counter.load(std::memory_order_relaxed) + 1;
    counter.store(value, std::memory_order_relaxed);
    return value;
  }
  std::atomic<uint32_t> empty_run_{0};  // empty polls since the last activity
  std::atomic<uint32_t> active_{0};     // polls and posts since the timer last looked
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
  void TellSources(bool empty);  // empty: PollProgress (the poller lends its thread), else StillPolled
  // A source that pollers of this CQ no longer visit: it goes back to the engine (sources_mutex_).
  static void Withhold(ProgressSource* source);
  void CompleteArmedLocked(int32_t status, AsyncOp** done);
  static void Finish(AsyncOp* list, int32_t status);

  mutable base::Mutex mutex_;
  Ring<Completion> ring_;
  uint64_t head_ = 0;  // position of the next to poll
  std::atomic<size_t> count_{0};  // written under mutex_ (no read-modify-write), read without it
  std::atomic<bool> broken_{false};
  uint64_t pushed_ = 0;          // entries ever pushed
  uint64_t seen_ = 0;            // entries that fired a notify or that a draining poll saw
  uint64_t solicited_unseen_ = 0;// solicited or error entries pushed after seen_
  std::atomic<bool> unseen_{false};  // pushed_ != seen_, readable without the lock
  AsyncOp* armed_ = nullptr;     // outstanding Notify requests, oldest first
  NotifyType armed_type_ = NotifyType::Errors;  // strongest type armed

  base::Mutex sources_mutex_;
  size_t sources_ = 0;                   // attached
  std::vector<ProgressSource*> lenders_; // every source while the CQ lends its pollers, else empty
  bool lending_ = true;                  // sources_ has not exceeded kMaxLendingSources since it was 0
  std::atomic<uint32_t> reaping_polls_{0};  // polls that found entries (a hint, not exact)
};

}  // namespace ndwv::dev
