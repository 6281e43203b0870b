// IND2CompletionQueue over IWVCompletionQueue: polling translates WV completions into ND2_RESULTs.
#pragma once

#include "nd/com.h"

namespace ndwv::nd {

class Adapter;

class CompletionQueue final
    : public OverlappedObject<CompletionQueue, IND2CompletionQueue, IID_IND2CompletionQueue> {
 public:
  CompletionQueue(Adapter& adapter, base::HandleRef file, ComPtr<IWVCompletionQueue> cq);

  Adapter* adapter() const { return adapter_.get(); }
  IWVCompletionQueue* wv() const { return cq_.get(); }
  IWVOverlapped* wvRequests() const { return cq_.get(); }

  // IND2CompletionQueue
  HRESULT STDMETHODCALLTYPE GetNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) override;
  HRESULT STDMETHODCALLTYPE Resize(ULONG queueDepth) override;
  HRESULT STDMETHODCALLTYPE Notify(ULONG type, OVERLAPPED* pOverlapped) override;
  ULONG STDMETHODCALLTYPE GetResults(ND2_RESULT results[], ULONG nResults) override;

 private:
  const Ref<Adapter> adapter_;
  const base::HandleRef file_;
  const ComPtr<IWVCompletionQueue> cq_;
};

// What an ND consumer sees of a WV work completion.
ND2_RESULT ToNdResult(const WV_COMPLETION& completion);

// Where CQ and SRQ notifications are processed: the CPUs of the thread that completes them
// (the device's progress engine), as the device reports them.
HRESULT ReportNotifyAffinity(const Adapter& adapter, USHORT* pGroup, KAFFINITY* pAffinity);

}  // namespace ndwv::nd
