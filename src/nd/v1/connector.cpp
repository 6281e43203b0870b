#include "nd/v1/connector.h"

#include <algorithm>
#include <limits>

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/completion_queue.h"
#include "nd/connector.h"
#include "nd/queue_pair.h"
#include "nd/v1/adapter.h"
#include "nd/v1/completion_queue.h"
#include "nd/v1/endpoint.h"

namespace ndwv::nd::v1 {

namespace {

// Version 1 sizes are SIZE_T; version 2's ULONG. Larger than a ULONG is larger than any limit.
ULONG Narrow(SIZE_T value) {
  return ULONG(std::min<SIZE_T>(value, std::numeric_limits<ULONG>::max()));
}

}  // namespace

HRESULT SetProtocol(IWVConnectEndpoint* endpoint, INT protocol) {
  UINT8 number = UINT8(protocol);
  return NdStatus(endpoint->Modify(WV_EP_OPTION_PROTOCOL, &number, sizeof number));
}

Connector::Connector(Adapter& adapter, Ref<nd::Connector> connector)
    : adapter_(&adapter), connector_(std::move(connector)) {
  // An unanswered Connect or Accept is "try again" in version 1 (nd1-spi.md §1, #34).
  connector_->wv()->Modify(WV_EP_OPTION_RETRYABLE_TIMEOUT, nullptr, 0);
}

IWVOverlapped* Connector::wvRequests() const { return connector_->wvRequests(); }

Endpoint* Connector::MyEndpoint(INDEndpoint* pEndpoint) const {
  Endpoint* endpoint = adapter_->Mine<Endpoint>(pEndpoint);
  return endpoint != nullptr && endpoint->connector() == this ? endpoint : nullptr;
}

HRESULT Connector::CreateEndpoint(INDCompletionQueue* pInboundCq, INDCompletionQueue* pOutboundCq,
                                  SIZE_T nInboundEntries, SIZE_T nOutboundEntries,
                                  SIZE_T nInboundSge, SIZE_T nOutboundSge,
                                  SIZE_T InboundReadLimit, SIZE_T OutboundReadLimit,
                                  SIZE_T* pMaxInlineData, INDEndpoint** ppEndpoint) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  const ND_ADAPTER_INFO1& info = adapter_->info();
  CompletionQueue* inbound = adapter_->Mine<CompletionQueue>(pInboundCq);
  if (inbound == nullptr) return ND_INVALID_PARAMETER_1;
  CompletionQueue* outbound = adapter_->Mine<CompletionQueue>(pOutboundCq);
  if (outbound == nullptr) return ND_INVALID_PARAMETER_2;
  // Exactly the adapter's maxima are allowed (MPICH's netmod asks for them, #8).
  if (nInboundEntries == 0 || nInboundEntries > info.MaxInboundRequests)
    return ND_INVALID_PARAMETER_3;
  if (nOutboundEntries == 0 || nOutboundEntries > info.MaxOutboundRequests)
    return ND_INVALID_PARAMETER_4;
  if (nInboundSge > info.MaxInboundSge) return ND_INVALID_PARAMETER_5;
  if (nOutboundSge > info.MaxOutboundSge) return ND_INVALID_PARAMETER_6;
  if (InboundReadLimit > info.MaxInboundReadLimit) return ND_INVALID_PARAMETER_7;
  if (OutboundReadLimit > info.MaxOutboundReadLimit) return ND_INVALID_PARAMETER_8;
  if (ppEndpoint == nullptr) return ND_INVALID_PARAMETER_10;
  // One endpoint per connector: it is the connection's queue pair.
  if (hasEndpoint_.exchange(true)) return ND_NOT_SUPPORTED;

  nd::QueuePair* created = nullptr;
  HRESULT hr = adapter_->base().NewQueuePair(
      inbound->base(), outbound->base(), nullptr, nullptr, ULONG(nInboundEntries),
      ULONG(nOutboundEntries), ULONG(nInboundSge), ULONG(nOutboundSge), ULONG(info.MaxInlineData), &created);
  if (FAILED(hr)) {
    hasEndpoint_.store(false);
    return hr;
  }
  Ref<nd::QueuePair> qp = Adopt(created);
  // What the queue pair got, not what was asked (D10).
  WV_QP_ATTRIBUTES granted{};
  if (hr = NdStatus(qp->wv()->Query(&granted)); FAILED(hr)) {
    hasEndpoint_.store(false);
    return hr;
  }
  Endpoint::Limits limits;
  limits.inboundSge = nInboundSge;
  limits.outboundSge = nOutboundSge;
  limits.inboundReadLimit = InboundReadLimit;
  limits.outboundReadLimit = OutboundReadLimit;
  limits.maxInline = granted.MaxInlineSend;
  auto* endpoint = new (std::nothrow) Endpoint(*this, std::move(qp), limits);
  if (endpoint == nullptr) {
    hasEndpoint_.store(false);
    return ND_NO_MEMORY;
  }
  if (pMaxInlineData != nullptr) *pMaxInlineData = limits.maxInline;
  *ppEndpoint = endpoint;
  return ND_SUCCESS;
}

