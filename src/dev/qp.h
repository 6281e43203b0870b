// Reliable-connected queue pair: the verbs state machine, the send and receive queues, in-order
// completion and flush. The wire protocol lives in a Link (one per connected QP, made by the
// transport); the QP knows nothing about sockets.
//
// Threads: posting runs on the caller's thread and kicks the link; the link's progress runs on
// the engine or on a CQ poller's thread; state changes to Error (flush) run as deferred work
// holding no lock (the work pool, or the engine after its turn) or on the caller's thread (Flush,
// release), never in an engine handler.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "dev/async.h"
#include "dev/counters.h"
#include "dev/cq.h"
#include "dev/memory.h"
#include "dev/ring.h"

namespace ndwv::dev {

inline constexpr uint32_t kMaxSge = 16;
inline constexpr uint32_t kMaxInline = 256;

enum class QpState { Reset, Init, Rtr, Rts, Sqd, Sqe, Error };
const char* ToString(QpState state);
bool IsLegalTransition(QpState from, QpState to);

// Send flags, with the WV_SEND_* values. kInvalidate: a Send with Invalidate of `rkey`.
enum SendFlag : uint32_t {
  kFence = 0x2, kSignaled = 0x4, kSolicited = 0x8, kInline = 0x10, kInvalidate = 0x20
};

// The most one work request moves (MaxTransferLength): a post referring to more is refused
// (WV_BUFFER_OVERFLOW), and so is a peer's request for more (a Read Request, an RDMA Write).
inline constexpr uint64_t kMaxTransferLength = uint64_t(1) << 30;

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// The piece of an SGE list at byte `offset`: its address and contiguous length (0 past the end).
inline std::pair<uint8_t*, uint64_t> PieceAt(const Sge* sge, uint32_t num_sge, uint64_t offset) {
  for (uint32_t i = 0; i < num_sge; ++i) {
    if (offset < sge[i].length)
      return {reinterpret_cast<uint8_t*>(sge[i].addr) + offset, sge[i].length - offset};
    offset -= sge[i].length;
  }
  return {nullptr, 0};
}

// Laid out so that a small request touches few cache lines of the (large, cycling) queue ring:
// the fixed fields first, then either the SGE list or the inline data, whichever it uses.
struct SendWqe {
  uint64_t wr_id;
  WrOpcode opcode;
  uint32_t flags;
  uint32_t num_sge;       // 0 for inline requests
  uint64_t length;        // bytes the request moves
  uint64_t remote_addr;   // Write/Read
  uint32_t rkey;          // Write/Read: the target's key; Send with kInvalidate: the key to invalidate
  // Execution state, owned by the link while it transmits.
  WcStatus status;        // set when done
  bool done;
  uint64_t sent;
  std::shared_ptr<MemoryWindow> window;  // Bind/Invalidate
  union {
    Sge sge[kMaxSge];
    uint8_t inline_data[kMaxInline];  // ND_OP_FLAG_INLINE: copied at post time
  };
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint64_t length;  // capacity
  Sge sge[kMaxSge];

