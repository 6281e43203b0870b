// IND2Connector over IWVConnectEndpoint. The connection's real state lives in WV; the connector
// remembers only what it needs to answer the SPI's own statuses: whether it is bound (Connect
// binds an unbound connector) and which side it plays, if any (ND_CONNECTION_INVALID before).
#pragma once

#include <atomic>

#include "nd/com.h"

namespace ndwv::nd {

class Adapter;

class Connector final : public OverlappedObject<Connector, IND2Connector, IID_IND2Connector> {
 public:
  Connector(Adapter& adapter, base::HandleRef file, ComPtr<IWVConnectEndpoint> endpoint);

  Adapter* adapter() const { return adapter_.get(); }
  IWVConnectEndpoint* wv() const { return endpoint_.get(); }
  IWVOverlapped* wvRequests() const { return endpoint_.get(); }

  // Listener::GetConnectionRequest: `listener` is to hand the connector its next request. An
  // active connector is refused here; WV refuses one whose earlier request waits or came.
  HRESULT AwaitRequest(IWVConnectEndpoint* listener, OVERLAPPED* pOverlapped);

  // IND2Connector
  HRESULT STDMETHODCALLTYPE Bind(const sockaddr* pAddress, ULONG cbAddress) override;
  HRESULT STDMETHODCALLTYPE Connect(IUnknown* pQueuePair, const sockaddr* pDestinationAddress,
                                    ULONG cbDestinationAddress, ULONG inboundReadLimit,
                                    ULONG outboundReadLimit, const void* pPrivateData,
                                    ULONG cbPrivateData, OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE CompleteConnect(OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Accept(IUnknown* pQueuePair, ULONG inboundReadLimit,
                                   ULONG outboundReadLimit, const void* pPrivateData,
                                   ULONG cbPrivateData, OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Reject(const void* pPrivateData, ULONG cbPrivateData) override;
  HRESULT STDMETHODCALLTYPE GetReadLimits(ULONG* pInboundReadLimit,
                                          ULONG* pOutboundReadLimit) override;
  HRESULT STDMETHODCALLTYPE GetPrivateData(void* pPrivateData, ULONG* pcbPrivateData) override;
  HRESULT STDMETHODCALLTYPE GetLocalAddress(sockaddr* pAddress, ULONG* pcbAddress) override;
  HRESULT STDMETHODCALLTYPE GetPeerAddress(sockaddr* pAddress, ULONG* pcbAddress) override;
  HRESULT STDMETHODCALLTYPE NotifyDisconnect(OVERLAPPED* pOverlapped) override;
  HRESULT STDMETHODCALLTYPE Disconnect(OVERLAPPED* pOverlapped) override;

 private:
  enum class Role { None, Active, Passive };

  HRESULT BindTo(const sockaddr* address);
  // What WV knows about the connection, once the connector has a side.
  HRESULT QueryConnection(WV_CONNECT_ATTRIBUTES* attributes);
  // The same, and ND_CONNECTION_INVALID until the peer's private data and read limits came (its
  // request, reply or rejection): GetReadLimits and GetPrivateData (nd2-spi: "after Connect
  // completes ... or after GetConnectionRequest completes").
  HRESULT QueryPeer(WV_CONNECT_ATTRIBUTES* attributes);
  // GetLocalAddress and GetPeerAddress: one of the connection's addresses, by the size protocol.
  HRESULT ReturnAddress(WV_SOCKADDR WV_CONNECT_ATTRIBUTES::*which, sockaddr* pAddress,
                        ULONG* pcbAddress);
  // The private data and read limits to send; ND_INVALID_BUFFER_SIZE above `maxData`.
  HRESULT MakeParam(ULONG inboundReadLimit, ULONG outboundReadLimit, const void* pPrivateData,
                    ULONG cbPrivateData, ULONG maxData, WV_CONNECT_PARAM* param) const;

  const Ref<Adapter> adapter_;
  const base::HandleRef file_;
  const ComPtr<IWVConnectEndpoint> endpoint_;
  std::atomic<bool> bound_{false};
  std::atomic<Role> role_{Role::None};
};

}  // namespace ndwv::nd
