// RoCE over a lossy link: nft drops a share of the datagrams to and from the listener's UDP port
// (every datagram of the connection, the CM's included), and every byte must still arrive intact,
// with no error: retransmission (sequence NAKs, ACK timeouts, CM retries) repairs the loss within
// the retry budget. iWARP leaves loss to TCP, so the test runs on RoCE only.
//
// Needs root and nft (CI has both); otherwise skipped. The rule lives in a table of its own, named
// after this process, removed when the test ends however it ends.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);
constexpr int kLossPercent = 10;
constexpr size_t kSendSizes[] = {0, 1, 100, 4096, 65536 + 3, 1 << 20};
constexpr int kSends = int(sizeof kSendSizes / sizeof kSendSizes[0]);
constexpr size_t kRdmaBytes = 1 << 20;
constexpr size_t kMaxSend = 1 << 20;

bool Shell(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

// Drops kLossPercent of the UDP datagrams from or to `port` on this host while it lives.
class LossyPort {
 public:
  explicit LossyPort(uint16_t port) : table_("ndwv_lossy_" + std::to_string(getpid())) {
    std::string p = std::to_string(port), n = std::to_string(kLossPercent);
    ok_ = Shell("nft add table inet " + table_) &&
          Shell("nft add chain inet " + table_ + " out '{ type filter hook output priority 0; }'") &&
          Shell("nft 'add rule inet " + table_ + " out udp dport " + p + " numgen random mod 100 < " + n + " drop'") &&
          Shell("nft 'add rule inet " + table_ + " out udp sport " + p + " numgen random mod 100 < " + n + " drop'");
  }
  ~LossyPort() { Shell("nft delete table inet " + table_); }
  bool ok() const { return ok_; }

 private:
  std::string table_;
  bool ok_ = false;
};

uint64_t SendSeed(int i, bool fromServer) { return (fromServer ? 700 : 300) + uint64_t(i); }

// Sends every size, then receives every size from the other side, byte-exact.
void ExchangeSends(Endpoint& e, uint8_t* buffer, UINT32 token, bool server) {
  for (int i = 0; i < kSends; ++i) {
    FillPattern(buffer, kSendSizes[i], SendSeed(i, server));
    ND2_SGE sge = {buffer, ULONG(kSendSizes[i]), token};
    IT_OK(e.qp->Send(Ctx(0x200 + i), &sge, 1, 0));
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200 + i), e.qpContext, -1},
                     "a send over the lossy link");
  }
}

void ReceiveAll(Endpoint& e, uint8_t* inbox, bool server) {
  for (int i = 0; i < kSends; ++i) {
    ExpectCompletion(e.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100 + i), e.qpContext,
                                   int64_t(kSendSizes[i])},
                     "a receive over the lossy link");
    CheckPattern(inbox + size_t(i) * kMaxSend, kSendSizes[i], SendSeed(i, !server), "received bytes");
  }
}

