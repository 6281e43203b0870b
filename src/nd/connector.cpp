#include "nd/connector.h"

#include <algorithm>
#include <cstring>

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/queue_pair.h"

namespace ndwv::nd {

namespace {
// Retry counts for the connection: the most the CM fields carry. The device bounds the time
// retries may take by its own settings, so an RNR count of 7 is not IB's "retry forever" here.
constexpr UINT8 kRetryCount = 7;
constexpr UINT8 kRnrRetryCount = 7;
}  // namespace

Connector::Connector(Adapter& adapter, base::HandleRef file, ComPtr<IWVConnectEndpoint> endpoint)
    : adapter_(&adapter), file_(std::move(file)), endpoint_(std::move(endpoint)) {}

HRESULT Connector::AwaitRequest(IWVConnectEndpoint* listener, OVERLAPPED* pOverlapped) {
  Role previous = Role::None;
  if (!role_.compare_exchange_strong(previous, Role::Passive) && previous == Role::Active)
    return ND_CONNECTION_ACTIVE;
  HRESULT hr = NdStatus(listener->GetRequest(endpoint_.get(), pOverlapped));
  if (FAILED(hr)) role_ = previous;
  return hr;
}

HRESULT Connector::BindTo(const sockaddr* address) {
  WV_SOCKADDR local;
  if (HRESULT hr = adapter_->BindableAddress(address, &local); FAILED(hr)) return hr;
  HRESULT hr = endpoint_->BindAddress(&local.Sa);  // a second Bind: ADDRESS_ALREADY_ASSOCIATED
  if (SUCCEEDED(hr)) bound_ = true;
  return NdStatus(hr);
}

HRESULT Connector::Bind(const sockaddr* pAddress, ULONG cbAddress) {
  if (HRESULT hr = CheckSockaddr(pAddress, cbAddress, 1); FAILED(hr)) return hr;
  return BindTo(pAddress);
}

HRESULT Connector::MakeParam(ULONG inboundReadLimit, ULONG outboundReadLimit,
                             const void* pPrivateData, ULONG cbPrivateData, ULONG maxData,
                             WV_CONNECT_PARAM* param) const {
  if (cbPrivateData > std::min<SIZE_T>(maxData, sizeof(param->Data))) return ND_INVALID_BUFFER_SIZE;
  if (cbPrivateData != 0 && pPrivateData == nullptr) return ND_ACCESS_VIOLATION;
  const ND2_ADAPTER_INFO& info = adapter_->info();
  *param = {};
  param->DataLength = cbPrivateData;
  if (cbPrivateData != 0) std::memcpy(param->Data, pPrivateData, cbPrivateData);
  // Limits beyond the adapter's are clamped silently (nd2-spi.md §14.1).
  param->ResponderResources = std::min(inboundReadLimit, info.MaxInboundReadLimit);
  param->InitiatorDepth = std::min(outboundReadLimit, info.MaxOutboundReadLimit);
  param->RetryCount = kRetryCount;
  param->RnrRetryCount = kRnrRetryCount;
  return ND_SUCCESS;
}

HRESULT Connector::Connect(IUnknown* pQueuePair, const sockaddr* pDestinationAddress,
                           ULONG cbDestinationAddress, ULONG inboundReadLimit,
                           ULONG outboundReadLimit, const void* pPrivateData, ULONG cbPrivateData,
                           OVERLAPPED* pOverlapped) {
  QueuePair* qp = adapter_->Mine<QueuePair>(pQueuePair);
  if (qp == nullptr) return ND_INVALID_PARAMETER_1;
  if (HRESULT hr = CheckSockaddr(pDestinationAddress, cbDestinationAddress, 2); FAILED(hr))
    return hr;
  if (IsUnspecified(pDestinationAddress)) return STATUS_BAD_NETWORK_NAME;
  WV_CONNECT_PARAM param;
  // Too much private data leaves the connector as it was, ready for a corrected Connect.
  if (HRESULT hr = MakeParam(inboundReadLimit, outboundReadLimit, pPrivateData, cbPrivateData,
                             adapter_->info().MaxCallerData, &param);
      FAILED(hr))
    return hr;

  // Active from now on. A connector already active retries, which WV accepts after a failure.
  // One handed to a GetConnectionRequest becomes passive only when that completes (nd2-spi's
  // connector states): WV refuses it (ND_CONNECTION_ACTIVE) while the request waits or once it
  // came, and connects it, unbound (WV picks the port), if the request was canceled.
  const Role previous = role_.exchange(Role::Active);
  HRESULT hr = ND_SUCCESS;
  // Every caller we know binds first; an ephemeral port is the tolerant choice.
  if (!bound_ && previous == Role::None) {
    WV_SOCKADDR any{};
    any.Sa.sa_family = pDestinationAddress->sa_family;
    hr = BindTo(&any.Sa);
  }
  if (SUCCEEDED(hr)) {
    WV_SOCKADDR destination = CopySockaddr(pDestinationAddress);
    hr = NdStatus(endpoint_->Connect(qp->wv(), &destination.Sa, &param, pOverlapped));
  }
  if (FAILED(hr)) role_ = previous;
  return hr;
}

HRESULT Connector::CompleteConnect(OVERLAPPED* pOverlapped) {
  if (role_ != Role::Active) return ND_CONNECTION_INVALID;
  WV_CONNECT_PARAM param{};  // the active side's Accept: ready the QP, send the final handshake
  return NdStatus(endpoint_->Accept(nullptr, &param, pOverlapped));
}

HRESULT Connector::Accept(IUnknown* pQueuePair, ULONG inboundReadLimit, ULONG outboundReadLimit,
                          const void* pPrivateData, ULONG cbPrivateData, OVERLAPPED* pOverlapped) {
  QueuePair* qp = adapter_->Mine<QueuePair>(pQueuePair);
  if (qp == nullptr) return ND_INVALID_PARAMETER_1;
  WV_CONNECT_PARAM param;
  if (HRESULT hr = MakeParam(inboundReadLimit, outboundReadLimit, pPrivateData, cbPrivateData,
                             adapter_->info().MaxCalleeData, &param);
      FAILED(hr))
    return hr;
  if (role_ != Role::Passive) return ND_CONNECTION_INVALID;
  // Never more than the connecting peer offered: our inbound reads are its outbound ones.
  WV_CONNECT_ATTRIBUTES peer{};
  if (SUCCEEDED(endpoint_->Query(&peer))) {
    param.ResponderResources = std::min(param.ResponderResources, peer.Param.InitiatorDepth);
    param.InitiatorDepth = std::min(param.InitiatorDepth, peer.Param.ResponderResources);
  }
  return NdStatus(endpoint_->Accept(qp->wv(), &param, pOverlapped));
}

HRESULT Connector::Reject(const void* pPrivateData, ULONG cbPrivateData) {
  if (cbPrivateData > adapter_->info().MaxCalleeData) return ND_INVALID_BUFFER_SIZE;
  if (cbPrivateData != 0 && pPrivateData == nullptr) return ND_ACCESS_VIOLATION;
  if (role_ == Role::None) return ND_CONNECTION_INVALID;
  return NdStatus(endpoint_->Reject(pPrivateData, cbPrivateData));
}

HRESULT Connector::QueryConnection(WV_CONNECT_ATTRIBUTES* attributes) {
  if (role_ == Role::None) return ND_CONNECTION_INVALID;
  *attributes = {};
  return NdStatus(endpoint_->Query(attributes));
}

HRESULT Connector::QueryPeer(WV_CONNECT_ATTRIBUTES* attributes) {
  if (HRESULT hr = QueryConnection(attributes); FAILED(hr)) return hr;
  return attributes->PeerParamReceived ? ND_SUCCESS : ND_CONNECTION_INVALID;
}

HRESULT Connector::GetReadLimits(ULONG* pInboundReadLimit, ULONG* pOutboundReadLimit) {
  WV_CONNECT_ATTRIBUTES connection;
  if (HRESULT hr = QueryPeer(&connection); FAILED(hr)) return hr;
  // WV reports the peer's own view: its outbound reads arrive here, its inbound ones go there.
  const ND2_ADAPTER_INFO& info = adapter_->info();
  if (pInboundReadLimit != nullptr)
    *pInboundReadLimit = std::min(connection.Param.InitiatorDepth, info.MaxInboundReadLimit);
  if (pOutboundReadLimit != nullptr)
    *pOutboundReadLimit = std::min(connection.Param.ResponderResources, info.MaxOutboundReadLimit);
  return ND_SUCCESS;
}

HRESULT Connector::GetPrivateData(void* pPrivateData, ULONG* pcbPrivateData) {
  if (pcbPrivateData == nullptr) return ND_INVALID_PARAMETER_2;
  WV_CONNECT_ATTRIBUTES connection;
  if (HRESULT hr = QueryPeer(&connection); FAILED(hr)) return hr;
  ULONG length =
      ULONG(std::min<SIZE_T>(connection.Param.DataLength, sizeof(connection.Param.Data)));
  // Unlike the address getters, a short buffer still receives what fits.
  ULONG copied = std::min(*pcbPrivateData, length);
  if (pPrivateData != nullptr && copied != 0)
    std::memcpy(pPrivateData, connection.Param.Data, copied);
  bool overflow = *pcbPrivateData < length || (pPrivateData == nullptr && length != 0);
  *pcbPrivateData = length;
  return overflow ? ND_BUFFER_OVERFLOW : ND_SUCCESS;
}

HRESULT Connector::ReturnAddress(WV_SOCKADDR WV_CONNECT_ATTRIBUTES::*which, sockaddr* pAddress,
                                 ULONG* pcbAddress) {
  if (pcbAddress == nullptr) return ND_INVALID_PARAMETER_2;
  WV_CONNECT_ATTRIBUTES connection;
  if (HRESULT hr = QueryConnection(&connection); FAILED(hr)) return hr;
  const sockaddr* address = &(connection.*which).Sa;
  if (SockaddrLength(address->sa_family) == 0) return ND_CONNECTION_INVALID;
  return ReturnSockaddr(address, pAddress, pcbAddress);
}

HRESULT Connector::GetLocalAddress(sockaddr* pAddress, ULONG* pcbAddress) {
  return ReturnAddress(&WV_CONNECT_ATTRIBUTES::LocalAddress, pAddress, pcbAddress);
}

HRESULT Connector::GetPeerAddress(sockaddr* pAddress, ULONG* pcbAddress) {
  return ReturnAddress(&WV_CONNECT_ATTRIBUTES::PeerAddress, pAddress, pcbAddress);
}

HRESULT Connector::NotifyDisconnect(OVERLAPPED* pOverlapped) {
  if (role_ == Role::None) return ND_CONNECTION_INVALID;
  return NdStatus(endpoint_->NotifyDisconnect(pOverlapped));
}

HRESULT Connector::Disconnect(OVERLAPPED* pOverlapped) {
  if (role_ == Role::None) return ND_CONNECTION_INVALID;
  // One WV request does both halves: the CM exchange, then the flush of the QP (DESIGN.md).
  return NdStatus(endpoint_->Disconnect(pOverlapped));
}

}  // namespace ndwv::nd
