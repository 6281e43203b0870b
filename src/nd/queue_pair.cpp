#include "nd/queue_pair.h"

#include <endian.h>

#include <algorithm>

#include "nd/adapter.h"
#include "nd/completion_queue.h"
#include "nd/memory_region.h"
#include "nd/memory_window.h"
#include "nd/sges.h"
#include "nd/shared_receive_queue.h"

namespace ndwv::nd {

namespace {

constexpr ULONG kSendFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE |
                             ND_OP_FLAG_SEND_AND_SOLICIT_EVENT | ND_OP_FLAG_INLINE;
constexpr ULONG kReadFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE;
constexpr ULONG kWriteFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE | ND_OP_FLAG_INLINE;
constexpr ULONG kBindFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE |
                             ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE;
constexpr ULONG kInvalidateFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE;

UINT64 WrId(void* requestContext) { return reinterpret_cast<UINT64>(requestContext); }

}  // namespace

DWORD WvSendFlags(ULONG ndFlags) {
  DWORD flags = (ndFlags & ND_OP_FLAG_SILENT_SUCCESS) ? 0 : WV_SEND_SIGNALED;
  if (ndFlags & ND_OP_FLAG_READ_FENCE) flags |= WV_SEND_FENCE;
  if (ndFlags & ND_OP_FLAG_SEND_AND_SOLICIT_EVENT) flags |= WV_SEND_SOLICITED;
  if (ndFlags & ND_OP_FLAG_INLINE) flags |= WV_SEND_INLINE;
  return flags;
}

QueuePair::QueuePair(Adapter& adapter, CompletionQueue& receiveCq, CompletionQueue& initiatorCq,
                     SharedReceiveQueue* srq, ComPtr<IWVConnectQueuePair> qp)
    : adapter_(&adapter),
      receiveCq_(&receiveCq),
      initiatorCq_(&initiatorCq),
      srq_(srq),
      qp_(std::move(qp)) {}

HRESULT QueuePair::Flush() {
  WV_QP_ATTRIBUTES attributes{};
  attributes.QpState = WvQpStateError;
  return NdStatus(qp_->Modify(&attributes, WV_QP_ATTR_STATE, nullptr));
}

// An inline request's pieces are copied at post, as many as its bytes may be; others go by the
// QP's SGEs, at most the adapter's.
ULONG QueuePair::MostInitiatorSges(ULONG flags) const {
  const ND2_ADAPTER_INFO& info = adapter_->info();
  return (flags & ND_OP_FLAG_INLINE) ? std::max(info.MaxInitiatorSge, info.MaxInlineDataSize) : info.MaxInitiatorSge;
}

HRESULT QueuePair::Send(void* requestContext, const ND2_SGE sge[], ULONG nSge, ULONG flags) {
  if (flags & ~kSendFlags) return ND_INVALID_PARAMETER_4;
  if (HRESULT hr = CheckSges(sge, nSge, MostInitiatorSges(flags)); FAILED(hr)) return hr;
  WvSges sgl(sge, nSge);
  if (!sgl.ok()) return ND_NO_MEMORY;
  return NdStatus(qp_->Send(WrId(requestContext), sgl.data(), sgl.size(), WvSendFlags(flags), 0));
}

HRESULT QueuePair::Receive(void* requestContext, const ND2_SGE sge[], ULONG nSge) {
  if (HRESULT hr = CheckSges(sge, nSge, adapter_->info().MaxReceiveSge); FAILED(hr)) return hr;
  WvSges sgl(sge, nSge);
  if (!sgl.ok()) return ND_NO_MEMORY;
  return NdStatus(qp_->PostReceive(WrId(requestContext), sgl.data(), sgl.size()));
}

HRESULT QueuePair::Read(void* requestContext, const ND2_SGE sge[], ULONG nSge, UINT64 remoteAddress,
                        UINT32 remoteToken, ULONG flags) {
  if (flags & ~kReadFlags) return ND_INVALID_PARAMETER_6;
  if (HRESULT hr = CheckSges(sge, nSge, MostInitiatorSges(flags)); FAILED(hr)) return hr;
  WvSges sgl(sge, nSge);
  if (!sgl.ok()) return ND_NO_MEMORY;
  // WV takes the remote address in network order; ND tokens are network order already.
  return NdStatus(qp_->Read(WrId(requestContext), sgl.data(), sgl.size(), WvSendFlags(flags),
                            htobe64(remoteAddress), remoteToken));
}

HRESULT QueuePair::Write(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                         UINT64 remoteAddress, UINT32 remoteToken, ULONG flags) {
  if (flags & ~kWriteFlags) return ND_INVALID_PARAMETER_6;
  if (HRESULT hr = CheckSges(sge, nSge, MostInitiatorSges(flags)); FAILED(hr)) return hr;
  WvSges sgl(sge, nSge);
  if (!sgl.ok()) return ND_NO_MEMORY;
  return NdStatus(qp_->Write(WrId(requestContext), sgl.data(), sgl.size(), WvSendFlags(flags), 0,
                             htobe64(remoteAddress), remoteToken));
}

HRESULT QueuePair::Bind(void* requestContext, IUnknown* pMemoryRegion, IUnknown* pMemoryWindow,
                        const void* pBuffer, SIZE_T cbBuffer, ULONG flags) {
  MemoryRegion* mr = adapter_->Mine<MemoryRegion>(pMemoryRegion);
  if (mr == nullptr) return ND_INVALID_PARAMETER_2;
  MemoryWindow* mw = adapter_->Mine<MemoryWindow>(pMemoryWindow);
  if (mw == nullptr) return ND_INVALID_PARAMETER_3;
  if (flags & ~kBindFlags) return ND_INVALID_PARAMETER_6;

  // A window can grant no right the region lacks locally: remote writes need local write.
  MemoryRegion::Registration registration = mr->registration();
  if (!registration.registered) return ND_ACCESS_VIOLATION;
  if ((flags & ND_OP_FLAG_ALLOW_WRITE) && !(WvAccess(registration.flags) & WV_ACCESS_LOCAL_WRITE))
    return ND_ACCESS_VIOLATION;

  DWORD access = 0;
  if (flags & ND_OP_FLAG_ALLOW_READ) access |= WV_ACCESS_REMOTE_READ;
  if (flags & ND_OP_FLAG_ALLOW_WRITE) access |= WV_ACCESS_REMOTE_WRITE;
  NET32 rkey = 0;
  HRESULT hr = qp_->BindMemoryWindow(mw->wv(), WrId(requestContext), registration.lkey, access,
                                     WvSendFlags(flags), pBuffer, cbBuffer, &rkey);
  if (SUCCEEDED(hr)) mw->SetRemoteToken(rkey);  // valid from now on, before the completion
  return NdStatus(hr);
}

HRESULT QueuePair::Invalidate(void* requestContext, IUnknown* pMemoryWindow, ULONG flags) {
  MemoryWindow* mw = adapter_->Mine<MemoryWindow>(pMemoryWindow);
  if (mw == nullptr) return ND_INVALID_PARAMETER_2;
  if (flags & ~kInvalidateFlags) return ND_INVALID_PARAMETER_3;
  return NdStatus(qp_->InvalidateMemoryWindow(mw->wv(), WrId(requestContext), WvSendFlags(flags)));
}

}  // namespace ndwv::nd
