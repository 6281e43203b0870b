#include "nd/v1/completion_queue.h"

#include "nd/completion_queue.h"
#include "nd/v1/adapter.h"

namespace ndwv::nd::v1 {

namespace {

// Version 1 names three outcomes differently from version 2 (nd1-spi.md §2.7, §4 #22-24): the
// retry budget running out is ND_TIMEOUT, and whatever the peer refused (its receive too small,
// a window's range or rights) is ND_REMOTE_ERROR. The rest is shared.
HRESULT Status(WV_WC_STATUS status) {
  switch (status) {
    case WvWcRnrRetryError:
    case WvWcTimeoutRetryError: return ND_TIMEOUT;
    case WvWcRemoteInvalidRequest:
    case WvWcRemoteAccessError: return ND_REMOTE_ERROR;
    default: return CompletionStatus(status);
  }
}

}  // namespace

ND_RESULT* CompleteResult(const WV_COMPLETION& completion) {
  auto* result = reinterpret_cast<ND_RESULT*>(completion.WrId);
  result->Status = Status(completion.Status);
  // Bytes moved by a transfer that succeeded; none for a window's bind or invalidation.
  bool moved = completion.Status == WvWcSuccess && completion.Opcode != WvBindWindow &&
               completion.Opcode != WvInvalidateWindow;
  result->BytesTransferred = moved ? completion.Length : 0;
  return result;
}

CompletionQueue::CompletionQueue(Adapter& adapter, Ref<nd::CompletionQueue> cq)
    : adapter_(&adapter), cq_(std::move(cq)) {}

IWVOverlapped* CompletionQueue::wvRequests() const { return cq_->wvRequests(); }

HRESULT CompletionQueue::Resize(SIZE_T nEntries) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  if (nEntries == 0 || nEntries > adapter_->info().MaxCqEntries) return ND_INVALID_PARAMETER;
  return cq_->Resize(ULONG(nEntries));
}

HRESULT CompletionQueue::Notify(DWORD Type, OVERLAPPED* pOverlapped) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_2;
  return cq_->Notify(Type, pOverlapped);
}

SIZE_T CompletionQueue::GetResults(ND_RESULT* pResults[], SIZE_T nResults) {
  if (pResults == nullptr) return 0;
  return PollCompletions(cq_->wv(), pResults, nResults,
                         [](const WV_COMPLETION& c) { return CompleteResult(c); });
}

}  // namespace ndwv::nd::v1