  // A receive post (a QP's or an SRQ's): the entry filled, its length summed in the same pass;
  // false, the entry left free, if more than a work request may move (kMaxTransferLength).
  bool Fill(uint64_t id, const Sge* given, uint32_t count) {
    uint64_t total = 0;
    for (uint32_t i = 0; i < count; ++i) {
      sge[i] = given[i];
      total += given[i].length;
    }
    if (total > kMaxTransferLength) return false;
    wr_id = id;
    num_sge = count;
    length = total;
    return true;
  }
  // Copies what is in use (on the receive path: not the whole SGE array).
  void CopyTo(RecvWqe* out) const {
    out->wr_id = wr_id;
    out->num_sge = num_sge;
    out->length = length;
    for (uint32_t i = 0; i < num_sge; ++i) out->sge[i] = sge[i];
  }
};

// The bytes a queue's entries take (Ring): the fixed fields, then room for `sge` SGEs, or for
// `max_inline` bytes of inline data on a send queue.
static_assert(std::is_standard_layout_v<SendWqe> && std::is_standard_layout_v<RecvWqe>, "offsetof");
inline size_t SendWqeBytes(uint32_t sge, uint32_t max_inline) {
  return offsetof(SendWqe, sge) + std::max(std::min(sge, kMaxSge) * sizeof(Sge), size_t(std::min(max_inline, kMaxInline)));
}
inline size_t RecvWqeBytes(uint32_t sge) { return offsetof(RecvWqe, sge) + std::min(sge, kMaxSge) * sizeof(Sge); }
// The SGEs an entry for `sge` SGEs (and `max_inline` bytes) holds once its bytes are rounded up to
// whole cache lines: what a queue can grant beyond the request at no cost, as an RNIC's WQE stride
// does. At most kMaxSge.
uint32_t SendSgeFillingLines(uint32_t sge, uint32_t max_inline);
uint32_t RecvSgeFillingLines(uint32_t sge);

struct QpCaps {
  uint32_t send_depth, recv_depth, send_sge, recv_sge, max_inline;
};

class SharedReceiveQueue;
class QueuePair;

// The transport side of a connected QP.
class Link : public ProgressSource {
 public:
  virtual ~Link() = default;
  virtual void Kick() = 0;      // send work is waiting
  // A send request was posted. A transport may leave it queued for a moment, to send it with the
  // next ones, when something already in flight is sure to kick it.
  virtual void Posted(const SendWqe& /*request*/) { Kick(); }
  virtual void Shutdown() = 0;  // stop all progress and release the connection; idempotent
  // The connection's counters and identity: the transport counts, the QP adds its flushes.
  ConnectionCounters& counters() { return counters_; }

  // The passive side's QP is in RTS from its Accept on (as rdma_cm's accept moves it), but the
  // link sends nothing posted until the connection is established (iWARP: the peer's RTR; RoCE:
  // the RTU, the first packet or a DREQ). Establishment then changes no QP state, which the
  // engine, where it is seen, may not do: it lifts this hold, and the Accept completes there
  // and then, without a hand-off to the work pool.
  bool HeldUntilEstablished() const { return held_until_established_.load(std::memory_order_acquire); }
  void Established() {
    held_until_established_.store(false, std::memory_order_release);
    Kick();
  }

 protected:
  explicit Link(bool held_until_established = false) : held_until_established_(held_until_established) {}
  ConnectionCounters counters_;

 private:
  std::atomic<bool> held_until_established_;
};

class QueuePair : public std::enable_shared_from_this<QueuePair> {
 public:
  QueuePair(std::shared_ptr<ProtectionDomain> pd, std::shared_ptr<CompletionQueue> send_cq,
            std::shared_ptr<CompletionQueue> recv_cq, std::shared_ptr<SharedReceiveQueue> srq,
            void* context, const QpCaps& caps);
  ~QueuePair();

  uint32_t qpn() const { return qpn_; }
  void* context() const { return context_; }
  const QpCaps& caps() const { return caps_; }
  ProtectionDomain& pd() const { return *pd_; }
  QpState state() const { return state_.load(std::memory_order_acquire); }

  // One connection endpoint at a time may use the QP to connect: Claim is true for the first
  // owner (and again for it), false for another until the owner lets go (Unclaim). An owner is a
  // number never used twice (not an address), so a late Unclaim cannot free another's claim.
  bool Claim(uint64_t owner) {
    uint64_t none = 0;
    return claimant_.compare_exchange_strong(none, owner) || none == owner;
  }
  void Unclaim(uint64_t owner) { claimant_.compare_exchange_strong(owner, 0); }

  // Verbs Modify of the state. To Error: stops the link and flushes every outstanding request.
  int32_t Modify(QpState to);
  // Moves to Error from a thread that must not do it itself (an engine handler, a poller), as
  // deferred work (Engine::Defer).
  void DeferError();

