// ndping: one-way send/receive message rate (nd-tools.md §8). The client keeps up to `-q` sends
// in flight, limited by the credits the server grants (its posted receives); the server only
// receives, answering a zero-byte sync message with a zero-byte ack and sending a one-byte
// credit message every depth/2 receives. The client prints the time per message and the
// bandwidth per size.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 500000;
constexpr std::size_t kBufferSize = kMaxTransfer + 40;
constexpr ULONG kCreditSize = 1;  // a credit message; an empty message is a sync (C) or ack (S)
// Room on a CQ beside a full queue: the client's credit message and ack, the server's acks and
// credit messages (where MaxCompletionQueueDepth allows it).
constexpr ULONG kCqSlack = 32;
void* const kReceiveContext = reinterpret_cast<void*>(std::uintptr_t(0x1000));
void* const kSendContext = reinterpret_cast<void*>(std::uintptr_t(0x2000));
void* const kControlContext = reinterpret_cast<void*>(std::uintptr_t(0x3000));

const char kUsage[] =
    "ndping -s|-c [-b|-p] [-n nSge] [-q pipeline] [-l logFile] <ip>[:port]\n"
    "\n"
    "One-way send/receive message rate: the client sends, the server receives and grants\n"
    "credits; the client prints the time per message and bytes/s per size, 1 B to 4 MiB.\n"
    "\n"
    NDTOOL_SIDE_USAGE NDTOOL_WAIT_USAGE("")
    "  -n nSge         SGEs per request (default 1)\n"
    "  -q pipeline     sends kept in flight by the client (default 128)\n"
    NDTOOL_ADDRESS_USAGE(54324)
    "\n" NDTOOL_ENV_USAGE;

const ToolSpec kSpec{"ndping", 54324, kUsage, false};

// One CQ, one QP and the buffer every request uses (receives each over the whole buffer).
struct Endpoint {
  Endpoint(Adapter& adapter, const Options& options, ULONG cqDepth, ULONG depth)
      : options(options),
        threshold(adapter.info().InlineRequestThreshold),
        buffer(std::make_unique<char[]>(kBufferSize)),
        cq(adapter, cqDepth, options.blocking),
        mr(adapter),
        sgl(options.nSge),
        receiveSgl(options.nSge) {
    const ND2_ADAPTER_INFO& info = adapter.info();
    qp = adapter.CreateQueuePair(cq.get(), std::min(depth, info.MaxReceiveQueueDepth),
                                 std::min(depth, info.MaxInitiatorQueueDepth), options.nSge,
                                 options.nSge, threshold);
    mr.Register(buffer.get(), kBufferSize, ND_MR_FLAG_ALLOW_LOCAL_WRITE);
    receiveSges = BuildSgl(receiveSgl.data(), options.nSge, buffer.get(), kBufferSize, mr.localToken());
  }

  void PostReceive() {
    ND_CHECK(qp->Receive(kReceiveContext, receiveSgl.data(), receiveSges), "IND2QueuePair::Receive");
  }

  void Send(void* context, std::size_t size) {
    ULONG count = BuildSgl(sgl.data(), options.nSge, buffer.get(), size, mr.localToken());
    ULONG flags = size < threshold ? ND_OP_FLAG_INLINE : 0;
    ND_CHECK(qp->Send(context, sgl.data(), count, flags), "IND2QueuePair::Send");
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

// Receives until the client disconnects (its flush completes a request with ND_CANCELED).
// `credits` is what the client was granted at the start; each credit message grants credits/2.
// It is sent every credits/2 receives (the original: every depth/2 = (credits + 1)/2), so that
// no credit is lost: otherwise one leaks per message and a long run ends with the client out of
// credits and the server out of messages.
void Serve(Endpoint& ep, ULONG credits) {
  const ULONG creditEvery = std::max<ULONG>(1, credits / 2);
  std::uint64_t received = 0;
  for (;;) {
    ND2_RESULT r = ep.cq.Next("Waiting for a message");
    if (r.Status == ND_CANCELED) return;
    if (r.Status != ND_SUCCESS) FailCompletion("Receiving", r, __LINE__);
    if (r.RequestType == Nd2RequestTypeSend) continue;  // our acks and credit messages
    if (r.RequestType != Nd2RequestTypeReceive) FailCompletion("Receiving", r, __LINE__);
    if (r.BytesTransferred == 0) ep.Send(kControlContext, 0);  // the round's sync: ack it
    ep.PostReceive();
    if (++received % creditEvery == 0) ep.Send(kControlContext, kCreditSize);
  }
}

int RunServer(const Options& o, const std::vector<Round>&) {
  NdLibrary nd;
  Adapter adapter;
  adapter.Open(reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
  const ND2_ADAPTER_INFO& info = adapter.info();
  const ULONG depth = std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth);
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, depth + kCqSlack), depth);
  for (ULONG i = 0; i < depth; ++i) ep.PostReceive();

