// IND2Adapter: one opened RDMA device. As in WinOFED's ND-over-WinVerbs mapping it is a WV
// provider (endpoints are made there), a WV device (CQs) and a WV protection domain (memory,
// queue pairs, windows); the ND adapter id is the device GUID. Every object created here holds
// the adapter, so the WV objects outlive all their users.
#pragma once

#include "nd/com.h"

namespace ndwv::nd {

class CompletionQueue;
class Connector;
class Listener;
class MemoryWindow;
class QueuePair;
class SharedReceiveQueue;

class Adapter final : public Object<Adapter, IND2Adapter, IID_IND2Adapter> {
 public:
  // Opens device `guid` of `wv` and allocates the adapter's protection domain.
  static HRESULT Open(ComPtr<IWVProvider> wv, NET64 guid, Adapter** adapter);

  const ND2_ADAPTER_INFO& info() const { return info_; }
  const WV_DEVICE_ATTRIBUTES& attributes() const { return attributes_; }
  IWVProvider* wv() const { return wv_.get(); }
  IWVDevice* device() const { return device_.get(); }
  IWVProtectionDomain* pd() const { return pd_.get(); }

  // The address a connector or listener of this adapter binds to for `requested`: an address this
  // adapter serves (else ND_INVALID_ADDRESS), or a wildcard, which never reaches other adapters.
  HRESULT BindableAddress(const sockaddr* requested, WV_SOCKADDR* bindable) const;

  // `p` as one of this adapter's objects of type T, or nullptr (NULL, foreign, another adapter's).
  template <class T>
  T* Mine(IUnknown* p) const {
    T* object = Downcast<T>(p);
    return object != nullptr && object->adapter() == this ? object : nullptr;
  }

  // The objects of the adapter, made with arguments already checked, each returned with its
  // creation reference (the IND2Adapter methods publish them; version 1 wraps them). A QP holds
  // `receiveSge` and `initiatorSge` SGEs per request, as granted by the caller, and the most read
  // limits, which the connection sets.
  HRESULT NewCompletionQueue(base::HandleRef file, ULONG queueDepth, CompletionQueue** cq);
  HRESULT NewQueuePair(CompletionQueue& receiveCq, CompletionQueue& initiatorCq,
                       SharedReceiveQueue* srq, void* context, ULONG receiveQueueDepth,
                       ULONG initiatorQueueDepth, ULONG receiveSge, ULONG initiatorSge,
                       ULONG inlineDataSize, QueuePair** qp);
  HRESULT NewMemoryWindow(MemoryWindow** mw);
  HRESULT NewConnector(base::HandleRef file, Connector** connector);
  HRESULT NewListener(base::HandleRef file, Listener** listener);

  // IND2Adapter
  HRESULT STDMETHODCALLTYPE CreateOverlappedFile(HANDLE* phOverlappedFile) override;
  HRESULT STDMETHODCALLTYPE Query(ND2_ADAPTER_INFO* pInfo, ULONG* pcbInfo) override;
  HRESULT STDMETHODCALLTYPE QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList,
                                             ULONG* pcbAddressList) override;
  HRESULT STDMETHODCALLTYPE CreateCompletionQueue(REFIID iid, HANDLE hOverlappedFile,
                                                  ULONG queueDepth, USHORT group,
                                                  KAFFINITY affinity,
                                                  void** ppCompletionQueue) override;
  HRESULT STDMETHODCALLTYPE CreateMemoryRegion(REFIID iid, HANDLE hOverlappedFile,
                                               void** ppMemoryRegion) override;
  HRESULT STDMETHODCALLTYPE CreateMemoryWindow(REFIID iid, void** ppMemoryWindow) override;
  HRESULT STDMETHODCALLTYPE CreateSharedReceiveQueue(REFIID iid, HANDLE hOverlappedFile,
                                                     ULONG queueDepth, ULONG maxRequestSge,
                                                     ULONG notifyThreshold, USHORT group,
                                                     KAFFINITY affinity,
                                                     void** ppSharedReceiveQueue) override;
  HRESULT STDMETHODCALLTYPE CreateQueuePair(REFIID iid, IUnknown* pReceiveCompletionQueue,
                                            IUnknown* pInitiatorCompletionQueue, void* context,
                                            ULONG receiveQueueDepth, ULONG initiatorQueueDepth,
                                            ULONG maxReceiveRequestSge,
                                            ULONG maxInitiatorRequestSge, ULONG inlineDataSize,
                                            void** ppQueuePair) override;
  HRESULT STDMETHODCALLTYPE CreateQueuePairWithSrq(
      REFIID iid, IUnknown* pReceiveCompletionQueue, IUnknown* pInitiatorCompletionQueue,
      IUnknown* pSharedReceiveQueue, void* context, ULONG initiatorQueueDepth,
      ULONG maxInitiatorRequestSge, ULONG inlineDataSize, void** ppQueuePair) override;
  HRESULT STDMETHODCALLTYPE CreateConnector(REFIID iid, HANDLE hOverlappedFile,
                                            void** ppConnector) override;
  HRESULT STDMETHODCALLTYPE CreateListener(REFIID iid, HANDLE hOverlappedFile,
                                           void** ppListener) override;

 private:
  Adapter(ComPtr<IWVProvider> wv, ComPtr<IWVDevice> device, ComPtr<IWVProtectionDomain> pd,
          NET64 guid, const WV_DEVICE_ATTRIBUTES& attributes);

  const ComPtr<IWVProvider> wv_;
  const ComPtr<IWVDevice> device_;
  const ComPtr<IWVProtectionDomain> pd_;
  const NET64 guid_;
  const WV_DEVICE_ATTRIBUTES attributes_;
  const ND2_ADAPTER_INFO info_;
};

}  // namespace ndwv::nd
