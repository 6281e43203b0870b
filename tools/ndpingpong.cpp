// ndpingpong: send/receive round trip (nd-tools.md §8). The client sends a message and waits for
// the server to send it back; it prints half the round-trip time per size.
#include <algorithm>
#include <memory>
#include <vector>

#include "nd_objects.h"
#include "pingpong.h"

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
    NDTOOL_PINGPONG_OPTIONS
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

  // The rounds' needs (pingpong.h): a result is the CQ's ND2_RESULT.
  ND2_RESULT Next(const char* what) { return cq.Next(what); }
  static Completed KindOf(const ND2_RESULT& r) {
    if (r.RequestType == Nd2RequestTypeReceive) return Completed::Receive;
    return r.RequestType == Nd2RequestTypeSend ? Completed::Send : Completed::Other;
  }
  static HRESULT StatusOf(const ND2_RESULT& r) { return r.Status; }
  static std::size_t BytesOf(const ND2_RESULT& r) { return r.BytesTransferred; }
  void Repost(const ND2_RESULT&) { Repost(); }
  [[noreturn]] static void Fail(const char* what, const ND2_RESULT& r, int line) {
    FailCompletion(what, r, line);
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

int RunServer(const Options& o, const std::vector<Round>&) {
  NdLibrary nd;
  Adapter adapter;
  adapter.Open(reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
  const ND2_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth));

  NdRef<IND2Listener> listener = Listen(adapter, reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
  NdRef<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
  Accept(connector.get(), ep.qp.get(), 0, 0);
  ServePongs(ep);

  Disconnect(connector.get());
  ep.mr.Deregister();
  return 0;
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

  for (int i = 0; i < kWarmupIterations; ++i) PingOnce(ep, kWarmupSize);
  SleepMs(1000);

  MeasureRounds(rounds, 2, [&](std::size_t size, std::uint64_t iterations) {
    for (std::uint64_t i = 0; i < iterations; ++i) PingOnce(ep, size);
  });

  Disconnect(connector.get());
  ep.mr.Deregister();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
