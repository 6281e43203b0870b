#include "dev/srq.h"

#include <ndwv/wvstatus.h>

namespace ndwv::dev {

SharedReceiveQueue::SharedReceiveQueue(std::shared_ptr<ProtectionDomain> pd, uint32_t depth,
                                       uint32_t max_sge, uint32_t limit)
    : pd_(std::move(pd)), ring_(depth, RecvWqeBytes(max_sge)), max_sge_(max_sge), limit_(limit) {}

int32_t SharedReceiveQueue::PostReceive(uint64_t wr_id, const Sge* sge, uint32_t num_sge) {
  if (num_sge > max_sge_) return WV_DATA_OVERRUN;
  base::MutexLock lock(mutex_);
  if (tail_ - head_ == ring_.capacity()) return WV_NO_MORE_ENTRIES;
  if (!ring_[tail_].Fill(wr_id, sge, num_sge)) return WV_BUFFER_OVERFLOW;
  tail_++;
  ring_.Prefetch(tail_, true);
  return WV_SUCCESS;
}

bool SharedReceiveQueue::Take(RecvWqe* out) {
  AsyncOp* fire = nullptr;
  {
    base::MutexLock lock(mutex_);
    if (head_ == tail_) return false;
    ring_[head_].CopyTo(out);
    head_++;
    ring_.Prefetch(head_, false);
    if (armed_ && tail_ - head_ < limit_) std::swap(fire, armed_);
  }
  for (AsyncOp* op = fire; op;) {
    AsyncOp* next = op->next;
    op->Complete(WV_SUCCESS);
    op = next;
  }
  return true;
}

int32_t SharedReceiveQueue::Modify(uint32_t depth, uint32_t limit) {
  base::MutexLock lock(mutex_);
  if (depth) {
    uint64_t count = tail_ - head_;
    if (depth < count) return WV_BUFFER_OVERFLOW;
    ring_.Resize(depth, head_, count);
    head_ = 0;
    tail_ = count;
  }
  if (limit) limit_ = limit;
  return WV_SUCCESS;
}

void SharedReceiveQueue::Query(uint32_t* depth, uint32_t* max_sge, uint32_t* limit) {
  base::MutexLock lock(mutex_);
  *depth = uint32_t(ring_.capacity());
  *max_sge = max_sge_;
  *limit = limit_;
}

int32_t SharedReceiveQueue::Notify(AsyncOp* op) {
  base::MutexLock lock(mutex_);
  op->next = armed_;
  armed_ = op;
  return WV_PENDING;
}

void SharedReceiveQueue::CancelNotifies() {
  AsyncOp* list;
  {
    base::MutexLock lock(mutex_);
    list = armed_;
    armed_ = nullptr;
  }
  while (list) {
    AsyncOp* next = list->next;
    list->Complete(WV_CANCELLED);
    list = next;
  }
}

}  // namespace ndwv::dev
