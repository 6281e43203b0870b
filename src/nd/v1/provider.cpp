#include "nd/v1/provider.h"

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/provider.h"
#include "nd/v1/adapter.h"

namespace ndwv::nd::v1 {

Provider::Provider(Ref<nd::Provider> provider) : provider_(std::move(provider)) {}

HRESULT Provider::QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList, SIZE_T* pBufferSize) {
  if (pBufferSize == nullptr) return ND_INVALID_PARAMETER_2;
  return ReturnAddressList(provider_->Addresses(), pAddressList, pBufferSize);
}

HRESULT Provider::OpenAdapter(const struct sockaddr* pAddress, SIZE_T AddressLength,
                              INDAdapter** ppAdapter) {
  if (ppAdapter == nullptr) return ND_INVALID_PARAMETER_3;
  // An address that is no IPv4 or IPv6 sockaddr, or that no device here serves: version 1 says
  // ND_INVALID_ADDRESS for all of them (nd1-spi.md §2.2). The port plays no part.
  if (pAddress == nullptr || AddressLength < sizeof(sockaddr)) return ND_INVALID_ADDRESS;
  ULONG needed = SockaddrLength(pAddress->sa_family);
  if (needed == 0 || AddressLength < needed) return ND_INVALID_ADDRESS;
  UINT64 adapterId = 0;
  if (FAILED(provider_->ResolveAddress(pAddress, needed, &adapterId))) return ND_INVALID_ADDRESS;
  nd::Adapter* base = nullptr;
  if (HRESULT hr = provider_->Open(adapterId, &base); FAILED(hr)) return hr;
  Adapter* adapter = nullptr;
  if (HRESULT hr = Adapter::Open(base, WithoutPort(pAddress), &adapter); FAILED(hr)) return hr;
  *ppAdapter = adapter;
  return ND_SUCCESS;
}

HRESULT ClassFactory::CreateInstance(IUnknown* pUnkOuter, REFIID riid, void** ppvObject) {
  if (ppvObject == nullptr) return E_POINTER;
  *ppvObject = nullptr;
  if (pUnkOuter != nullptr) return CLASS_E_NOAGGREGATION;
  if (riid == IID_IND2Provider) return NdwvGetProvider(riid, ppvObject);
  if (riid != IID_INDProvider && riid != IID_IUnknown) return E_NOINTERFACE;
  nd::Provider* base = nullptr;
  if (HRESULT hr = nd::Provider::Create(WvGetObject, &base); FAILED(hr)) return hr;
  auto* provider = new (std::nothrow) Provider(Adopt(base));
  if (provider == nullptr) return E_OUTOFMEMORY;
  return Publish(provider, riid, ppvObject);
}

HRESULT ClassFactory::LockServer(BOOL fLock) {
  if (fLock)
    locks_.fetch_add(1, std::memory_order_relaxed);
  else
    locks_.fetch_sub(1, std::memory_order_release);
  return S_OK;
}

}  // namespace ndwv::nd::v1
