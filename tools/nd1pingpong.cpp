// nd1pingpong: ndpingpong on NetworkDirect version 1 (options and output as ndpingpong's). The
// client sends a message and waits for the server to send it back; it prints half the round-trip
// time per size. Every request carries an ND_RESULT of its own, which the CQ hands back; small
// messages go inline without asking (version 1 has no INLINE flag: the provider decides).
#include <algorithm>
#include <memory>
#include <vector>

#include "nd1_objects.h"
#include "pingpong.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 100000;
constexpr std::size_t kBufferSize = kMaxTransfer + 40;

const char kUsage[] =
    "nd1pingpong -s|-c [-b|-p] [-n nSge] [-q N] [-l logFile] <ip>[:port]\n"
    "\n"
    "Send/receive ping-pong over NetworkDirect version 1 (INDEndpoint): the client sends a\n"
    "message and the server sends it back; the client prints half the round trip per size,\n"
    "1 B to 4 MiB. Either side may be ndpingpong (version 2).\n"
    "\n"
    NDTOOL_PINGPONG_OPTIONS
    "\n" NDTOOL_ENV_USAGE;

const ToolSpec kSpec{"nd1pingpong", 54325, kUsage, false};

// What both sides set up: one CQ, the buffer, the connector and its endpoint with every receive
// posted (each over the whole buffer, each with its own ND_RESULT).
struct Endpoint {
  Endpoint(V1Adapter& adapter, const Options& options, SIZE_T depth)
      : options(options),
        buffer(std::make_unique<char[]>(kBufferSize)),
        cq(adapter, depth, options.blocking),
        mr(adapter, buffer.get(), kBufferSize),
        receives(std::min(depth, adapter.info().MaxInboundRequests)),
        sgl(options.nSge),
        receiveSgl(options.nSge) {
    receiveSges = BuildSgl(receiveSgl.data(), options.nSge, buffer.get(), kBufferSize, mr.handle());
  }

  // Makes the endpoint of `made` and posts every receive.
  void Create(NdRef<INDConnector> made, const ND_ADAPTER_INFO& info) {
    connector = std::move(made);
    endpoint = CreateEndpoint(connector.get(), cq.get(), receives.size(),
                              std::min<SIZE_T>(receives.size(), info.MaxOutboundRequests),
                              options.nSge, options.nSge, 0, 0);
    for (ND_RESULT& receive : receives) Repost(&receive);
  }

  void Repost(ND_RESULT* receive) {
    ND_CHECK(endpoint->Receive(receive, receiveSgl.data(), receiveSges), "INDEndpoint::Receive");
  }

  // The rounds' needs (pingpong.h): a result is the ND_RESULT the request was posted with.
  ND_RESULT* Next(const char* what) { return cq.Next(what); }
  Completed KindOf(const ND_RESULT* r) const {
    if (r >= receives.data() && r < receives.data() + receives.size()) return Completed::Receive;
    return r == &send ? Completed::Send : Completed::Other;
  }
  static HRESULT StatusOf(const ND_RESULT* r) { return r->Status; }
  static std::size_t BytesOf(const ND_RESULT* r) { return r->BytesTransferred; }
  [[noreturn]] static void Fail(const char* what, const ND_RESULT* r, int line) {
    FailResult(what, r, line);
  }

  void Send(std::size_t size) {
    ULONG count = BuildSgl(sgl.data(), options.nSge, buffer.get(), size, mr.handle());
    ND_CHECK(endpoint->Send(&send, sgl.data(), count, 0), "INDEndpoint::Send");
  }

  void End() {
    Disconnect(connector.get());
    endpoint.Reset();
    mr.Deregister();
  }

  // Declared so that the endpoint goes first and the buffer last.
  const Options& options;
  std::unique_ptr<char[]> buffer;
  V1CompletionQueue cq;
  V1MemoryRegion mr;
  std::vector<ND_RESULT> receives;
  ND_RESULT send{};
  std::vector<ND_SGE> sgl, receiveSgl;
  ULONG receiveSges = 0;
  NdRef<INDConnector> connector;
  NdRef<INDEndpoint> endpoint;
};

int RunServer(const Options& o, const std::vector<Round>&) {
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCqEntries, info.MaxInboundRequests));
  NdRef<INDListen> listen = AcceptOne(adapter, address, ep);
  ServePongs(ep);
  ep.End();
  return 0;
}

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCqEntries, info.MaxOutboundRequests));
  ConnectTo(adapter, server, o.addressLength, ep);

  for (int i = 0; i < kWarmupIterations; ++i) PingOnce(ep, kWarmupSize);
  SleepMs(1000);
  MeasureRounds(rounds, 2, [&](std::size_t size, std::uint64_t iterations) {
    for (std::uint64_t i = 0; i < iterations; ++i) PingOnce(ep, size);
  });
  ep.End();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
