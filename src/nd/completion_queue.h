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
// The verbs → ND status mapping that ND applications and their tests expect (nd2-spi.md §12).
HRESULT CompletionStatus(WV_WC_STATUS status);

// Polls up to `n` completions of `cq` into out[] as convert(WV_COMPLETION) makes them, in small
// batches through a stack buffer (WV_COMPLETION is larger than an ND result, so the caller's
// array cannot serve as the poll buffer). Returns how many.
template <class Out, class Count, class Convert>
Count PollCompletions(IWVCompletionQueue* cq, Out out[], Count n, Convert convert) {
  constexpr Count kBatch = 16;
  WV_COMPLETION batch[kBatch];
  Count done = 0;
  while (done < n) {
    Count want = n - done < kBatch ? n - done : kBatch;
    Count got = Count(cq->Poll(batch, want));
    for (Count i = 0; i < got; ++i) out[done + i] = convert(batch[i]);
    done += got;
    if (got < want) break;
  }
  return done;
}

// Where CQ and SRQ notifications are processed: the CPUs of the thread that completes them
// (the device's progress engine), as the device reports them.
HRESULT ReportNotifyAffinity(const Adapter& adapter, USHORT* pGroup, KAFFINITY* pAffinity);

}  // namespace ndwv::nd
