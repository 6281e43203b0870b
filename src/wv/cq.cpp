#include "wv/objects.h"

namespace ndwv::wv {

static_assert(int(dev::WcStatus::Flushed) == WvWcFlushed && int(dev::WcStatus::Error) == WvWcError);
static_assert(int(dev::WrOpcode::Receive) == WvReceive && int(dev::WrOpcode::Invalidate) == WvInvalidateWindow);
static_assert(int(dev::NotifyType::Solicited) == WvCqSolicited && int(dev::NotifyType::Any) == WvCqNextCompletion);

CompletionQueue::CompletionQueue(Device* device, base::HandleRef file, size_t entries)
    : device_(device), file_(std::move(file)), cq_(std::make_shared<dev::CompletionQueue>(entries)) {}

// Released with Notify requests armed: they complete (canceled) rather than never.
CompletionQueue::~CompletionQueue() { cq_->CancelNotifies(); }

HRESULT CompletionQueue::CancelOverlappedRequests() {
  cq_->CancelNotifies();
  return WV_SUCCESS;
}

HRESULT CompletionQueue::GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  return WaitResult(overlapped, bytes, wait);
}

HRESULT CompletionQueue::Resize(SIZE_T* entries) {
  if (!entries || *entries == 0) return WV_INVALID_PARAMETER;
  return cq_->Resize(*entries);
}

HRESULT CompletionQueue::Peek(SIZE_T* count) {
  if (!count) return WV_INVALID_PARAMETER;
  *count = cq_->Count();
  return WV_SUCCESS;
}

HRESULT CompletionQueue::Notify(WV_CQ_NOTIFY_TYPE type, OVERLAPPED* overlapped) {
  if (!overlapped || type > WvCqSolicited) return WV_INVALID_PARAMETER;
  return StartOverlapped(new OverlappedOp(file_, overlapped),
                         [&](OverlappedOp* op) { return cq_->Notify(dev::NotifyType(type), op); });
}

HRESULT CompletionQueue::BatchNotify(SIZE_T, OVERLAPPED*) { return WV_NOT_SUPPORTED; }

SIZE_T CompletionQueue::Poll(WV_COMPLETION completions[], SIZE_T entries) {
  constexpr size_t kBatch = 16;
  dev::Completion batch[kBatch];
  SIZE_T total = 0;
  while (total < entries) {
    size_t want = std::min<size_t>(kBatch, entries - total);
    size_t n = cq_->Poll(batch, want);
    for (size_t i = 0; i < n; ++i) {
      WV_COMPLETION& c = completions[total + i];
      c = {};
      c.QpContext = batch[i].qp_context;
      c.WrId = batch[i].wr_id;
      c.Opcode = WV_WC_OPCODE(batch[i].opcode);
      c.Length = batch[i].length;
      c.Status = WV_WC_STATUS(batch[i].status);
    }
    total += n;
    if (n < want) break;
  }
  return total;
}

}  // namespace ndwv::wv
