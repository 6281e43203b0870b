// INDProvider and the class factory that makes it: version 1 is reached the way Windows' helper
// library reaches a version 1 provider DLL (DllGetClassObject → IClassFactory::CreateInstance →
// INDProvider::OpenAdapter, nd1-spi.md §2.1). The provider answers for the same devices as the
// version 2 one it is made of.
#pragma once

#include "nd/v1/object.h"

namespace ndwv::nd {
class Provider;
}

namespace ndwv::nd::v1 {

class Provider final : public Object<Provider, INDProvider, IID_INDProvider> {
 public:
  explicit Provider(Ref<nd::Provider> provider);

  // INDProvider
  HRESULT STDMETHODCALLTYPE QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList,
                                             SIZE_T* pBufferSize) override;
  HRESULT STDMETHODCALLTYPE OpenAdapter(const struct sockaddr* pAddress, SIZE_T AddressLength,
                                        INDAdapter** ppAdapter) override;

 private:
  const Ref<nd::Provider> provider_;
};

// The class factory (DllGetClassObject's IClassFactory): providers of either version.
class ClassFactory final : public Object<ClassFactory, IClassFactory, IID_IClassFactory> {
 public:
  // IClassFactory
  HRESULT STDMETHODCALLTYPE CreateInstance(IUnknown* pUnkOuter, REFIID riid,
                                           void** ppvObject) override;
  HRESULT STDMETHODCALLTYPE LockServer(BOOL fLock) override;

  // LockServer(TRUE) calls not yet undone, in the process (DllCanUnloadNow).
  static LONG locks() { return locks_.load(std::memory_order_acquire); }

 private:
  static inline std::atomic<LONG> locks_{0};
};

}  // namespace ndwv::nd::v1
