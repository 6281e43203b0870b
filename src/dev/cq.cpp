#include "dev/cq.h"

#include <algorithm>

#include <ndwv/wvstatus.h>

#include "base/settings.h"

namespace ndwv::dev {

CompletionQueue::CompletionQueue(size_t entries) : ring_(entries) {}

size_t CompletionQueue::capacity() const {
  base::MutexLock lock(mutex_);
  return ring_.capacity();
}

int32_t CompletionQueue::Resize(size_t entries) {
  base::MutexLock lock(mutex_);
  size_t count = count_.load();
  if (entries < count) return WV_BUFFER_OVERFLOW;
  ring_.Resize(entries, head_, count);
  head_ = 0;
  return WV_SUCCESS;
}

void CompletionQueue::TellSources(const Completion* reaped, size_t n) {
  static const bool lend_thread = base::LoadSettings() ? base::LoadSettings()->poll_progress : true;
  if (!lend_thread) return;
  if (!sources_mutex_.try_lock()) return;
  if (!lenders_.empty()) {
    // A received message is the peer's: the application polled for it. Anything else it reaps
    // is the end of one of its own requests.
    bool peer_message = std::any_of(reaped, reaped + n, [](const Completion& c) { return c.opcode == WrOpcode::Receive; });
    for (ProgressSource* source : lenders_) n ? source->Reaped(peer_message) : source->PollProgress();
  }
  sources_mutex_.unlock();
}

size_t CompletionQueue::Poll(Completion* out, size_t max) {
  if (max == 0) return 0;
  if (count_.load(std::memory_order_acquire) == 0) {
    TellSources(out, 0);  // the poller lends its thread
    if (count_.load(std::memory_order_acquire) == 0) {
      if (!unseen_.load(std::memory_order_acquire)) return 0;  // nothing to mark seen
      base::MutexLock lock(mutex_);
      // Checked again under the lock: an entry pushed since the check above was not seen, and
      // marking it seen would keep the next Notify from firing for it (a lost wake-up).
      if (count_.load() == 0) {
        seen_ = pushed_;  // a draining poll has seen everything
        solicited_unseen_ = 0;
        unseen_.store(false, std::memory_order_relaxed);
        return 0;
      }
    }
  }
  base::UniqueLock lock(mutex_);
  size_t count = count_.load(std::memory_order_relaxed);  // written only under mutex_
  size_t n = std::min(max, count);
  for (size_t i = 0; i < n; ++i) out[i] = ring_[head_++];
  count_.store(count - n, std::memory_order_release);
  if (n) ring_.Prefetch(head_, false);
  if (n < max) {
    seen_ = pushed_;
    solicited_unseen_ = 0;
    unseen_.store(false, std::memory_order_relaxed);
  }
  lock.unlock();
  if (n) TellSources(out, n);  // a wait may end here (PollerRule)
  return n;
}

void CompletionQueue::Push(const Completion& completion, bool solicited) {
  AsyncOp* fire = nullptr;
  int32_t status = WV_SUCCESS;
  {
    base::MutexLock lock(mutex_);
    if (broken_.load()) return;
    size_t count = count_.load();
    if (count == ring_.capacity()) {
      // Overrun: the CQ and everything completing to it are unusable from now on.
      broken_.store(true, std::memory_order_release);
      CompleteArmedLocked(WV_BUFFER_OVERFLOW, &fire);
      status = WV_BUFFER_OVERFLOW;
    } else {
      ring_[head_ + count] = completion;
      count_.store(count + 1, std::memory_order_release);
      ring_.Prefetch(head_ + count + 1, true);
      pushed_++;
      unseen_.store(true, std::memory_order_relaxed);
      bool wakes_solicited = solicited || completion.status != WcStatus::Success;
      if (wakes_solicited) solicited_unseen_++;
      if (armed_ && (armed_type_ == NotifyType::Any ||
                     (armed_type_ == NotifyType::Solicited && wakes_solicited))) {
        CompleteArmedLocked(WV_SUCCESS, &fire);
      }
    }
  }
  Finish(fire, status);
}

void CompletionQueue::CompleteArmedLocked(int32_t, AsyncOp** done) {
  mutex_.AssertHeld();
  *done = armed_;
  armed_ = nullptr;
  armed_type_ = NotifyType::Errors;
  seen_ = pushed_;
  solicited_unseen_ = 0;
  unseen_.store(false, std::memory_order_relaxed);
}

void CompletionQueue::Finish(AsyncOp* list, int32_t status) {
  while (list) {
    AsyncOp* next = list->next;
    list->next = nullptr;
    list->Complete(status);
    list = next;
  }
}

int32_t CompletionQueue::Notify(NotifyType type, AsyncOp* op) {
  {
    base::MutexLock lock(sources_mutex_);
    for (ProgressSource* source : lenders_) source->OnNotifyArmed();
  }
  AsyncOp* fire = nullptr;
  {
    base::MutexLock lock(mutex_);
    if (broken_.load()) return WV_BUFFER_OVERFLOW;
    op->next = nullptr;
    AsyncOp** tail = &armed_;
    while (*tail) tail = &(*tail)->next;
    *tail = op;
    if (type == NotifyType::Any || (type == NotifyType::Solicited && armed_type_ == NotifyType::Errors))
      armed_type_ = type;
    // Entries nobody has seen yet satisfy the new request at once.
    bool unseen = pushed_ > seen_;
    if ((armed_type_ == NotifyType::Any && unseen) ||
        (armed_type_ == NotifyType::Solicited && solicited_unseen_ > 0))
      CompleteArmedLocked(WV_SUCCESS, &fire);
  }
  Finish(fire, WV_SUCCESS);
  return WV_PENDING;
}

void CompletionQueue::CancelNotifies() {
  AsyncOp* list;
  {
    base::MutexLock lock(mutex_);
    list = armed_;
    armed_ = nullptr;
    armed_type_ = NotifyType::Errors;
  }
  Finish(list, WV_CANCELLED);
}

void CompletionQueue::AttachSource(ProgressSource* source) {
  base::MutexLock lock(sources_mutex_);
  ++sources_;
  if (lending_ && sources_ <= kMaxLendingSources) {
    lenders_.push_back(source);
    return;
  }
  if (lending_) {
    // One source too many: from now on every source of this CQ stays with the engine.
    lending_ = false;
    for (ProgressSource* lender : lenders_) Withhold(lender);
    lenders_.clear();
  }
  Withhold(source);
}

void CompletionQueue::DetachSource(ProgressSource* source) {
  base::MutexLock lock(sources_mutex_);
  --sources_;
  if (lending_) {
    lenders_.erase(std::find(lenders_.begin(), lenders_.end(), source));
  } else {
    source->withheld_.fetch_sub(1, std::memory_order_relaxed);
    lending_ = sources_ == 0;
  }
}

void CompletionQueue::Withhold(ProgressSource* source) {
  if (source->withheld_.fetch_add(1, std::memory_order_relaxed) == 0) source->OnNotifyArmed();
}

}  // namespace ndwv::dev
