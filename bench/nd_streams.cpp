// nd_streams: many streams at once through ndwv, as an MPI all-to-all drives them: a client and a
// server process on 127.0.0.1, N connections (one QP each, all QPs of a process on one shared
// CQ), and every connection streaming one-way RDMA Writes of SIZE bytes, K in flight each, for
// SECONDS. Prints the aggregate rate of the completed Writes (1 GB = 1e9 bytes). On RoCE the
// connections share the process's UDP sockets, so this is where its congestion control (windows,
// CNPs, go-back-N) shows; tcp_streams is the same over plain TCP, and bench/streams.sh runs both.
//
//   nd_streams [-n N] [-s SIZE] [-k K] [-t SECONDS] [--port P]    (defaults 128, 65536, 4, 5)
//
// The client starts the server itself (this program again, with --serve; scale_common.h's
// ServerProcess). The server registers one target buffer of N * SIZE bytes; after it accepts a
// connection it Sends that connection's slice {address, token} into the Receive the client
// posted before its Connect. The client busy-polls its CQ (GetResults in a loop) and reposts a
// Write on each completion; past SECONDS it posts no more and drains what is in flight. Then it
// disconnects every connector; the server, waiting on every connection's NotifyDisconnect,
// disconnects its side too and exits. Data is not checked: this is a rate.
//
// Connections are made one at a time (setup is not measured). Every wait has a bound: the ND
// helpers' (NDWV_TOOL_TIMEOUT_MS, 30 s), kBoundS for the loops here, and a watchdog (SIGALRM)
// behind them for a call that never returns. A failed ND call prints its step and status and
// exits nonzero; so does a run with any Write completed in error.
#include <ndwv/ndwv.h>

#include <memory>
#include <vector>

#include "nd_objects.h"
#include "scale_common.h"
#include "streams_common.h"

namespace {

using streams::Options;
using ndtool::NdRef;
using scale::NowUs;

constexpr unsigned kBoundS = 60;                        // each wait of this program
constexpr std::uint64_t kBoundUs = kBoundS * 1000000ull;

const char kUsage[] =
    "usage: nd_streams [-n N] [-s SIZE] [-k K] [-t SECONDS] [--port P]\n"
    "  -n N        connections (default 128)\n"
    "  -s SIZE     bytes of each RDMA Write (default 65536)\n"
    "  -k K        Writes in flight on every connection (default 4)\n"
    "  -t SECONDS  how long the Writes are posted (default 5)\n"
    "  --port P    the server's port on 127.0.0.1 (default 0: a free one)\n"
    "Environment: NDWV_TRANSPORTS=iwarp|roce chooses the transport. The client starts the server.\n";

// One connection's slice of the server's target buffer, as the server Sends it (host byte
// order: both processes are on this machine).
struct Target {
  UINT64 address;
  UINT32 token;
  UINT32 length;
};
static_assert(sizeof(Target) == 16);

struct Conn {
  NdRef<IND2QueuePair> qp;
  NdRef<IND2Connector> connector;
  unsigned inFlight = 0;
  bool failed = false;  // a Write completed in error: the QP is done
};

std::uint32_t MsLeft(std::uint64_t untilUs) { return std::uint32_t(std::max(scale::MsUntil(untilUs), 1)); }

// ---- server ------------------------------------------------------------------------------------

int Serve(const Options& o) {
  scale::LineChannel control(o.serveFd);
  ndtool::NdLibrary nd;
  ndtool::Adapter adapter;
  sockaddr_in local = scale::Loopback(o.port);
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&local);
  adapter.Open(address, sizeof local);
  const unsigned n = o.connections;
  ndtool::CompletionQueue cq(adapter, n + 16, false);  // the Sends of the targets

  std::vector<char> target(std::size_t(n) * o.size);
  std::vector<Target> records(n);
  ndtool::MemoryRegion targetMr(adapter), recordMr(adapter);
  targetMr.Register(target.data(), target.size(), ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_WRITE);
  recordMr.Register(records.data(), records.size() * sizeof(Target), ND_MR_FLAG_ALLOW_LOCAL_WRITE);

