// Sends and receives between two processes: sizes from 0 B to 4 MiB over uneven SGE lists that
// differ on the two sides, both directions, exact byte counts and data, completions in order with
// their contexts and types; inline sends from unregistered, immediately reused memory; and 200
// messages in flight at once.
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);
constexpr uint8_t kFill = 0xEE;  // receive memory before anything arrives

// ---- 3a. sizes and SGE lists, both directions ---------------------------------------------------

constexpr size_t kSizes[] = {0, 1, 7, 4096, 65536 + 3, 1 << 20, 4 << 20};
constexpr int kMessages = int(sizeof kSizes / sizeof kSizes[0]);
constexpr size_t kSpare = 13;  // receive capacity beyond the message

uint64_t Seed(int message, int direction) { return kSizes[message] * 31 + uint64_t(direction); }

// Where each message lives: sends as 3 pieces 5 bytes apart, receives (13 bytes larger) as 3
// pieces of other proportions 11 bytes apart. The same on both sides.
struct Plan {
  std::vector<Layout> send, receive;
  size_t sendBytes = 0, receiveBytes = 0;
  Plan() {
    for (int i = 0; i < kMessages; ++i) {
      send.push_back(MakeLayout(kSizes[i], sendBytes, 3, 5, 0));
      sendBytes = send.back().end + 64;
      receive.push_back(MakeLayout(kSizes[i] + kSpare, receiveBytes, 3, 11, 1));
      receiveBytes = receive.back().end + 64;
    }
  }
};

// One side's buffers for the exchange.
struct Mailboxes {
  Mailboxes(Adapter& adapter, const Plan& plan)
      : outbox(plan.sendBytes, 0x11),
        inbox(plan.receiveBytes, kFill),
        outboxMr(adapter, outbox.data(), outbox.size(), kSourceFlags),
        inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags) {}
  std::vector<uint8_t> outbox, inbox;
  Mr outboxMr, inboxMr;
};

void PostReceives(Endpoint& e, const Plan& plan, Mailboxes& m) {
  for (int i = 0; i < kMessages; ++i) {
    ND2_SGE sges[4];
    ULONG n = BuildSges(sges, plan.receive[i], m.inbox.data(), m.inboxMr.token());
    IT_OK(e.qp->Receive(Ctx(0x100 + i), sges, n));
  }
}

// Posts every message at once, then expects their completions in posting order.
void SendAll(Endpoint& e, const Plan& plan, Mailboxes& m, int direction) {
  for (int i = 0; i < kMessages; ++i) {
    ScatterPattern(plan.send[i], m.outbox.data(), Seed(i, direction));
    ND2_SGE sges[4];
    ULONG n = BuildSges(sges, plan.send[i], m.outbox.data(), m.outboxMr.token());
    IT_OK(e.qp->Send(Ctx(0x200 + i), n ? sges : nullptr, n, 0));  // 0 bytes: no SGE list at all
  }
  for (int i = 0; i < kMessages; ++i) {
    std::string what = "send of " + std::to_string(kSizes[i]) + " bytes";
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200 + i), e.qpContext},
                     what.c_str());
  }
}

void ReceiveAll(Endpoint& e, const Plan& plan, Mailboxes& m, int direction) {
  for (int i = 0; i < kMessages; ++i) {
    std::string what = "receive of " + std::to_string(kSizes[i]) + " bytes";
    ExpectCompletion(e.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100 + i),
                                   e.qpContext, int64_t(kSizes[i])},
                     what.c_str());
    CheckReceived(plan.receive[i], m.inbox.data(), kSizes[i], Seed(i, direction), kFill,
                  what.c_str());
  }
}

const Shape kSizesShape = {.depth = 16, .sge = 3, .separateCqs = true};

IT_PEER(sizes_server) {
  Adapter adapter;
  Plan plan;
  Mailboxes m(adapter, plan);
  Endpoint server(adapter, kServerQp, kSizesShape);
  PostReceives(server, plan, m);
  Serve(parent, server);
  ReceiveAll(server, plan, m, 1);
  SendAll(server, plan, m, 2);  // only after the client's messages arrived (iWARP rule)
  ExpectNoCompletion(server.receiveCq, "server receive CQ after the exchange", 50);
  ServerTeardown(parent, server);
}

