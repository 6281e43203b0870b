// Disconnect with receives outstanding on both sides: the side that disconnects first sees its
// receives flushed (ND_CANCELED) before its Disconnect completes ND_SUCCESS; the other side's
// NotifyDisconnect completes ND_SUCCESS and its receives are flushed, and its own Disconnect
// afterwards still succeeds. Either side may go first, or both at once. Every request completes
// exactly once.
#include <unistd.h>

#include <cstdio>

#include <gtest/gtest.h>

#include <string>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);
constexpr int kReceives = 5;  // per side: one is used by the opening exchange, 4 stay outstanding

// The receives still outstanding, flushed in posting order.
void ExpectFlushedReceives(Endpoint& e, const char* side) {
  for (int i = 1; i < kReceives; ++i) {
    std::string what = std::string(side) + ": outstanding receive " + std::to_string(i);
    ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100 + i), e.qpContext, -1},
                     what.c_str());
  }
}

// The same, but they must be in the CQ already (Disconnect completes after the flush).
void ExpectAlreadyFlushedReceives(Endpoint& e, const char* side) {
  ND2_RESULT results[kReceives + 1];
  ULONG n = e.cq->GetResults(results, kReceives + 1);
  IT_CHECK_MSG(n == kReceives - 1, std::string(side) + ": " + std::to_string(n) +
                                       " completions in the CQ when Disconnect completed, expected " +
                                       std::to_string(kReceives - 1) + " flushed receives");
  for (ULONG i = 0; i < n; ++i) {
    const ND2_RESULT& r = results[i];
    IT_CHECK_MSG(r.Status == ND_CANCELED && r.RequestType == Nd2RequestTypeReceive &&
                     r.RequestContext == Ctx(0x100 + 1 + i) && r.QueuePairContext == e.qpContext,
                 std::string(side) + ": " + Describe(r));
  }
}

// A pending NotifyDisconnect on the side that disconnects itself still completes, once.
void ExpectNotifyEnded(Ov& notify, HRESULT issued, const char* side) {
  HRESULT hr = notify.Finish(issued, "NotifyDisconnect of the disconnecting side");
  IT_CHECK_MSG(hr == ND_SUCCESS || hr == STATUS_CONNECTION_DISCONNECTED || hr == ND_CANCELED,
               std::string(side) + ": NotifyDisconnect ended with " + StatusName(hr));
}

// The side that disconnects first.
void DisconnectFirst(Channel& channel, Endpoint& e, const char* side) {
  Ov notify;
  HRESULT issued = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
  IT_CHECK_HR(ND_PENDING, issued);
  channel.Expect("notify posted");
  IT_OK(Disconnect(e.connector.get()));
  ExpectAlreadyFlushedReceives(e, side);
  channel.Send("disconnected first");
  ExpectNotifyEnded(notify, issued, side);
  channel.Expect("done");
  ExpectNoCompletion(e.cq.get(), side);
}

// The side whose peer disconnects.
void DisconnectedByPeer(Channel& channel, Endpoint& e, const char* side) {
  Ov notify;
  HRESULT hr = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
  IT_CHECK_HR(ND_PENDING, hr);  // nothing has happened yet
  channel.Send("notify posted");
  IT_OK(notify.Finish(hr, "NotifyDisconnect"));
  ExpectFlushedReceives(e, side);
  channel.Expect("disconnected first");
  // After the peer's close only the flush is left, and it has run: the Disconnect (still
  // ND_SUCCESS) has ended by the time it returns, with no hand-off to another thread.
  Ov disconnect;
  HRESULT issued = e.connector->Disconnect(disconnect.Prepare(e.connector.get()));
  IT_CHECK_MSG(issued != ND_PENDING || disconnect.Completed(),
               std::string(side) + ": a Disconnect after the peer's was still pending when it returned");
  IT_OK(disconnect.Finish(issued, "Disconnect after the peer's"));
  ExpectNoCompletion(e.cq.get(), side);
  channel.Send("done");
}

// Both sides at once.
void DisconnectTogether(Channel& channel, Endpoint& e, const char* side) {
  Ov notify;
  HRESULT issued = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
  IT_CHECK_HR(ND_PENDING, issued);
  channel.Barrier("disconnect now");
  IT_OK(Disconnect(e.connector.get()));  // ND_SUCCESS, not ND_TIMEOUT: the closes crossed
  ExpectAlreadyFlushedReceives(e, side);
  ExpectNotifyEnded(notify, issued, side);
  channel.Barrier("done");
  ExpectNoCompletion(e.cq.get(), side);
}