  NdRef<IND2Listener> listener = ndtool::Listen(adapter, address, sizeof local);
  sockaddr_in bound{};
  ULONG length = sizeof bound;
  ND_CHECK(listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&bound), &length), "IND2Listener::GetLocalAddress");
  control.Send("ready port=" + std::to_string(ntohs(bound.sin_port)));

  // Setup: each connection accepted, told its target, and watched for its end.
  scale::Watch("server: accepting", kBoundS + n);
  std::vector<Conn> conns(n);
  std::vector<ndtool::Overlapped> notify(n);  // each connection's NotifyDisconnect
  std::vector<HRESULT> notifyIssued(n);
  for (unsigned i = 0; i < n; ++i) {
    Conn& c = conns[i];
    c.connector = ndtool::GetConnectionRequest(adapter, listener.get());
    c.qp = adapter.CreateQueuePair(cq.get(), 1, 1, 1, 1, 0);
    ndtool::Accept(c.connector.get(), c.qp.get(), 0, 0);
    records[i] = {reinterpret_cast<UINT64>(target.data() + std::size_t(i) * o.size), targetMr.get()->GetRemoteToken(),
                  o.size};
    ND2_SGE sge{&records[i], sizeof(Target), recordMr.localToken()};
    ND_CHECK(c.qp->Send(&c, &sge, 1, 0), "IND2QueuePair::Send (the target)");
    notifyIssued[i] = c.connector->NotifyDisconnect(notify[i].Prepare());
    if (FAILED(notifyIssued[i])) ndtool::Fail("IND2Connector::NotifyDisconnect", notifyIssued[i], __LINE__);
  }
  for (unsigned i = 0; i < n; ++i) {
    ND2_RESULT r = cq.Next("the Sends of the targets", kBoundS * 1000);
    if (r.Status != ND_SUCCESS || r.RequestType != Nd2RequestTypeSend) ndtool::FailCompletion("Send (the target)", r, __LINE__);
  }

  // The client streams, then disconnects every connection: the end of each is awaited in turn,
  // all within the stream's time and the bounds of its drain and teardown.
  scale::Watch("server: awaiting the disconnects", o.seconds + 3 * kBoundS + 30);
  const std::uint64_t until = NowUs() + (o.seconds + 3 * kBoundS) * 1000000ull;
  for (unsigned i = 0; i < n; ++i) {
    Conn& c = conns[i];
    HRESULT hr = notify[i].Complete(c.connector.get(), notifyIssued[i], "awaiting the client's Disconnect", MsLeft(until));
    if (FAILED(hr) && hr != STATUS_CONNECTION_DISCONNECTED) ndtool::Fail("IND2Connector::NotifyDisconnect", hr, __LINE__);
    ndtool::Disconnect(c.connector.get());
    c.connector.Reset();
    c.qp.Reset();
  }
  alarm(0);
  listener.Reset();
  targetMr.Deregister();
  recordMr.Deregister();
  return scale::kExitOk;  // returned, not _exit: NDWV_COUNTERS=exit writes its report at exit
}

// ---- client ------------------------------------------------------------------------------------

