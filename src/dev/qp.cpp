#include "dev/qp.h"

#include <cstring>
#include <random>
#include <utility>

#include <ndwv/wvstatus.h>

#include "base/log.h"
#include "dev/engine.h"
#include "dev/srq.h"

namespace ndwv::dev {

namespace {
// QPNs count from a random start, so that a peer cannot tell another connection's QPN from its
// own, and skip 0 and 1, the IB special QPs.
uint32_t NewQpn() {
  static std::atomic<uint32_t> next{std::random_device{}()};
  for (;;)
    if (uint32_t qpn = next.fetch_add(1, std::memory_order_relaxed) & 0xFFFFFF; qpn > 1) return qpn;
}
}  // namespace

const char* ToString(QpState state) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERROR"};
  return names[int(state)];
}

bool IsLegalTransition(QpState from, QpState to) {
  if (to == QpState::Reset || to == QpState::Error) return true;
  switch (from) {
    case QpState::Reset: return to == QpState::Init;
    case QpState::Init: return to == QpState::Init || to == QpState::Rtr;
    case QpState::Rtr: return to == QpState::Rts;
    case QpState::Rts: return to == QpState::Rts || to == QpState::Sqd;
    case QpState::Sqd: return to == QpState::Rts || to == QpState::Sqd;
    case QpState::Sqe: return to == QpState::Rts;
    case QpState::Error: return false;
  }
  return false;
}

QueuePair::QueuePair(std::shared_ptr<ProtectionDomain> pd, std::shared_ptr<CompletionQueue> send_cq,
                     std::shared_ptr<CompletionQueue> recv_cq, std::shared_ptr<SharedReceiveQueue> srq,
                     void* context, const QpCaps& caps)
    : qpn_(NewQpn()),
      context_(context),
      caps_(caps),
      pd_(std::move(pd)),
      send_cq_(std::move(send_cq)),
      recv_cq_(std::move(recv_cq)),
      srq_(std::move(srq)),
      sq_(caps.send_depth, SendWqeBytes(caps.send_sge, caps.max_inline)),
      rq_(srq_ ? 0 : caps.recv_depth, RecvWqeBytes(caps.recv_sge)) {
  error_work_.owner = this;
  error_work_.run = [](WorkItem* item) {
    QueuePair* owner = static_cast<ErrorWork*>(item)->owner;
    std::shared_ptr<QueuePair> qp;
    {
      base::MutexLock lock(owner->state_mutex_);
      qp = std::move(owner->error_work_.qp);
    }
    if (qp) qp->Modify(QpState::Error);
  };
}

QueuePair::~QueuePair() {
  // Released without Disconnect: the link is gone already (it holds the QP while attached), so
  // only the queues are left to flush.
  Flush();
}

bool QueuePair::Attach(std::shared_ptr<Link> link) {
  // Serialized with a move to Error, which detaches the link it finds from the CQs: a link
  // attached after it would stay a source of the CQs, and be polled after its destruction.
  base::MutexLock error_lock(error_mutex_);
  std::shared_ptr<Link> old;
  {
    base::MutexLock lock(state_mutex_);
    QpState state = state_.load();
    if (state == QpState::Error || state == QpState::Reset) return false;
    old = std::exchange(link_, link);
    SetKickTarget(link);
  }
  if (old) DetachFromCqs(old.get());
  if (link) {
    recv_cq_->AttachSource(link.get());
    if (send_cq_ != recv_cq_) send_cq_->AttachSource(link.get());
  }
  return true;
}

void QueuePair::DetachFromCqs(Link* link) {
  recv_cq_->DetachSource(link);
  if (send_cq_ != recv_cq_) send_cq_->DetachSource(link);
}

std::shared_ptr<Link> QueuePair::link() const {
  base::MutexLock lock(state_mutex_);
  return link_;
}

