// ndpingpong: send/receive round trip (nd-tools.md §8). The client sends a message and waits for
// the server to send it back; it prints half the round-trip time per size.
#include <algorithm>
#include <deque>
#include <memory>
#include <vector>

#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 100000;
constexpr std::size_t kBufferSize = kMaxTransfer + 40;
void* const kReceiveContext = reinterpret_cast<void*>(std::uintptr_t(0x1000));
void* const kSendContext = reinterpret_cast<void*>(std::uintptr_t(0x2000));

const char kUsage[] =
    "ndpingpong -s|-c [-b|-p] [-n nSge] [-q N] [-l logFile] <ip>[:port]\n"
    "\n"
    "Send/receive ping-pong: the client sends a message and the server sends it back; the\n"
    "client prints half the round trip per size, 1 B to 4 MiB.\n"
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

const ToolSpec kSpec{"ndpingpong", 54325, kUsage, false};

// What both sides set up before connecting: one CQ, one QP and the buffer with all receives
// posted (each over the whole buffer).
struct Endpoint {
  Endpoint(Adapter& adapter, const Options& options, ULONG depth)
      : options(options),
        threshold(adapter.info().InlineRequestThreshold),
        buffer(std::make_unique<char[]>(kBufferSize)),
        cq(adapter, depth, options.blocking),
        mr(adapter),
        sgl(options.nSge) {
    const ND2_ADAPTER_INFO& info = adapter.info();
    ULONG receives = std::min(depth, info.MaxReceiveQueueDepth);
    qp = adapter.CreateQueuePair(cq.get(), receives, std::min(depth, info.MaxInitiatorQueueDepth),
                                 options.nSge, options.nSge, threshold);
    mr.Register(buffer.get(), kBufferSize, ND_MR_FLAG_ALLOW_LOCAL_WRITE);
    receiveSgl.resize(options.nSge);
    receiveSges = BuildSgl(receiveSgl.data(), options.nSge, buffer.get(), kBufferSize, mr.localToken());
    for (ULONG i = 0; i < receives; ++i) Repost();
  }

  void Repost() {
    ND_CHECK(qp->Receive(kReceiveContext, receiveSgl.data(), receiveSges), "IND2QueuePair::Receive");
  }

  void Send(std::size_t size) {
    ULONG count = BuildSgl(sgl.data(), options.nSge, buffer.get(), size, mr.localToken());
    ULONG flags = size < threshold ? ND_OP_FLAG_INLINE : 0;
    ND_CHECK(qp->Send(kSendContext, sgl.data(), count, flags), "IND2QueuePair::Send");
  }

  // Declared so that the QP goes first and the buffer last.
  const Options& options;
  ULONG threshold;
  std::unique_ptr<char[]> buffer;
  CompletionQueue cq;
  MemoryRegion mr;
  std::vector<ND2_SGE> sgl, receiveSgl;
  ULONG receiveSges = 0;
  NdRef<IND2QueuePair> qp;
};

// Pong until the client disconnects (its flush completes a receive with ND_CANCELED). One pong
// is in flight at a time: the next is sent once the previous send has completed.
void Serve(Endpoint& ep) {
  std::deque<ULONG> pending;  // sizes of pings not yet answered
  bool sending = false;
  for (;;) {
    ND2_RESULT r = ep.cq.Next("Waiting for a ping");
    if (r.Status == ND_CANCELED) return;
    if (r.Status != ND_SUCCESS) FailCompletion("Pong", r, __LINE__);
    if (r.RequestType == Nd2RequestTypeReceive) {
      ep.Repost();
      pending.push_back(r.BytesTransferred);
    } else if (r.RequestType == Nd2RequestTypeSend) {
      sending = false;
    } else {
      FailCompletion("Pong", r, __LINE__);
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
  Adapter adapter;
  adapter.Open(reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
  const ND2_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth));

  NdRef<IND2Listener> listener = Listen(adapter, reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
  NdRef<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
  Accept(connector.get(), ep.qp.get(), 0, 0);
  Serve(ep);

  Disconnect(connector.get());
  ep.mr.Deregister();
  return 0;
}

// One round trip: send, then reap both the send completion and the pong.
void Ping(Endpoint& ep, std::size_t size) {
  ep.Send(size);
  bool sent = false, answered = false;
  while (!sent || !answered) {
    ND2_RESULT r = ep.cq.Next("Waiting for a pong");
    if (r.Status != ND_SUCCESS) FailCompletion("Ping", r, __LINE__);
    if (r.RequestType == Nd2RequestTypeSend) {
      sent = true;
    } else if (r.RequestType == Nd2RequestTypeReceive) {
      if (r.BytesTransferred != size) FailCompletion("Pong of the wrong size", r, __LINE__);
      ep.Repost();
      answered = true;
    } else {
      FailCompletion("Ping", r, __LINE__);
    }
  }
}

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  const ND2_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, info.MaxInitiatorQueueDepth));

  NdRef<IND2Connector> connector = Connect(adapter, ep.qp.get(), server, o.addressLength, 0, 0);
  CompleteConnect(connector.get());

  for (int i = 0; i < kWarmupIterations; ++i) Ping(ep, kWarmupSize);
  SleepMs(1000);

  MeasureRounds(rounds, 2, [&](std::size_t size, std::uint64_t iterations) {
    for (std::uint64_t i = 0; i < iterations; ++i) Ping(ep, size);
  });

  Disconnect(connector.get());
  ep.mr.Deregister();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