TEST(IntegrationSendReceive, SizesAndSgeListsBothDirections) {
  RunWithPeer("sizes_server", [](Channel& peer) {
    Adapter adapter;
    Plan plan;
    Mailboxes m(adapter, plan);
    Endpoint client(adapter, kClientQp, kSizesShape);
    PostReceives(client, plan, m);
    ConnectTo(peer, client);
    SendAll(client, plan, m, 1);
    ReceiveAll(client, plan, m, 2);
    ExpectNoCompletion(client.cq.get(), "client initiator CQ after the exchange", 50);
    ClientTeardown(peer, client);
  });
}

// ---- 3b. inline sends -----------------------------------------------------------------------------

constexpr ULONG kInlineSize = 128;  // the QP's inline size (the adapter's InlineRequestThreshold)
constexpr size_t kInlineSizes[] = {0, 1, 7, 64, kInlineSize};
constexpr int kInlineMessages = int(sizeof kInlineSizes / sizeof kInlineSizes[0]);
constexpr size_t kPlainSize = 300;  // a registered 3-SGE send after the inline ones
constexpr size_t kSlot = 512;       // receive capacity per message

IT_PEER(inline_server) {
  Adapter adapter;
  std::vector<uint8_t> inbox(kSlot * (kInlineMessages + 1), kFill);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint server(adapter, kServerQp, {.depth = 16});
  for (int i = 0; i <= kInlineMessages; ++i) {
    ND2_SGE sge = {inbox.data() + i * kSlot, ULONG(kSlot), inboxMr.token()};
    IT_OK(server.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  Serve(parent, server);
  for (int i = 0; i <= kInlineMessages; ++i) {
    size_t size = i < kInlineMessages ? kInlineSizes[i] : kPlainSize;
    std::string what = "receive of " + std::to_string(size) + " bytes (message " +
                       std::to_string(i) + ")";
    ExpectCompletion(server.cq.get(),
                     {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100 + i), kServerQp, int64_t(size)},
                     what.c_str());
    CheckPattern(inbox.data() + i * kSlot, size, 500 + size, what.c_str());
    CheckFilled(inbox.data() + i * kSlot + size, kSlot - size, kFill, what.c_str());
  }
  ServerTeardown(parent, server);
}

TEST(IntegrationSendReceive, InlineSendsCopyDataAtPostTime) {
  RunWithPeer("inline_server", [](Channel& peer) {
    Adapter adapter;
    IT_CHECK(adapter.info().MaxInlineDataSize >= kInlineSize);
    std::vector<uint8_t> plain(kPlainSize + 20);
    Mr plainMr(adapter, plain.data(), plain.size(), kSourceFlags);
    // Declared with one initiator SGE: inline sends may use more (their data is copied), and
    // a provider grants more SGEs than declared (nd2-spi.md §12).
    Endpoint client(adapter, kClientQp, {.depth = 16, .sge = 1, .inlineSize = kInlineSize});
    ConnectTo(peer, client);
    for (int i = 0; i < kInlineMessages; ++i) {
      // Unregistered stack memory and a token that means nothing: both allowed for inline data.
      uint8_t stack[2 * kInlineSize];
      std::memset(stack, kFill, sizeof stack);
      Layout layout = MakeLayout(kInlineSizes[i], 0, 4, 3, i);
      ScatterPattern(layout, stack, 500 + kInlineSizes[i]);
      ND2_SGE sges[4];
      ULONG n = BuildSges(sges, layout, stack, 0xBAD0BAD0);
      IT_OK(client.qp->Send(Ctx(0x200 + i), sges, n, ND_OP_FLAG_INLINE));
      std::memset(stack, 0, sizeof stack);  // reused at once: the data was copied
    }
    // More than the QP's inline size is refused at post time, and the QP stays usable.
    uint8_t big[kInlineSize + 1] = {};
    ND2_SGE bigSge = {big, ULONG(sizeof big), 0};
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, client.qp->Send(Ctx(0x2FF), &bigSge, 1, ND_OP_FLAG_INLINE));

    Layout layout = MakeLayout(kPlainSize, 0, 3, 7, 2);
    ScatterPattern(layout, plain.data(), 500 + kPlainSize);
    ND2_SGE sges[3];
    ULONG n = BuildSges(sges, layout, plain.data(), plainMr.token());
    IT_OK(client.qp->Send(Ctx(0x200 + kInlineMessages), sges, n, 0));

    for (int i = 0; i <= kInlineMessages; ++i)
      ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200 + i), kClientQp},
                       "send completion");
    ClientTeardown(peer, client);
  });
}