int32_t QueuePair::Modify(QpState to) {
  base::UniqueLock error_lock(error_mutex_, std::defer_lock);
  if (to == QpState::Error || to == QpState::Reset) error_lock.lock();
  std::shared_ptr<Link> link;
  {
    base::MutexLock lock(state_mutex_);
    QpState from = state_.load();
    if (from == to && to == QpState::Error) return WV_SUCCESS;
    if (!IsLegalTransition(from, to)) return WV_INVALID_DEVICE_STATE;
    state_.store(to, std::memory_order_release);
    if (link_ && link_->counters().registered())
      NDWV_LOG(Debug, "%s: %s -> %s", link_->counters().Identity().c_str(), ToString(from), ToString(to));
    else
      NDWV_LOG(Debug, "qp %u: %s -> %s", qpn_, ToString(from), ToString(to));
    if (to == QpState::Error || to == QpState::Reset) {
      link = std::exchange(link_, nullptr);
      SetKickTarget(nullptr);
    } else if (to == QpState::Rts) {
      link = link_;
    }
  }
  if (to != QpState::Error && to != QpState::Reset) {
    if (link) link->Kick();  // requests posted in RTR waited for RTS
    return WV_SUCCESS;
  }
  if (link) {
    // Stop the wire first: nothing may place data into a buffer once its request is flushed.
    DetachFromCqs(link.get());
    link->Shutdown();
  }
  size_t flushed = Flush();
  if (!link && flushed) NDWV_LOG(Debug, "qp %u: flushed %zu requests", qpn_, flushed);
  if (link) {
    if (flushed && link->counters().registered())
      NDWV_LOG(Debug, "%s: flushed %zu requests", link->counters().Identity().c_str(), flushed);
    link->counters().AddShared(Counter::Flushes);
    link->counters().AddShared(Counter::FlushedRequests, flushed);
  }
  return WV_SUCCESS;
}

void QueuePair::DeferError() {
  {
    // Errors are found on several threads at once (the engine, a poller, the CM's work): the
    // first one queues the work; the others find it queued (or the QP in Error already).
    base::MutexLock lock(state_mutex_);
    if (state_.load() == QpState::Error || error_work_.qp) return;
    error_work_.qp = shared_from_this();
  }
  Engine::Get().Defer(&error_work_);
}

namespace {
uint32_t SgesInLines(size_t header, size_t bytes) {
  constexpr size_t kLine = 64;
  const size_t lines = (bytes + kLine - 1) / kLine * kLine;
  return uint32_t(std::min<size_t>((lines - header) / sizeof(Sge), kMaxSge));
}
}  // namespace

uint32_t SendSgeFillingLines(uint32_t sge, uint32_t max_inline) {
  return SgesInLines(offsetof(SendWqe, sge), SendWqeBytes(sge, max_inline));
}
uint32_t RecvSgeFillingLines(uint32_t sge) { return SgesInLines(offsetof(RecvWqe, sge), RecvWqeBytes(sge)); }

// What a flush reports for a request. A Bind or an Invalidate changed its window when it was
// posted (wv binds before it posts; PostSend invalidates), and a flush cannot undo that: it reports
// that it happened, so that a window is never bound or unbound behind an ND_CANCELED.
namespace {
WcStatus FlushedAs(const SendWqe& wqe) {
  if (wqe.done) return wqe.status;
  bool changed_its_window = wqe.opcode == WrOpcode::Bind || wqe.opcode == WrOpcode::Invalidate;
  return changed_its_window ? WcStatus::Success : WcStatus::Flushed;
}
}  // namespace

size_t QueuePair::Flush() {
  size_t flushed = 0;
  {
    base::MutexLock lock(sq_mutex_);
    uint64_t tail = sq_tail_.load();
    for (; sq_head_ < tail; ++sq_head_, ++flushed) {
      SendWqe& wqe = send_at(sq_head_);
      send_cq_->Push({context_, wqe.wr_id, 0, wqe.opcode, FlushedAs(wqe)}, false);
      wqe.window.reset();
    }
  }
  {
    base::MutexLock lock(rq_mutex_);
    for (; rq_head_ < rq_tail_; ++rq_head_, ++flushed) {
      RecvWqe& wqe = rq_[rq_head_];
      recv_cq_->Push({context_, wqe.wr_id, 0, WrOpcode::Receive, WcStatus::Flushed}, false);
    }
  }
  return flushed;
}

