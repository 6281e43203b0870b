#include "nd/listener.h"

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/connector.h"

namespace ndwv::nd {

Listener::Listener(Adapter& adapter, base::HandleRef file, ComPtr<IWVConnectEndpoint> endpoint)
    : adapter_(&adapter), file_(std::move(file)), endpoint_(std::move(endpoint)) {}

HRESULT Listener::Bind(const sockaddr* pAddress, ULONG cbAddress) {
  if (HRESULT hr = CheckSockaddr(pAddress, cbAddress, 1); FAILED(hr)) return hr;
  WV_SOCKADDR local;
  if (HRESULT hr = adapter_->BindableAddress(pAddress, &local); FAILED(hr)) return hr;
  return NdStatus(endpoint_->BindAddress(&local.Sa));  // again: ADDRESS_ALREADY_ASSOCIATED
}

HRESULT Listener::Listen(ULONG backlog) {
  if (listening_) return ND_INVALID_DEVICE_STATE;
  HRESULT hr = endpoint_->Listen(backlog);  // 0: no limit asked (ConnectEndpoint::Listen)
  if (SUCCEEDED(hr)) listening_ = true;
  return NdStatus(hr);
}

HRESULT Listener::GetLocalAddress(sockaddr* pAddress, ULONG* pcbAddress) {
  if (pcbAddress == nullptr) return ND_INVALID_PARAMETER_2;
  if (!listening_) return ND_INVALID_DEVICE_STATE;
  WV_CONNECT_ATTRIBUTES attributes{};
  if (HRESULT hr = endpoint_->Query(&attributes); FAILED(hr)) return NdStatus(hr);
  if (SockaddrLength(attributes.LocalAddress.Sa.sa_family) == 0) return ND_INVALID_DEVICE_STATE;
  return ReturnSockaddr(&attributes.LocalAddress.Sa, pAddress, pcbAddress);
}

HRESULT Listener::GetConnectionRequest(IUnknown* pConnector, OVERLAPPED* pOverlapped) {
  Connector* connector = adapter_->Mine<Connector>(pConnector);
  if (connector == nullptr) return ND_INVALID_PARAMETER_1;
  return connector->AwaitRequest(endpoint_.get(), pOverlapped);
}

}  // namespace ndwv::nd
