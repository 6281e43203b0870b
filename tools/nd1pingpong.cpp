// nd1pingpong: ndpingpong on NetworkDirect version 1 (options and output as ndpingpong's). The
// client sends a message and waits for the server to send it back; it prints half the round-trip
// time per size. Every request carries an ND_RESULT of its own, which the CQ hands back; small
// messages go inline without asking (version 1 has no INLINE flag: the provider decides).
#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "nd1_objects.h"

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
    "  -s              server: listen on ip:port\n"
    "  -c              client: connect to ip:port\n"
    "  -b              blocking: wait for completions (CQ Notify)\n"
    "  -p              polling: spin on the CQ (default)\n"
    "  -n nSge         SGEs per request (default 1)\n"
    "  -q N            accepted and ignored\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>[:port]     a.b.c.d[:port] or [ipv6][:port], last; default port 54325\n"
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
  bool IsReceive(const ND_RESULT* r) const {
    return r >= receives.data() && r < receives.data() + receives.size();
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

// Pong until the client disconnects (its flush completes a receive with ND_CANCELED). One pong
// is in flight at a time: the next is sent once the previous send has completed.
void Serve(Endpoint& ep) {
  std::deque<SIZE_T> pending;  // sizes of pings not yet answered
  bool sending = false;
  for (;;) {
    ND_RESULT* r = ep.cq.Next("Waiting for a ping");
    if (r->Status == ND_CANCELED) return;
    if (r->Status != ND_SUCCESS) FailResult("Pong", r, __LINE__);
    if (ep.IsReceive(r)) {
      pending.push_back(r->BytesTransferred);
      ep.Repost(r);
    } else if (r == &ep.send) {
      sending = false;
    } else {
      FailResult("Pong", r, __LINE__);
    }
    if (!sending && !pending.empty()) {
      ep.Send(pending.front());
      pending.pop_front();
      sending = true;
    }
  }
}

int RunServer(const Options& o, const std::vector<Round>&) {
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCqEntries, info.MaxInboundRequests));
  NdRef<INDListen> listen = Listen(adapter, address);
  ep.Create(GetConnectionRequest(adapter, listen.get()), info);
  Accept(ep.connector.get(), ep.endpoint.get());
  Serve(ep);
  ep.End();
  return 0;
}

// One round trip: send, then reap both the send's result and the pong.
void Ping(Endpoint& ep, std::size_t size) {
  ep.Send(size);
  bool sent = false, answered = false;
  while (!sent || !answered) {
    ND_RESULT* r = ep.cq.Next("Waiting for a pong");
    if (r->Status != ND_SUCCESS) FailResult("Ping", r, __LINE__);
    if (r == &ep.send) {
      sent = true;
    } else if (ep.IsReceive(r)) {
      if (r->BytesTransferred != size) FailResult("Pong of the wrong size", r, __LINE__);
      ep.Repost(r);
      answered = true;
    } else {
      FailResult("Ping", r, __LINE__);
    }
  }
}

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCqEntries, info.MaxOutboundRequests));
  ep.Create(adapter.CreateConnector(), info);
  Connect(ep.connector.get(), ep.endpoint.get(), server, o.addressLength);
  CompleteConnect(ep.connector.get());

  for (int i = 0; i < kWarmupIterations; ++i) Ping(ep, kWarmupSize);
  SleepMs(1000);
  MeasureRounds(rounds, 2, [&](std::size_t size, std::uint64_t iterations) {
    for (std::uint64_t i = 0; i < iterations; ++i) Ping(ep, size);
  });
  ep.End();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