enum class Mode { ClientFirst, ServerFirst, Together };

// Both sides: receives posted, connected, one message each way, then the teardown of `mode`.
void RunSide(Channel& channel, bool server, Mode mode) {
  Adapter adapter;
  std::vector<uint8_t> buffer(kReceives * 64 + 64);
  Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
  Endpoint e(adapter, server ? kServerQp : kClientQp, {.depth = 8});
  for (int i = 0; i < kReceives; ++i) {
    ND2_SGE sge = {buffer.data() + 64 * i, 64, mr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  ND2_SGE out = {buffer.data() + kReceives * 64, 32, mr.token()};
  const char* side = server ? "server" : "client";
  if (server) {
    Serve(channel, e);
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), kServerQp, 32},
                     "server: the client's message");
    IT_OK(e.qp->Send(Ctx(0x200), &out, 1, 0));
  } else {
    ConnectTo(channel, e);
    IT_OK(e.qp->Send(Ctx(0x200), &out, 1, 0));
  }
  // Completion order across the two queues is not defined: collect both.
  bool sent = false, received = false;
  for (int i = 0; i < 2; ++i) {
    ND2_RESULT r = NextCompletion(e.cq.get(), "the opening exchange");
    IT_CHECK_MSG(r.Status == ND_SUCCESS, Describe(r));
    if (r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x200) && !sent) {
      sent = true;
    } else if (r.RequestType == Nd2RequestTypeReceive && r.RequestContext == Ctx(0x100) &&
               r.BytesTransferred == 32 && !received && !server) {
      received = true;
    } else {
      IT_FAIL(std::string(side) + ": unexpected completion " + Describe(r));
    }
    if (server) break;  // the server consumed its receive above
  }

  bool first = (mode == Mode::ClientFirst) != server;
  if (mode == Mode::Together)
    DisconnectTogether(channel, e, side);
  else if (first)
    DisconnectFirst(channel, e, side);
  else
    DisconnectedByPeer(channel, e, side);
}

Mode ParseMode(const std::string& name) {
  if (name == "client_first") return Mode::ClientFirst;
  if (name == "server_first") return Mode::ServerFirst;
  if (name == "together") return Mode::Together;
  IT_FAIL("unknown mode " + name);
}

IT_PEER(disconnect_server) { RunSide(parent, true, ParseMode(args.Get("mode"))); }

void RunMode(const char* mode) {
  RunWithPeer("disconnect_server", {{"mode", mode}},
              [&](Channel& peer) { RunSide(peer, false, ParseMode(mode)); });
}

TEST(IntegrationDisconnect, ClientDisconnectsFirstWithReceivesOutstanding) { RunMode("client_first"); }
TEST(IntegrationDisconnect, ServerDisconnectsFirstWithReceivesOutstanding) { RunMode("server_first"); }
TEST(IntegrationDisconnect, BothDisconnectAtOnce) { RunMode("together"); }

// ---- the active side sends and disconnects right after CompleteConnect --------------------------

constexpr int kQuickRounds = 50;  // one connection each: the races are short

// The connection was established and carried a message before the client left: Accept succeeds,
// the message is received, the rest is flushed, and the teardown still succeeds.
IT_PEER(quick_close_server) {
  Adapter adapter;
  Ref<IND2Listener> listener;
  parent.SendValue("port", StartListening(adapter, listener));
  for (int round = 0; round < kQuickRounds; ++round) {
    std::vector<uint8_t> inbox(128, 0xEE);
    Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
    Endpoint e(adapter, kServerQp, {.depth = 4});
    for (int i = 0; i < 2; ++i) {
      ND2_SGE sge = {inbox.data() + 64 * i, 64, mr.token()};
      IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
    }
    e.connector = GetConnectionRequest(adapter, listener.get());
    HRESULT accepted = Accept(e.connector.get(), e.qp.get(), 0, 0);
    IT_CHECK_MSG(accepted == ND_SUCCESS,
                 "round " + std::to_string(round) + ": Accept returned " + StatusName(accepted));
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), kServerQp, 32},
                     "the client's only message");
    CheckPattern(inbox.data(), 32, 4000 + round, "the client's only message");
    ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x101), kServerQp, -1},
                     "the receive left when the client disconnected");
    Ov notify;
    HRESULT hr = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
    IT_OK(notify.Finish(hr, "NotifyDisconnect after the peer left"));
    IT_OK(Disconnect(e.connector.get()));
    ExpectNoCompletion(e.cq.get(), "server CQ", 5);
    parent.Send("round " + std::to_string(round) + " done");
  }
}

