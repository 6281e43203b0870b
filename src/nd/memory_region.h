// IND2MemoryRegion: at most one registration in the adapter's WV protection domain at a time.
#pragma once

#include <mutex>

#include "base/mutex.h"
#include "nd/com.h"

namespace ndwv::nd {

class Adapter;

class MemoryRegion final
    : public OverlappedObject<MemoryRegion, IND2MemoryRegion, IID_IND2MemoryRegion> {
 public:
  MemoryRegion(Adapter& adapter, base::HandleRef file);
  ~MemoryRegion() override;

  // What a memory-window Bind needs to know about the registration.
  struct Registration {
    bool registered = false;
    ULONG flags = 0;  // ND_MR_FLAG_*
    UINT32 lkey = 0;
  };
  Registration registration() const;

  Adapter* adapter() const { return adapter_.get(); }
  // WV registers synchronously, so no WV request of ours is ever outstanding.
  IWVOverlapped* wvRequests() const { return nullptr; }

  // IND2MemoryRegion
  HRESULT STDMETHODCALLTYPE Register(const void* pBuffer, SIZE_T cbBuffer, ULONG flags,
                                     OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Deregister(OVERLAPPED* pOverlapped) override;
  UINT32 STDMETHODCALLTYPE GetLocalToken() override;
  UINT32 STDMETHODCALLTYPE GetRemoteToken() override;

 private:
  // Reports a result through the OVERLAPPED and returns ND_PENDING: ND applications written for
  // Windows only look for completions on the port (nd2-spi.md §7, "always pend").
  HRESULT CompleteAsPending(OVERLAPPED* ov, HRESULT status);

  const Ref<Adapter> adapter_;
  const base::HandleRef file_;
  mutable base::Mutex mutex_{"nd::MemoryRegion::mutex_"};
  Registration registration_ NDWV_GUARDED_BY(mutex_);
  WV_MEMORY_KEYS keys_ NDWV_GUARDED_BY(mutex_) = {};
};

// The WV access rights for ND registration flags.
DWORD WvAccess(ULONG ndFlags);

}  // namespace ndwv::nd