void PostReceives(Endpoint& e, uint8_t* inbox, UINT32 token) {
  for (int i = 0; i < kSends; ++i) {
    ND2_SGE sge = {inbox + size_t(i) * kMaxSend, ULONG(kMaxSend), token};
    IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
}

// The close exchange crosses the lossy link too: a DREQ goes about four times in its budget (each
// retransmission waits twice as long), and with 10 % lost each way every DREQ or DREP of them is
// lost about once in 750 runs. Disconnect then ends ND_TIMEOUT (success class: the QP is flushed
// all the same), as the SPI says it does when the peer does not answer.
void DisconnectOverTheLoss(Endpoint& e) {
  HRESULT closed = Disconnect(e.connector.get());
  if (closed != ND_SUCCESS && closed != ND_TIMEOUT) IT_FAIL("Disconnect over the lossy link returned " + StatusName(closed));
}

IT_PEER(lossy_client) {
  Adapter adapter;
  std::vector<uint8_t> inbox((kSends + 1) * kMaxSend), out(kMaxSend + kRdmaBytes);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Mr outMr(adapter, out.data(), out.size(), kSinkFlags);
  Endpoint e(adapter, kClientQp, {.depth = 16, .cqDepth = 64, .separateCqs = true});
  PostReceives(e, inbox.data(), inboxMr.token());
  uint8_t* description = inbox.data() + kSends * kMaxSend;  // where the server's region is told
  ND2_SGE d = {description, ULONG(sizeof(RemoteBuffer)), inboxMr.token()};
  IT_OK(e.qp->Receive(Ctx(0x100 + kSends), &d, 1));
  ConnectTo(parent, e);
  ExchangeSends(e, out.data(), outMr.token(), false);
  ReceiveAll(e, inbox.data(), false);
  // The server's region: Write 1 MiB into its first half, Read its second half back.
  RemoteBuffer region = ReceiveRemoteBuffer(e, description, Ctx(0x100 + kSends));
  uint8_t* source = out.data();
  FillPattern(source, kRdmaBytes, 4242);
  ND2_SGE w = {source, ULONG(kRdmaBytes), outMr.token()};
  IT_OK(e.qp->Write(Ctx(0x300), &w, 1, region.address, region.token, 0));
  ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x300), kClientQp, -1}, "the Write");
  uint8_t* sink = out.data() + kMaxSend;
  std::memset(sink, 0, kRdmaBytes);
  ND2_SGE r = {sink, ULONG(kRdmaBytes), outMr.token()};
  IT_OK(e.qp->Read(Ctx(0x301), &r, 1, region.address + kRdmaBytes, region.token, 0));
  ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x301), kClientQp, -1}, "the Read");
  CheckPattern(sink, kRdmaBytes, 4343, "bytes read over the lossy link");
  parent.Send("rdma done");
  DisconnectOverTheLoss(e);
  parent.Send("client disconnected");
}

TEST(IntegrationLossyLink, EveryByteArrivesThroughTenPercentLoss) {
  if (!TransportIsRoce()) GTEST_SKIP() << "RoCE only: on iWARP, TCP repairs loss";
  if (geteuid() != 0 || !Shell("nft list tables")) GTEST_SKIP() << "needs root and nft";
  RunWithPeer("lossy_client", [](Channel& client) {
    Adapter adapter;
    std::vector<uint8_t> inbox(kSends * kMaxSend), out(kMaxSend), region(2 * kRdmaBytes);
    Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
    Mr outMr(adapter, out.data(), out.size(), kSinkFlags);
    FillPattern(region.data() + kRdmaBytes, kRdmaBytes, 4343);
    Mr regionMr(adapter, region.data(), region.size(), kTargetFlags);
    Endpoint e(adapter, kServerQp, {.depth = 16, .cqDepth = 64, .separateCqs = true});
    PostReceives(e, inbox.data(), inboxMr.token());

    uint16_t port = StartListening(adapter, e.listener);
    LossyPort loss(port);
    if (!loss.ok()) IT_FAIL("could not install the nft rule");
    client.SendValue("port", port);
    e.connector = GetConnectionRequest(adapter, e.listener.get());
    IT_OK(Accept(e.connector.get(), e.qp.get(), 4, 4));
    client.Send("accepted");

    ExchangeSends(e, out.data(), outMr.token(), true);
    ReceiveAll(e, inbox.data(), true);
    // The client acts on this message and may disconnect before its ACK, if lost, is repeated:
    // then the Send is flushed (ND_CANCELED), as any request outstanding when a connection ends.
    SendRemoteBuffer(e, {reinterpret_cast<uint64_t>(region.data()), region.size(), regionMr.remoteToken(), 0},
                     Ctx(0x400), true);
    client.Expect("rdma done", 60000);
    CheckPlacedByPeer([&] { CheckPattern(region.data(), kRdmaBytes, 4242, "bytes written over the lossy link"); });
    client.Expect("client disconnected");
    DisconnectOverTheLoss(e);
  });
}

}  // namespace
}  // namespace ndit