HRESULT Connector::Connect(INDEndpoint* pEndpoint, const struct sockaddr* pAddress,
                           SIZE_T AddressLength, INT Protocol, USHORT LocalPort,
                           const void* pPrivateData, SIZE_T PrivateDataLength,
                           OVERLAPPED* pOverlapped) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  Endpoint* endpoint = MyEndpoint(pEndpoint);
  if (endpoint == nullptr) return ND_INVALID_PARAMETER_1;
  if (pAddress == nullptr) return ND_INVALID_PARAMETER_2;
  // Version 1 reports every fault of the peer's address so, its length included (§2.8).
  ULONG needed = AddressLength >= sizeof(sockaddr) ? SockaddrLength(pAddress->sa_family) : 0;
  if (needed == 0 || AddressLength < needed || pAddress->sa_family != adapter_->ip().Sa.sa_family)
    return ND_INVALID_ADDRESS;
  if (!IsProtocolNumber(Protocol)) return ND_INVALID_PARAMETER_4;
  if (PrivateDataLength > adapter_->info().MaxCallerData) return ND_INVALID_BUFFER_SIZE;
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_8;

  // From the adapter's address and the caller's port; a Connect issued again (after ND_TIMEOUT)
  // keeps the first one's.
  if (!bound_.load()) {
    WV_SOCKADDR local = adapter_->ip();
    SetPort(&local, LocalPort);
    if (HRESULT hr = connector_->Bind(&local.Sa, SockaddrLength(local.Sa.sa_family)); FAILED(hr))
      return hr;
    bound_.store(true);
  }
  if (HRESULT hr = SetProtocol(connector_->wv(), Protocol); FAILED(hr)) return hr;
  const Endpoint::Limits& limits = endpoint->limits();
  HRESULT hr = connector_->Connect(&endpoint->base(), pAddress, needed,
                                   Narrow(limits.inboundReadLimit),
                                   Narrow(limits.outboundReadLimit), pPrivateData,
                                   ULONG(PrivateDataLength), pOverlapped);
  return hr == STATUS_BAD_NETWORK_NAME ? ND_INVALID_ADDRESS : hr;
}

HRESULT Connector::CompleteConnect(OVERLAPPED* pOverlapped) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_1;
  return connector_->CompleteConnect(pOverlapped);
}

HRESULT Connector::Accept(INDEndpoint* pEndpoint, const void* pPrivateData,
                          SIZE_T PrivateDataLength, OVERLAPPED* pOverlapped) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  Endpoint* endpoint = MyEndpoint(pEndpoint);
  if (endpoint == nullptr) return ND_INVALID_PARAMETER_1;
  if (PrivateDataLength > adapter_->info().MaxCalleeData) return ND_INVALID_BUFFER_SIZE;
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_4;
  if (endpoint->Connected()) return ND_CONNECTION_ACTIVE;  // version 1 names it so (§2.8)
  const Endpoint::Limits& limits = endpoint->limits();
  return connector_->Accept(&endpoint->base(), Narrow(limits.inboundReadLimit),
                            Narrow(limits.outboundReadLimit), pPrivateData,
                            ULONG(PrivateDataLength), pOverlapped);
}

HRESULT Connector::Reject(const void* pPrivateData, SIZE_T PrivateDataLength) {
  if (PrivateDataLength > adapter_->info().MaxCalleeData) return ND_INVALID_BUFFER_SIZE;
  return connector_->Reject(pPrivateData, ULONG(PrivateDataLength));
}

HRESULT Connector::GetConnectionData(SIZE_T* pInboundReadLimit, SIZE_T* pOutboundReadLimit,
                                     void* pPrivateData, SIZE_T* pPrivateDataLength) {
  // Version 2 already states the limits from the caller's side (nd1-spi.md §2.8).
  ULONG inbound = 0, outbound = 0;
  if (HRESULT hr = connector_->GetReadLimits(&inbound, &outbound); FAILED(hr)) return hr;
  if (pInboundReadLimit != nullptr) *pInboundReadLimit = inbound;
  if (pOutboundReadLimit != nullptr) *pOutboundReadLimit = outbound;
  if (pPrivateDataLength == nullptr) return ND_SUCCESS;
  ULONG length = Narrow(*pPrivateDataLength);
  HRESULT hr = connector_->GetPrivateData(pPrivateData, &length);
  *pPrivateDataLength = length;
  return hr;
}

template <class Getter>
HRESULT Connector::ReturnAddress(Getter get, struct sockaddr* pAddress, SIZE_T* pAddressLength) {
  if (pAddressLength == nullptr) return ND_INVALID_PARAMETER_2;
  ULONG length = Narrow(*pAddressLength);
  HRESULT hr = (connector_.get()->*get)(pAddress, &length);
  if (hr == ND_SUCCESS || hr == ND_BUFFER_OVERFLOW) *pAddressLength = length;
  return hr;
}

HRESULT Connector::GetLocalAddress(struct sockaddr* pAddress, SIZE_T* pAddressLength) {
  return ReturnAddress(&nd::Connector::GetLocalAddress, pAddress, pAddressLength);
}

HRESULT Connector::GetPeerAddress(struct sockaddr* pAddress, SIZE_T* pAddressLength) {
  return ReturnAddress(&nd::Connector::GetPeerAddress, pAddress, pAddressLength);
}

HRESULT Connector::NotifyDisconnect(OVERLAPPED* pOverlapped) {
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_1;
  return connector_->NotifyDisconnect(pOverlapped);
}

HRESULT Connector::Disconnect(OVERLAPPED* pOverlapped) {
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_1;
  // A NotifyDisconnect still waiting is the application's own request: canceled, not
  // satisfied, by the application's Disconnect (the version 1 rule, nd1-spi.md §2.8). A
  // Disconnect already running is never canceled.
  connector_->wv()->CancelOverlappedRequests();
  return connector_->Disconnect(pOverlapped);
}

}  // namespace ndwv::nd::v1
