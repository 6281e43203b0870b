// ndrping: one-way RDMA Write (default, -w) or RDMA Read (-r) rate (nd-tools.md §8). The server
// exposes a buffer through a memory window and waits; the client keeps up to `credits` RDMA
// operations in flight against it and prints the time per operation and the bandwidth per size.
// The original's -w selected Read; here -w selects Write. Give both sides the same operation:
// the server derives the window's rights from it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 500000;
constexpr std::size_t kBufferSize = kMaxTransfer + 40;
void* const kReceiveContext = reinterpret_cast<void*>(std::uintptr_t(0x1000));
void* const kSendContext = reinterpret_cast<void*>(std::uintptr_t(0x2000));
void* const kReadContext = reinterpret_cast<void*>(std::uintptr_t(0x3000));
void* const kWriteContext = reinterpret_cast<void*>(std::uintptr_t(0x4000));
void* const kBindContext = reinterpret_cast<void*>(std::uintptr_t(0x5000));

// The server's window, sent to the client (host byte order).
struct Record {
  UINT32 token;
  ULONG inboundReadLimit;
  UINT64 address;
};
static_assert(sizeof(Record) == 16);

const char kUsage[] =
    "ndrping -s|-c [-b|-p] [-w|--write] [-r|--read] [-n nSge] [-q N] [-l logFile] <ip>[:port]\n"
    "\n"
    "One-way RDMA rate: the client keeps RDMA Writes (default) or Reads in flight against the\n"
    "server's memory window and prints time per operation and bytes/s per size, 1 B to 4 MiB.\n"
    "\n"
    NDTOOL_RPING_OPTIONS
    "\n" NDTOOL_ENV_USAGE
    "  NDWV_TOOL_RUN_TIMEOUT_MS=ms  bound on the server's wait for the end of the run;\n"
    "                            default 900000\n";

const ToolSpec kSpec{"ndrping", 54326, kUsage, true};

// Waits for one completion of `type` with `context`, successful; anything else fails the tool.
void Expect(CompletionQueue& cq, ND2_REQUEST_TYPE type, void* context, const char* what,
            std::uint32_t timeoutMs = WaitTimeoutMs()) {
  ND2_RESULT r = cq.Next(what, timeoutMs);
  if (r.Status != ND_SUCCESS || r.RequestType != type || r.RequestContext != context)
    FailCompletion(what, r, __LINE__);
}

int RunServer(const Options& o, const std::vector<Round>&) {
  const bool read = o.op == RdmaOp::Read;
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  adapter.RequireInOrderDma();
  const ND2_ADAPTER_INFO& info = adapter.info();

  auto buffer = std::make_unique<char[]>(kBufferSize);
  CompletionQueue cq(adapter, info.MaxCompletionQueueDepth, o.blocking);
  ULONG depth = std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth);
  NdRef<IND2QueuePair> qp =
      adapter.CreateQueuePair(cq.get(), depth, std::min(depth, info.MaxInitiatorQueueDepth), 1, 1, 0);
  MemoryRegion mr(adapter);
  mr.Register(buffer.get(), kBufferSize,
              ND_MR_FLAG_ALLOW_LOCAL_WRITE | (read ? ND_MR_FLAG_ALLOW_REMOTE_READ : ND_MR_FLAG_ALLOW_REMOTE_WRITE));
  ND2_SGE sge{};
  sge.Buffer = buffer.get();
  sge.BufferLength = ULONG(kBufferSize);
  sge.MemoryRegionToken = mr.localToken();
  ND_CHECK(qp->Receive(kReceiveContext, &sge, 1), "IND2QueuePair::Receive");  // the terminate

  NdRef<IND2Listener> listener = Listen(adapter, address, o.addressLength);
  NdRef<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
  Accept(connector.get(), qp.get(), info.MaxInboundReadLimit, 0);

  NdRef<IND2MemoryWindow> mw = adapter.CreateMemoryWindow();
  ND_CHECK(qp->Bind(kBindContext, mr.get(), mw.get(), buffer.get(), kBufferSize,
                    read ? ND_OP_FLAG_ALLOW_READ : ND_OP_FLAG_ALLOW_WRITE),
           "IND2QueuePair::Bind");
  Expect(cq, Nd2RequestTypeBind, kBindContext, "Memory window bind");

  Record record{mw->GetRemoteToken(), info.MaxInboundReadLimit, reinterpret_cast<UINT64>(buffer.get())};
  std::memcpy(buffer.get(), &record, sizeof record);
  sge.BufferLength = sizeof record;
  ND_CHECK(qp->Send(kSendContext, &sge, 1, 0), "IND2QueuePair::Send");
  Expect(cq, Nd2RequestTypeSend, kSendContext, "Sending the record");

  // The client's RDMA traffic is invisible here; only its zero-byte terminate ends the wait.
  Expect(cq, Nd2RequestTypeReceive, kReceiveContext, "Waiting for the client's terminate", RunTimeoutMs());

  Disconnect(connector.get());
  mw.Reset();  // a bound window would make Deregister fail with ND_DEVICE_BUSY
  mr.Deregister();
  return 0;
}

