#include "nd/listener.h"

#include <algorithm>
#include <cstdio>

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/connector.h"

namespace ndwv::nd {

namespace {
// The host's limit on a listener's queue (the kernel's somaxconn), read once; 4096 (the kernel's
// default) where it cannot be read. Every connection a listener queues holds memory and, on
// iWARP, a socket: a careful administrator's bound, not a number a peer could exploit.
SIZE_T HostBacklog() {
  static const SIZE_T backlog = [] {
    unsigned long value = 0;
    FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "re");
    bool read = f && std::fscanf(f, "%lu", &value) == 1 && value > 0;
    if (f) std::fclose(f);
    return read ? SIZE_T(value) : SIZE_T(4096);
  }();
  return backlog;
}
}  // namespace

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
  // ND's backlog 0 means "no limit": the host's. A larger one is cut to it, as listen(2) does.
  HRESULT hr = endpoint_->Listen(backlog != 0 ? std::min<SIZE_T>(backlog, HostBacklog()) : HostBacklog());
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
  if (!connector->BecomePassive()) return ND_CONNECTION_ACTIVE;
  HRESULT hr = NdStatus(endpoint_->GetRequest(connector->wv(), pOverlapped));
  if (FAILED(hr)) connector->AbandonPassive();
  return hr;
}

}  // namespace ndwv::nd
