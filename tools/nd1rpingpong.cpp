// nd1rpingpong: ndrpingpong on NetworkDirect version 1 (options and output as ndrpingpong's).
// Each side binds a memory window over its buffer and sends the other the window's descriptor;
// the client writes `size` bytes whose last byte is 'X', the server spins until that byte
// arrives, sets it to 'Y' and writes the buffer back. The client prints the full round trip per
// size. Requires in-order placement (the last byte lands last), which ndwv's adapters have.
#include <algorithm>
#include <initializer_list>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "last_byte.h"
#include "nd1_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 100000;
constexpr std::size_t kDataSize = kMaxTransfer + 40;
constexpr std::size_t kLocalRecordOffset = kDataSize;
constexpr std::size_t kPeerRecordOffset = kDataSize + sizeof(ND_MW_DESCRIPTOR);
constexpr std::size_t kBufferSize = kDataSize + 2 * sizeof(ND_MW_DESCRIPTOR);

const char kUsage[] =
    "nd1rpingpong -s|-c [-b|-p|-m] [-n nSge] [-q N] [-l logFile] <ip>[:port]\n"
    "\n"
    "RDMA Write ping-pong over NetworkDirect version 1 (INDEndpoint, window descriptors): the\n"
    "client writes a buffer into the server's memory window and the server writes it back as\n"
    "soon as its last byte has arrived (in-order placement). The client prints the full round\n"
    "trip per size, 1 B to 4 MiB.\n"
    "\n"
    NDTOOL_RPINGPONG_OPTIONS NDTOOL_ENV_USAGE;

const ToolSpec kSpec{"nd1rpingpong", 54327, kUsage, false, 0, true};

struct Endpoint {
  Endpoint(V1Adapter& adapter, const Options& options, SIZE_T depth)
      : options(options),
        depth(depth),
        buffer(std::make_unique<char[]>(kBufferSize)),  // zero-filled
        cq(adapter, depth, options.blocking),
        mr(adapter, buffer.get(), kBufferSize),
        sgl(options.nSge) {
    ND_CHECK(adapter.get()->CreateMemoryWindow(&invalidated,
                                               reinterpret_cast<INDMemoryWindow**>(mw.Out())),
             "INDAdapter::CreateMemoryWindow");
  }

  // Makes the endpoint of `made` and posts the receive of the peer's descriptor.
  void Create(NdRef<INDConnector> made, const ND_ADAPTER_INFO& info) {
    connector = std::move(made);
    endpoint = CreateEndpoint(connector.get(), cq.get(), std::min(depth, info.MaxInboundRequests),
                              std::min(depth, info.MaxOutboundRequests), 1, options.nSge, 0, 0);
    ND_SGE sge{buffer.get() + kPeerRecordOffset, sizeof(ND_MW_DESCRIPTOR), mr.handle()};
    ND_CHECK(endpoint->Receive(&receive, &sge, 1), "INDEndpoint::Receive");
  }

  // Waits for the results `expected` (successful, in any order); fails on anything else.
  void Reap(std::initializer_list<ND_RESULT*> expected, const char* what) {
    std::vector<ND_RESULT*> left(expected);
    while (!left.empty()) {
      ND_RESULT* r = cq.Next(what);
      auto found = std::find(left.begin(), left.end(), r);
      if (found == left.end() || r->Status != ND_SUCCESS) FailResult(what, r, __LINE__);
      left.erase(found);
    }
  }

  // Binds the window over the whole buffer and sends its descriptor to the peer.
  void BindAndSendDescriptor() {
    ND_MW_DESCRIPTOR descriptor;
    ND_CHECK(endpoint->Bind(&bind, mr.handle(), mw.get(), buffer.get(), kBufferSize,
                            ND_OP_FLAG_ALLOW_WRITE, &descriptor),
             "INDEndpoint::Bind");
    Reap({&bind}, "Memory window bind");
    std::memcpy(buffer.get() + kLocalRecordOffset, &descriptor, sizeof descriptor);
    ND_SGE sge{buffer.get() + kLocalRecordOffset, sizeof descriptor, mr.handle()};
    ND_CHECK(endpoint->Send(&send, &sge, 1, 0), "INDEndpoint::Send");
  }

