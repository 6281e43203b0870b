// nd1rping: ndrping on NetworkDirect version 1 (options and output as ndrping's): one-way RDMA
// Write (default, -w) or RDMA Read (-r) rate. The server binds a memory window over its buffer
// and sends the client the window's descriptor; the client keeps up to `credits` RDMA operations
// in flight through it and prints the time per operation and the bandwidth per size. Give both
// sides the same operation: the server derives the window's rights from it.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "nd1_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 500000;
constexpr std::size_t kBufferSize = kMaxTransfer + 40;

const char kUsage[] =
    "nd1rping -s|-c [-b|-p] [-w|--write] [-r|--read] [-n nSge] [-q N] [-l logFile] <ip>[:port]\n"
    "\n"
    "One-way RDMA rate over NetworkDirect version 1 (INDEndpoint, a window descriptor): the\n"
    "client keeps RDMA Writes (default) or Reads in flight against the server's memory window\n"
    "and prints time per operation and bytes/s per size, 1 B to 4 MiB.\n"
    "\n"
    NDTOOL_RPING_OPTIONS
    "\n" NDTOOL_ENV_USAGE
    "  NDWV_TOOL_RUN_TIMEOUT_MS=ms  bound on the server's wait for the end of the run;\n"
    "                            default 900000\n";

const ToolSpec kSpec{"nd1rping", 54326, kUsage, true};

// Waits for `expected` to complete successfully; anything else fails the tool.
void Expect(V1CompletionQueue& cq, ND_RESULT* expected, const char* what,
            std::uint32_t timeoutMs = WaitTimeoutMs()) {
  ND_RESULT* r = cq.Next(what, timeoutMs);
  if (r != expected || r->Status != ND_SUCCESS) FailResult(what, r, __LINE__);
}

int RunServer(const Options& o, const std::vector<Round>&) {
  const bool read = o.op == RdmaOp::Read;
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();

  auto buffer = std::make_unique<char[]>(kBufferSize);
  V1CompletionQueue cq(adapter, info.MaxCqEntries, o.blocking);
  V1MemoryRegion mr(adapter, buffer.get(), kBufferSize);
  NdRef<INDListen> listen = Listen(adapter, address);
  NdRef<INDConnector> connector = GetConnectionRequest(adapter, listen.get());
  // As many of the client's Reads as it asks for, within the adapter's limit.
  SIZE_T inbound = 0, outbound = 0;
  GetReadLimits(connector.get(), &inbound, &outbound);
  SIZE_T depth = std::min(info.MaxCqEntries, info.MaxInboundRequests);
  NdRef<INDEndpoint> endpoint =
      CreateEndpoint(connector.get(), cq.get(), depth, std::min(depth, info.MaxOutboundRequests), 1,
                     1, std::min(inbound, info.MaxInboundReadLimit), 0);
  ND_RESULT terminate{}, bind{}, send{}, invalidated{};
  ND_SGE sge{buffer.get(), kBufferSize, mr.handle()};
  ND_CHECK(endpoint->Receive(&terminate, &sge, 1), "INDEndpoint::Receive");
  Accept(connector.get(), endpoint.get());

  NdRef<INDMemoryWindow> mw;
  ND_CHECK(adapter.get()->CreateMemoryWindow(&invalidated,
                                             reinterpret_cast<INDMemoryWindow**>(mw.Out())),
           "INDAdapter::CreateMemoryWindow");
  ND_MW_DESCRIPTOR descriptor;
  ND_CHECK(endpoint->Bind(&bind, mr.handle(), mw.get(), buffer.get(), kBufferSize,
                          read ? ND_OP_FLAG_ALLOW_READ : ND_OP_FLAG_ALLOW_WRITE, &descriptor),
           "INDEndpoint::Bind");
  Expect(cq, &bind, "Memory window bind");
  ND_SGE record{&descriptor, sizeof descriptor, nullptr};  // inline: the bytes go at once
  ND_CHECK(endpoint->Send(&send, &record, 1, 0), "INDEndpoint::Send");
  Expect(cq, &send, "Sending the descriptor");

  // The client's RDMA traffic is invisible here; only its zero-byte terminate ends the wait.
  Expect(cq, &terminate, "Waiting for the client's terminate", RunTimeoutMs());

  Disconnect(connector.get());
  mw.Reset();  // a bound window would make DeregisterMemory fail with ND_DEVICE_BUSY
  endpoint.Reset();
  mr.Deregister();
  return 0;
}

