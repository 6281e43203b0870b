// What a Windows ND provider DLL exports, from the library that is ndwv's provider: the class
// object of either SPI version (DllGetClassObject) and whether the library is in use
// (DllCanUnloadNow). The helper library reaches version 1 through them (ndsupport.cpp).
#include <ndwv/ndsupport.h>

#include "nd/provider.h"
#include "nd/v1/provider.h"

HRESULT NdwvGetProvider(REFIID iid, void** ppProvider) {
  ndwv::nd::Provider* provider = nullptr;
  if (HRESULT hr = ndwv::nd::Provider::Create(WvGetObject, &provider); FAILED(hr)) return hr;
  return ndwv::nd::Publish(provider, iid, ppProvider);
}

HRESULT DllGetClassObject(REFCLSID, REFIID riid, void** ppv) {
  if (ppv == nullptr) return E_POINTER;
  *ppv = nullptr;
  // The version 2 framework asks for the provider itself (nd1-spi.md §2.1).
  if (riid == IID_IND2Provider) return NdwvGetProvider(riid, ppv);
  if (riid != IID_IClassFactory && riid != IID_IUnknown) return E_NOINTERFACE;
  auto* factory = new (std::nothrow) ndwv::nd::v1::ClassFactory;
  if (factory == nullptr) return E_OUTOFMEMORY;
  return ndwv::nd::Publish(factory, riid, ppv);
}

HRESULT DllCanUnloadNow() {
  bool inUse = ndwv::nd::liveObjects.load(std::memory_order_acquire) != 0 ||
               ndwv::nd::v1::ClassFactory::locks() != 0;
  return inUse ? S_FALSE : S_OK;
}
