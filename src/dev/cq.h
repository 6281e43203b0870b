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
