// The NetworkDirect version 1 objects of the v1 tools (nd1pingpong, nd1rping, nd1rpingpong), in
// the shape of nd_objects.h and written, like it, only against the public headers: the adapter
// opened by NdOpenV1Adapter, a CQ that hands back the ND_RESULTs given with the requests,
// registrations named by handle, endpoints made by connectors, and the connection steps. Every
// wait has a bound (WaitTimeoutMs). The tools connect for TCP's protocol number, so that they
// meet the v2 tools too (the wire is the same).
#pragma once

#include <ndwv/ndspi.h>
#include <ndwv/ndstatus.h>
#include <ndwv/ndsupport.h>

#include <cstddef>
#include <cstdint>

#include "nd_objects.h"
#include "tool.h"

namespace ndtool {

// One adapter opened on a local address the v1 way, and its limits.
class V1Adapter {
 public:
  void Open(const sockaddr* localAddress, ULONG length);
  // Opens the adapter the OS would use to reach `server` (NdResolveAddress).
  void OpenForPeer(const sockaddr* server, ULONG length);

  INDAdapter* get() const { return adapter_.get(); }
  const ND_ADAPTER_INFO& info() const { return info_; }

  NdRef<INDCompletionQueue> CreateCompletionQueue(SIZE_T depth);
  NdRef<INDConnector> CreateConnector();

 private:
  NdRef<INDAdapter> adapter_;
  ND_ADAPTER_INFO info_{};
};

// A CQ polled (-p) or armed and waited on (-b), as CompletionQueue (nd_objects.h).
class V1CompletionQueue {
 public:
  V1CompletionQueue(V1Adapter& adapter, SIZE_T depth, bool blocking);
  INDCompletionQueue* get() const { return cq_.get(); }
  bool Poll(ND_RESULT** result) { return cq_->GetResults(result, 1) == 1; }
  // The next result, whatever its status; the tool fails if none comes within timeoutMs.
  ND_RESULT* Next(const char* what, std::uint32_t timeoutMs = WaitTimeoutMs());

 private:
  NdRef<INDCompletionQueue> cq_;
  Overlapped notify_;
  bool blocking_;
};

// One registration, named by its handle.
class V1MemoryRegion {
 public:
  V1MemoryRegion(V1Adapter& adapter, const void* buffer, std::size_t length);
  void Deregister();
  ND_MR_HANDLE handle() const { return handle_; }

 private:
  INDAdapter* adapter_;
  ND_MR_HANDLE handle_ = nullptr;
};

// SplitSgl's pieces as ND_SGEs of the registration `handle`.
ULONG BuildSgl(ND_SGE* sgl, ULONG maxSge, void* buffer, std::size_t length, ND_MR_HANDLE handle);

// The endpoint of `connector`, with both queues on `cq`.
NdRef<INDEndpoint> CreateEndpoint(INDConnector* connector, INDCompletionQueue* cq,
                                  SIZE_T inboundDepth, SIZE_T outboundDepth, SIZE_T inboundSge,
                                  SIZE_T outboundSge, SIZE_T inboundReadLimit,
                                  SIZE_T outboundReadLimit);

// Client: connects `endpoint` (made by `connector`) to `server` from the adapter's address and an
// ephemeral port. A refused or timed-out attempt is issued again, on the same connector and
// endpoint as version 1 allows, until the wait bound: a client may start just before its server.
void Connect(INDConnector* connector, INDEndpoint* endpoint, const sockaddr* server,
             ULONG serverLength);
void CompleteConnect(INDConnector* connector);

// Server: listens on the adapter's address at the port of `address`.
NdRef<INDListen> Listen(V1Adapter& adapter, const sockaddr* address);
NdRef<INDConnector> GetConnectionRequest(V1Adapter& adapter, INDListen* listen);
// The requester's read limits, from this side's point of view.
void GetReadLimits(INDConnector* connector, SIZE_T* inbound, SIZE_T* outbound);
void Accept(INDConnector* connector, INDEndpoint* endpoint);

// The connection of a tool's endpoint object `ep`, whose Create(NdRef<INDConnector>, const
// ND_ADAPTER_INFO&) makes its endpoint on that connector and sets ep.connector and ep.endpoint.
// Server: the first connection request to `address`, accepted; returns the listen.
template <class Ep>
NdRef<INDListen> AcceptOne(V1Adapter& adapter, const sockaddr* address, Ep& ep) {
  NdRef<INDListen> listen = Listen(adapter, address);
  ep.Create(GetConnectionRequest(adapter, listen.get()), adapter.info());
  Accept(ep.connector.get(), ep.endpoint.get());
  return listen;
}
// Client: connected to `server`, on a connector of its own.
template <class Ep>
void ConnectTo(V1Adapter& adapter, const sockaddr* server, ULONG serverLength, Ep& ep) {
  ep.Create(adapter.CreateConnector(), adapter.info());
  Connect(ep.connector.get(), ep.endpoint.get(), server, serverLength);
  CompleteConnect(ep.connector.get());
}

// Tears the connection down and waits for it (flushes the endpoint).
void Disconnect(INDConnector* connector);

// "<what>: unexpected result (status s)" and exit.
[[noreturn]] void FailResult(const char* what, const ND_RESULT* result, int line);

}  // namespace ndtool