// ---- 3c. many sends in flight -------------------------------------------------------------------

constexpr int kPipelined = 200;
constexpr size_t kPipeSlot = 2048;
size_t PipeSize(int i) { return i % 40 == 0 ? 0 : size_t(i) * 97 % kPipeSlot; }

IT_PEER(pipeline_server) {
  Adapter adapter;
  std::vector<uint8_t> inbox(kPipeSlot * kPipelined, kFill);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint server(adapter, kServerQp, {.depth = 256, .sge = 1});
  for (int i = 0; i < kPipelined; ++i) {
    ND2_SGE sge = {inbox.data() + i * kPipeSlot, ULONG(kPipeSlot), inboxMr.token()};
    IT_OK(server.qp->Receive(Ctx(0x1000 + i), &sge, 1));
  }
  Serve(parent, server);
  for (int i = 0; i < kPipelined; ++i) {
    std::string what = "pipelined receive " + std::to_string(i);
    ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x1000 + i),
                                       kServerQp, int64_t(PipeSize(i))},
                     what.c_str());
    CheckPattern(inbox.data() + i * kPipeSlot, PipeSize(i), 7000 + i, what.c_str());
    CheckFilled(inbox.data() + i * kPipeSlot + PipeSize(i), kPipeSlot - PipeSize(i), kFill,
                what.c_str());
  }
  ServerTeardown(parent, server);
}

TEST(IntegrationSendReceive, ManySendsInFlightCompleteInOrder) {
  RunWithPeer("pipeline_server", [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> outbox(kPipeSlot * kPipelined);
    for (int i = 0; i < kPipelined; ++i)
      FillPattern(outbox.data() + i * kPipeSlot, PipeSize(i), 7000 + i);
    Mr outboxMr(adapter, outbox.data(), outbox.size(), kSourceFlags);
    Endpoint client(adapter, kClientQp, {.depth = 256, .sge = 1});
    ConnectTo(peer, client);
    for (int i = 0; i < kPipelined; ++i) {
      ND2_SGE sge = {outbox.data() + i * kPipeSlot, ULONG(PipeSize(i)), outboxMr.token()};
      IT_OK(client.qp->Send(Ctx(0x1000 + i), &sge, PipeSize(i) ? 1 : 0, 0));
    }
    for (int i = 0; i < kPipelined; ++i)
      ExpectCompletion(client.cq.get(),
                       {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x1000 + i), kClientQp},
                       ("pipelined send " + std::to_string(i)).c_str());
    ClientTeardown(peer, client);
  });
}

// ---- 3d. a receive too small, and no receive at all ---------------------------------------------
// Both end the connection (ConnectTo returns after the server's Accept completed, so that the
// error cannot overtake the establishment).

IT_PEER(small_receive_server) {
  Adapter adapter;
  std::vector<uint8_t> inbox(100 + 4096, kFill);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint server(adapter, kServerQp, {.depth = 4});
  ND2_SGE small = {inbox.data(), 100, inboxMr.token()};
  IT_OK(server.qp->Receive(Ctx(0x100), &small, 1));
  ND2_SGE large = {inbox.data() + 100, 4096, inboxMr.token()};
  IT_OK(server.qp->Receive(Ctx(0x101), &large, 1));
  Serve(parent, server);
  // nd2-spi.md §15.1: the receive whose buffer is too small completes ND_DATA_OVERRUN.
  ExpectCompletion(server.cq.get(), {ND_DATA_OVERRUN, Nd2RequestTypeReceive, Ctx(0x100), kServerQp, -1},
                   "the receive that was too small");
  ExpectCompletion(server.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x101), kServerQp, -1},
                   "the next receive, after the connection ended");
  parent.Expect("client done");
  IT_OK(Disconnect(server.connector.get()));
}