struct Client {
  // Keeps up to `credits` operations of `size` bytes in flight until `iterations` completed.
  void Run(std::size_t size, std::uint64_t iterations) {
    ULONG count = BuildSgl(sgl.data(), ULONG(sgl.size()), buffer, size, mr->handle());
    std::uint64_t issued = 0, completed = 0;
    std::size_t next = 0;  // the ND_RESULT of the next operation: each in flight has its own
    ULONG inFlight = 0;
    while (completed < iterations) {
      for (; inFlight < credits && issued < iterations; ++inFlight, ++issued) {
        ND_RESULT* result = &results[next];
        next = (next + 1) % results.size();
        HRESULT hr = read ? endpoint->Read(result, sgl.data(), count, &peer, 0, 0)
                          : endpoint->Write(result, sgl.data(), count, &peer, 0, 0);
        ND_CHECK(hr, read ? "INDEndpoint::Read" : "INDEndpoint::Write");
      }
      ND_RESULT* r = cq->Next("Waiting for an RDMA result");
      if (r->Status == ND_REMOTE_ERROR)
        std::printf("  (the server's window refuses this operation: give both sides the same -w/-r)\n");
      if (r->Status != ND_SUCCESS || r < results.data() || r >= results.data() + results.size())
        FailResult("RDMA operation", r, __LINE__);
      --inFlight;
      ++completed;
    }
  }

  bool read;
  ULONG credits;
  V1CompletionQueue* cq;
  V1MemoryRegion* mr;
  INDEndpoint* endpoint;
  char* buffer;
  std::vector<ND_SGE> sgl;
  std::vector<ND_RESULT> results;  // one per credit
  ND_MW_DESCRIPTOR peer;
};

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  const bool read = o.op == RdmaOp::Read;
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();

  SIZE_T depth = std::min(info.MaxCqEntries, info.MaxOutboundRequests);
  SIZE_T nSge = std::min<SIZE_T>(o.nSge, info.MaxOutboundSge);
  if (read) depth = std::min(depth, info.MaxOutboundReadLimit);
  auto buffer = std::make_unique<char[]>(kBufferSize);
  V1CompletionQueue cq(adapter, depth, o.blocking);
  V1MemoryRegion mr(adapter, buffer.get(), kBufferSize);
  NdRef<INDConnector> connector = adapter.CreateConnector();
  NdRef<INDEndpoint> endpoint =
      CreateEndpoint(connector.get(), cq.get(), std::min(depth, info.MaxInboundRequests), depth, 1,
                     nSge, 0, read ? depth : 0);
  ND_RESULT record{}, terminate{};
  ND_SGE sge{buffer.get(), kBufferSize, mr.handle()};
  ND_CHECK(endpoint->Receive(&record, &sge, 1), "INDEndpoint::Receive");  // the descriptor
  Connect(connector.get(), endpoint.get(), server, o.addressLength);
  CompleteConnect(connector.get());

  ND_RESULT* r = cq.Next("Waiting for the server's descriptor");
  if (r != &record || r->Status != ND_SUCCESS || r->BytesTransferred < sizeof(ND_MW_DESCRIPTOR))
    FailResult("Receiving the descriptor", r, __LINE__);
  Client client{read, ULONG(depth), &cq, &mr, endpoint.get(), buffer.get(),
                std::vector<ND_SGE>(nSge), std::vector<ND_RESULT>(depth), ND_MW_DESCRIPTOR{}};
  std::memcpy(&client.peer, buffer.get(), sizeof client.peer);
  if (read) {  // the Reads the server grants: the negotiated limit
    SIZE_T inbound = 0, outbound = 0;
    GetReadLimits(connector.get(), &inbound, &outbound);
    client.credits = ULONG(std::min<SIZE_T>(client.credits, outbound));
  }
  if (client.credits == 0) FailPlain("The server allows no RDMA Reads: give both sides -r.");

  client.Run(kWarmupSize, kWarmupIterations);
  SleepMs(1000);
  MeasureRounds(rounds, 1, [&](std::size_t size, std::uint64_t iterations) {
    client.Run(size, iterations);
  });

  ND_CHECK(endpoint->Send(&terminate, nullptr, 0, 0), "INDEndpoint::Send");  // terminate
  Expect(cq, &terminate, "Sending the terminate");
  Disconnect(connector.get());
  endpoint.Reset();
  mr.Deregister();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