  void TakePeerDescriptor() { std::memcpy(&peer, buffer.get() + kPeerRecordOffset, sizeof peer); }

  void Write(std::size_t size) {
    ULONG count = BuildSgl(sgl.data(), options.nSge, buffer.get(), size, mr.handle());
    ND_CHECK(endpoint->Write(&write, sgl.data(), count, &peer, 0, 0), "INDEndpoint::Write");
  }

  // The last-byte rounds' needs (last_byte.h).
  char* data() const { return buffer.get(); }
  bool pollsWhileWaiting() const { return !options.blocking && !options.memoryWait; }
  void PollWrite(int* writes, const char* what) {
    ND_RESULT* r;
    if (!cq.Poll(&r)) return;
    if (r != &write || r->Status != ND_SUCCESS || *writes == 0) FailResult(what, r, __LINE__);
    --*writes;
  }
  void ReapWrite(const char* what) { Reap({&write}, what); }

  void End() {
    Disconnect(connector.get());
    mw.Reset();  // a window still bound would make DeregisterMemory fail with ND_DEVICE_BUSY
    endpoint.Reset();
    mr.Deregister();
  }

  const Options& options;
  SIZE_T depth;
  std::unique_ptr<char[]> buffer;
  V1CompletionQueue cq;
  V1MemoryRegion mr;
  std::vector<ND_SGE> sgl;
  ND_RESULT receive{}, send{}, bind{}, write{}, invalidated{};
  NdRef<INDMemoryWindow> mw;
  NdRef<INDConnector> connector;
  NdRef<INDEndpoint> endpoint;
  ND_MW_DESCRIPTOR peer{};
};

int RunServer(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  V1Adapter adapter;
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.Open(address, o.addressLength);
  const ND_ADAPTER_INFO& info = adapter.info();
  Endpoint ep(adapter, o, std::min(info.MaxCqEntries, info.MaxInboundRequests));
  NdRef<INDListen> listen = AcceptOne(adapter, address, ep);
  ep.Reap({&ep.receive}, "Waiting for the client's descriptor");
  ep.TakePeerDescriptor();
  // The client's terminate comes into the same record slot, after the rounds.
  ND_SGE sge{ep.buffer.get() + kPeerRecordOffset, sizeof(ND_MW_DESCRIPTOR), ep.mr.handle()};
  ND_CHECK(ep.endpoint->Receive(&ep.receive, &sge, 1), "INDEndpoint::Receive");
  ep.BindAndSendDescriptor();
  ep.Reap({&ep.send}, "Sending the descriptor");

  for (int i = 0; i < kWarmupIterations; ++i) Pong(ep, kWarmupSize, kWarmupMarks);
  for (const Round& round : rounds)
    for (std::uint64_t i = 0; i < round.iterations; ++i) Pong(ep, round.size, kTestMarks);

  ep.Reap({&ep.receive}, "Waiting for the client's terminate");
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
  ep.BindAndSendDescriptor();  // the client goes first: the server may only send after a receive
  ep.Reap({&ep.send, &ep.receive}, "Exchanging descriptors");
  ep.TakePeerDescriptor();

  for (int i = 0; i < kWarmupIterations; ++i) Ping(ep, kWarmupSize, kWarmupMarks);
  MeasureRounds(rounds, 1, [&](std::size_t size, std::uint64_t iterations) {
    for (std::uint64_t i = 0; i < iterations; ++i) Ping(ep, size, kTestMarks);
  });

  // Zero-byte terminate. Its result may also be a flush if the server tears down first.
  ND_CHECK(ep.endpoint->Send(&ep.send, nullptr, 0, 0), "INDEndpoint::Send");
  ND_RESULT* r = ep.cq.Next("Sending the terminate");
  if (r != &ep.send || (r->Status != ND_SUCCESS && r->Status != ND_CANCELED))
    FailResult("Terminate", r, __LINE__);
  ep.End();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
