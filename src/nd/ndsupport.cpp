// The NetworkDirect helper library (ndsupport.h). On Windows it finds ND providers in the Winsock
// catalog; here the one provider is built in. While the library is started it holds the verbs
// layer (and so the device) up, not a provider object: DllCanUnloadNow counts only the
// application's objects.
#include <ndwv/ndsupport.h>
#include <ndwv/ndwv.h>
#include <ndwv/winverbs.h>

#include <cstring>
#include <mutex>

#include "base/log.h"
#include "base/mutex.h"
#include "nd/address.h"
#include "nd/provider.h"

using ndwv::nd::ComPtr;
using ndwv::nd::Provider;

namespace {

// Never destroyed (base/settings.h): a program may exit, without NdCleanup, while its other
// threads still call in.
ndwv::base::Mutex& g_mutex = *new ndwv::base::Mutex("ndsupport g_mutex");
int g_starts NDWV_GUARDED_BY(g_mutex) = 0;
ComPtr<IWVProvider>& g_wv NDWV_GUARDED_BY(g_mutex) = *new ComPtr<IWVProvider>;

// A provider over the verbs layer the library holds, while it is started.
ComPtr<Provider> StartedProvider() {
  ComPtr<IWVProvider> wv;
  {
    ndwv::base::MutexLock lock(g_mutex);
    wv = g_wv;
  }
  Provider* provider = nullptr;
  if (!wv || FAILED(Provider::Over(WvGetObject, std::move(wv), &provider))) return nullptr;
  ComPtr<Provider> held(provider);
  provider->Release();
  return held;
}

// A version 1 adapter, the way Windows' helper library opens one from a version 1 provider DLL
// (nd1-spi.md §2.10): the class factory, an INDProvider, its OpenAdapter.
HRESULT OpenV1Adapter(const sockaddr* address, SIZE_T length, INDAdapter** adapter) {
  ComPtr<IClassFactory> factory;
  HRESULT hr = DllGetClassObject(IID_INDProvider, IID_IClassFactory,
                                 reinterpret_cast<void**>(factory.put()));
  if (FAILED(hr)) return hr;
  ComPtr<INDProvider> provider;
  hr = factory->CreateInstance(nullptr, IID_INDProvider, reinterpret_cast<void**>(provider.put()));
  if (FAILED(hr)) return hr;
  return provider->OpenAdapter(address, length, adapter);
}

// Whether the provider serves this (validated) address: the port plays no part.
bool Serves(Provider* provider, const sockaddr* address) {
  UINT64 adapterId = 0;
  return SUCCEEDED(
      provider->ResolveAddress(address, ndwv::nd::SockaddrLength(address->sa_family), &adapterId));
}

}  // namespace

HRESULT NdStartup() {
  ndwv::base::MutexLock lock(g_mutex);
  if (g_starts == 0) {
    // Holding the verbs layer keeps the device up between the application's own objects.
    if (HRESULT hr = ndwv::nd::GetWvProvider(WvGetObject, &g_wv); FAILED(hr)) return hr;
  }
  ++g_starts;
  return S_OK;
}

HRESULT NdCleanup() {
  ComPtr<IWVProvider> last;  // released outside the lock
  ndwv::base::MutexLock lock(g_mutex);
  if (g_starts == 0) return ND_DEVICE_NOT_READY;
  if (--g_starts == 0) std::swap(last, g_wv);
  return S_OK;
}

void NdFlushProviders() {
  // The provider is part of this library: there is nothing to unload.
}

HRESULT NdQueryAddressList(DWORD flags, SOCKET_ADDRESS_LIST* pAddressList, SIZE_T* pcbAddressList) {
  ComPtr<Provider> provider = StartedProvider();
  if (!provider) return ND_DEVICE_NOT_READY;
  if (pcbAddressList == nullptr) return ND_INVALID_PARAMETER_3;
  // Ours serves both versions on every address and is no emulator: its addresses are left out
  // only when both versions are (MS-MPI's v1 channel excludes v2 and must see them).
  constexpr DWORD kBothVersions = ND_QUERY_EXCLUDE_NDv1_ADDRESSES | ND_QUERY_EXCLUDE_NDv2_ADDRESSES;
  std::vector<WV_SOCKADDR> addresses;
  if ((flags & kBothVersions) != kBothVersions) addresses = provider->Addresses();
  return ndwv::nd::ReturnAddressList(addresses, pAddressList, pcbAddressList);
}