struct Client {
  // Keeps up to `credits` operations of `size` bytes in flight until `iterations` completed.
  void Run(std::size_t size, std::uint64_t iterations) {
    ULONG count = BuildSgl(sgl.data(), ULONG(sgl.size()), buffer, size, mr->localToken());
    ULONG flags = !read && size < threshold ? ND_OP_FLAG_INLINE : 0;
    void* context = read ? kReadContext : kWriteContext;
    std::uint64_t issued = 0, completed = 0;
    ULONG inFlight = 0;
    while (completed < iterations) {
      for (; inFlight < credits && issued < iterations; ++inFlight, ++issued) {
        HRESULT hr = read ? qp->Read(context, sgl.data(), count, peer.address, peer.token, flags)
                          : qp->Write(context, sgl.data(), count, peer.address, peer.token, flags);
        ND_CHECK(hr, read ? "IND2QueuePair::Read" : "IND2QueuePair::Write");
      }
      ND2_RESULT r = cq->Next("Waiting for an RDMA completion");
      if (r.Status == ND_ACCESS_VIOLATION)
        std::printf("  (the server's window refuses this operation: give both sides the same -w/-r)\n");
      if (r.Status != ND_SUCCESS || r.RequestContext != context) FailCompletion("RDMA operation", r, __LINE__);
      --inFlight;
      ++completed;
    }
  }

  bool read;
  ULONG threshold, credits;
  CompletionQueue* cq;
  MemoryRegion* mr;
  IND2QueuePair* qp;
  char* buffer;
  std::vector<ND2_SGE> sgl;
  Record peer;
};

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  const bool read = o.op == RdmaOp::Read;
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  adapter.RequireInOrderDma();
  const ND2_ADAPTER_INFO& info = adapter.info();

  ULONG depth = std::min(info.MaxCompletionQueueDepth, info.MaxInitiatorQueueDepth);
  ULONG nSge = std::min(o.nSge, info.MaxInitiatorSge);
  if (read) {
    depth = std::min(depth, info.MaxOutboundReadLimit);
    nSge = std::min(nSge, info.MaxReadSge);
  }
  auto buffer = std::make_unique<char[]>(kBufferSize);
  CompletionQueue cq(adapter, depth, o.blocking);
  MemoryRegion mr(adapter);
  mr.Register(buffer.get(), kBufferSize, ND_MR_FLAG_ALLOW_LOCAL_WRITE | (read ? ND_MR_FLAG_RDMA_READ_SINK : 0));
  NdRef<IND2QueuePair> qp = adapter.CreateQueuePair(cq.get(), std::min(depth, info.MaxReceiveQueueDepth),
                                                    depth, 1, nSge, info.InlineRequestThreshold);
  ND2_SGE sge{};
  sge.Buffer = buffer.get();
  sge.BufferLength = ULONG(kBufferSize);
  sge.MemoryRegionToken = mr.localToken();
  ND_CHECK(qp->Receive(kReceiveContext, &sge, 1), "IND2QueuePair::Receive");  // the record

  NdRef<IND2Connector> connector = Connect(adapter, qp.get(), server, o.addressLength, 0, read ? depth : 0);
  CompleteConnect(connector.get());

  ND2_RESULT r = cq.Next("Waiting for the server's record");
  if (r.Status != ND_SUCCESS || r.RequestType != Nd2RequestTypeReceive || r.BytesTransferred < sizeof(Record))
    FailCompletion("Receiving the record", r, __LINE__);
  Client client{read, info.InlineRequestThreshold, depth, &cq, &mr, qp.get(), buffer.get(),
                std::vector<ND2_SGE>(nSge), Record{}};
  std::memcpy(&client.peer, buffer.get(), sizeof client.peer);
  if (read) client.credits = std::min(depth, client.peer.inboundReadLimit);
  if (client.credits == 0) FailPlain("The server allows no RDMA Reads: give both sides -r.");

  client.Run(kWarmupSize, kWarmupIterations);
  SleepMs(1000);

  MeasureRounds(rounds, 1, [&](std::size_t size, std::uint64_t iterations) {
    client.Run(size, iterations);
  });

  ND_CHECK(qp->Send(kSendContext, nullptr, 0, 0), "IND2QueuePair::Send");  // terminate
  Expect(cq, Nd2RequestTypeSend, kSendContext, "Sending the terminate");
  Disconnect(connector.get());
  mr.Deregister();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
