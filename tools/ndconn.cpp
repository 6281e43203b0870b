// ndconn: connection set-up and tear-down rate. Each cycle the client creates a QP and a
// connector, connects (Connect, CompleteConnect) and disconnects; the server accepts the request
// on a new connector and QP, waits for the client's disconnect and disconnects too. Both release
// the cycle's connector, then its QP, before the next. The client prints the cycles, the
// seconds, the cycles per second and the mean time per cycle; then, as rdma-core's cmtime does,
// each step of a cycle with its mean, least and greatest time: where a setup's time goes. No
// banners (nd-tools.md §7).
//
// The client's Connect carries {cycle, cycles} as private data, so the server ends after the
// last cycle whatever its own -n. Cycle 0 is a warm-up (it may also wait for the server to
// listen) and is not timed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr ULONG kDefaultCycles = 1000;

// The client's Connect private data (host byte order).
struct CycleData {
  ULONG cycle;   // 0 .. cycles - 1; 0 is the warm-up
  ULONG cycles;  // the client's -n plus the warm-up
};

const char kUsage[] =
    "ndconn -s|-c [-n cycles] [-l logFile] <ip>[:port]\n"
    "\n"
    "Connection rate: the client connects and disconnects `cycles` times, with a new connector\n"
    "and QP each time, and prints the cycles per second and the mean time per cycle, then the\n"
    "time of each step of a cycle (mean, least, greatest).\n"
    "\n"
    "  -s              server: listen on ip:port; accepts until the client's last cycle\n"
    "  -c              client: connect to ip:port\n"
    "  -n cycles       client: connect/disconnect cycles (default 1000); the server follows\n"
    "                  the client's count\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>[:port]     a.b.c.d[:port] or [ipv6][:port], last; default port 54328\n"
    "\n"
    "Environment:\n"
    "  NDWV_TOOL_TIMEOUT_MS=ms   bound on every wait (connection, disconnect); default 30000\n";

const ToolSpec kSpec{"ndconn", 54328, kUsage, false, kDefaultCycles};

// The cycle's QP: no requests are ever posted on it.
NdRef<IND2QueuePair> CreateQueuePair(Adapter& adapter, IND2CompletionQueue* cq) {
  return adapter.CreateQueuePair(cq, 1, 1, 1, 1, 0);
}

// The steps of a timed cycle, in order, and their times.
enum Step { kCreateQueuePair, kCreateConnector, kBind, kConnect, kCompleteConnect, kDisconnect, kRelease, kSteps };
const char* const kStepNames[kSteps] = {"CreateQueuePair", "CreateConnector", "Bind",   "Connect",
                                        "CompleteConnect", "Disconnect",      "Release"};

class StepTimes {
 public:
  // Starts a cycle's first step.
  void Begin() { last_ = NowMicros(); }
  // `step` ended now; the next begins.
  void End(Step step) {
    std::uint64_t now = NowMicros();
    Times& t = times_[step];
    double us = double(now - last_);
    t.total += us;
    t.least = t.count == 0 ? us : std::min(t.least, us);
    t.greatest = std::max(t.greatest, us);
    ++t.count;
    last_ = now;
  }
  void Print() const {
    std::printf("%-16s%11s%11s%11s\n", "Step", "usec/cycle", "least", "greatest");
    for (int step = 0; step < kSteps; ++step) {
      const Times& t = times_[step];
      std::printf("%-16s%11.2f%11.2f%11.2f\n", kStepNames[step], t.count ? t.total / double(t.count) : 0.0, t.least,
                  t.greatest);
    }
  }

 private:
  struct Times {
    double total = 0, least = 0, greatest = 0;
    std::uint64_t count = 0;
  };
  Times times_[kSteps];
  std::uint64_t last_ = 0;
};

int RunServer(const Options& o) {
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  NdRef<IND2CompletionQueue> cq = adapter.CreateCompletionQueue(2);
  NdRef<IND2Listener> listener = Listen(adapter, address, o.addressLength);

  ULONG accepted = 0;
  for (;;) {
    NdRef<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
    std::vector<char> data = GetPrivateData(connector.get());
    CycleData cycle{};
    if (data.size() < sizeof cycle) FailMessage("The connection request carries no cycle number", __LINE__);
    std::memcpy(&cycle, data.data(), sizeof cycle);
    NdRef<IND2QueuePair> qp = CreateQueuePair(adapter, cq.get());
    Accept(connector.get(), qp.get(), 0, 0);
    WaitForPeerDisconnect(connector.get());
    Disconnect(connector.get());
    connector.Reset();  // the connection first, then the QP it used
    qp.Reset();
    ++accepted;
    if (cycle.cycle + 1 >= cycle.cycles) break;
  }
  std::printf("Accepted %u connections.\n", accepted);
  return 0;
}

int RunClient(const Options& o) {
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  NdRef<IND2CompletionQueue> cq = adapter.CreateCompletionQueue(2);

  const ULONG cycles = o.cycles + 1;  // + the warm-up
  {
    // The warm-up: Connect retries until the server listens.
    NdRef<IND2QueuePair> qp = CreateQueuePair(adapter, cq.get());
    CycleData data{0, cycles};
    NdRef<IND2Connector> connector = Connect(adapter, qp.get(), server, o.addressLength, 0, 0, &data, sizeof data);
    CompleteConnect(connector.get());
    Disconnect(connector.get());
  }
  RoundTimer timer;
  StepTimes steps;
  timer.Start();
  for (ULONG i = 1; i < cycles; ++i) {
    steps.Begin();
    NdRef<IND2QueuePair> qp = CreateQueuePair(adapter, cq.get());
    steps.End(kCreateQueuePair);
    NdRef<IND2Connector> connector = adapter.CreateConnector();
    steps.End(kCreateConnector);
    ND_CHECK(connector->Bind(adapter.peerSource(), adapter.peerSourceLength()), "IND2Connector::Bind");
    steps.End(kBind);
    CycleData data{i, cycles};
    RequireSuccess(connector.get(), "IND2Connector::Connect", __LINE__, [&](OVERLAPPED* ov) {
      return connector->Connect(qp.get(), server, o.addressLength, 0, 0, &data, sizeof data, ov);
    });
    steps.End(kConnect);
    CompleteConnect(connector.get());
    steps.End(kCompleteConnect);
    Disconnect(connector.get());
    steps.End(kDisconnect);
    connector.Reset();  // the connection first, then the QP it used
    qp.Reset();
    steps.End(kRelease);
  }
  timer.Stop();

  ND2_RESULT stray{};
  if (cq->GetResults(&stray, 1) != 0) FailCompletion("A QP without requests completed one", stray, __LINE__);

  double seconds = timer.elapsedUs / 1e6;
  PrintProcessors();
  std::printf("%9s%9s%11s%11s\n", "Cycles", "Seconds", "Cycles/s", "usec/cycle");
  std::printf("%9u%9.2f%11.2f%11.2f\n", o.cycles, seconds, double(o.cycles) / seconds,
              timer.elapsedUs / double(o.cycles));
  steps.Print();
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  Options options = ParseOptions(argc, argv, kSpec);
  int rc = options.server ? RunServer(options) : RunClient(options);
  PrintCounters();
  return rc;
}
