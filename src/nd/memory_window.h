// IND2MemoryWindow over IWVMemoryWindow. The queue pair's Bind stores the new remote token here;
// it is valid as soon as Bind returns.
#pragma once

#include <atomic>

#include "nd/com.h"

namespace ndwv::nd {

class Adapter;

class MemoryWindow final : public Object<MemoryWindow, IND2MemoryWindow, IID_IND2MemoryWindow> {
 public:
  MemoryWindow(Adapter& adapter, ComPtr<IWVMemoryWindow> mw);

  Adapter* adapter() const { return adapter_.get(); }
  IWVMemoryWindow* wv() const { return mw_.get(); }
  void SetRemoteToken(UINT32 rkey) { rkey_.store(rkey, std::memory_order_release); }

  // IND2MemoryWindow
  UINT32 STDMETHODCALLTYPE GetRemoteToken() override {
    return rkey_.load(std::memory_order_acquire);
  }

 private:
  const Ref<Adapter> adapter_;
  const ComPtr<IWVMemoryWindow> mw_;
  std::atomic<UINT32> rkey_{0};  // from the last Bind, network order
};

}  // namespace ndwv::nd