TEST(IntegrationDisconnect, ActiveSideSendsAndDisconnectsRightAfterConnecting) {
  RunWithPeer("quick_close_server", [](Channel& peer) {
    Adapter adapter;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    for (int round = 0; round < kQuickRounds; ++round) {
      std::vector<uint8_t> message(32);
      FillPattern(message.data(), message.size(), 4000 + round);
      Mr mr(adapter, message.data(), message.size(), kSourceFlags);
      Endpoint e(adapter, kClientQp, {.depth = 4});
      e.connector = adapter.CreateConnector();
      IT_OK(Connect(e.connector.get(), e.qp.get(), port, 0, 0));
      CompleteConnect(e.connector.get());
      ND2_SGE sge = {message.data(), 32, mr.token()};
      IT_OK(e.qp->Send(Ctx(0x200), &sge, 1, 0));
      ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kClientQp},
                       "the only message");
      IT_OK(Disconnect(e.connector.get()));
      peer.Expect("round " + std::to_string(round) + " done");
    }
  });
}

// ---- the passive side disconnects as soon as the message arrived --------------------------------

// A Send the peer received completes ND_SUCCESS even when the peer disconnects right after
// receiving it: whatever acknowledges it (the ACK on RoCE, the answer to the confirming probe
// with NDWV_IWARP_CONFIRM=all) leaves before the peer's close. The server waits the blocking way,
// so the progress engine, not a poller, takes the message in while the Disconnect starts.
IT_PEER(receive_then_disconnect_server) {
  Adapter adapter;
  Ref<IND2Listener> listener;
  parent.SendValue("port", StartListening(adapter, listener));
  for (int round = 0; round < kQuickRounds; ++round) {
    std::vector<uint8_t> inbox(64);
    Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
    Endpoint e(adapter, kServerQp, {.depth = 4});
    ND2_SGE sge = {inbox.data(), 64, mr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100), &sge, 1));
    e.connector = GetConnectionRequest(adapter, listener.get());
    IT_OK(Accept(e.connector.get(), e.qp.get(), 0, 0));
    Ov arrived;
    HRESULT hr = e.cq->Notify(ND_CQ_NOTIFY_ANY, arrived.Prepare(e.cq.get()));
    parent.Send("armed");
    IT_OK(arrived.Finish(hr, "Notify for the client's message"));
    ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), kServerQp, 32},
                     "the client's message");
    IT_OK(Disconnect(e.connector.get()));
    parent.Send("round " + std::to_string(round) + " done");
  }
}

TEST(IntegrationDisconnect, SendCompletesWhenThePeerDisconnectsRightAfterReceivingIt) {
  RunWithPeer("receive_then_disconnect_server", [](Channel& peer) {
    Adapter adapter;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    for (int round = 0; round < kQuickRounds; ++round) {
      std::vector<uint8_t> message(32, uint8_t(round));
      Mr mr(adapter, message.data(), message.size(), kSourceFlags);
      Endpoint e(adapter, kClientQp, {.depth = 4});
      e.connector = adapter.CreateConnector();
      IT_OK(Connect(e.connector.get(), e.qp.get(), port, 0, 0));
      CompleteConnect(e.connector.get());
      peer.Expect("armed");
      ND2_SGE sge = {message.data(), 32, mr.token()};
      IT_OK(e.qp->Send(Ctx(0x200), &sge, 1, 0));
      std::string what = "round " + std::to_string(round) + ": the message the server received";
      ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kClientQp}, what.c_str());
      peer.Expect("round " + std::to_string(round) + " done");
      IT_OK(Disconnect(e.connector.get()));
    }
  });
}

// ---- the peer goes away without Disconnect -----------------------------------------------------

