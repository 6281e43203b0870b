// IND2Listener over a listening IWVConnectEndpoint; each GetConnectionRequest hands WV the
// endpoint of a fresh connector to attach the next request to.
#pragma once

#include <atomic>

#include "nd/com.h"

namespace ndwv::nd {

class Adapter;

class Listener final : public OverlappedObject<Listener, IND2Listener, IID_IND2Listener> {
 public:
  Listener(Adapter& adapter, base::HandleRef file, ComPtr<IWVConnectEndpoint> endpoint);

  Adapter* adapter() const { return adapter_.get(); }
  IWVConnectEndpoint* wv() const { return endpoint_.get(); }
  IWVOverlapped* wvRequests() const { return endpoint_.get(); }

  // IND2Listener
  HRESULT STDMETHODCALLTYPE Bind(const sockaddr* pAddress, ULONG cbAddress) override;
  HRESULT STDMETHODCALLTYPE Listen(ULONG backlog) override;
  HRESULT STDMETHODCALLTYPE GetLocalAddress(sockaddr* pAddress, ULONG* pcbAddress) override;
  HRESULT STDMETHODCALLTYPE GetConnectionRequest(IUnknown* pConnector,
                                                 OVERLAPPED* pOverlapped) override;

 private:
  const Ref<Adapter> adapter_;
  const base::HandleRef file_;
  const ComPtr<IWVConnectEndpoint> endpoint_;
  std::atomic<bool> listening_{false};
};

}  // namespace ndwv::nd