HRESULT NdResolveAddress(const sockaddr* pRemoteAddress, SIZE_T cbRemoteAddress,
                         sockaddr* pLocalAddress, SIZE_T* pcbLocalAddress) {
  ComPtr<Provider> provider = StartedProvider();
  if (!provider) return ND_DEVICE_NOT_READY;
  if (HRESULT hr = ndwv::nd::CheckSockaddr(pRemoteAddress, cbRemoteAddress, 1); FAILED(hr))
    return hr;
  if (pcbLocalAddress == nullptr) return ND_INVALID_PARAMETER_4;
  WV_SOCKADDR local;
  if (HRESULT hr = ndwv::nd::RouteSource(pRemoteAddress, &local); FAILED(hr)) return hr;
  if (!Serves(provider.get(), &local.Sa)) return ND_INVALID_ADDRESS;
  SIZE_T size = ndwv::nd::SockaddrLength(local.Sa.sa_family);
  if (pLocalAddress == nullptr || *pcbLocalAddress < size) {
    *pcbLocalAddress = size;
    return ND_BUFFER_OVERFLOW;
  }
  std::memcpy(pLocalAddress, &local, size);
  *pcbLocalAddress = size;
  return ND_SUCCESS;
}

HRESULT NdCheckAddress(const sockaddr* pAddress, SIZE_T cbAddress) {
  ComPtr<Provider> provider = StartedProvider();
  if (!provider) return ND_DEVICE_NOT_READY;
  if (HRESULT hr = ndwv::nd::CheckSockaddr(pAddress, cbAddress, 1); FAILED(hr)) return hr;
  return Serves(provider.get(), pAddress) ? ND_SUCCESS : ND_INVALID_ADDRESS;
}

HRESULT NdOpenAdapter(REFIID iid, const sockaddr* pAddress, SIZE_T cbAddress, void** ppIAdapter) {
  ComPtr<Provider> provider = StartedProvider();
  if (!provider) return ND_DEVICE_NOT_READY;
  // The helper library reports every fault of the address, length included, as argument 2.
  if (HRESULT hr = ndwv::nd::CheckSockaddr(pAddress, cbAddress, 2, 2); FAILED(hr)) return hr;
  if (ppIAdapter == nullptr) return ND_INVALID_PARAMETER_4;
  HRESULT hr;
  if (iid == IID_INDAdapter) {
    hr = OpenV1Adapter(pAddress, cbAddress, reinterpret_cast<INDAdapter**>(ppIAdapter));
  } else {
    UINT64 adapterId = 0;
    hr = provider->ResolveAddress(pAddress, ULONG(cbAddress), &adapterId);
    if (SUCCEEDED(hr)) hr = provider->OpenAdapter(iid, adapterId, ppIAdapter);
  }
  if (FAILED(hr)) {
    // As with several providers: one that cannot open the address leaves it to the next, and
    // when none is left the address is "not an ND address".
    NDWV_LOG(Info, "NdOpenAdapter: the provider could not open the adapter: 0x%08x", unsigned(hr));
    return ND_INVALID_ADDRESS;
  }
  return ND_SUCCESS;
}

HRESULT NdOpenV1Adapter(const sockaddr* pAddress, SIZE_T cbAddress, INDAdapter** ppIAdapter) {
  return NdOpenAdapter(IID_INDAdapter, pAddress, cbAddress, reinterpret_cast<void**>(ppIAdapter));
}

extern "C" const char* ndwv_adapter_transport(uint64_t adapter_id) {
  // Asked of the verbs layer, as the ND provider learns everything about its adapters.
  void* object = nullptr;
  if (FAILED(WvGetObject(IID_IWVProvider, &object))) return nullptr;
  ComPtr<IWVProvider> wv;
  *wv.put() = static_cast<IWVProvider*>(object);
  ComPtr<IWVDevice> device;
  if (FAILED(wv->OpenDevice(adapter_id, device.put()))) return nullptr;
  WV_DEVICE_ATTRIBUTES attributes;
  if (FAILED(device->Query(&attributes))) return nullptr;
  if (attributes.DeviceType == WvDeviceIwarp) return "iWARP";
  WV_PORT_ATTRIBUTES port;
  if (SUCCEEDED(device->QueryPort(1, &port)) && port.Transport == WvPortTransportRdmaoe) return "RoCEv2";
  return "InfiniBand";
}
