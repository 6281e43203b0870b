// NetworkDirect version 1 and version 2 on the same wire (issue 21 item 3): a version 1 client
// against a version 2 server and the reverse, in two processes. Each side sends the other
// messages of several sizes (bytes checked), then RDMA-writes into and reads from the other's
// memory: the version 1 side through a window descriptor (the version 2 side turns its address
// and token into one), the version 2 side through the descriptor the version 1 side's Bind made.
#include <endian.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "harness_v1.h"

namespace ndit {
namespace {

constexpr size_t kSizes[] = {0, 8, 4097, 1 << 20};
constexpr size_t kMessages = std::size(kSizes);
constexpr size_t kBuffer = (1 << 20) + 64;  // per message: each receive has its own
constexpr size_t kWindow = 64 * 1024;
void* const kV2Qp = Ctx(0x2A);

uint64_t Seed(size_t size, int from) { return size * 7 + uint64_t(from); }

// ---- the version 2 side -------------------------------------------------------------------------

struct V2Peer {
  explicit V2Peer(Adapter& adapter)
      : e(adapter, kV2Qp, Shape{}),
        outbox(kBuffer, 0),
        inbox(kMessages * kBuffer, 0xEE),
        target(kWindow, 0x5A),
        outboxMr(adapter, outbox.data(), outbox.size(), kSourceFlags),
        inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags),
        targetMr(adapter, target.data(), target.size(), kTargetFlags | kReadSinkFlags) {
    for (size_t i = 0; i < kMessages; ++i) PostReceive(i);
  }
  void PostReceive(size_t i) {
    ND2_SGE sge = {inbox.data() + i * kBuffer, ULONG(kBuffer), inboxMr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  // Receives the other side's messages, then sends its own.
  void Exchange(bool receiveFirst) {
    if (receiveFirst) ReceiveAll();
    for (size_t i = 0; i < kMessages; ++i) {
      FillPattern(outbox.data(), kSizes[i], Seed(kSizes[i], 2));
      ND2_SGE sge = {outbox.data(), ULONG(kSizes[i]), outboxMr.token()};
      IT_OK(e.qp->Send(Ctx(0x200 + i), kSizes[i] ? &sge : nullptr, kSizes[i] ? 1 : 0, 0));
      ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200 + i), kV2Qp},
                       "version 2 send");
    }
    if (!receiveFirst) ReceiveAll();
  }
  void ReceiveAll() {
    for (size_t i = 0; i < kMessages; ++i) {
      ExpectCompletion(e.cq.get(),
                       {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100 + i), kV2Qp, int64_t(kSizes[i])},
                       "version 2 receive of a version 1 send");
      CheckPattern(inbox.data() + i * kBuffer, kSizes[i], Seed(kSizes[i], 1), "version 1 message");
    }
  }
  // Writes its pattern into the version 1 side's window and reads it back.
  void WriteAndReadBack(const ND_MW_DESCRIPTOR& window) {
    uint64_t base = be64toh(window.Base);
    IT_CHECK_EQ(uint64_t(kWindow), be64toh(window.Length));
    FillPattern(outbox.data(), kWindow, 23);
    ND2_SGE sge = {outbox.data(), ULONG(kWindow), outboxMr.token()};
    IT_OK(e.qp->Write(Ctx(0x300), &sge, 1, base, window.Token, 0));
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x300), kV2Qp},
                     "version 2 Write into a version 1 window");
    ND2_SGE back = {inbox.data(), ULONG(kWindow), inboxMr.token()};
    IT_OK(e.qp->Read(Ctx(0x301), &back, 1, base, window.Token, 0));
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x301), kV2Qp},
                     "version 2 Read from a version 1 window");
    CheckPattern(inbox.data(), kWindow, 23, "read back from the version 1 window");
  }
  // Its target as a version 1 descriptor: address and token, in network order.
  ND_MW_DESCRIPTOR Descriptor() const {
    return {htobe64(reinterpret_cast<uint64_t>(target.data())), htobe64(kWindow),
            targetMr.remoteToken()};
  }

  Endpoint e;
  std::vector<uint8_t> outbox, inbox, target;
  Mr outboxMr, inboxMr, targetMr;
};

// ---- the version 1 side -------------------------------------------------------------------------

