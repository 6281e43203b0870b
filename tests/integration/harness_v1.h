// The harness's NetworkDirect version 1 side (nd1-spi.md): the adapter opened by IID_INDAdapter,
// registrations by handle, endpoints made by connectors, results that are the caller's own
// ND_RESULTs, and the connection steps. The channel protocol of Serve/ConnectTo (harness.h) is
// kept, so that a version 1 side and a version 2 side can meet (they share the wire).
#pragma once

#include <functional>

#include "harness.h"

namespace ndit {

// The IP protocol the version 1 tests listen and connect for (MS-MPI's: 123).
constexpr INT kV1Protocol = 123;

// The version 1 adapter serving 127.0.0.1 (NdOpenAdapter(IID_INDAdapter)) and its limits.
class V1Adapter {
 public:
  V1Adapter();
  V1Adapter(const V1Adapter&) = delete;
  V1Adapter& operator=(const V1Adapter&) = delete;

  INDAdapter* get() const { return adapter_.get(); }
  INDAdapter* operator->() const { return adapter_.get(); }
  const ND_ADAPTER_INFO& info() const { return info_; }
  // Releases the adapter (the objects made from it may still hold it).
  ULONG Release() { return adapter_.Reset(); }

  Ref<INDCompletionQueue> CreateCq(SIZE_T depth);
  Ref<INDConnector> CreateConnector();
  // Listens on 127.0.0.1, port 0, for `protocol`; returns the port given (host order).
  uint16_t Listen(Ref<INDListen>& listen, INT protocol = kV1Protocol, SIZE_T backlog = 0);

 private:
  Ref<INDAdapter> adapter_;
  ND_ADAPTER_INFO info_{};
};

// RegisterMemory/DeregisterMemory through the overlapped path.
ND_MR_HANDLE V1Register(INDAdapter* adapter, const void* buffer, size_t length);
HRESULT V1Deregister(INDAdapter* adapter, ND_MR_HANDLE handle);

// One registration, deregistered on destruction.
class V1Mr {
 public:
  V1Mr(V1Adapter& adapter, const void* buffer, size_t length);
  ~V1Mr();
  V1Mr(const V1Mr&) = delete;
  V1Mr& operator=(const V1Mr&) = delete;
  ND_MR_HANDLE handle() const { return handle_; }
  // Deregisters now (the destructor then has nothing to do); returns the final status.
  HRESULT Deregister();

 private:
  INDAdapter* adapter_;
  ND_MR_HANDLE handle_ = nullptr;
};

// One end of a version 1 connection: its CQ(s), connector and endpoint (made from the connector,
// before the connection on the active side, after the request on the passive side).
struct V1Shape {
  SIZE_T depth = 64;  // both queues
  SIZE_T sge = 4;     // both queues
  SIZE_T cqDepth = 1024;
  SIZE_T inboundReadLimit = 4, outboundReadLimit = 4;
  bool separateCqs = false;  // receives on a CQ of their own
};
struct V1Side {
  explicit V1Side(V1Adapter& adapter, const V1Shape& shape = {});
  // Makes the endpoint from the connector (made first if there is none) with the shape's read
  // limits, or the ones given.
  void CreateEndpoint();
  void CreateEndpoint(SIZE_T inboundReadLimit, SIZE_T outboundReadLimit);

  V1Adapter& adapter;
  V1Shape shape;
  Ref<INDCompletionQueue> cq;  // outbound results (and inbound unless separateCqs)
  Ref<INDCompletionQueue> ownInboundCq;
  INDCompletionQueue* inboundCq;
  Ref<INDConnector> connector;
  Ref<INDEndpoint> endpoint;
  Ref<INDListen> listen;
  SIZE_T maxInline = 0;  // what CreateEndpoint reported
};

// ---- results --------------------------------------------------------------------------------------

// The next result of `cq`; fails if none comes in time.
ND_RESULT* V1NextResult(INDCompletionQueue* cq, const char* what, int ms = kWaitMs);
// The next result must be `expected` (that very pointer) with `status` and, when bytes >= 0,
// that many bytes.
void V1ExpectResult(INDCompletionQueue* cq, ND_RESULT* expected, HRESULT status, int64_t bytes,
                    const char* what, int ms = kWaitMs);
// No result arrives within `ms` (a bounded look).
void V1ExpectNoResult(INDCompletionQueue* cq, const char* what, int ms = 200);

// ---- connections ---------------------------------------------------------------------------------

// The steps, each returning its final status (bounded).
HRESULT V1Connect(V1Side& side, uint16_t port, const void* data = nullptr, SIZE_T length = 0,
                  INT protocol = kV1Protocol);
HRESULT V1Accept(V1Side& side, const void* data = nullptr, SIZE_T length = 0);
void V1CompleteConnect(V1Side& side);
HRESULT V1Disconnect(INDConnector* connector);
// Waits for the next request on side.listen into a fresh connector (side.connector).
void V1GetConnectionRequest(V1Side& side);

// The usual establishment over the channel, the version 1 way, with the channel protocol of
// Serve/ConnectTo (the peer may be either version). The server listens, sends the port, takes
// the request, makes its endpoint with the requester's limits (capped by its shape), lets
// `prepare` post its receives, and accepts; the client makes its endpoint (unless it has one),
// lets `prepare` post, connects and completes.
using V1Prepare = std::function<void(V1Side&)>;
void V1Serve(Channel& channel, V1Side& server, const V1Prepare& prepare = nullptr);
void V1ConnectTo(Channel& channel, V1Side& client, const V1Prepare& prepare = nullptr);
// The usual end, as ClientTeardown/ServerTeardown.
void V1ClientTeardown(Channel& channel, V1Side& client);
void V1ServerTeardown(Channel& channel, V1Side& server);

// An SGE list of one entry.
inline ND_SGE V1Sge(void* buffer, size_t length, ND_MR_HANDLE handle) {
  return ND_SGE{buffer, length, handle};
}

// A window descriptor over the channel (20 bytes as they are, in hex).
void SendDescriptor(Channel& channel, const ND_MW_DESCRIPTOR& descriptor);
ND_MW_DESCRIPTOR ReceiveDescriptor(Channel& channel);

}  // namespace ndit
