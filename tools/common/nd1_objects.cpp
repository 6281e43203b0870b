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
  const char* what = "INDAdapter::RegisterMemory";
  ND_CHECK(RunRequest(adapter_, what,
                      [&](OVERLAPPED* ov) {
                        return adapter_->RegisterMemory(buffer, length, ov, &handle_);
                      }),
           what);
}

void V1MemoryRegion::Deregister() {
  const char* what = "INDAdapter::DeregisterMemory";
  ND_CHECK(RunRequest(adapter_, what,
                      [&](OVERLAPPED* ov) { return adapter_->DeregisterMemory(handle_, ov); }),
           what);
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
  // A refused or timed-out attempt (ND_TIMEOUT is version 1's "try again") is issued again on
  // the same connector and endpoint.
  RetryConnect("INDConnector::Connect", [&](std::uint32_t leftMs) {
    Overlapped ov;
    HRESULT hr = connector->Connect(endpoint, server, serverLength, kProtocol, 0, nullptr, 0,
                                    ov.Prepare());
    return ov.Complete(connector, hr, "INDConnector::Connect", leftMs);
  });
}

void CompleteConnect(INDConnector* connector) {
  RequireSuccess(connector, "INDConnector::CompleteConnect", __LINE__,
                 [&](OVERLAPPED* ov) { return connector->CompleteConnect(ov); });
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
  RequireSuccess(listen, "INDListen::GetConnectionRequest", __LINE__, [&](OVERLAPPED* ov) {
    return listen->GetConnectionRequest(connector.get(), ov);
  });
  return connector;
}

void GetReadLimits(INDConnector* connector, SIZE_T* inbound, SIZE_T* outbound) {
  HRESULT hr = connector->GetConnectionData(inbound, outbound, nullptr, nullptr);
  if (hr != ND_SUCCESS) Fail("INDConnector::GetConnectionData", hr, __LINE__);
}

void Accept(INDConnector* connector, INDEndpoint* endpoint) {
  RequireSuccess(connector, "INDConnector::Accept", __LINE__,
                 [&](OVERLAPPED* ov) { return connector->Accept(endpoint, nullptr, 0, ov); });
}

void Disconnect(INDConnector* connector) {
  // ND_TIMEOUT (the peer never answered the disconnect request) is a success.
  const char* what = "INDConnector::Disconnect";
  ND_CHECK(RunRequest(connector, what, [&](OVERLAPPED* ov) { return connector->Disconnect(ov); }),
           what);
}

void FailResult(const char* what, const ND_RESULT* result, int line) {
  if (FAILED(result->Status)) Fail(what, result->Status, line);
  char message[200];
  std::snprintf(message, sizeof message, "%s: unexpected result %p (status %08x, %zu bytes)", what,
                static_cast<const void*>(result), unsigned(result->Status), result->BytesTransferred);
  FailMessage(message, line);
}

}  // namespace ndtool