struct V1Peer {
  explicit V1Peer(V1Adapter& adapter)
      : side(adapter),
        outbox(kBuffer, 0),
        inbox(kMessages * kBuffer, 0xEE),
        target(kWindow, 0x5A),
        outboxMr(adapter, outbox.data(), outbox.size()),
        inboxMr(adapter, inbox.data(), inbox.size()),
        targetMr(adapter, target.data(), target.size()),
        receives(kMessages) {
    IT_OK(adapter->CreateMemoryWindow(&invalidated,
                                      reinterpret_cast<INDMemoryWindow**>(window.Out())));
  }
  V1Prepare PostReceives() {
    return [this](V1Side& s) {
      for (size_t i = 0; i < kMessages; ++i) {
        ND_SGE sge = V1Sge(inbox.data() + i * kBuffer, kBuffer, inboxMr.handle());
        IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
      }
    };
  }
  void Exchange(bool receiveFirst) {
    if (receiveFirst) ReceiveAll();
    std::vector<ND_RESULT> sends(kMessages);
    for (size_t i = 0; i < kMessages; ++i) {
      FillPattern(outbox.data(), kSizes[i], Seed(kSizes[i], 1));
      ND_SGE sge = V1Sge(outbox.data(), kSizes[i], outboxMr.handle());
      IT_OK(side.endpoint->Send(&sends[i], kSizes[i] ? &sge : nullptr, kSizes[i] ? 1 : 0, 0));
      V1ExpectResult(side.cq.get(), &sends[i], ND_SUCCESS, int64_t(kSizes[i]), "version 1 send");
    }
    if (!receiveFirst) ReceiveAll();
  }
  void ReceiveAll() {
    for (size_t i = 0; i < kMessages; ++i) {
      V1ExpectResult(side.inboundCq, &receives[i], ND_SUCCESS, int64_t(kSizes[i]),
                     "version 1 receive of a version 2 send");
      CheckPattern(inbox.data() + i * kBuffer, kSizes[i], Seed(kSizes[i], 2), "version 2 message");
    }
  }
  // Binds a read/write window over its target (completing before the descriptor is sent).
  ND_MW_DESCRIPTOR Bind() {
    ND_RESULT bind;
    ND_MW_DESCRIPTOR descriptor;
    IT_OK(side.endpoint->Bind(&bind, targetMr.handle(), window.get(), target.data(), kWindow,
                              ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE, &descriptor));
    V1ExpectResult(side.cq.get(), &bind, ND_SUCCESS, 0, "Bind");
    return descriptor;
  }
  // Writes its pattern into the version 2 side's memory and reads it back.
  void WriteAndReadBack(const ND_MW_DESCRIPTOR& remote) {
    FillPattern(outbox.data(), kWindow, 29);
    ND_RESULT write, read;
    ND_SGE sge = V1Sge(outbox.data(), kWindow, outboxMr.handle());
    IT_OK(side.endpoint->Write(&write, &sge, 1, &remote, 0, 0));
    V1ExpectResult(side.cq.get(), &write, ND_SUCCESS, int64_t(kWindow),
                   "version 1 Write into version 2 memory");
    ND_SGE back = V1Sge(inbox.data(), kWindow, inboxMr.handle());
    IT_OK(side.endpoint->Read(&read, &back, 1, &remote, 0, 0));
    V1ExpectResult(side.cq.get(), &read, ND_SUCCESS, int64_t(kWindow),
                   "version 1 Read from version 2 memory");
    CheckPattern(inbox.data(), kWindow, 29, "read back from the version 2 memory");
  }

  V1Side side;
  std::vector<uint8_t> outbox, inbox, target;
  V1Mr outboxMr, inboxMr, targetMr;
  std::vector<ND_RESULT> receives;
  ND_RESULT invalidated{};
  Ref<INDMemoryWindow> window;
};

// After the messages: each side writes into and reads from the other's memory; the version 1
// side says when its window is bound and when the version 2 side may stop.
void V1Rdma(Channel& channel, V1Peer& v1) {
  SendDescriptor(channel, v1.Bind());
  v1.WriteAndReadBack(ReceiveDescriptor(channel));
  channel.Barrier("rdma done");
}

void V2Rdma(Channel& channel, V2Peer& v2) {
  v2.WriteAndReadBack(ReceiveDescriptor(channel));
  SendDescriptor(channel, v2.Descriptor());
  channel.Barrier("rdma done");
  CheckPlacedByPeer([&] { CheckPattern(v2.target.data(), kWindow, 29, "what the version 1 side wrote"); });
}

IT_PEER(v2_server) {
  Adapter adapter;
  V2Peer v2(adapter);
  Serve(parent, v2.e);
  v2.Exchange(true);
  V2Rdma(parent, v2);
  ServerTeardown(parent, v2.e);
}

TEST(InteropV1, AVersion1ClientWithAVersion2Server) {
  RunWithPeer("v2_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Peer v1(adapter);
    V1ConnectTo(peer, v1.side, v1.PostReceives());
    v1.Exchange(false);
    V1Rdma(peer, v1);
    CheckPattern(v1.target.data(), kWindow, 23, "what the version 2 side wrote");
    V1ClientTeardown(peer, v1.side);
  });
}

IT_PEER(v1_server) {
  V1Adapter adapter;
  V1Peer v1(adapter);
  V1Serve(parent, v1.side, v1.PostReceives());
  v1.Exchange(true);
  V1Rdma(parent, v1);
  CheckPattern(v1.target.data(), kWindow, 23, "what the version 2 side wrote");
  V1ServerTeardown(parent, v1.side);
}

TEST(InteropV1, AVersion2ClientWithAVersion1Server) {
  RunWithPeer("v1_server", [](Channel& peer) {
    Adapter adapter;
    V2Peer v2(adapter);
    ConnectTo(peer, v2.e);
    v2.Exchange(false);
    V2Rdma(peer, v2);
    ClientTeardown(peer, v2.e);
  });
}

}  // namespace
}  // namespace ndit
