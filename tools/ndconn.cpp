// ndconn: connection set-up and tear-down rate. Each cycle the client creates a QP and a
// connector, connects (Connect, CompleteConnect) and disconnects; the server accepts the request
// on a new connector and QP, waits for the client's disconnect and disconnects too. Both release
// the cycle's connector, then its QP, before the next. The client prints the cycles, the
// seconds, the cycles per second and the mean time per cycle. No banners (nd-tools.md §7).
//
// The client's Connect carries {cycle, cycles} as private data, so the server ends after the
// last cycle whatever its own -n. Cycle 0 is a warm-up (it may also wait for the server to
// listen) and is not timed.
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
    "and QP each time, and prints the cycles per second and the mean time per cycle.\n"
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
  RoundTimer timer;
  for (ULONG i = 0; i < cycles; ++i) {
    if (i == 1) timer.Start();
    NdRef<IND2QueuePair> qp = CreateQueuePair(adapter, cq.get());
    CycleData data{i, cycles};
    NdRef<IND2Connector> connector =
        Connect(adapter, qp.get(), server, o.addressLength, 0, 0, &data, sizeof data);
    CompleteConnect(connector.get());
    Disconnect(connector.get());
    connector.Reset();  // the connection first, then the QP it used
    qp.Reset();
  }
  timer.Stop();

  ND2_RESULT stray{};
  if (cq->GetResults(&stray, 1) != 0) FailCompletion("A QP without requests completed one", stray, __LINE__);

  double seconds = timer.elapsedUs / 1e6;
  PrintProcessors();
  std::printf("%9s%9s%11s%11s\n", "Cycles", "Seconds", "Cycles/s", "usec/cycle");
  std::printf("%9u%9.2f%11.2f%11.2f\n", o.cycles, seconds, double(o.cycles) / seconds,
              timer.elapsedUs / double(o.cycles));
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
