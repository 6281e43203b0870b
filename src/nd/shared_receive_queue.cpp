#include "nd/shared_receive_queue.h"

#include "nd/adapter.h"
#include "nd/completion_queue.h"
#include "nd/sges.h"

namespace ndwv::nd {

SharedReceiveQueue::SharedReceiveQueue(Adapter& adapter, base::HandleRef file,
                                       ComPtr<IWVSharedReceiveQueue> srq)
    : adapter_(&adapter), file_(std::move(file)), srq_(std::move(srq)) {}

HRESULT SharedReceiveQueue::GetNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) {
  return ReportNotifyAffinity(*adapter_, pGroup, pAffinity);
}

HRESULT SharedReceiveQueue::Modify(ULONG queueDepth, ULONG notifyThreshold) {
  if (queueDepth > adapter_->info().MaxSharedReceiveQueueDepth) return ND_INVALID_PARAMETER;
  // ND: 0 leaves a value unchanged; WV takes both values, so fill in the current ones.
  SIZE_T maxWr = queueDepth, maxSge = 0, limit = notifyThreshold;
  if (queueDepth == 0 || notifyThreshold == 0) {
    SIZE_T currentWr = 0, currentLimit = 0;
    HRESULT hr = srq_->Query(&currentWr, &maxSge, &currentLimit);
    if (FAILED(hr)) return NdStatus(hr);
    if (queueDepth == 0) maxWr = currentWr;
    if (notifyThreshold == 0) limit = currentLimit;
  }
  return NdStatus(srq_->Modify(maxWr, limit));
}

HRESULT SharedReceiveQueue::Notify(OVERLAPPED* pOverlapped) {
  return NdStatus(srq_->Notify(pOverlapped));
}

HRESULT SharedReceiveQueue::Receive(void* requestContext, const ND2_SGE sge[], ULONG nSge) {
  if (HRESULT hr = CheckSges(sge, nSge, adapter_->info().MaxReceiveSge); FAILED(hr)) return hr;
  WvSges sgl(sge, nSge);
  if (!sgl.ok()) return ND_NO_MEMORY;
  return NdStatus(
      srq_->PostReceive(reinterpret_cast<UINT64>(requestContext), sgl.data(), sgl.size()));
}

}  // namespace ndwv::nd
