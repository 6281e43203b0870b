// IWVProtectionDomain, with what lives in it: memory registrations, windows and SRQs.
#include <arpa/inet.h>

#include "base/object_pool.h"
#include "wv/objects.h"

namespace ndwv::wv {

ProtectionDomain::ProtectionDomain(Device* device)
    : device_(device), pd_(std::make_shared<dev::ProtectionDomain>()) {}

Device* ProtectionDomain::device() const { return static_cast<Device*>(device_.get()); }

HRESULT ProtectionDomain::GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  return WaitResult(overlapped, bytes, wait);
}

HRESULT ProtectionDomain::RegisterMemory(const VOID* buffer, SIZE_T length, DWORD access, OVERLAPPED*,
                                         WV_MEMORY_KEYS* keys) {
  if (!keys) return WV_INVALID_PARAMETER;
  if (!buffer || length == 0) return WV_INVALID_PARAMETER;
  if (length > device()->device()->attributes().max_mr_size) return WV_INVALID_PARAMETER;
  uint32_t lkey, rkey;
  int32_t status = pd_->Register(buffer, length, access, &lkey, &rkey);
  if (status != WV_SUCCESS) return status;
  keys->Lkey = lkey;
  keys->Rkey = htonl(rkey);  // remote keys travel in network order
  return WV_SUCCESS;
}

HRESULT ProtectionDomain::DeregisterMemory(UINT32 lkey, OVERLAPPED*) { return pd_->Deregister(lkey); }

HRESULT ProtectionDomain::AllocateMemoryWindow(IWVMemoryWindow** mw) {
  if (!mw) return WV_INVALID_PARAMETER;
  auto window = pd_->AllocateWindow();
  if (!window) return WV_INSUFFICIENT_RESOURCES;
  *mw = new MemoryWindow(this, std::move(window));
  return WV_SUCCESS;
}

HRESULT ProtectionDomain::CreateSharedReceiveQueue(HANDLE file, SIZE_T max_wr, SIZE_T max_sge, SIZE_T limit,
                                                   IWVSharedReceiveQueue** srq) {
  if (!srq) return WV_INVALID_PARAMETER;
  const dev::DeviceAttributes& a = device()->device()->attributes();
  if (max_wr == 0 || max_wr > a.max_srq_wr) return WV_INVALID_PARAMETER_3;
  if (max_sge > a.max_srq_sge) return WV_INVALID_PARAMETER_4;
  base::HandleRef retained = RetainedFile(file);
  if (!retained) return WV_INVALID_HANDLE;
  *srq = new SharedReceiveQueue(this, std::move(retained),
                                std::make_shared<dev::SharedReceiveQueue>(pd_, uint32_t(max_wr),
                                                                          uint32_t(max_sge), uint32_t(limit)));
  return WV_SUCCESS;
}

HRESULT ProtectionDomain::CreateConnectQueuePair(WV_QP_CREATE* create, IWVConnectQueuePair** qp) {
  if (!create || !qp || create->QpType != WvQpTypeRc) return WV_INVALID_PARAMETER;
  auto* send_cq = dynamic_cast<CompletionQueue*>(create->pSendCq);
  auto* recv_cq = dynamic_cast<CompletionQueue*>(create->pReceiveCq);
  auto* srq = dynamic_cast<SharedReceiveQueue*>(create->pSharedReceiveQueue);
  if (!send_cq || !recv_cq || (create->pSharedReceiveQueue && !srq)) return WV_INVALID_PARAMETER;
  const dev::DeviceAttributes& a = device()->device()->attributes();
  if (create->SendDepth == 0 || create->SendDepth > a.max_qp_wr) return WV_INVALID_PARAMETER;
  if (!srq && (create->ReceiveDepth == 0 || create->ReceiveDepth > a.max_qp_wr)) return WV_INVALID_PARAMETER;
  if (create->SendSge > a.max_sge || create->ReceiveSge > a.max_sge) return WV_INVALID_PARAMETER;
  if (create->MaxInlineSend > a.max_inline) return WV_INVALID_PARAMETER;
  // SGEs as asked, or more: as many as fill the entries' cache lines, which cost nothing more (a
  // verbs provider may grant more than asked; Query tells what was granted).
  dev::QpCaps caps{uint32_t(create->SendDepth), uint32_t(create->ReceiveDepth),
                   dev::SendSgeFillingLines(uint32_t(create->SendSge), uint32_t(create->MaxInlineSend)),
                   dev::RecvSgeFillingLines(uint32_t(create->ReceiveSge)), uint32_t(create->MaxInlineSend)};
  auto device_qp = base::MakePooled<dev::QueuePair>(pd_, send_cq->cq(), recv_cq->cq(),
                                                   srq ? srq->srq() : nullptr, create->Context, caps);
  *qp = new ConnectQueuePair(this, *create, std::move(device_qp));
  return WV_SUCCESS;
}

// ---- memory window ------------------------------------------------------------------------------

MemoryWindow::MemoryWindow(ProtectionDomain* pd, std::shared_ptr<dev::MemoryWindow> window)
    : pd_(pd), window_(std::move(window)) {}

MemoryWindow::~MemoryWindow() { window_->pd->FreeWindow(window_.get()); }

HRESULT MemoryWindow::SetRemoteInvalidateId(UINT64 wr_id) {
  window_->pd->SetRemoteInvalidateId(window_.get(), wr_id);
  return WV_SUCCESS;
}

// ---- shared receive queue -------------------------------------------------------------------------

SharedReceiveQueue::SharedReceiveQueue(ProtectionDomain* pd, base::HandleRef file,
                                       std::shared_ptr<dev::SharedReceiveQueue> srq)
    : pd_(pd), file_(std::move(file)), srq_(std::move(srq)) {}

SharedReceiveQueue::~SharedReceiveQueue() { srq_->CancelNotifies(); }

HRESULT SharedReceiveQueue::CancelOverlappedRequests() {
  srq_->CancelNotifies();
  return WV_SUCCESS;
}

HRESULT SharedReceiveQueue::GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  return WaitResult(overlapped, bytes, wait);
}

HRESULT SharedReceiveQueue::Query(SIZE_T* max_wr, SIZE_T* max_sge, SIZE_T* limit) {
  uint32_t wr, sge, lim;
  srq_->Query(&wr, &sge, &lim);
  if (max_wr) *max_wr = wr;
  if (max_sge) *max_sge = sge;
  if (limit) *limit = lim;
  return WV_SUCCESS;
}

HRESULT SharedReceiveQueue::Modify(SIZE_T max_wr, SIZE_T limit) {
  return srq_->Modify(uint32_t(max_wr), uint32_t(limit));
}

HRESULT SharedReceiveQueue::PostReceive(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge) {
  if (num_sge > dev::kMaxSge) return WV_DATA_OVERRUN;
  dev::Sge sge[dev::kMaxSge];
  for (SIZE_T i = 0; i < num_sge; ++i)
    sge[i] = {reinterpret_cast<uint64_t>(sgl[i].pAddress), sgl[i].Length, sgl[i].Lkey};
  return srq_->PostReceive(wr_id, sge, uint32_t(num_sge));
}

HRESULT SharedReceiveQueue::Notify(OVERLAPPED* overlapped) {
  if (!overlapped) return WV_INVALID_PARAMETER;
  return StartOverlapped(new OverlappedOp(file_, overlapped), [&](OverlappedOp* op) { return srq_->Notify(op); });
}

}  // namespace ndwv::wv