// The client connects, then either releases its QP and connector without Disconnect, or its
// process exits. Either way the server's NotifyDisconnect completes, its receives are flushed,
// and its Disconnect succeeds.
// Serves one client with three receives posted, says "ready", and checks what the client's
// going away (however it went) does here: NotifyDisconnect completes, the receives are flushed,
// Disconnect succeeds, nothing else completes.
void ServeUntilTheClientIsGone(Channel& client, const char* how) {
  Adapter adapter;
  std::vector<uint8_t> inbox(3 * 64);
  Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint e(adapter, kServerQp, {.depth = 4});
  for (int i = 0; i < 3; ++i) {
    ND2_SGE sge = {inbox.data() + 64 * i, 64, mr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  Serve(client, e);
  Ov notify;
  HRESULT hr = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  client.Send("ready");
  IT_OK(notify.Finish(hr, (std::string("NotifyDisconnect when ") + how).c_str()));
  for (int i = 0; i < 3; ++i)
    ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100 + i), kServerQp, -1},
                     (std::string("a receive outstanding when ") + how).c_str());
  IT_OK(Disconnect(e.connector.get()));
  ExpectNoCompletion(e.cq.get(), "server CQ", 50);
}

IT_PEER(abandoned_server) {
  ServeUntilTheClientIsGone(parent, "the client went away");
  parent.Send("server done");
}

IT_PEER(vanishing_client) {
  Adapter adapter;
  Endpoint e(adapter, kClientQp, {.depth = 4});
  ConnectTo(parent, e);
  parent.Expect("ready");
  std::fflush(nullptr);
  _exit(0);  // no Disconnect, no Release, no NdCleanup: the process is simply gone
}

TEST(IntegrationDisconnect, PeerProcessExitsWithoutDisconnect) {
  RunWithPeer("vanishing_client", [](Channel& client) {
    // This process serves; the channel to the client carries the port and "ready".
    ServeUntilTheClientIsGone(client, "the client process exited");
  });
}

TEST(IntegrationDisconnect, ReleaseWithoutDisconnect) {
  RunWithPeer("abandoned_server", [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> inbox(2 * 64);
    Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
    Endpoint e(adapter, kClientQp, {.depth = 4});
    for (int i = 0; i < 2; ++i) {
      ND2_SGE sge = {inbox.data() + 64 * i, 64, mr.token()};
      IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
    }
    ConnectTo(peer, e);
    peer.Expect("ready");
    // The QP first, while the connector still refers to it; then the connector.
    e.qp.Reset();
    e.connector.Reset();
    // Completions of a released QP can still be dequeued: its receives were flushed.
    for (int i = 0; i < 2; ++i)
      ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100 + i), kClientQp, -1},
                       "a receive of the released QP");
    peer.Expect("server done");
  });
}

}  // namespace
}  // namespace ndit

namespace ndit {
namespace {

// ---- a connector disconnects once ----------------------------------------------------------------

IT_PEER(disconnect_twice_server) {
  Adapter adapter;
  Endpoint e(adapter, Ctx(0x5E), {.depth = 4});
  Serve(parent, e);
  ServerTeardown(parent, e);  // after the client's: succeeds, only the flush is left
  IT_CHECK_HR(ND_CONNECTION_INVALID, Disconnect(e.connector.get()));
}

// The second Disconnect of a connector, after its first completed, is refused; so on the side
// whose peer went first.
TEST(IntegrationDisconnect, SecondDisconnectIsInvalid) {
  RunWithPeer("disconnect_twice_server", [](Channel& peer) {
    Adapter adapter;
    Endpoint client(adapter, Ctx(0xC1), {.depth = 4});
    ConnectTo(peer, client);
    ClientTeardown(peer, client);
    IT_CHECK_HR(ND_CONNECTION_INVALID, Disconnect(client.connector.get()));
  });
}

}  // namespace
}  // namespace ndit

