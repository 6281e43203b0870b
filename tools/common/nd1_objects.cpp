#include "nd1_objects.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstdio>

namespace ndtool {

namespace {
// The protocol the tools listen and connect for: TCP's, as version 2 does on the wire.
constexpr INT kProtocol = IPPROTO_TCP;

USHORT PortOf(const sockaddr* address) {
  return address->sa_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6*>(address)->sin6_port
                                        : reinterpret_cast<const sockaddr_in*>(address)->sin_port;
}
}  // namespace

// ---- adapter ---------------------------------------------------------------------------------

void V1Adapter::Open(const sockaddr* localAddress, ULONG length) {
  ND_CHECK(NdOpenV1Adapter(localAddress, length, reinterpret_cast<INDAdapter**>(adapter_.Out())),
           "NdOpenV1Adapter");
  SIZE_T size = sizeof info_;
  ND_CHECK(adapter_->Query(ND_VERSION_1, &info_, &size), "INDAdapter::Query");
}

void V1Adapter::OpenForPeer(const sockaddr* server, ULONG length) {
  sockaddr_storage source{};
  SIZE_T size = sizeof source;
  ND_CHECK(NdResolveAddress(server, length, reinterpret_cast<sockaddr*>(&source), &size),
           "NdResolveAddress");
  Open(reinterpret_cast<const sockaddr*>(&source), ULONG(size));
}

NdRef<INDCompletionQueue> V1Adapter::CreateCompletionQueue(SIZE_T depth) {
  NdRef<INDCompletionQueue> cq;
  ND_CHECK(adapter_->CreateCompletionQueue(depth, reinterpret_cast<INDCompletionQueue**>(cq.Out())),
           "INDAdapter::CreateCompletionQueue");
  return cq;
}

NdRef<INDConnector> V1Adapter::CreateConnector() {
  NdRef<INDConnector> connector;
  ND_CHECK(adapter_->CreateConnector(reinterpret_cast<INDConnector**>(connector.Out())),
           "INDAdapter::CreateConnector");
  return connector;
}

// ---- completion queue, memory -------------------------------------------------------------------

V1CompletionQueue::V1CompletionQueue(V1Adapter& adapter, SIZE_T depth, bool blocking)
    : cq_(adapter.CreateCompletionQueue(depth)), blocking_(blocking) {}

ND_RESULT* V1CompletionQueue::Next(const char* what, std::uint32_t timeoutMs) {
  return NextCompletion<INDCompletionQueue, ND_RESULT*>(
      cq_.get(), notify_, blocking_, [this](ND_RESULT** r) { return Poll(r); }, what, timeoutMs);
}

V1MemoryRegion::V1MemoryRegion(V1Adapter& adapter, const void* buffer, std::size_t length)
    : adapter_(adapter.get()) {
  Overlapped ov;
  HRESULT hr = adapter_->RegisterMemory(buffer, length, ov.Prepare(), &handle_);
  ND_CHECK(ov.Complete(adapter_, hr, "INDAdapter::RegisterMemory"), "INDAdapter::RegisterMemory");
}

void V1MemoryRegion::Deregister() {
  Overlapped ov;
  HRESULT hr = adapter_->DeregisterMemory(handle_, ov.Prepare());
  ND_CHECK(ov.Complete(adapter_, hr, "INDAdapter::DeregisterMemory"), "INDAdapter::DeregisterMemory");
}

ULONG BuildSgl(ND_SGE* sgl, ULONG maxSge, void* buffer, std::size_t length, ND_MR_HANDLE handle) {
  return SplitSgl(sgl, maxSge, buffer, length, [handle](ND_SGE& sge, char* at, std::size_t bytes) {
    sge = {at, bytes, handle};
  });
}

NdRef<INDEndpoint> CreateEndpoint(INDConnector* connector, INDCompletionQueue* cq,
                                  SIZE_T inboundDepth, SIZE_T outboundDepth, SIZE_T inboundSge,
                                  SIZE_T outboundSge, SIZE_T inboundReadLimit,
                                  SIZE_T outboundReadLimit) {
  NdRef<INDEndpoint> endpoint;
  ND_CHECK(connector->CreateEndpoint(cq, cq, inboundDepth, outboundDepth, inboundSge, outboundSge,
                                     inboundReadLimit, outboundReadLimit, nullptr,
                                     reinterpret_cast<INDEndpoint**>(endpoint.Out())),
           "INDConnector::CreateEndpoint");
  return endpoint;
}

// ---- connections -----------------------------------------------------------------------------

void Connect(INDConnector* connector, INDEndpoint* endpoint, const sockaddr* server,
             ULONG serverLength) {
  const std::uint64_t end = NowMicros() + std::uint64_t(WaitTimeoutMs()) * 1000;
  for (;;) {
    std::uint64_t now = NowMicros();
    std::uint32_t leftMs = now < end ? std::uint32_t((end - now + 999) / 1000) : 1;
    Overlapped ov;
    HRESULT hr = connector->Connect(endpoint, server, serverLength, kProtocol, 0, nullptr, 0,
                                    ov.Prepare());
    hr = ov.Complete(connector, hr, "INDConnector::Connect", leftMs);
    if (hr == ND_SUCCESS) return;
    // ND_TIMEOUT is version 1's "try again"; a refusal is retried while the server comes up.
    bool retry = hr == ND_CONNECTION_REFUSED || hr == ND_TIMEOUT ||
                 hr == ND_NETWORK_UNREACHABLE || hr == ND_HOST_UNREACHABLE;
    if (!retry || NowMicros() + 50000 >= end) Fail("INDConnector::Connect", hr, __LINE__);
    SleepMs(50);
  }
}

void CompleteConnect(INDConnector* connector) {
  Overlapped ov;
  HRESULT hr = connector->CompleteConnect(ov.Prepare());
  hr = ov.Complete(connector, hr, "INDConnector::CompleteConnect");
  if (hr != ND_SUCCESS) Fail("INDConnector::CompleteConnect", hr, __LINE__);
}

NdRef<INDListen> Listen(V1Adapter& adapter, const sockaddr* address) {
  NdRef<INDListen> listen;
  USHORT port = 0;
  ND_CHECK(adapter.get()->Listen(0, kProtocol, PortOf(address), &port,
                                 reinterpret_cast<INDListen**>(listen.Out())),
           "INDAdapter::Listen");
  return listen;
}

NdRef<INDConnector> GetConnectionRequest(V1Adapter& adapter, INDListen* listen) {
  NdRef<INDConnector> connector = adapter.CreateConnector();
  Overlapped ov;
  HRESULT hr = listen->GetConnectionRequest(connector.get(), ov.Prepare());
  hr = ov.Complete(listen, hr, "INDListen::GetConnectionRequest");
  if (hr != ND_SUCCESS) Fail("INDListen::GetConnectionRequest", hr, __LINE__);
  return connector;
}

void GetReadLimits(INDConnector* connector, SIZE_T* inbound, SIZE_T* outbound) {
  HRESULT hr = connector->GetConnectionData(inbound, outbound, nullptr, nullptr);
  if (hr != ND_SUCCESS) Fail("INDConnector::GetConnectionData", hr, __LINE__);
}

void Accept(INDConnector* connector, INDEndpoint* endpoint) {
  Overlapped ov;
  HRESULT hr = connector->Accept(endpoint, nullptr, 0, ov.Prepare());
  hr = ov.Complete(connector, hr, "INDConnector::Accept");
  if (hr != ND_SUCCESS) Fail("INDConnector::Accept", hr, __LINE__);
}

void Disconnect(INDConnector* connector) {
  Overlapped ov;
  HRESULT hr = connector->Disconnect(ov.Prepare());
  // ND_TIMEOUT (the peer never answered the disconnect request) is a success.
  ND_CHECK(ov.Complete(connector, hr, "INDConnector::Disconnect"), "INDConnector::Disconnect");
}

void FailResult(const char* what, const ND_RESULT* result, int line) {
  if (FAILED(result->Status)) Fail(what, result->Status, line);
  char message[200];
  std::snprintf(message, sizeof message, "%s: unexpected result %p (status %08x, %zu bytes)", what,
                static_cast<const void*>(result), unsigned(result->Status), result->BytesTransferred);
  FailMessage(message, line);
}

}  // namespace ndtool