  NdRef<IND2Listener> listener = Listen(adapter, reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
  NdRef<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
  const ULONG credits = depth - 1;  // the client's initial credits
  Accept(connector.get(), ep.qp.get(), 0, 0, &credits, sizeof credits);
  Serve(ep, credits);

  Disconnect(connector.get());
  ep.mr.Deregister();
  return 0;
}

class Client {
 public:
  Client(Endpoint& ep, ULONG depth, ULONG peerDepth)
      : ep_(ep), window_(std::max<ULONG>(1, std::min(ep.options.queueDepth, depth))),
        peerDepth_(peerDepth), credits_(peerDepth) {}

  // Sends `iterations` messages of `size` bytes, then a sync; returns when the server's ack
  // has arrived and every send has completed.
  void Run(std::size_t size, std::uint64_t iterations) {
    ep_.PostReceive();  // for credit messages and the ack
    ep_.PostReceive();
    std::uint64_t issued = 0;
    bool syncDue = false, syncSent = false, acked = false;
    while (!acked || outstanding_ > 0) {
      while (issued < iterations && credits_ > 0 && outstanding_ < window_) {
        ep_.Send(kSendContext, size);
        ++issued;
        ++outstanding_;
        --credits_;
      }
      if (syncDue && credits_ > 0) {
        ep_.Send(kControlContext, 0);
        ++outstanding_;
        --credits_;
        syncDue = false;
        syncSent = true;
      }
      ND2_RESULT r = ep_.cq.Next(syncSent ? "Waiting for the server's ack" : "Waiting for a completion");
      if (r.Status != ND_SUCCESS) FailCompletion("Sending", r, __LINE__);
      if (r.RequestType == Nd2RequestTypeSend) {
        --outstanding_;
        if (issued == iterations && !syncSent) syncDue = true;
      } else if (r.RequestType == Nd2RequestTypeReceive && r.BytesTransferred == kCreditSize) {
        credits_ += peerDepth_ / 2;
        ep_.PostReceive();
      } else if (r.RequestType == Nd2RequestTypeReceive && r.BytesTransferred == 0 && syncSent) {
        acked = true;
      } else {
        FailCompletion("Unexpected message from the server", r, __LINE__);
      }
    }
  }

 private:
  Endpoint& ep_;
  const ULONG window_;
  const ULONG peerDepth_;
  ULONG credits_;
  ULONG outstanding_ = 0;
};

int RunClient(const Options& o, const std::vector<Round>& rounds) {
  NdLibrary nd;
  Adapter adapter;
  const sockaddr* server = reinterpret_cast<const sockaddr*>(&o.address);
  adapter.OpenForPeer(server, o.addressLength);
  const ND2_ADAPTER_INFO& info = adapter.info();
  const ULONG depth = std::min(info.MaxCompletionQueueDepth, info.MaxInitiatorQueueDepth);
  Endpoint ep(adapter, o, std::min(info.MaxCompletionQueueDepth, depth + kCqSlack), depth);

  NdRef<IND2Connector> connector = Connect(adapter, ep.qp.get(), server, o.addressLength, 0, 0);
  // The server's receive depth (less one) in its Accept's private data: the initial credits.
  std::vector<char> data = GetPrivateData(connector.get());
  if (data.size() < sizeof(ULONG)) FailMessage("The server sent no credit count", __LINE__);
  ULONG peerDepth = 0;
  std::memcpy(&peerDepth, data.data(), sizeof peerDepth);
  if (peerDepth < 2) FailMessage("The server granted fewer than 2 credits", __LINE__);
  CompleteConnect(connector.get());

  Client client(ep, depth, peerDepth);
  client.Run(kWarmupSize, kWarmupIterations);
  SleepMs(1000);

  MeasureRounds(rounds, 1, [&](std::size_t size, std::uint64_t iterations) {
    client.Run(size, iterations);
  });

  Disconnect(connector.get());
  ep.mr.Deregister();
  return 0;
}

}  // namespace

int main(int argc, char* argv[]) {
  return RunMeasuringTool(argc, argv, kSpec, kMaxIterations, RunServer, RunClient);
}
