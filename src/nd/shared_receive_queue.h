// IND2SharedReceiveQueue over IWVSharedReceiveQueue.
#pragma once

#include "nd/com.h"

namespace ndwv::nd {

class Adapter;

class SharedReceiveQueue final : public OverlappedObject<SharedReceiveQueue, IND2SharedReceiveQueue,
                                                         IID_IND2SharedReceiveQueue> {
 public:
  SharedReceiveQueue(Adapter& adapter, base::HandleRef file, ComPtr<IWVSharedReceiveQueue> srq);

  Adapter* adapter() const { return adapter_.get(); }
  IWVSharedReceiveQueue* wv() const { return srq_.get(); }
  IWVOverlapped* wvRequests() const { return srq_.get(); }

  // IND2SharedReceiveQueue
  HRESULT STDMETHODCALLTYPE GetNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) override;
  HRESULT STDMETHODCALLTYPE Modify(ULONG queueDepth, ULONG notifyThreshold) override;
  HRESULT STDMETHODCALLTYPE Notify(OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Receive(void* requestContext, const ND2_SGE sge[], ULONG nSge) override;

 private:
  const Ref<Adapter> adapter_;
  const base::HandleRef file_;
  const ComPtr<IWVSharedReceiveQueue> srq_;
};

}  // namespace ndwv::nd