namespace ndit {
namespace {

// ---- objects released in other orders, requests pending -----------------------------------------

// The client releases everything without Disconnect, in the order given (the CQ or the adapter
// first, while the QP and connector still use them), with receives pending. Its own
// requests are flushed (counted before the CQ goes, or unobservable after: then only no crash, no
// leak under the sanitizers); the server sees the connection end and each of its requests complete
// exactly once (ServeUntilTheClientIsGone).
class IntegrationRelease : public ::testing::TestWithParam<const char*> {};

TEST_P(IntegrationRelease, EveryRequestCompletesOnceWhateverIsReleasedFirst) {
  const std::string order = GetParam();
  RunWithPeer("abandoned_server", [&](Channel& peer) {
    auto adapter = std::make_unique<Adapter>();
    std::vector<uint8_t> inbox(2 * 64);
    auto mr = std::make_unique<Mr>(*adapter, inbox.data(), inbox.size(), kSinkFlags);
    auto e = std::make_unique<Endpoint>(*adapter, kClientQp, Shape{.depth = 4});
    for (int i = 0; i < 2; ++i) {
      ND2_SGE sge = {inbox.data() + 64 * i, 64, mr->token()};
      IT_OK(e->qp->Receive(Ctx(0x100 + i), &sge, 1));
    }
    ConnectTo(peer, *e);
    peer.Expect("ready");
    if (order == "cq_first") {
      e->cq.Reset();         // the QP still holds it: its completions have somewhere to go
      e->qp.Reset();
      e->connector.Reset();
      mr.reset();
      adapter.reset();
    } else {                 // adapter_first: every object keeps what it uses alive
      mr.reset();
      adapter.reset();
      e->connector.Reset();
      for (int i = 0; i < 2; ++i)  // the QP is still there: its receives were flushed by the close
        ExpectCompletion(e->cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100 + i), kClientQp, -1},
                         "a receive after the adapter and connector were released");
      ExpectNoCompletion(e->cq.get(), "client CQ", 50);
      e->qp.Reset();
    }
    e.reset();
    peer.Expect("server done");
  });
}

INSTANTIATE_TEST_SUITE_P(Order, IntegrationRelease, ::testing::Values("cq_first", "adapter_first"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// ---- a QP that failed on a local error -----------------------------------------------------------

// A Send from memory its token does not cover fails at once (ND_ACCESS_VIOLATION) and takes the QP
// to Error with the connection still up. Its Disconnect then succeeds without waiting for the peer.
// (On iWARP the stream closes its socket with the QP and no longer reads the peer's close; before
// the connection manager was told, Disconnect waited NDWV_DISCONNECT_TIMEOUT_MS and ended
// ND_TIMEOUT.) On iWARP that close ends the connection, so NotifyDisconnect completes on both
// sides; on RoCE the CM connection stays up until the Disconnect, as an HCA's QP error does not
// disconnect, and the peer hears of it by the DREQ.
// Either side: one 64-byte receive (Ctx(0x100)) posted before the connection.
struct OneReceiveSide {
  explicit OneReceiveSide(void* qpContext) : e(adapter, qpContext, {.depth = 4}) {
    ND2_SGE sge = {inbox.data(), ULONG(inbox.size()), mr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100), &sge, 1));
  }
  Adapter adapter;
  std::vector<uint8_t> inbox = std::vector<uint8_t>(64);
  Mr mr{adapter, inbox.data(), inbox.size(), kSinkFlags};
  Endpoint e;
};

IT_PEER(local_error_server) {
  OneReceiveSide side(kServerQp);
  Endpoint& e = side.e;
  Serve(parent, e);
  Ov notify;
  HRESULT hr = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
  parent.Send("notify posted");
  IT_OK(notify.Finish(hr, "NotifyDisconnect when the client's QP failed"));
  ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100), kServerQp, -1},
                   "server: the receive, flushed");
  IT_OK(Disconnect(e.connector.get()));
  ExpectNoCompletion(e.cq.get(), "server");
  parent.Send("server done");
}

TEST(IntegrationDisconnect, AQpFailedOnALocalErrorDisconnectsWithoutWaitingForThePeer) {
  RunWithPeer("local_error_server", [](Channel& peer) {
    OneReceiveSide side(kClientQp);
    Endpoint& e = side.e;
    std::vector<uint8_t> unregistered(32);
    ConnectTo(peer, e);
    Ov notify;
    HRESULT issued = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
    IT_CHECK_HR(ND_PENDING, issued);
    peer.Expect("notify posted");
    ND2_SGE outside = {unregistered.data(), 32, side.mr.token()};
    IT_OK(e.qp->Send(Ctx(0x200), &outside, 1, 0));
    ExpectCompletion(e.cq.get(), {ND_ACCESS_VIOLATION, Nd2RequestTypeSend, Ctx(0x200), kClientQp, -1},
                     "client: the Send from memory its token does not cover");
    ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x100), kClientQp, -1},
                     "client: the receive, flushed");
    if (!TransportIsRoce()) IT_OK(notify.Finish(issued, "NotifyDisconnect once the stream closed"));
    IT_OK(Disconnect(e.connector.get()));  // ND_SUCCESS, not ND_TIMEOUT
    if (TransportIsRoce()) ExpectNotifyEnded(notify, issued, "client");
    peer.Expect("server done");
    ExpectNoCompletion(e.cq.get(), "client");
  });
}

}  // namespace
}  // namespace ndit
