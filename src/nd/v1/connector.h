// INDConnector: a version 2 connector, driven the version 1 way. The endpoint it creates is the
// queue pair its connection uses, with the read limits fixed at CreateEndpoint; Connect binds
// the adapter's address with the caller's local port and names the listener's IP protocol.
// Disconnect, NotifyDisconnect and the rest are version 2's (the same teardown contract), with
// version 1's differences: an unanswered Connect or Accept completes ND_TIMEOUT (try again), and
// a local Disconnect completes a pending NotifyDisconnect with ND_CANCELED.
#pragma once

#include <atomic>

#include "nd/v1/object.h"

namespace ndwv::nd {
class Connector;
}

namespace ndwv::nd::v1 {

class Adapter;
class Endpoint;

// An IANA protocol number (0..255): what version 1 listens and connects for.
constexpr bool IsProtocolNumber(INT protocol) { return protocol >= 0 && protocol <= 255; }
// Gives `endpoint` the protocol of its service (RoCE carries it in the service ID).
HRESULT SetProtocol(IWVConnectEndpoint* endpoint, INT protocol);

class Connector final : public OverlappedObject<Connector, INDConnector, IID_INDConnector> {
 public:
  Connector(Adapter& adapter, Ref<nd::Connector> connector);

  Adapter* adapter() const { return adapter_.get(); }
  nd::Connector& base() const { return *connector_; }
  IWVOverlapped* wvRequests() const;
  // The endpoint this connector created was destroyed: CreateEndpoint may make another.
  void EndpointGone() { hasEndpoint_.store(false); }

  // INDConnector
  HRESULT STDMETHODCALLTYPE CreateEndpoint(INDCompletionQueue* pInboundCq,
                                           INDCompletionQueue* pOutboundCq,
                                           SIZE_T nInboundEntries, SIZE_T nOutboundEntries,
                                           SIZE_T nInboundSge, SIZE_T nOutboundSge,
                                           SIZE_T InboundReadLimit, SIZE_T OutboundReadLimit,
                                           SIZE_T* pMaxInlineData,
                                           INDEndpoint** ppEndpoint) override;
  HRESULT STDMETHODCALLTYPE Connect(INDEndpoint* pEndpoint, const struct sockaddr* pAddress,
                                    SIZE_T AddressLength, INT Protocol, USHORT LocalPort,
                                    const void* pPrivateData, SIZE_T PrivateDataLength,
                                    OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE CompleteConnect(OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Accept(INDEndpoint* pEndpoint, const void* pPrivateData,
                                   SIZE_T PrivateDataLength, OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Reject(const void* pPrivateData, SIZE_T PrivateDataLength) override;
  HRESULT STDMETHODCALLTYPE GetConnectionData(SIZE_T* pInboundReadLimit,
                                              SIZE_T* pOutboundReadLimit, void* pPrivateData,
                                              SIZE_T* pPrivateDataLength) override;
  HRESULT STDMETHODCALLTYPE GetLocalAddress(struct sockaddr* pAddress,
                                            SIZE_T* pAddressLength) override;
  HRESULT STDMETHODCALLTYPE GetPeerAddress(struct sockaddr* pAddress,
                                           SIZE_T* pAddressLength) override;
  HRESULT STDMETHODCALLTYPE NotifyDisconnect(OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Disconnect(OVERLAPPED* pOverlapped) override;

 private:
  // pEndpoint if this connector created it, else nullptr.
  Endpoint* MyEndpoint(INDEndpoint* pEndpoint) const;
  // GetLocalAddress and GetPeerAddress: the version 2 getter with a SIZE_T length.
  template <class Getter>
  HRESULT ReturnAddress(Getter get, struct sockaddr* pAddress, SIZE_T* pAddressLength);

  const Ref<Adapter> adapter_;
  const Ref<nd::Connector> connector_;
  std::atomic<bool> hasEndpoint_{false};
  std::atomic<bool> bound_{false};
};

}  // namespace ndwv::nd::v1
