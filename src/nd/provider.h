// IND2Provider: the entry point of the ND provider, answering for every RDMA device WV offers.
#pragma once

#include <vector>

#include "nd/com.h"

// The IND2Provider of ndwv (what DllGetClassObject returns for IID_IND2Provider, dll.cpp): a new
// provider object for IID_IND2Provider or IID_IUnknown. Needs no NdStartup.
HRESULT NdwvGetProvider(REFIID iid, void** ppProvider);

namespace ndwv::nd {

class Adapter;

// Where WV providers come from: WvGetObject, or a fake in unit tests.
using WvSource = HRESULT (*)(REFIID iid, LPVOID* ppv);

class Provider final : public Object<Provider, IND2Provider, IID_IND2Provider> {
 public:
  // A provider over WV providers made by `source` (one for its own queries, one per adapter).
  static HRESULT Create(WvSource source, Provider** provider);
  // The same, with `wv` for its own queries.
  static HRESULT Over(WvSource source, ComPtr<IWVProvider> wv, Provider** provider);

  // Every host address some device serves (QueryAddressList, NdQueryAddressList).
  std::vector<WV_SOCKADDR> Addresses() const;
  // Opens adapter `adapterId`, with a WV provider of its own, with its creation reference.
  HRESULT Open(UINT64 adapterId, Adapter** adapter);

  // IND2Provider
  HRESULT STDMETHODCALLTYPE QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList,
                                             ULONG* pcbAddressList) override;
  HRESULT STDMETHODCALLTYPE ResolveAddress(const sockaddr* pAddress, ULONG cbAddress,
                                           UINT64* pAdapterId) override;
  HRESULT STDMETHODCALLTYPE OpenAdapter(REFIID iid, UINT64 adapterId, void** ppAdapter) override;

 private:
  Provider(WvSource source, ComPtr<IWVProvider> wv) : source_(source), wv_(std::move(wv)) {}

  const WvSource source_;
  const ComPtr<IWVProvider> wv_;
};

// A new WV provider from `source`.
HRESULT GetWvProvider(WvSource source, ComPtr<IWVProvider>* wv);

}  // namespace ndwv::nd
