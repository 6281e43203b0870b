// ndrpingpong: RDMA Write ping-pong with last-byte polling (nd-tools.md §8). Each side exposes
// its buffer through a memory window; the client writes `size` bytes whose last byte is 'X', the
// server spins until that byte arrives, sets it to 'Y' and writes the buffer back. The client
// prints the full round trip per size. Requires in-order placement (the last byte lands last).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "last_byte.h"
#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 100000;
constexpr std::size_t kDataSize = kMaxTransfer + 40;
constexpr std::size_t kBufferSize = kDataSize + 32;  // + our record and the peer's
constexpr std::size_t kLocalRecordOffset = kDataSize;
constexpr std::size_t kPeerRecordOffset = kDataSize + 16;
void* const kReceiveContext = reinterpret_cast<void*>(std::uintptr_t(0x1000));
void* const kSendContext = reinterpret_cast<void*>(std::uintptr_t(0x2000));
void* const kBindContext = reinterpret_cast<void*>(std::uintptr_t(0x3000));
void* const kWriteContext = reinterpret_cast<void*>(std::uintptr_t(0x4000));

// What each side tells the other about its window (sent as is, host byte order).
struct Record {
  UINT32 token;
  UINT64 address;
};
static_assert(sizeof(Record) == 16);

const char kUsage[] =
    "ndrpingpong -s|-c [-b|-p|-m] [-n nSge] [-q N] [-l logFile] <ip>[:port]\n"
    "\n"
    "RDMA Write ping-pong: the client writes a buffer into the server's memory window and the\n"
    "server writes it back as soon as its last byte has arrived (in-order placement). The\n"
    "client prints the full round trip per size, 1 B to 4 MiB.\n"
    "\n"
    NDTOOL_RPINGPONG_OPTIONS NDTOOL_ENV_USAGE;

const ToolSpec kSpec{"ndrpingpong", 54327, kUsage, false, 0, true};

struct Endpoint {
  Endpoint(Adapter& adapter, const Options& options, ULONG depth)
      : options(options),
        threshold(adapter.info().InlineRequestThreshold),
        buffer(std::make_unique<char[]>(kBufferSize)),  // zero-filled
        cq(adapter, depth, options.blocking),
        mr(adapter),
        sgl(options.nSge) {
    const ND2_ADAPTER_INFO& info = adapter.info();
    qp = adapter.CreateQueuePair(cq.get(), std::min(depth, info.MaxReceiveQueueDepth),
                                 std::min(depth, info.MaxInitiatorQueueDepth), 1, options.nSge,
                                 threshold);
    mr.Register(buffer.get(), kBufferSize, ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_WRITE);
    mw = adapter.CreateMemoryWindow();
  }

  void PostReceive() {
    ND2_SGE sge{};
    sge.Buffer = buffer.get() + kPeerRecordOffset;
    sge.BufferLength = sizeof(Record);
    sge.MemoryRegionToken = mr.localToken();
    ND_CHECK(qp->Receive(kReceiveContext, &sge, 1), "IND2QueuePair::Receive");
  }

  // Waits for exactly these completions, all successful; anything else fails the tool.
  void Reap(int sends, int receives, int binds, int writes, const char* what) {
    while (sends + receives + binds + writes > 0) {
      ND2_RESULT r = cq.Next(what);
      Count(r, &sends, &receives, &binds, &writes, what);
    }
  }

  static void Count(const ND2_RESULT& r, int* sends, int* receives, int* binds, int* writes,
                    const char* what) {
    int* left = r.RequestType == Nd2RequestTypeSend      ? sends
                : r.RequestType == Nd2RequestTypeReceive ? receives
                : r.RequestType == Nd2RequestTypeBind    ? binds
                : r.RequestType == Nd2RequestTypeWrite   ? writes
                                                         : nullptr;
    if (r.Status == ND_SUCCESS && r.RequestType == Nd2RequestTypeReceive && *receives == 0)
      FailMessage("The peer ended the test early (do NDWV_BENCH_SIZES/NDWV_BENCH_ITERS match?)", __LINE__);
    if (r.Status != ND_SUCCESS || !left || *left == 0) FailCompletion(what, r, __LINE__);
    --*left;
  }

