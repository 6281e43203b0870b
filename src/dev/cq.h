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
struct ProgressSource {
  virtual void PollProgress() = 0;    // a poller found the CQ empty and lends its thread
  // A poller reaped completions, or the application posted: its thread is active and will poll
  // (lending itself) or arm a Notify.
  virtual void StillPolled() = 0;
  virtual void OnNotifyArmed() = 0;   // someone waits for an event: progress must not need a poller
 protected:
  ~ProgressSource() = default;
};

// While a poller lends its thread, the transport keeps its socket from the engine: on a busy
// machine a wake-up per packet costs more than the packet (the woken engine preempts a poller, or
// holds the socket while preempted). kSpinningPolls polls (PollProgress or StillPolled: polls and
// posts) mean "a poller spins"; few, so that the engine lets go soon after the polling starts
// again (a writer reports a poll per few completions). Fewer than half as many within kPollIdle:
// the engine watches again.
inline constexpr uint32_t kSpinningPolls = 8;
inline constexpr std::chrono::milliseconds kPollIdle{10};

// The polls a transport counts for that rule. A hint, not an exact count: a plain load and store
// per poll (no read-modify-write), so two pollers may count once.
class SpinCount {
 public:
  // Counts a poll; true at the one that makes the pollers spinning.
  bool Count() {
    uint32_t polls = polls_.load(std::memory_order_relaxed) + 1;
    polls_.store(polls, std::memory_order_relaxed);
    return polls == kSpinningPolls;
  }
  void Reset() { polls_.store(0, std::memory_order_relaxed); }
  // Every kPollIdle while the engine keeps away: whether the polling went on, and a new count.
  bool StillSpinning() { return polls_.exchange(0, std::memory_order_relaxed) >= kSpinningPolls / 2; }

 private:
  std::atomic<uint32_t> polls_{0};
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

  void AttachSource(ProgressSource* source);
  void DetachSource(ProgressSource* source);

 private:
  void TellSources(bool empty);  // empty: PollProgress (the poller lends its thread), else StillPolled
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
  std::vector<ProgressSource*> sources_;
  std::atomic<uint32_t> reaping_polls_{0};  // polls that found entries (a hint, not exact)
};

}  // namespace ndwv::dev
