// IND2QueuePair over IWVConnectQueuePair (RC). Posts translate flags, SGEs and byte order and
// pass WV's immediate status through: the codes are ND's already.
#pragma once

#include "nd/com.h"

namespace ndwv::nd {

class Adapter;
class CompletionQueue;
class SharedReceiveQueue;

class QueuePair final : public Object<QueuePair, IND2QueuePair, IID_IND2QueuePair> {
 public:
  // Holds the CQs and SRQ for as long as WV's queue pair uses them.
  QueuePair(Adapter& adapter, CompletionQueue& receiveCq, CompletionQueue& initiatorCq,
            SharedReceiveQueue* srq, ComPtr<IWVConnectQueuePair> qp);

  Adapter* adapter() const { return adapter_.get(); }
  IWVConnectQueuePair* wv() const { return qp_.get(); }

  // IND2QueuePair
  HRESULT STDMETHODCALLTYPE Flush() override;
  HRESULT STDMETHODCALLTYPE Send(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                                 ULONG flags) override;
  HRESULT STDMETHODCALLTYPE Receive(void* requestContext, const ND2_SGE sge[], ULONG nSge) override;
  HRESULT STDMETHODCALLTYPE Bind(void* requestContext, IUnknown* pMemoryRegion,
                                 IUnknown* pMemoryWindow, const void* pBuffer, SIZE_T cbBuffer,
                                 ULONG flags) override;
  HRESULT STDMETHODCALLTYPE Invalidate(void* requestContext, IUnknown* pMemoryWindow,
                                       ULONG flags) override;
  HRESULT STDMETHODCALLTYPE Read(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                                 UINT64 remoteAddress, UINT32 remoteToken, ULONG flags) override;
  HRESULT STDMETHODCALLTYPE Write(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                                  UINT64 remoteAddress, UINT32 remoteToken, ULONG flags) override;

 private:
  ULONG MostInitiatorSges(ULONG flags) const;  // for a Send, Read or Write with `flags`

  const Ref<Adapter> adapter_;
  const Ref<CompletionQueue> receiveCq_;
  const Ref<CompletionQueue> initiatorCq_;
  const Ref<SharedReceiveQueue> srq_;
  const ComPtr<IWVConnectQueuePair> qp_;  // last: released before the CQs and SRQ it uses
};

// WV send flags for ND operation flags (those valid for the operation, already checked).
DWORD WvSendFlags(ULONG ndFlags);

}  // namespace ndwv::nd
