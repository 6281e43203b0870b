#include "nd/provider.h"

#include "nd/adapter.h"
#include "nd/address.h"

namespace ndwv::nd {

HRESULT GetWvProvider(WvSource source, ComPtr<IWVProvider>* wv) {
  void* object = nullptr;
  HRESULT hr = source(IID_IWVProvider, &object);
  if (FAILED(hr)) return NdStatus(hr);
  *wv->put() = static_cast<IWVProvider*>(object);
  return ND_SUCCESS;
}

HRESULT Provider::Create(WvSource source, Provider** provider) {
  ComPtr<IWVProvider> wv;
  if (HRESULT hr = GetWvProvider(source, &wv); FAILED(hr)) return hr;
  return Over(source, std::move(wv), provider);
}

HRESULT Provider::Over(WvSource source, ComPtr<IWVProvider> wv, Provider** provider) {
  *provider = new (std::nothrow) Provider(source, std::move(wv));
  return *provider != nullptr ? ND_SUCCESS : ND_NO_MEMORY;
}

std::vector<WV_SOCKADDR> Provider::Addresses() const { return ServedAddresses(wv_.get()); }

HRESULT Provider::QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList, ULONG* pcbAddressList) {
  if (pcbAddressList == nullptr) return ND_INVALID_PARAMETER_2;
  return ReturnAddressList(Addresses(), pAddressList, pcbAddressList);
}

HRESULT Provider::ResolveAddress(const sockaddr* pAddress, ULONG cbAddress, UINT64* pAdapterId) {
  if (HRESULT hr = CheckSockaddr(pAddress, cbAddress, 1); FAILED(hr)) return hr;
  if (pAdapterId == nullptr) return ND_INVALID_PARAMETER_3;
  WV_SOCKADDR ip = WithoutPort(pAddress);
  WV_DEVICE_ADDRESS device{};
  if (HRESULT hr = wv_->TranslateAddress(&ip.Sa, &device); FAILED(hr))
    return hr == WV_DEVICE_REMOVED ? ND_DEVICE_REMOVED : ND_INVALID_ADDRESS;
  *pAdapterId = device.DeviceGuid;  // the ND adapter id is the device GUID
  return ND_SUCCESS;
}

HRESULT Provider::Open(UINT64 adapterId, Adapter** adapter) {
  // Each adapter has a WV provider of its own, as in the WinOFED mapping (nd2-spi.md §14.4).
  ComPtr<IWVProvider> wv;
  if (HRESULT hr = GetWvProvider(source_, &wv); FAILED(hr)) return hr;
  return Adapter::Open(std::move(wv), adapterId, adapter);
}

HRESULT Provider::OpenAdapter(REFIID iid, UINT64 adapterId, void** ppAdapter) {
  Adapter* adapter = nullptr;
  if (HRESULT hr = Open(adapterId, &adapter); FAILED(hr)) return hr;
  return Publish(adapter, iid, ppAdapter);
}

}  // namespace ndwv::nd