int Run(const Options& o, int argc, char** argv) {
  scale::ServerProcess server;
  server.Start(argc, argv);
  const unsigned port = unsigned(scale::Get(scale::ParseFigures(server.Expect("ready", "start listening", 30000)), "port"));
  sockaddr_in peer = scale::Loopback(port);
  const sockaddr* peerAddress = reinterpret_cast<const sockaddr*>(&peer);
  const unsigned n = o.connections;
  std::uint64_t bytes = 0, completed = 0, errors = 0;
  double seconds = 0;
  std::string transport;
  {
    ndtool::NdLibrary nd;
    ndtool::Adapter adapter;
    adapter.OpenForPeer(peerAddress, sizeof peer);
    const ND2_ADAPTER_INFO& info = adapter.info();
    const char* name = ndwv_adapter_transport(info.AdapterId);
    transport = name ? name : "unknown transport";
    const std::uint64_t depth = std::uint64_t(n) * (o.inFlight + 1) + 16;  // every Write and every target's Receive
    if (depth > info.MaxCompletionQueueDepth)
      scale::Die("one CQ for " + std::to_string(n) + " QPs with " + std::to_string(o.inFlight) +
                 " Writes each needs depth " + std::to_string(depth) + ", the adapter's maximum is " +
                 std::to_string(info.MaxCompletionQueueDepth) + ": lower -n or -k");
    if (o.inFlight > info.MaxInitiatorQueueDepth || o.size > info.MaxTransferLength)
      scale::Die("-k or -s beyond the adapter's limits (initiator depth " + std::to_string(info.MaxInitiatorQueueDepth) +
                 ", transfer length " + std::to_string(info.MaxTransferLength) + ")");
    ndtool::CompletionQueue cq(adapter, ULONG(depth), false);

    // One source buffer for every Write (its contents do not matter), then the targets' slots.
    std::vector<char> buffer(o.size + std::size_t(n) * sizeof(Target));
    Target* targets = reinterpret_cast<Target*>(buffer.data() + o.size);
    ndtool::MemoryRegion mr(adapter);
    mr.Register(buffer.data(), buffer.size(), ND_MR_FLAG_ALLOW_LOCAL_WRITE);

    // Setup, one connection at a time: the Receive for its target is posted before the Connect.
    scale::Watch("client: connecting", kBoundS + n);
    std::vector<Conn> conns(n);
    for (unsigned i = 0; i < n; ++i) {
      Conn& c = conns[i];
      c.qp = adapter.CreateQueuePair(cq.get(), 1, o.inFlight, 1, 1, 0);
      ND2_SGE sge{&targets[i], sizeof(Target), mr.localToken()};
      ND_CHECK(c.qp->Receive(&c, &sge, 1), "IND2QueuePair::Receive (the target)");
      c.connector = ndtool::Connect(adapter, c.qp.get(), peerAddress, sizeof peer, 0, 0);
      ndtool::CompleteConnect(c.connector.get());
    }
    for (unsigned i = 0; i < n; ++i) {
      ND2_RESULT r = cq.Next("the targets", kBoundS * 1000);
      if (r.Status != ND_SUCCESS || r.RequestType != Nd2RequestTypeReceive || r.BytesTransferred != sizeof(Target))
        ndtool::FailCompletion("Receive (the target)", r, __LINE__);
    }

    // The streams: K Writes in flight on every connection, one reposted per completion.
    auto post = [&](Conn& c) {
      const Target& t = targets[&c - conns.data()];
      ND2_SGE sge{buffer.data(), o.size, mr.localToken()};
      ND_CHECK(c.qp->Write(&c, &sge, 1, t.address, t.token, 0), "IND2QueuePair::Write");
      c.inFlight++;
    };
    scale::Watch("client: streaming", o.seconds + kBoundS + 30);
    const std::uint64_t start = NowUs(), stopAt = start + o.seconds * 1000000ull;
    std::uint64_t outstanding = 0, lastCompletion = start;
    for (Conn& c : conns)
      for (unsigned k = 0; k < o.inFlight; ++k, ++outstanding) post(c);
    ND2_RESULT results[64];
    while (outstanding > 0) {
      const ULONG got = cq.get()->GetResults(results, 64);
      const std::uint64_t now = NowUs();
      if (got == 0) {
        if (now - lastCompletion > kBoundUs)
          scale::Die("no Write completed for " + std::to_string(kBoundS) + " s (" + std::to_string(outstanding) +
                         " in flight)", scale::kExitFailed);
        continue;
      }
      lastCompletion = now;
      for (ULONG i = 0; i < got; ++i) {
        Conn& c = *static_cast<Conn*>(results[i].RequestContext);
        outstanding--;
        c.inFlight--;
        if (results[i].Status != ND_SUCCESS || results[i].RequestType != Nd2RequestTypeWrite) {
          if (errors++ < 5)
            std::fprintf(stderr, "nd_streams: connection %zu: Write completed with status 0x%08X\n",
                         std::size_t(&c - conns.data()), unsigned(results[i].Status));
          c.failed = true;
          continue;
        }
        bytes += o.size;
        completed++;
        if (now < stopAt && !c.failed) {
          post(c);
          outstanding++;
        }
      }
    }
    seconds = double(NowUs() - start) / 1e6;

    std::printf("nd_streams: %s\n", transport.c_str());
    std::printf("connections: %u\nsize: %u\nin flight: %u\nseconds: %.3f\nwrites completed: %llu\n", n, o.size,
                o.inFlight, seconds, (unsigned long long)completed);
    std::printf("bytes completed: %llu\naggregate GB/s: %.3f\ncompletions with an error: %llu\n",
                (unsigned long long)bytes, double(bytes) / seconds / 1e9, (unsigned long long)errors);
    std::fflush(stdout);

    // Teardown: every connector disconnected (each wait bounded by the helpers), then released.
    scale::Watch("client: disconnecting", kBoundS + n);
    for (Conn& c : conns) {
      ndtool::Disconnect(c.connector.get());
      c.connector.Reset();
      c.qp.Reset();
    }
    mr.Deregister();
  }
  scale::Watch("client: awaiting the server's exit", kBoundS + 10);
  const int serverExit = server.Wait(kBoundS * 1000);
  alarm(0);
  if (serverExit != 0) std::printf("the server exited with status %d\n", serverExit);
  const bool ok = errors == 0 && serverExit == 0;
  std::printf("result: %s\n", ok ? "ok" : "FAILED");
  return ok ? scale::kExitOk : scale::kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = streams::Parse(argc, argv, kUsage, true);
  scale::g_program = o.serveFd >= 0 ? "nd_streams server" : "nd_streams";
  // iWARP takes a socket per connection in each process.
  scale::EnsureDescriptors(scale::g_program, o.connections + 64, true);
  return o.serveFd >= 0 ? Serve(o) : Run(o, argc, argv);
}