int32_t QueuePair::PostSend(const SendWqe& request) {
  QpState state = this->state();
  // The passive side's QP is in RTS from its Accept on: an answer to a message that arrived
  // before the Accept completed is taken, as an HCA does, and its link holds it until the
  // connection is established (Link::HeldUntilEstablished).
  if (state != QpState::Rts && state != QpState::Sqd && state != QpState::Error) return WV_CONNECTION_INVALID;
  bool is_inline = request.flags & kInline;
  if (is_inline ? request.length > caps_.max_inline : request.num_sge > caps_.send_sge)
    return is_inline ? WV_BUFFER_OVERFLOW : WV_DATA_OVERRUN;
  if (request.num_sge > kMaxSge) return WV_DATA_OVERRUN;
  if (request.length > kMaxTransferLength) return WV_BUFFER_OVERFLOW;
  // A reference, not a pointer: what the link sends may complete, and the application release
  // the QP (and with it the link) on another thread, before Posted returns (a completion-port
  // worker releasing a connection as soon as its last Send completed). Nothing below touches
  // the QP after Posted.
  std::shared_ptr<Link> link;
  {
    base::MutexLock lock(sq_mutex_);
    link = kick_;
    uint64_t tail = sq_tail_.load(std::memory_order_relaxed);
    if (tail - sq_head_ == sq_.capacity()) return WV_NO_MORE_ENTRIES;
    SendWqe& wqe = send_at(tail);
    wqe.wr_id = request.wr_id;
    wqe.opcode = request.opcode;
    wqe.flags = request.flags;
    wqe.num_sge = request.num_sge;
    wqe.length = request.length;
    wqe.remote_addr = request.remote_addr;
    wqe.rkey = request.rkey;
    wqe.window = request.window;
    wqe.sent = 0;
    wqe.done = false;
    wqe.status = WcStatus::Success;
    // The window stops working now, in one step with the check that it was bound, so that a
    // peer's Send with Invalidate racing this request unbinds it at most once: one of the two
    // fails. Nothing bound to invalidate: a malformed request, completed in its turn with LocalOp.
    // Posted to an Error QP it is flushed, and so changes nothing.
    if (request.opcode == WrOpcode::Invalidate &&
        (state == QpState::Error || !request.window || !pd_->InvalidateWindow(request.window.get()))) {
      wqe.done = true;
      wqe.status = state == QpState::Error ? WcStatus::Flushed : WcStatus::LocalOp;
    }
    if (is_inline) {
      // Copied now: the caller may reuse its buffers as soon as the post returns.
      size_t offset = 0;
      for (uint32_t i = 0; i < request.num_sge; ++i) {
        memcpy(wqe.inline_data + offset, reinterpret_cast<const void*>(request.sge[i].addr),
               request.sge[i].length);
        offset += request.sge[i].length;
      }
      wqe.num_sge = 0;
    } else {
      for (uint32_t i = 0; i < request.num_sge; ++i) {
        wqe.sge[i] = request.sge[i];
        // Checked at post time; a bad SGE completes the request with a protection error.
        bool write = request.opcode == WrOpcode::Read;
        if (request.sge[i].length &&
            pd_->CheckLocal(request.sge[i].lkey, request.sge[i].addr, request.sge[i].length, write) !=
                KeyCheck::Ok) {
          wqe.done = true;
          wqe.status = WcStatus::LocalProtection;
        }
      }
    }
    sq_tail_.store(tail + 1, std::memory_order_release);
    sq_.Prefetch(tail + 1, true);
    if (state == QpState::Error) {
      CompleteSendLocked(tail, FlushedAs(wqe));  // posts to an Error QP are flushed at once
      return WV_SUCCESS;
    }
  }
  if (link) {
    // The poster's thread is active: an engine that pollers sent away stays away (a burst of
    // posts would otherwise have it transmit alongside the poster, on a busy machine). A post
    // alone never sends it away (PollerRule, dev/poller_handoff.h).
    link->StillPolled();
    link->Posted(request);
  }
  return WV_SUCCESS;
}