TEST(IntegrationSendReceive, ReceiveBufferTooSmall) {
  RunWithPeer("small_receive_server", [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> buffer(200 + 64);
    FillPattern(buffer.data(), 200, 3);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Endpoint client(adapter, kClientQp, {.depth = 4, .separateCqs = true});
    ND2_SGE in = {buffer.data() + 200, 64, mr.token()};
    IT_OK(client.qp->Receive(Ctx(0x100), &in, 1));
    ConnectTo(peer, client);
    ND2_SGE out = {buffer.data(), 200, mr.token()};
    IT_OK(client.qp->Send(Ctx(0x200), &out, 1, 0));
    // The sender may learn of it (STATUS_DATA_ERROR) or not (iWARP completes sends once sent).
    ND2_RESULT r = NextCompletion(client.cq.get(), "the send to a receive too small");
    IT_CHECK_MSG(r.RequestContext == Ctx(0x200) && r.RequestType == Nd2RequestTypeSend &&
                     (r.Status == ND_SUCCESS || r.Status == STATUS_DATA_ERROR),
                 Describe(r));
    ExpectCompletion(client.receiveCq, {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100), kClientQp, -1},
                     "the client's receive after the connection ended");
    peer.Send("client done");
    IT_OK(Disconnect(client.connector.get()));
  });
}

IT_PEER(no_receive_server) {
  Adapter adapter;
  Endpoint server(adapter, kServerQp, {.depth = 4});  // and not a single receive posted
  // Serve() by hand: NotifyDisconnect is posted before the client hears "accepted" and sends.
  parent.SendValue("port", StartListening(adapter, server.listener));
  server.connector = GetConnectionRequest(adapter, server.listener.get());
  IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
  Ov notify;
  HRESULT hr = server.connector->NotifyDisconnect(notify.Prepare(server.connector.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  parent.Send("accepted");
  IT_OK(notify.Finish(hr, "NotifyDisconnect when the unexpected message ended the connection"));
  IT_OK(server.qp->Send(Ctx(0x201), nullptr, 0, 0));
  ExpectCompletion(server.cq.get(), {ND_CANCELED, Nd2RequestTypeSend, Ctx(0x201), kServerQp},
                   "a send after the connection ended");
  parent.Expect("client done");
  IT_OK(Disconnect(server.connector.get()));
}

// nd2-spi.md §3 and §12: a send that finds no receive posted at the peer completes ND_IO_TIMEOUT
// (NdSendNoReceive) when Sends are confirmed (NDWV_IWARP_CONFIRM=all); otherwise it completes
// when handed to TCP, as on an RNIC. Either way the connection is then over.
TEST(IntegrationSendReceive, SendWithNoReceivePostedAtThePeer) {
  RunWithPeer("no_receive_server", [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> buffer(128);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Endpoint client(adapter, kClientQp, {.depth = 4, .separateCqs = true});
    ND2_SGE in = {buffer.data() + 64, 64, mr.token()};
    IT_OK(client.qp->Receive(Ctx(0x100), &in, 1));
    ConnectTo(peer, client);
    ND2_SGE out = {buffer.data(), 64, mr.token()};
    IT_OK(client.qp->Send(Ctx(0x200), &out, 1, 0));
    ND2_RESULT r = NextCompletion(client.cq.get(), "the send nobody had a receive for", kWaitMs);
    // Unconfirmed, the Send completes when handed to TCP, unless the peer's refusal is read before
    // the transmit path got to complete it: then it carries the refusal. Confirmed, always that.
    bool ok = r.Status == ND_IO_TIMEOUT || (!SendsConfirmed() && r.Status == ND_SUCCESS);
    if (!ok || r.RequestType != Nd2RequestTypeSend || r.RequestContext != Ctx(0x200))
      IT_FAIL("the send nobody had a receive for: completion " + Describe(r));
    ExpectCompletion(client.receiveCq, {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100), kClientQp, -1},
                     "the client's receive after the connection ended");
    peer.Send("client done");
    IT_OK(Disconnect(client.connector.get()));
  });
}

}  // namespace
}  // namespace ndit
