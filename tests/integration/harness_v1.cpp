// The version 1 side of the harness (harness_v1.h).
#include "harness_v1.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace ndit {

// ---- adapter, memory ----------------------------------------------------------------------------

V1Adapter::V1Adapter() {
  sockaddr_in address = Loopback(0);
  IT_OK(NdOpenAdapter(IID_INDAdapter, reinterpret_cast<sockaddr*>(&address), sizeof address,
                      adapter_.Out()));
  SIZE_T size = sizeof info_;
  IT_OK(adapter_->Query(ND_VERSION_1, &info_, &size));
  IT_CHECK_EQ(sizeof(ND_ADAPTER_INFO), size);
}

Ref<INDCompletionQueue> V1Adapter::CreateCq(SIZE_T depth) {
  Ref<INDCompletionQueue> cq;
  IT_OK(adapter_->CreateCompletionQueue(depth, reinterpret_cast<INDCompletionQueue**>(cq.Out())));
  return cq;
}

Ref<INDConnector> V1Adapter::CreateConnector() {
  Ref<INDConnector> connector;
  IT_OK(adapter_->CreateConnector(reinterpret_cast<INDConnector**>(connector.Out())));
  return connector;
}

uint16_t V1Adapter::Listen(Ref<INDListen>& listen, INT protocol, SIZE_T backlog) {
  USHORT port = 0;
  IT_OK(adapter_->Listen(backlog, protocol, 0, &port,
                         reinterpret_cast<INDListen**>(listen.Out())));
  IT_CHECK(port != 0);
  return ntohs(port);
}

ND_MR_HANDLE V1Register(INDAdapter* adapter, const void* buffer, size_t length) {
  ND_MR_HANDLE handle = nullptr;
  Ov ov;
  HRESULT hr = adapter->RegisterMemory(buffer, length, ov.Prepare(adapter), &handle);
  IT_OK(ov.Finish(hr, "INDAdapter::RegisterMemory"));
  IT_CHECK(handle != nullptr);
  return handle;
}

HRESULT V1Deregister(INDAdapter* adapter, ND_MR_HANDLE handle) {
  Ov ov;
  HRESULT hr = adapter->DeregisterMemory(handle, ov.Prepare(adapter));
  return ov.Finish(hr, "INDAdapter::DeregisterMemory");
}

V1Mr::V1Mr(V1Adapter& adapter, const void* buffer, size_t length)
    : adapter_(adapter.get()), handle_(V1Register(adapter_, buffer, length)) {}

HRESULT V1Mr::Deregister() {
  HRESULT hr = V1Deregister(adapter_, handle_);
  if (hr == ND_SUCCESS) handle_ = nullptr;
  return hr;
}

V1Mr::~V1Mr() {
  if (handle_ == nullptr) return;
  // No failure may escape a destructor: a plain bounded wait.
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  OVERLAPPED ov{};
  ov.hEvent = event;
  HRESULT hr = adapter_->DeregisterMemory(handle_, &ov);
  SIZE_T bytes = 0;
  for (int i = 0; hr == ND_PENDING && i < 100; ++i) {
    WaitForSingleObject(event, 50);
    hr = adapter_->GetOverlappedResult(&ov, &bytes, FALSE);
  }
  if (hr != ND_SUCCESS)
    std::fprintf(stderr, "warning: DeregisterMemory ended with %s\n", StatusName(hr).c_str());
  if (event != nullptr) CloseHandle(event);
}

// ---- endpoints ----------------------------------------------------------------------------------

V1Side::V1Side(V1Adapter& adapter, const V1Shape& shape)
    : adapter(adapter), shape(shape), cq(adapter.CreateCq(shape.cqDepth)) {
  if (shape.separateCqs) ownInboundCq = adapter.CreateCq(shape.cqDepth);
  inboundCq = shape.separateCqs ? ownInboundCq.get() : cq.get();
}

void V1Side::CreateEndpoint() { CreateEndpoint(shape.inboundReadLimit, shape.outboundReadLimit); }

void V1Side::CreateEndpoint(SIZE_T inboundReadLimit, SIZE_T outboundReadLimit) {
  if (!connector) connector = adapter.CreateConnector();
  IT_OK(connector->CreateEndpoint(inboundCq, cq.get(), shape.depth, shape.depth, shape.sge,
                                  shape.sge, inboundReadLimit, outboundReadLimit, &maxInline,
                                  reinterpret_cast<INDEndpoint**>(endpoint.Out())));
}

// ---- results ------------------------------------------------------------------------------------

ND_RESULT* V1NextResult(INDCompletionQueue* cq, const char* what, int ms) {
  Deadline deadline(ms);
  unsigned spins = 0;
  ND_RESULT* result = nullptr;
  for (;;) {
    if (cq->GetResults(&result, 1) == 1) return result;
    if (deadline.Expired())
      IT_FAIL(std::string("no result for ") + what + " within " + std::to_string(ms) + " ms");
    Pause(spins);
  }
}