void QueuePair::SetKickTarget(const std::shared_ptr<Link>& link) {
  base::MutexLock lock(sq_mutex_);
  kick_ = link;  // a poster that took it may still kick it after this (a shut link does nothing)
}

int32_t QueuePair::PostReceive(uint64_t wr_id, const Sge* sge, uint32_t num_sge) {
  if (srq_) return WV_INVALID_DEVICE_REQUEST;
  if (num_sge > caps_.recv_sge || num_sge > kMaxSge) return WV_DATA_OVERRUN;
  base::MutexLock lock(rq_mutex_);
  if (rq_tail_ - rq_head_ == rq_.capacity()) return WV_NO_MORE_ENTRIES;
  if (!rq_[rq_tail_].Fill(wr_id, sge, num_sge)) return WV_BUFFER_OVERFLOW;
  rq_tail_++;
  rq_.Prefetch(rq_tail_, true);
  if (state() == QpState::Error) {
    recv_cq_->Push({context_, wr_id, 0, WrOpcode::Receive, WcStatus::Flushed}, false);
    rq_head_ = rq_tail_;
  }
  return WV_SUCCESS;
}

void QueuePair::FinishSend(uint64_t position, WcStatus status) {
  {
    base::MutexLock lock(sq_mutex_);
    CompleteSendLocked(position, status);
  }
  if (status != WcStatus::Success && status != WcStatus::Flushed) DeferError();
}

void QueuePair::CompleteSendLocked(uint64_t position, WcStatus status) {
  sq_mutex_.AssertHeld();
  if (position < sq_head_) return;  // already flushed
  SendWqe& wqe = send_at(position);
  wqe.done = true;
  wqe.status = status;
  uint64_t tail = sq_tail_.load();
  while (sq_head_ < tail && send_at(sq_head_).done) {
    SendWqe& head = send_at(sq_head_);
    if ((head.flags & kSignaled) || head.status != WcStatus::Success)
      send_cq_->Push({context_, head.wr_id, uint32_t(head.length), head.opcode, head.status}, false);
    head.window.reset();
    sq_head_++;
  }
}

void QueuePair::FailOldest(WcStatus status) {
  {
    base::MutexLock lock(sq_mutex_);
    for (uint64_t position = sq_head_; position < sq_tail_.load(); ++position) {
      if (!send_at(position).done) {
        CompleteSendLocked(position, status);
        break;
      }
    }
  }
  DeferError();
}

bool QueuePair::TakeReceive(RecvWqe* out) {
  if (srq_) return srq_->Take(out);
  base::MutexLock lock(rq_mutex_);
  if (rq_head_ == rq_tail_) return false;
  rq_[rq_head_].CopyTo(out);
  rq_head_++;
  rq_.Prefetch(rq_head_, false);
  return true;
}

bool QueuePair::InvalidateRemote(uint32_t rkey) {
  std::optional<uint64_t> report;
  if (!pd_->InvalidateRemote(rkey, qpn_, &report)) return false;
  if (report) recv_cq_->Push({context_, *report, 0, WrOpcode::Invalidate, WcStatus::Success}, false);
  return true;
}

void QueuePair::CompleteReceive(const RecvWqe& wqe, uint32_t length, WcStatus status, bool solicited) {
  recv_cq_->Push({context_, wqe.wr_id, length, WrOpcode::Receive, status}, solicited);
  if (status != WcStatus::Success && status != WcStatus::Flushed) DeferError();
}

}  // namespace ndwv::dev
