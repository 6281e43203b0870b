// INDCompletionQueue: a version 2 completion queue on the adapter's file. Version 1 results are
// the caller's own ND_RESULTs: the request's ND_RESULT* travels as the WV request id, and
// GetResults writes the outcome into it and hands back that very pointer.
#pragma once

#include "nd/v1/object.h"

namespace ndwv::nd {
class CompletionQueue;
}

namespace ndwv::nd::v1 {

class Adapter;

class CompletionQueue final
    : public OverlappedObject<CompletionQueue, INDCompletionQueue, IID_INDCompletionQueue> {
 public:
  CompletionQueue(Adapter& adapter, Ref<nd::CompletionQueue> cq);

  Adapter* adapter() const { return adapter_.get(); }
  nd::CompletionQueue& base() const { return *cq_; }
  IWVOverlapped* wvRequests() const;

  // INDCompletionQueue
  HRESULT STDMETHODCALLTYPE Resize(SIZE_T nEntries) override;
  HRESULT STDMETHODCALLTYPE Notify(DWORD Type, OVERLAPPED* pOverlapped) override;
  SIZE_T STDMETHODCALLTYPE GetResults(ND_RESULT* pResults[], SIZE_T nResults) override;

 private:
  const Ref<Adapter> adapter_;
  const Ref<nd::CompletionQueue> cq_;
};

// What a version 1 caller sees of a WV work completion, written into the request's ND_RESULT.
ND_RESULT* CompleteResult(const WV_COMPLETION& completion);

}  // namespace ndwv::nd::v1