void V1ExpectResult(INDCompletionQueue* cq, ND_RESULT* expected, HRESULT status, int64_t bytes,
                    const char* what, int ms) {
  ND_RESULT* r = V1NextResult(cq, what, ms);
  char text[256];
  std::snprintf(text, sizeof text, "%s: result %p {%s, %zu bytes}, expected %p {%s, %lld bytes}",
                what, static_cast<void*>(r), StatusName(r->Status).c_str(), r->BytesTransferred,
                static_cast<void*>(expected), StatusName(status).c_str(), (long long)bytes);
  if (r != expected || r->Status != status || (bytes >= 0 && int64_t(r->BytesTransferred) != bytes))
    IT_FAIL(text);
}

void V1ExpectNoResult(INDCompletionQueue* cq, const char* what, int ms) {
  Deadline deadline(ms);
  unsigned spins = 0;
  ND_RESULT* result = nullptr;
  while (!deadline.Expired()) {
    if (cq->GetResults(&result, 1) == 1)
      IT_FAIL(std::string(what) + ": unexpected result with " + StatusName(result->Status));
    Pause(spins);
  }
}

// ---- connections --------------------------------------------------------------------------------

HRESULT V1Connect(V1Side& side, uint16_t port, const void* data, SIZE_T length, INT protocol) {
  sockaddr_in server = Loopback(port);
  Ov ov;
  HRESULT hr = side.connector->Connect(side.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                       sizeof server, protocol, 0, data, length,
                                       ov.Prepare(side.connector.get()));
  return ov.Finish(hr, "INDConnector::Connect");
}

HRESULT V1Accept(V1Side& side, const void* data, SIZE_T length) {
  Ov ov;
  HRESULT hr = side.connector->Accept(side.endpoint.get(), data, length,
                                      ov.Prepare(side.connector.get()));
  return ov.Finish(hr, "INDConnector::Accept");
}

void V1CompleteConnect(V1Side& side) {
  Ov ov;
  HRESULT hr = side.connector->CompleteConnect(ov.Prepare(side.connector.get()));
  IT_OK(ov.Finish(hr, "INDConnector::CompleteConnect"));
}

HRESULT V1Disconnect(INDConnector* connector) {
  Ov ov;
  HRESULT hr = connector->Disconnect(ov.Prepare(connector));
  return ov.Finish(hr, "INDConnector::Disconnect");
}

void V1GetConnectionRequest(V1Side& side) {
  side.connector = side.adapter.CreateConnector();
  Ov ov;
  HRESULT hr = side.listen->GetConnectionRequest(side.connector.get(), ov.Prepare(side.listen.get()));
  IT_OK(ov.Finish(hr, "INDListen::GetConnectionRequest"));
}

void V1Serve(Channel& channel, V1Side& server, const V1Prepare& prepare) {
  // A version 2 client connects for TCP's protocol number (what version 2 uses on the wire).
  uint16_t port = server.adapter.Listen(server.listen, IPPROTO_TCP);
  channel.SendValue("port", port);
  V1GetConnectionRequest(server);
  SIZE_T inbound = 0, outbound = 0;
  SIZE_T length = 0;
  HRESULT hr = server.connector->GetConnectionData(&inbound, &outbound, nullptr, &length);
  IT_CHECK_MSG(hr == ND_SUCCESS || hr == ND_BUFFER_OVERFLOW, StatusName(hr));
  server.CreateEndpoint(std::min(inbound, server.shape.inboundReadLimit),
                        std::min(outbound, server.shape.outboundReadLimit));
  if (prepare) prepare(server);
  IT_OK(V1Accept(server));
  channel.Send("accepted");
}

void V1ConnectTo(Channel& channel, V1Side& client, const V1Prepare& prepare) {
  uint16_t port = uint16_t(channel.ReceiveValue("port"));
  if (!client.endpoint) client.CreateEndpoint();
  if (prepare) prepare(client);
  IT_OK(V1Connect(client, port, nullptr, 0, IPPROTO_TCP));
  V1CompleteConnect(client);
  channel.Expect("accepted");
}

void V1ClientTeardown(Channel& channel, V1Side& client) {
  IT_OK(V1Disconnect(client.connector.get()));
  channel.Send("client disconnected");
}

void V1ServerTeardown(Channel& channel, V1Side& server) {
  channel.Expect("client disconnected");
  IT_OK(V1Disconnect(server.connector.get()));
}

void SendDescriptor(Channel& channel, const ND_MW_DESCRIPTOR& descriptor) {
  char hex[2 * sizeof descriptor + 1];
  const auto* bytes = reinterpret_cast<const uint8_t*>(&descriptor);
  for (size_t i = 0; i < sizeof descriptor; ++i) std::snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
  channel.Send(std::string("descriptor ") + hex);
}

ND_MW_DESCRIPTOR ReceiveDescriptor(Channel& channel) {
  std::string line = channel.Receive("a window descriptor");
  const std::string prefix = "descriptor ";
  IT_CHECK_MSG(line.rfind(prefix, 0) == 0 && line.size() == prefix.size() + 40, line);
  ND_MW_DESCRIPTOR descriptor;
  auto* bytes = reinterpret_cast<uint8_t*>(&descriptor);
  for (size_t i = 0; i < sizeof descriptor; ++i)
    bytes[i] = uint8_t(std::stoul(line.substr(prefix.size() + 2 * i, 2), nullptr, 16));
  return descriptor;
}

}  // namespace ndit