  int32_t PostSend(const SendWqe& request);  // `sent`, `done`, `status` are ignored
  int32_t PostReceive(uint64_t wr_id, const Sge* sge, uint32_t num_sge);

  // ---- for the transport ----
  // Makes `link` the QP's transport and a progress source of its CQs. False if the QP is in Error
  // (or Reset) already: the link must not run.
  [[nodiscard]] bool Attach(std::shared_ptr<Link> link);
  std::shared_ptr<Link> link() const;
  // The send queue is a ring indexed by ever-growing positions.
  uint64_t send_tail() const { return sq_tail_.load(std::memory_order_acquire); }
  SendWqe& send_at(uint64_t position) { return sq_[position]; }
  // Marks the request at `position` done; completes the oldest requests that are done, in order.
  // An error status also moves the QP to Error (deferred).
  void FinishSend(uint64_t position, WcStatus status);
  // The peer reported an error for a request it cannot name: the oldest unfinished one takes it.
  void FailOldest(WcStatus status);
  // Takes the next receive for an incoming message (from the SRQ if the QP has one).
  bool TakeReceive(RecvWqe* out);
  void CompleteReceive(const RecvWqe& wqe, uint32_t length, WcStatus status, bool solicited);
  // A Send with Invalidate of `rkey` arrived whole: unbinds the window it names, which must be
  // bound to this QP, and reports that on the receive CQ when the window asks for it; call before
  // completing the Send's receive. False: nothing to invalidate (the receive fails LocalOp).
  bool InvalidateRemote(uint32_t rkey);

 private:
  size_t Flush();  // returns the requests flushed
  void SetKickTarget(const std::shared_ptr<Link>& link) NDWV_EXCLUDES(sq_mutex_);
  void DetachFromCqs(Link* link);  // once from each CQ (the two may be one)
  void CompleteSendLocked(uint64_t position, WcStatus status) NDWV_REQUIRES(sq_mutex_);

  const uint32_t qpn_;
  void* const context_;
  const QpCaps caps_;
  std::shared_ptr<ProtectionDomain> pd_;
  std::shared_ptr<CompletionQueue> send_cq_, recv_cq_;
  std::shared_ptr<SharedReceiveQueue> srq_;

  std::atomic<QpState> state_{QpState::Reset};
  std::atomic<uint64_t> claimant_{0};  // the connection endpoint using it; 0: none
  mutable base::Mutex state_mutex_{"QueuePair::state_mutex_"};  // guards state_ changes and link_
  // Held through a move to Error, so a second one waits for the flush.
  base::Mutex error_mutex_{"QueuePair::error_mutex_"};
  std::shared_ptr<Link> link_ NDWV_GUARDED_BY(state_mutex_);

  base::Mutex sq_mutex_{"QueuePair::sq_mutex_"};
  // link_ for posters, read under sq_mutex_ (which they hold anyway)
  std::shared_ptr<Link> kick_ NDWV_GUARDED_BY(sq_mutex_);
  Ring<SendWqe> sq_;  // written under sq_mutex_; the transport reads entries below sq_tail_
  uint64_t sq_head_ NDWV_GUARDED_BY(sq_mutex_) = 0;  // oldest not yet completed
  std::atomic<uint64_t> sq_tail_{0};                  // next free

  base::Mutex rq_mutex_{"QueuePair::rq_mutex_"};
  Ring<RecvWqe> rq_ NDWV_GUARDED_BY(rq_mutex_);
  uint64_t rq_head_ NDWV_GUARDED_BY(rq_mutex_) = 0;
  uint64_t rq_tail_ NDWV_GUARDED_BY(rq_mutex_) = 0;

  // Pre-allocated so an error found on the engine is always deferred (no allocation there).
  // It holds the QP while queued; qp is set and taken under state_mutex_.
  struct ErrorWork : WorkItem {
    QueuePair* owner = nullptr;
    std::shared_ptr<QueuePair> qp;
  } error_work_;
};

}  // namespace ndwv::dev