  // Binds the window over the whole buffer and sends its token and address to the peer.
  void BindAndSendRecord() {
    ND_CHECK(qp->Bind(kBindContext, mr.get(), mw.get(), buffer.get(), kBufferSize, ND_OP_FLAG_ALLOW_WRITE),
             "IND2QueuePair::Bind");
    Reap(0, 0, 1, 0, "Memory window bind");
    Record record{mw->GetRemoteToken(), reinterpret_cast<UINT64>(buffer.get())};
    std::memcpy(buffer.get() + kLocalRecordOffset, &record, sizeof record);
    ND2_SGE sge{};
    sge.Buffer = buffer.get() + kLocalRecordOffset;
    sge.BufferLength = sizeof record;
    sge.MemoryRegionToken = mr.localToken();
    ND_CHECK(qp->Send(kSendContext, &sge, 1, 0), "IND2QueuePair::Send");
  }

  void TakePeerRecord() { std::memcpy(&peer, buffer.get() + kPeerRecordOffset, sizeof peer); }

  void Write(std::size_t size) {
    ULONG count = BuildSgl(sgl.data(), options.nSge, buffer.get(), size, mr.localToken());
    ULONG flags = size < threshold ? ND_OP_FLAG_INLINE : 0;
    ND_CHECK(qp->Write(kWriteContext, sgl.data(), count, peer.address, peer.token, flags),
             "IND2QueuePair::Write");
  }

  // The last-byte rounds' needs (last_byte.h).
  char* data() const { return buffer.get(); }
  bool pollsWhileWaiting() const { return !options.blocking && !options.memoryWait; }
  void PollWrite(int* writes, const char* what) {
    ND2_RESULT r;
    int none = 0;
    if (cq.Poll(&r)) Count(r, &none, &none, &none, writes, what);
  }
  void ReapWrite(const char* what) { Reap(0, 0, 0, 1, what); }

  void Disconnect(IND2Connector* connector) {
    ndtool::Disconnect(connector);
    mw.Reset();  // a window still bound would make Deregister fail with ND_DEVICE_BUSY
    mr.Deregister();
  }

  const Options& options;
  ULONG threshold;
  std::unique_ptr<char[]> buffer;
  CompletionQueue cq;
  MemoryRegion mr;
  std::vector<ND2_SGE> sgl;
  NdRef<IND2MemoryWindow> mw;
  NdRef<IND2QueuePair> qp;
  Record peer{};
};

int RunServer(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  adapter.RequireInOrderDma();
  const ND2_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth));
  ep.PostReceive();  // the client's record
  ep.PostReceive();  // the client's terminate

  NdRef<IND2Listener> listener = Listen(adapter, address, o.addressLength);
  NdRef<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
  Accept(connector.get(), ep.qp.get(), 0, 0);
  ep.Reap(0, 1, 0, 0, "Waiting for the client's record");
  ep.TakePeerRecord();
  ep.BindAndSendRecord();
  ep.Reap(1, 0, 0, 0, "Sending the record");

  for (int i = 0; i < kWarmupIterations; ++i) Pong(ep, kWarmupSize, kWarmupMarks);
  for (const Round& round : rounds)
    for (std::uint64_t i = 0; i < round.iterations; ++i) Pong(ep, round.size, kTestMarks);

  ep.Reap(0, 1, 0, 0, "Waiting for the client's terminate");
  ep.Disconnect(connector.get());
  return 0;
}

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  adapter.RequireInOrderDma();
  const ND2_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, info.MaxInitiatorQueueDepth));
  ep.PostReceive();  // the server's record

  NdRef<IND2Connector> connector = Connect(adapter, ep.qp.get(), server, o.addressLength, 0, 0);
  CompleteConnect(connector.get());
  ep.BindAndSendRecord();  // the client goes first: the server may only send after a receive
  ep.Reap(1, 1, 0, 0, "Exchanging records");
  ep.TakePeerRecord();

  for (int i = 0; i < kWarmupIterations; ++i) Ping(ep, kWarmupSize, kWarmupMarks);

  MeasureRounds(rounds, 1, [&](std::size_t size, std::uint64_t iterations) {
    for (std::uint64_t i = 0; i < iterations; ++i) Ping(ep, size, kTestMarks);
  });

  // Zero-byte terminate. Its completion may also be a flush if the server tears down first.
  ND_CHECK(ep.qp->Send(kSendContext, nullptr, 0, 0), "IND2QueuePair::Send");
  ND2_RESULT r = ep.cq.Next("Sending the terminate");
  if (r.RequestType != Nd2RequestTypeSend || (r.Status != ND_SUCCESS && r.Status != ND_CANCELED))
    FailCompletion("Terminate", r, __LINE__);
  ep.Disconnect(connector.get());
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
