// INDAdapter: a version 2 adapter (its WV provider, device and protection domain) seen the
// version 1 way. It owns the one overlapped file every overlapped request of the adapter and of
// the objects made from it completes on (GetFileHandle), and the ND_MR_HANDLE registrations.
//
// Every object made from it holds it, so nothing the objects use goes away under them. Once the
// application has released the adapter itself, its objects only clean up: what would create,
// connect or post returns ND_DEVICE_REMOVED.
#pragma once

#include <atomic>

#include "nd/v1/object.h"
#include "nd/v1/registrations.h"

namespace ndwv::nd {
class Adapter;
}

namespace ndwv::nd::v1 {

class Adapter final : public OverlappedObject<Adapter, INDAdapter, IID_INDAdapter> {
 public:
  // A version 1 adapter over `adapter` (adopting its creation reference), opened for the local
  // address `ip`, where its listeners and connectors bind.
  static HRESULT Open(nd::Adapter* adapter, const WV_SOCKADDR& ip, Adapter** out);
  ~Adapter() override;

  nd::Adapter& base() const { return *base_; }
  const base::HandleRef& file() const { return file_; }
  // The local address the adapter was opened for, port 0.
  const WV_SOCKADDR& ip() const { return ip_; }
  const ND_ADAPTER_INFO1& info() const { return info_; }
  Registrations& registrations() { return registrations_; }
  // The application released the adapter: its objects refuse everything but cleanup.
  bool released() const { return released_.load(std::memory_order_relaxed); }
  // Registration is synchronous: no WV request of the adapter is ever outstanding.
  IWVOverlapped* wvRequests() const { return nullptr; }

  // `p` as one of this adapter's objects of type T, or nullptr (NULL, foreign, another adapter's,
  // or a version 2 object).
  template <class T>
  T* Mine(IUnknown* p) const {
    T* object = Downcast<T>(p);
    return object != nullptr && object->adapter() == this ? object : nullptr;
  }

  // INDAdapter
  HANDLE STDMETHODCALLTYPE GetFileHandle() override { return file_.get(); }
  HRESULT STDMETHODCALLTYPE Query(DWORD VersionRequested, ND_ADAPTER_INFO* pInfo,
                                  SIZE_T* pBufferSize) override;
  HRESULT STDMETHODCALLTYPE Control(DWORD IoControlCode, const void* pInBuffer,
                                    SIZE_T InBufferSize, void* pOutBuffer, SIZE_T OutBufferSize,
                                    SIZE_T* pBytesReturned, OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE CreateCompletionQueue(SIZE_T nEntries,
                                                  INDCompletionQueue** ppCq) override;
  HRESULT STDMETHODCALLTYPE RegisterMemory(const void* pBuffer, SIZE_T BufferSize,
                                           OVERLAPPED* pOverlapped, ND_MR_HANDLE* phMr) override;
  HRESULT STDMETHODCALLTYPE DeregisterMemory(ND_MR_HANDLE hMr, OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE CreateMemoryWindow(ND_RESULT* pInvalidateResult,
                                               INDMemoryWindow** ppMw) override;
  HRESULT STDMETHODCALLTYPE CreateConnector(INDConnector** ppConnector) override;
  HRESULT STDMETHODCALLTYPE Listen(SIZE_T Backlog, INT Protocol, USHORT Port,
                                   USHORT* pAssignedPort, INDListen** ppListen) override;

 private:
  Adapter(Ref<nd::Adapter> base, base::HandleRef file, const WV_SOCKADDR& ip);
  void Abandoned() noexcept override { released_.store(true, std::memory_order_relaxed); }
  // Reports a registration's result through the OVERLAPPED and returns ND_PENDING: programs
  // written for Windows look for it there (nd2-spi.md §7; nd1-spi.md §2.3, [rec]).
  HRESULT CompleteAsPending(OVERLAPPED* ov, HRESULT status);

  const Ref<nd::Adapter> base_;
  const base::HandleRef file_;
  const WV_SOCKADDR ip_;
  const ND_ADAPTER_INFO1 info_;
  Registrations registrations_;
  std::atomic<bool> released_{false};
};

}  // namespace ndwv::nd::v1
