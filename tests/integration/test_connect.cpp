// Connection establishment between two processes: private data and read limits both ways, the
// getters' size protocols, local and peer addresses, and the three ways to be refused (passive
// Reject, no listener, active Reject or release before CompleteConnect).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <ndwv/ndwv.h>

#include "harness.h"

namespace ndit {
namespace {

constexpr uint64_t kClientDataSeed = 101;
constexpr uint64_t kServerDataSeed = 202;
constexpr uint64_t kRejectDataSeed = 404;

std::string Num(uint64_t value) { return std::to_string(value); }

// GetPrivateData as the SPI describes it: the (NULL, &0) probe, a short buffer that still gets
// the first bytes, and an exact copy into a larger buffer (whose tail stays untouched).
void CheckPrivateData(IND2Connector* connector, ULONG length, uint64_t seed, const char* side) {
  std::string what = std::string(side) + " GetPrivateData";
  const ULONG reported = TransportIsRoce() ? 56 : length;  // RoCE: padded, see TransportIsRoce
  ULONG size = 0;
  HRESULT hr = connector->GetPrivateData(nullptr, &size);
  IT_CHECK_HR(reported == 0 ? ND_SUCCESS : ND_BUFFER_OVERFLOW, hr);
  IT_CHECK_EQ(reported, size);
  if (length > 1) {
    std::vector<uint8_t> partial(length, 0xEE);
    ULONG half = length / 2;
    size = half;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, connector->GetPrivateData(partial.data(), &size));
    IT_CHECK_EQ(reported, size);
    CheckPattern(partial.data(), half, seed, (what + " (short buffer)").c_str());
    CheckFilled(partial.data() + half, length - half, 0xEE, (what + " (short buffer tail)").c_str());
  }
  std::vector<uint8_t> full(reported + 8, 0xEE);
  size = ULONG(full.size());
  IT_OK(connector->GetPrivateData(full.data(), &size));
  IT_CHECK_EQ(reported, size);
  CheckPattern(full.data(), length, seed, what.c_str());
  CheckFilled(full.data() + length, reported - length, 0, (what + " (padding)").c_str());
  CheckFilled(full.data() + reported, 8, 0xEE, (what + " (beyond the data)").c_str());
}

void CheckReadLimits(IND2Connector* connector, ULONG inbound, ULONG outbound) {
  ULONG in = 0xDEAD, out = 0xDEAD;
  IT_OK(connector->GetReadLimits(&in, &out));
  IT_CHECK_EQ(inbound, in);
  IT_CHECK_EQ(outbound, out);
  // Either pointer is optional.
  in = 0xDEAD;
  IT_OK(connector->GetReadLimits(&in, nullptr));
  IT_CHECK_EQ(inbound, in);
  out = 0xDEAD;
  IT_OK(connector->GetReadLimits(nullptr, &out));
  IT_CHECK_EQ(outbound, out);
}

enum class Which { Local, Peer };

// GetLocalAddress / GetPeerAddress with the size probe: ND_BUFFER_OVERFLOW and the size, then the
// address, which is on 127.0.0.1.
sockaddr_in Address(IND2Connector* connector, Which which) {
  auto get = [&](sockaddr* address, ULONG* size) {
    return which == Which::Local ? connector->GetLocalAddress(address, size)
                                 : connector->GetPeerAddress(address, size);
  };
  ULONG size = 0;
  IT_CHECK_HR(ND_BUFFER_OVERFLOW, get(nullptr, &size));
  IT_CHECK_EQ(ULONG(sizeof(sockaddr_in)), size);
  sockaddr_in address{};
  size = sizeof address;
  IT_OK(get(reinterpret_cast<sockaddr*>(&address), &size));
  IT_CHECK_EQ(ULONG(sizeof(sockaddr_in)), size);
  IT_CHECK_EQ(AF_INET, int(address.sin_family));
  IT_CHECK_EQ(htonl(INADDR_LOOPBACK), address.sin_addr.s_addr);
  IT_CHECK(PortOf(address) != 0);
  return address;
}

// ---- 1. private data, read limits and addresses -------------------------------------------------

// The passive side: checks what the client asked for, then accepts with its own limits and data.
IT_PEER(connect_server) {
  Adapter adapter;
  Endpoint server(adapter, Ctx(0x5E));
  uint16_t port = StartListening(adapter, server.listener);
  parent.SendValue("port", port);
  Ref<IND2Connector> connector = GetConnectionRequest(adapter, server.listener.get());

  CheckPrivateData(connector.get(), ULONG(args.GetNumber("client_data")), kClientDataSeed,
                   "server");
  CheckReadLimits(connector.get(), ULONG(args.GetNumber("server_sees_in")),
                  ULONG(args.GetNumber("server_sees_out")));
  // The peer's address is known as soon as the request is (ndmpic relies on it).
  sockaddr_in peerBefore = Address(connector.get(), Which::Peer);

  ULONG dataLength = ULONG(args.GetNumber("server_data"));
  std::vector<uint8_t> data(adapter.info().MaxCalleeData + 1);
  FillPattern(data.data(), data.size(), kServerDataSeed);
  ULONG ird = ULONG(args.GetNumber("server_ird")), ord = ULONG(args.GetNumber("server_ord"));
  if (args.Get("oversized_accept_first") == "1") {
    // Too much private data is refused and leaves the connector ready for a proper Accept.
    Ov ov;
    HRESULT hr = connector->Accept(server.qp.get(), ird, ord, data.data(),
                                   adapter.info().MaxCalleeData + 1, ov.Prepare(connector.get()));
    IT_CHECK_HR(ND_INVALID_BUFFER_SIZE, ov.Finish(hr, "oversized Accept"));
  }
  IT_OK(Accept(connector.get(), server.qp.get(), ird, ord, data.data(), dataLength));

  sockaddr_in local = Address(connector.get(), Which::Local);
  sockaddr_in peer = Address(connector.get(), Which::Peer);
  IT_CHECK_EQ(port, PortOf(local));
  IT_CHECK_EQ(PortOf(peerBefore), PortOf(peer));
  parent.SendValue("server_local_port", PortOf(local));
  parent.SendValue("server_peer_port", PortOf(peer));

  // The client disconnects first; ours must still succeed, with the peer gone.
  parent.Expect("client disconnected");
  IT_OK(Disconnect(connector.get()));
}

struct LimitsCase {
  ULONG clientIrd, clientOrd, clientData;
  ULONG serverIrd, serverOrd, serverData;
  bool oversizedFirst;
};

void ConnectScenario(Adapter& adapter, Channel& peer, const LimitsCase& c) {
  Endpoint client(adapter, Ctx(0xC1));
  uint16_t port = uint16_t(peer.ReceiveValue("port"));
  client.connector = adapter.CreateConnector();
  IND2Connector* connector = client.connector.get();
  sockaddr_in local = Loopback(0);
  IT_OK(connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
  sockaddr_in server = Loopback(port);
  std::vector<uint8_t> data(adapter.info().MaxCallerData + 1);
  FillPattern(data.data(), data.size(), kClientDataSeed);

  if (c.oversizedFirst) {
    // More than MaxCallerData: refused, and the connector stays usable (nd2-spi.md §14.1).
    Ov ov;
    HRESULT hr = connector->Connect(client.qp.get(), reinterpret_cast<sockaddr*>(&server),
                                    sizeof server, c.clientIrd, c.clientOrd, data.data(),
                                    adapter.info().MaxCallerData + 1, ov.Prepare(connector));
    IT_CHECK_HR(ND_INVALID_BUFFER_SIZE, ov.Finish(hr, "oversized Connect"));
  }
  Ov ov;
  HRESULT hr = connector->Connect(client.qp.get(), reinterpret_cast<sockaddr*>(&server),
                                  sizeof server, c.clientIrd, c.clientOrd, data.data(),
                                  c.clientData, ov.Prepare(connector));
  IT_OK(ov.Finish(hr, "IND2Connector::Connect"));

  // What the server answered, before CompleteConnect.
  const ND2_ADAPTER_INFO& info = adapter.info();
  ULONG capIn = info.MaxInboundReadLimit, capOut = info.MaxOutboundReadLimit;
  ULONG offeredIrd = std::min(c.clientIrd, capIn), offeredOrd = std::min(c.clientOrd, capOut);
  ULONG serverIrd = std::min({c.serverIrd, capIn, offeredOrd});
  ULONG serverOrd = std::min({c.serverOrd, capOut, offeredIrd});
  CheckPrivateData(connector, c.serverData, kServerDataSeed, "client");
  CheckReadLimits(connector, std::min(serverOrd, capIn), std::min(serverIrd, capOut));
  sockaddr_in mine = Address(connector, Which::Local);
  sockaddr_in theirs = Address(connector, Which::Peer);
  IT_CHECK_EQ(port, PortOf(theirs));

  CompleteConnect(connector);
  IT_CHECK_EQ(uint64_t(port), peer.ReceiveValue("server_local_port"));
  IT_CHECK_EQ(uint64_t(PortOf(mine)), peer.ReceiveValue("server_peer_port"));
  IT_OK(Disconnect(connector));
  peer.Send("client disconnected");
}

void RunLimitsCase(const LimitsCase& c) {
  Adapter adapter;  // the peer's adapter has the same limits: one device per host
  const ND2_ADAPTER_INFO& info = adapter.info();
  ULONG capIn = info.MaxInboundReadLimit, capOut = info.MaxOutboundReadLimit;
  // The server sees the client's limits clamped by both adapters.
  std::map<std::string, std::string> args = {
      {"client_data", Num(c.clientData)},
      {"server_sees_in", Num(std::min({c.clientOrd, capOut, capIn}))},
      {"server_sees_out", Num(std::min({c.clientIrd, capIn, capOut}))},
      {"server_ird", Num(c.serverIrd)},
      {"server_ord", Num(c.serverOrd)},
      {"server_data", Num(c.serverData)},
      {"oversized_accept_first", c.oversizedFirst ? "1" : "0"},
  };
  RunWithPeer("connect_server", args, [&](Channel& peer) { ConnectScenario(adapter, peer, c); });
}

TEST(IntegrationConnect, PrivateDataAndReadLimitsBothWays) {
  Adapter probe;
  // The whole of MaxCallerData one way, an odd size the other; limits within the caps.
  RunLimitsCase({3, 5, probe.info().MaxCallerData, 4, 2, 17, true});
}

TEST(IntegrationConnect, ReadLimitsAreClampedAndEmptyPrivateData) {
  // Asking for more than the adapter has gets the adapter's caps; the passive side is further
  // held to what the active side offered.
  RunLimitsCase({7, 0xFFFFFFFF, 0, 0xFFFFFFFF, 0xFFFFFFFF, 0, false});
}

TEST(IntegrationConnect, MaxCalleeDataAndZeroReadLimits) {
  Adapter probe;
  RunLimitsCase({0, 0, 1, 0, 0, probe.info().MaxCalleeData, false});
}

// ---- 2. refusals --------------------------------------------------------------------------------

// Rejects the first request with private data; with then_accept=1 accepts the next one and
// receives one message on it.
IT_PEER(reject_server) {
  Adapter adapter;
  Endpoint server(adapter, Ctx(0x5E));
  std::vector<uint8_t> inbox(256, 0xEE);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  uint16_t port = StartListening(adapter, server.listener);
  parent.SendValue("port", port);

  Ref<IND2Connector> first = GetConnectionRequest(adapter, server.listener.get());
  CheckPrivateData(first.get(), 9, kClientDataSeed, "server");
  uint8_t data[20];
  FillPattern(data, sizeof data, kRejectDataSeed);
  IT_OK(first->Reject(data, sizeof data));

  if (args.Get("then_accept") == "1") {
    ND2_SGE sge = {inbox.data(), ULONG(inbox.size()), inboxMr.token()};
    IT_OK(server.qp->Receive(Ctx(0x100), &sge, 1));
    Ref<IND2Connector> second = GetConnectionRequest(adapter, server.listener.get());
    CheckPrivateData(second.get(), 9, kClientDataSeed, "server (second request)");
    IT_OK(Accept(second.get(), server.qp.get(), 1, 1));
    ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), Ctx(0x5E), 100},
                     "receive on the retried connection");
    CheckPattern(inbox.data(), 100, 7, "message on the retried connection");
    CheckFilled(inbox.data() + 100, inbox.size() - 100, 0xEE, "receive buffer beyond the message");
    parent.Expect("client disconnected");
    IT_OK(Disconnect(second.get()));
  } else {
    parent.Expect("done");
  }
}

TEST(IntegrationReject, PassiveRejectRefusesConnectWithPrivateData) {
  RunWithPeer("reject_server", [](Channel& peer) {
    Adapter adapter;
    Endpoint client(adapter, Ctx(0xC1));
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    client.connector = adapter.CreateConnector();
    uint8_t data[9];
    FillPattern(data, sizeof data, kClientDataSeed);
    IT_CHECK_HR(ND_CONNECTION_REFUSED,
                Connect(client.connector.get(), client.qp.get(), port, 1, 1, data, sizeof data));
    CheckPrivateData(client.connector.get(), 20, kRejectDataSeed, "client (reject data)");
    peer.Send("done");
  });
}

TEST(IntegrationReject, ConnectCanBeRetriedAfterReject) {
  RunWithPeer("reject_server", {{"then_accept", "1"}}, [](Channel& peer) {
    Adapter adapter;
    Endpoint client(adapter, Ctx(0xC1));
    std::vector<uint8_t> message(100);
    FillPattern(message.data(), message.size(), 7);
    Mr messageMr(adapter, message.data(), message.size(), kSourceFlags);
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    client.connector = adapter.CreateConnector();
    IND2Connector* connector = client.connector.get();
    uint8_t data[9];
    FillPattern(data, sizeof data, kClientDataSeed);
    IT_CHECK_HR(ND_CONNECTION_REFUSED,
                Connect(connector, client.qp.get(), port, 1, 1, data, sizeof data));
    // Retry on the same connector and QP (REFUSED allows it; the QP is left as it was).
    sockaddr_in server = Loopback(port);
    Ov ov;
    HRESULT hr = connector->Connect(client.qp.get(), reinterpret_cast<sockaddr*>(&server),
                                    sizeof server, 1, 1, data, sizeof data, ov.Prepare(connector));
    IT_OK(ov.Finish(hr, "second Connect"));
    CompleteConnect(connector);
    ND2_SGE sge = {message.data(), ULONG(message.size()), messageMr.token()};
    IT_OK(client.qp->Send(Ctx(0x200), &sge, 1, 0));
    ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), Ctx(0xC1)},
                     "send on the retried connection");
    IT_OK(Disconnect(connector));
    peer.Send("client disconnected");
  });
}

TEST(IntegrationReject, ConnectToPortWithoutListenerIsRefused) {
  RunLocal([] {
    // A port that is certainly not listening: bound by us, without listen().
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    IT_CHECK(fd >= 0);
    sockaddr_in address = Loopback(0);
    IT_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    IT_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    struct Closer {
      int fd;
      ~Closer() { close(fd); }
    } closer{fd};

    Adapter adapter;
    Endpoint client(adapter, Ctx(0xC1));
    client.connector = adapter.CreateConnector();
    IT_CHECK_HR(ND_CONNECTION_REFUSED,
                Connect(client.connector.get(), client.qp.get(), PortOf(address), 1, 1));
  });
}

// Accepts two requests; each time the active side gives up before CompleteConnect, so Accept
// completes ND_CONNECTION_REFUSED.
IT_PEER(accept_refused_server) {
  Adapter adapter;
  Ref<IND2Listener> listener;
  uint16_t port = StartListening(adapter, listener);
  parent.SendValue("port", port);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    Endpoint server(adapter, Ctx(0x5E));
    Ref<IND2Connector> connector = GetConnectionRequest(adapter, listener.get());
    IT_CHECK_HR(ND_CONNECTION_REFUSED, Accept(connector.get(), server.qp.get(), 1, 1));
    parent.Send("attempt " + std::to_string(attempt) + " refused");
  }
}

TEST(IntegrationReject, ActiveRejectOrReleaseRefusesAccept) {
  RunWithPeer("accept_refused_server", [](Channel& peer) {
    Adapter adapter;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    {
      // 1: Connect completes, then the active side Rejects instead of CompleteConnect.
      Endpoint client(adapter, Ctx(0xC1));
      client.connector = adapter.CreateConnector();
      IT_OK(Connect(client.connector.get(), client.qp.get(), port, 1, 1));
      IT_OK(client.connector->Reject(nullptr, 0));
      peer.Expect("attempt 1 refused");
    }
    {
      // 2: Connect completes, then the connector is released without CompleteConnect.
      Endpoint client(adapter, Ctx(0xC1));
      client.connector = adapter.CreateConnector();
      IT_OK(Connect(client.connector.get(), client.qp.get(), port, 1, 1));
      IT_CHECK_EQ(0u, client.connector.Reset());
      peer.Expect("attempt 2 refused");
    }
  });
}

// One connection; the client disconnects first, so on iWARP its port is left in TIME_WAIT.
IT_PEER(one_connection_server) {
  Adapter adapter;
  Endpoint server(adapter, Ctx(0x5E));
  Serve(parent, server);
  ServerTeardown(parent, server);
}

// A port held only by a closed connection is free for the next Bind (ndconn-style reconnects
// from a fixed port), and the connector bound to it holds it again: a third Bind is refused.
// The first connection's port is the kernel's choice (port 0), which the kernel may also give
// to another program's connection to another peer at the same time (a port serves any number of
// address pairs). Then the port is in use, and the Bind rightly refused: that is seen in
// /proc/net/tcp (a socket on the port other than our connection's TIME_WAIT: in another state,
// or to another peer, whose own TIME_WAIT may hold the port), and the case is tried again.
TEST(IntegrationConnect, PortOfAClosedConnectionCanBeBoundAgain) {
  for (int attempt = 1;; ++attempt) {
    bool shared = false;
    uint16_t port = 0;
    RunWithPeer("one_connection_server", [&](Channel& peer) {
      Adapter adapter;
      sockaddr_in local{}, remote{};
      {
        Endpoint client(adapter, Ctx(0xC1));
        ConnectTo(peer, client);
        ULONG size = sizeof local;
        IT_OK(client.connector->GetLocalAddress(reinterpret_cast<sockaddr*>(&local), &size));
        size = sizeof remote;
        IT_OK(client.connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&remote), &size));
        ClientTeardown(peer, client);
      }
      // iWARP: at once (TCP's TIME_WAIT does not count). RoCE: once the IB CM time-wait
      // (NDWV_ROCE_TIMEWAIT_MS) let go of the port.
      Ref<IND2Connector> again = adapter.CreateConnector();
      Deadline deadline;
      unsigned spins = 0;
      HRESULT hr;
      while ((hr = again->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local)) == ND_SHARING_VIOLATION &&
             TransportIsRoce() && !deadline.Expired())
        Pause(spins);
      if (hr == ND_SHARING_VIOLATION && !TransportIsRoce()) {
        port = PortOf(local);
        for (const TcpSocket& socket : TcpSocketsOn(port))
          shared |= (socket.state != 0x05 && socket.state != 0x06) || socket.remote_port != PortOf(remote);
        if (shared) return;
      }
      IT_OK(hr);
      Ref<IND2Connector> third = adapter.CreateConnector();
      IT_CHECK_HR(ND_SHARING_VIOLATION, third->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
    });
    if (!shared) return;
    std::printf("[ INFO     ] port %u is another connection's too; trying again\n", unsigned(port));
    IT_CHECK_MSG(attempt < 5, "the kernel's port was shared five times in a row");
  }
}

// A listener that has accepted a connection still holds its port alone: another process's Bind
// of it is refused. (On RoCE the accepted connection's data goes through a second socket on the
// listener's port, which the listener's socket must allow with SO_REUSEPORT; ndwv's own Bind never
// sets it, so the port stays closed to others.)
TEST(IntegrationConnect, ListenerPortStaysExclusiveWhileItServesAConnection) {
  RunWithPeer("one_connection_server", [](Channel& peer) {
    Adapter adapter;
    Endpoint client(adapter, Ctx(0xC1));
    ConnectTo(peer, client);
    sockaddr_in server{};
    ULONG size = sizeof server;
    IT_OK(client.connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&server), &size));
    Ref<IND2Listener> intruder = adapter.CreateListener();
    IT_CHECK_HR(ND_SHARING_VIOLATION, intruder->Bind(reinterpret_cast<sockaddr*>(&server), sizeof server));
    Ref<IND2Connector> connector = adapter.CreateConnector();
    IT_CHECK_HR(ND_SHARING_VIOLATION, connector->Bind(reinterpret_cast<sockaddr*>(&server), sizeof server));
    ClientTeardown(peer, client);
  });
}

// The client's CM timeout is 1 s (NDWV_CM_TIMEOUT_MS); the server holds the request three times
// that long before it Accepts, and the Connect still succeeds (nd2-spi 14.1: a Connect must not
// time out just because the peer is slow to Accept; RoCE's CM sends MRAs meanwhile).
IT_PEER(impatient_client) {
  Adapter adapter;
  Endpoint client(adapter, Ctx(0xC1));
  ConnectTo(parent, client);
  ClientTeardown(parent, client);
}

TEST(IntegrationConnect, ConnectWaitsForASlowAccept) {
  RunWithPeer("impatient_client", {{"env:NDWV_CM_TIMEOUT_MS", "1000"}, {"env:NDWV_ROCE_CM_TIMEOUT_MS", "100"}},
              [](Channel& peer) {
                Adapter adapter;
                Endpoint server(adapter, Ctx(0x5E));
                peer.SendValue("port", StartListening(server.adapter, server.listener));
                server.connector = GetConnectionRequest(server.adapter, server.listener.get());
                std::this_thread::sleep_for(std::chrono::milliseconds(3000));
                IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
                peer.Send("accepted");
                ServerTeardown(peer, server);
              });
}

// A connector bound to an address of its own may still take a request from a listener: the
// connection is the listener's port's, and the connector's own port is given up (iWARP used to
// keep its socket open and the port claimed for the life of the process).
TEST(IntegrationConnect, ABoundConnectorTakingARequestGivesItsOwnPortUp) {
  RunWithPeer("impatient_client", [](Channel& peer) {
    Adapter adapter;
    Endpoint server(adapter, Ctx(0x5E));
    uint16_t listening = StartListening(server.adapter, server.listener);
    // A port of its own: one a probe listener was given, free again once the probe is gone (on
    // RoCE once the engine closed the probe's socket, a moment later).
    auto bind_within_deadline = [](IND2Connector* connector, sockaddr_in& address) {
      Deadline deadline;
      unsigned spins = 0;
      HRESULT hr;
      while ((hr = connector->Bind(reinterpret_cast<sockaddr*>(&address), sizeof address)) == ND_SHARING_VIOLATION &&
             !deadline.Expired())
        Pause(spins);
      return hr;
    };
    sockaddr_in own = Loopback(PortOf([&] {
      Ref<IND2Listener> probe;
      uint16_t port = StartListening(adapter, probe);
      return Loopback(port);
    }()));
    server.connector = adapter.CreateConnector();
    IT_OK(bind_within_deadline(server.connector.get(), own));
    peer.SendValue("port", listening);
    Ov ov;
    HRESULT hr = server.listener->GetConnectionRequest(server.connector.get(), ov.Prepare(server.listener.get()));
    IT_OK(ov.Finish(hr, "IND2Listener::GetConnectionRequest"));
    IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
    peer.Send("accepted");
    sockaddr_in local{};
    ULONG size = sizeof local;
    IT_OK(server.connector->GetLocalAddress(reinterpret_cast<sockaddr*>(&local), &size));
    IT_CHECK_EQ(listening, PortOf(local));
    // The port it was bound to is free while the connection lives.
    Ref<IND2Connector> again = adapter.CreateConnector();
    IT_OK(bind_within_deadline(again.get(), own));
    ServerTeardown(peer, server);
  });
}

// Two endpoints of one adapter, each with a receive posted for one RemoteBuffer.
struct TwoEndpoints {
  TwoEndpoints(Adapter& adapter, uintptr_t context)
      : a(adapter, Ctx(context), {.separateCqs = true}), b(adapter, Ctx(context + 1), {.separateCqs = true}), inbox(2 * sizeof(RemoteBuffer), 0),
        inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags) {
    for (int i = 0; i < 2; ++i) {
      ND2_SGE sge = {Slot(i), ULONG(sizeof(RemoteBuffer)), inboxMr.token()};
      IT_OK(At(i).qp->Receive(Ctx(0x100 + i), &sge, 1));
    }
  }
  Endpoint& At(int i) { return i ? b : a; }
  uint8_t* Slot(int i) { return inbox.data() + i * sizeof(RemoteBuffer); }
  RemoteBuffer Receive(int i) { return ReceiveRemoteBuffer(At(i), Slot(i), Ctx(0x100 + i)); }
  void Send(int i, const RemoteBuffer& message) { SendRemoteBuffer(At(i), message, Ctx(0x200 + i)); }

  Endpoint a, b;
  std::vector<uint8_t> inbox;
  Mr inboxMr;
};

// On RoCE a process's port-0 connectors share its UDP ports (DESIGN.md "Addressing in user
// space"): NDWV_ROCE_PORT's or, without it, NDWV_ROCE_CONNECTOR_PORTS ports the kernel picks,
// taken in turn. Two connections from it to one listener report one port (`ports` 1) or two, not
// the listener's, and carry their own messages, both ways. (The client's data then goes through
// a flow to the listener's port, as the listener's does the other way: docs/roce.md "Ports and
// addresses".)
IT_PEER(shared_port_client) {
  const uint16_t shared = uint16_t(args.GetNumber("port"));  // 0: the kernel's choice
  const bool one_port = args.GetNumber("ports") == 1;
  uint16_t first = 0;
  Adapter adapter;
  TwoEndpoints clients(adapter, 0xA1);
  const uint16_t port = uint16_t(parent.ReceiveValue("port"));
  for (int i = 0; i < 2; ++i) {
    Endpoint& e = clients.At(i);
    e.connector = adapter.CreateConnector();
    IT_OK(Connect(e.connector.get(), e.qp.get(), port, 4, 4));
    CompleteConnect(e.connector.get());
    parent.Expect("accepted");
    sockaddr_in local{};
    ULONG size = sizeof local;
    IT_OK(e.connector->GetLocalAddress(reinterpret_cast<sockaddr*>(&local), &size));
    if (i == 0) first = PortOf(local);
    IT_CHECK(first != 0 && first != port && PortOf(local) != port);
    if (i == 1) IT_CHECK_EQ(one_port, first == PortOf(local));
    if (shared) IT_CHECK_EQ(shared, PortOf(local));
  }
  for (int i = 0; i < 2; ++i) clients.Send(i, {uint64_t(0xC0 + i), uint64_t(i), 0, 0});
  for (int i = 0; i < 2; ++i) IT_CHECK_EQ(uint64_t(0x50 + i), clients.Receive(i).address);
  for (int i = 0; i < 2; ++i) ClientTeardown(parent, clients.At(i));
}

// The server of the two tests below: one listener, two connections from the client one after
// the other, a message each way on each. `check_port` is shown the listener's port.
void ServeTwoConnections(Channel& peer, const std::function<void(uint16_t)>& check_port = nullptr) {
  Adapter adapter;
  TwoEndpoints servers(adapter, 0x5A);
  const uint16_t port = StartListening(adapter, servers.a.listener);
  if (check_port) check_port(port);
  peer.SendValue("port", port);
  for (int i = 0; i < 2; ++i) {  // the client connects one after the other
    Endpoint& e = servers.At(i);
    e.connector = GetConnectionRequest(adapter, servers.a.listener.get());
    IT_OK(Accept(e.connector.get(), e.qp.get(), 4, 4));
    peer.Send("accepted");
  }
  for (int i = 0; i < 2; ++i) {
    RemoteBuffer message = servers.Receive(i);
    IT_CHECK_EQ(uint64_t(0xC0 + i), message.address);
    IT_CHECK_EQ(uint64_t(i), message.length);
  }
  for (int i = 0; i < 2; ++i) servers.Send(i, {uint64_t(0x50 + i), 0, 0, 0});
  for (int i = 0; i < 2; ++i) ServerTeardown(peer, servers.At(i));
}

TEST(IntegrationConnect, ConnectorsShareTheProcessPortWithNdwvRocePort) {
  if (!TransportIsRoce()) GTEST_SKIP() << "NDWV_ROCE_PORT is a RoCE setting";
  // A UDP port free on 127.0.0.1 now (the peer binds it at its first connector).
  int probe = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in any = Loopback(0);
  socklen_t length = sizeof any;
  ASSERT_EQ(bind(probe, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ASSERT_EQ(getsockname(probe, reinterpret_cast<sockaddr*>(&any), &length), 0);
  const std::string shared = std::to_string(PortOf(any));
  close(probe);
  RunWithPeer("shared_port_client", {{"port", shared}, {"ports", "1"}, {"env:NDWV_ROCE_PORT", shared}},
              [](Channel& peer) { ServeTwoConnections(peer); });
}

// Without NDWV_ROCE_PORT, and NDWV_ROCE_CONNECTOR_PORTS=1, the port the kernel picks for the
// first connector; a listener bound to port 0 still has one of its own (two on one port would
// share a service ID).
TEST(IntegrationConnect, ConnectorsShareOnePortTheKernelPicksAndListenersHaveTheirOwn) {
  if (!TransportIsRoce()) GTEST_SKIP() << "an iWARP connection is a TCP socket, with a port of its own";
  RunWithPeer("shared_port_client", {{"port", "0"}, {"ports", "1"}, {"env:NDWV_ROCE_CONNECTOR_PORTS", "1"}},
              [](Channel& peer) {
                Adapter adapter;
                Endpoint other(adapter, Ctx(0x5B));
                const uint16_t other_port = StartListening(adapter, other.listener);
                ServeTwoConnections(peer, [&](uint16_t port) { IT_CHECK(port != other_port); });
              });
}

// With NDWV_ROCE_CONNECTOR_PORTS=2 two connectors in a row take the two ports in turn, and a
// listener's connections come from both (the wrap-around, a third connector on the first port,
// is RocePort.PortZeroConnectorsTakeTheirPortsInTurnEachCountedOnce's).
TEST(IntegrationConnect, ConnectorsTakeTheProcessPortsInTurn) {
  if (!TransportIsRoce()) GTEST_SKIP() << "an iWARP connection is a TCP socket, with a port of its own";
  RunWithPeer("shared_port_client", {{"port", "0"}, {"ports", "2"}, {"env:NDWV_ROCE_CONNECTOR_PORTS", "2"}},
              [](Channel& peer) { ServeTwoConnections(peer); });
}


// A process that has run out of descriptors (iWARP: every connection is a socket of its own).
// Bind fails with ND_INSUFFICIENT_RESOURCES, not a misleading address error. Its
// listener refuses the pending connection at once, instead of leaving it to the peer's timeout,
// and counts it; the engine does not spin on the listener, which stays readable meanwhile (a spin
// would count a refusal per turn). Once descriptors are free again the same listener serves the
// next Connect.
// Fills this process's descriptor table (under a soft limit of 256, so that it takes a few hundred
// at most) until End() or destruction, which give the descriptors and the limit back.
class DescriptorFamine {
 public:
  DescriptorFamine() {
    IT_CHECK(getrlimit(RLIMIT_NOFILE, &saved_) == 0);
    rlimit low = saved_;
    low.rlim_cur = std::min<rlim_t>(saved_.rlim_cur, 256);
    IT_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    for (int fd; (fd = fcntl(0, F_DUPFD_CLOEXEC, 0)) >= 0;) fillers_.push_back(fd);
    IT_CHECK_EQ(EMFILE, errno);
  }
  ~DescriptorFamine() { End(); }
  void End() {
    for (int fd : fillers_) close(fd);
    fillers_.clear();
    setrlimit(RLIMIT_NOFILE, &saved_);
  }

 private:
  rlimit saved_{};
  std::vector<int> fillers_;
};

IT_PEER(descriptor_starved_server) {
  Adapter adapter;
  Endpoint server(adapter, Ctx(0x5E));
  uint16_t port = StartListening(adapter, server.listener);
  DescriptorFamine famine;
  // A Bind, which needs a socket, says why it fails.
  sockaddr_in any = Loopback(0);
  Ref<IND2Connector> unbound = adapter.CreateConnector();
  IT_CHECK_HR(ND_INSUFFICIENT_RESOURCES, unbound->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));
  parent.SendValue("port", port);
  parent.Expect("connect ended");
  famine.End();
  parent.Send("room");
  server.connector = GetConnectionRequest(adapter, server.listener.get());
  IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
  parent.Send("accepted");
  ServerTeardown(parent, server);
  IT_CHECK_EQ(uint64_t(1), AdapterCounter("accepts_refused"));
}

TEST(IntegrationConnect, AListenerOutOfDescriptorsRefusesAtOnceAndRecovers) {
  if (TransportIsRoce()) GTEST_SKIP() << "an iWARP listener's accept(); RoCE's CM takes no descriptor";
#ifdef __SANITIZE_ADDRESS__
  // UBSan checks a pointer's memory through a pipe it opens: with no descriptor left it reports
  // every virtual call as a bad vptr.
  GTEST_SKIP() << "the sanitizers' runtime needs descriptors of its own";
#endif
  RunWithPeer("descriptor_starved_server", [](Channel& peer) {
    Adapter adapter;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    {
      Endpoint client(adapter, Ctx(0xC1));
      client.connector = adapter.CreateConnector();
      IT_CHECK_HR(ND_CONNECTION_REFUSED, Connect(client.connector.get(), client.qp.get(), port, 4, 4));
    }
    peer.Send("connect ended");
    peer.Expect("room");
    Endpoint client(adapter, Ctx(0xC1));
    client.connector = adapter.CreateConnector();
    IT_OK(Connect(client.connector.get(), client.qp.get(), port, 4, 4));
    CompleteConnect(client.connector.get());
    peer.Expect("accepted");
    ClientTeardown(peer, client);
  });
}


// RoCE: a connection on a listener's port gets a socket of its own only while descriptors last;
// without one it shares the port's. A listener in a process out of descriptors still accepts,
// and the connection carries data both ways.
IT_PEER(roce_descriptor_starved_server) {
  Adapter adapter;
  Endpoint server(adapter, Ctx(0x5E));
  uint8_t box[64] = {};
  Mr mr(adapter, box, sizeof box, kSinkFlags);
  ND2_SGE sge = {box, ULONG(sizeof box), mr.token()};
  IT_OK(server.qp->Receive(Ctx(0x100), &sge, 1));
  uint16_t port = StartListening(adapter, server.listener);
  DescriptorFamine famine;
  parent.SendValue("port", port);
  server.connector = GetConnectionRequest(adapter, server.listener.get());
  IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
  parent.Send("accepted");
  ExpectCompletion(server.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), Ctx(0x5E), 64},
                   "the client's message");
  CheckPattern(box, sizeof box, kClientDataSeed, "the client's message");
  FillPattern(box, sizeof box, kServerDataSeed);
  IT_OK(server.qp->Send(Ctx(0x200), &sge, 1, 0));
  ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), Ctx(0x5E)}, "the answer");
  ServerTeardown(parent, server);
}

TEST(IntegrationConnect, ARoceListenerOutOfDescriptorsStillAccepts) {
  if (!TransportIsRoce()) GTEST_SKIP() << "RoCE's flow sockets; an iWARP connection is a socket";
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "the sanitizers' runtime needs descriptors of its own";
#endif
  RunWithPeer("roce_descriptor_starved_server", [](Channel& peer) {
    Adapter adapter;
    Endpoint client(adapter, Ctx(0xC1), {.separateCqs = true});
    uint8_t box[64];
    Mr mr(adapter, box, sizeof box, kSinkFlags);
    ND2_SGE sge = {box, ULONG(sizeof box), mr.token()};
    IT_OK(client.qp->Receive(Ctx(0x100), &sge, 1));
    ConnectTo(peer, client);
    uint8_t out[64];
    FillPattern(out, sizeof out, kClientDataSeed);
    Mr outMr(adapter, out, sizeof out, kSourceFlags);
    ND2_SGE outSge = {out, ULONG(sizeof out), outMr.token()};
    IT_OK(client.qp->Send(Ctx(0x200), &outSge, 1, 0));
    ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), Ctx(0xC1)}, "send");
    ExpectCompletion(client.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), Ctx(0xC1), 64},
                     "the server's answer");
    CheckPattern(box, sizeof box, kServerDataSeed, "the server's answer");
    ClientTeardown(peer, client);
  });
}

// ---- data before Accept completes ---------------------------------------------------------------

// The MS-MPI connection pattern (Microsoft's ndmpic): the passive side pre-posts a receive,
// issues Accept and goes on polling; the active side sends as soon as CompleteConnect returns.
// The receive may complete before the Accept does, and the passive side answers at once: the
// Send must be taken (ND_SUCCESS) and reach the peer, as on an HCA, whatever the order of the
// two completions. Many connections, so that the answer lands in that window on some of them
// (the server reports how many).
constexpr int kEarlyCycles = 100;
constexpr size_t kEarlyMessage = 32;

IT_PEER(early_answer_client) {
  Adapter adapter;
  uint16_t port = uint16_t(parent.ReceiveValue("port"));
  for (int cycle = 0; cycle < kEarlyCycles; ++cycle) {
    Endpoint client(adapter, Ctx(0xC1));
    std::vector<uint8_t> out(kEarlyMessage), in(kEarlyMessage, 0xEE);
    FillPattern(out.data(), out.size(), 2 * cycle);
    Mr outMr(adapter, out.data(), out.size(), kSourceFlags), inMr(adapter, in.data(), in.size(), kSinkFlags);
    ND2_SGE receive = {in.data(), ULONG(in.size()), inMr.token()};
    IT_OK(client.qp->Receive(Ctx(0x10), &receive, 1));
    client.connector = adapter.CreateConnector();
    IT_OK(Connect(client.connector.get(), client.qp.get(), port, 0, 0));
    CompleteConnect(client.connector.get());
    ND2_SGE send = {out.data(), ULONG(out.size()), outMr.token()};
    IT_OK(client.qp->Send(Ctx(0x20), &send, 1, 0));  // at once: the server's Accept may still run
    // The send's completion and the answer's, in either order.
    bool sent = false, answered = false;
    while (!sent || !answered) {
      ND2_RESULT r = NextCompletion(client.cq.get(), "the client's send or the server's answer");
      bool send = r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x20) && !sent;
      bool answer = r.RequestType == Nd2RequestTypeReceive && r.RequestContext == Ctx(0x10) &&
                    r.BytesTransferred == kEarlyMessage && !answered;
      IT_CHECK_MSG(r.Status == ND_SUCCESS && (send || answer), Describe(r));
      (send ? sent : answered) = true;
    }
    CheckPattern(in.data(), in.size(), 2 * cycle + 1, "the server's answer");
    IT_OK(Disconnect(client.connector.get()));
    parent.Barrier("cycle");
  }
}

TEST(IntegrationConnect, AnAnswerToTheFirstMessageIsTakenBeforeAcceptCompletes) {
  RunWithPeer("early_answer_client", [](Channel& peer) {
    Adapter adapter;
    Ref<IND2Listener> listener;
    peer.SendValue("port", StartListening(adapter, listener));
    int early = 0;
    for (int cycle = 0; cycle < kEarlyCycles; ++cycle) {
      Endpoint server(adapter, Ctx(0x5E));
      std::vector<uint8_t> in(kEarlyMessage, 0xEE), out(kEarlyMessage);
      FillPattern(out.data(), out.size(), 2 * cycle + 1);
      Mr inMr(adapter, in.data(), in.size(), kSinkFlags), outMr(adapter, out.data(), out.size(), kSourceFlags);
      ND2_SGE receive = {in.data(), ULONG(in.size()), inMr.token()};
      IT_OK(server.qp->Receive(Ctx(0x10), &receive, 1));
      server.connector = GetConnectionRequest(adapter, listener.get());
      Ov acceptOv;
      HRESULT issued =
          server.connector->Accept(server.qp.get(), 0, 0, nullptr, 0, acceptOv.Prepare(server.connector.get()));
      ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), Ctx(0x5E),
                                         int64_t(kEarlyMessage)}, "the client's message");
      CheckPattern(in.data(), in.size(), 2 * cycle, "the client's message");
      bool accepted = issued != ND_PENDING || acceptOv.Completed();
      ND2_SGE send = {out.data(), ULONG(out.size()), outMr.token()};
      IT_OK(server.qp->Send(Ctx(0x20), &send, 1, 0));
      if (!accepted) ++early;
      IT_OK(acceptOv.Finish(issued, "IND2Connector::Accept"));
      ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20)}, "server send");
      peer.Barrier("cycle");
      IT_OK(Disconnect(server.connector.get()));
    }
    std::printf("answers posted before Accept completed: %d of %d\n", early, kEarlyCycles);
  });
}

// ---- connections made while another streams ------------------------------------------------------

constexpr ULONG kBulkWrite = 64 * 1024;
constexpr int kBulkInFlight = 8;  // RDMA Writes posted at once, each of kBulkWrite bytes
constexpr int kConnectsDuringBulk = 20;

// One connection streams 64 KiB RDMA Writes into the parent's buffer, kBulkInFlight at a time,
// from a thread, while the main thread makes and ends kConnectsDuringBulk more connections to the
// same listener, one by one; then a Send after the last Write (placed in order: it follows them).
IT_PEER(streaming_client) {
  Adapter adapter;
  const uint16_t port = uint16_t(parent.ReceiveValue("port"));
  std::vector<uint8_t> data(kBulkWrite);
  FillPattern(data.data(), data.size(), 11);
  uint8_t inbox[sizeof(RemoteBuffer)];
  Mr dataMr(adapter, data.data(), data.size(), kSourceFlags), inboxMr(adapter, inbox, sizeof inbox, kSinkFlags);
  Endpoint bulk(adapter, Ctx(0xB0), {.depth = kBulkInFlight, .sge = 1});
  ND2_SGE receive = {inbox, ULONG(sizeof inbox), inboxMr.token()};
  IT_OK(bulk.qp->Receive(Ctx(0x1), &receive, 1));
  bulk.connector = adapter.CreateConnector();
  IT_OK(Connect(bulk.connector.get(), bulk.qp.get(), port, 0, 0));
  CompleteConnect(bulk.connector.get());
  parent.Expect("accepted");  // Serve's
  const RemoteBuffer target = ReceiveRemoteBuffer(bulk, inbox, Ctx(0x1));
  IT_CHECK_EQ(uint64_t(kBulkWrite), target.length);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0};
  std::string failed;  // the sender's first bad completion; read after the join
  std::thread sender([&] {
    int inFlight = 0;
    for (Deadline drained; !stop.load() || inFlight > 0;) {
      if (inFlight == kBulkInFlight) sched_yield();  // the window is full: the engines need the cores
      ND2_RESULT r;
      while (bulk.cq->GetResults(&r, 1) == 1) {
        --inFlight;
        if (r.Status == ND_SUCCESS && r.RequestType == Nd2RequestTypeWrite) written.fetch_add(1);
        else if (failed.empty()) failed = "a bulk Write: " + Describe(r);
      }
      if (!stop.load()) {
        drained = Deadline();
        ND2_SGE sge = {data.data(), kBulkWrite, dataMr.token()};
        for (; inFlight < kBulkInFlight && SUCCEEDED(bulk.qp->Write(nullptr, &sge, 1, target.address, target.token, 0));
             ++inFlight) {}
      } else if (drained.Expired()) {
        failed = std::to_string(inFlight) + " bulk Writes did not complete";
        return;
      }
    }
  });
  unsigned spins = 0;
  for (Deadline deadline; written.load() < 2 * kBulkInFlight; Pause(spins))
    IT_CHECK_MSG(!deadline.Expired(), "the stream's first Writes");
  parent.Send("streaming");
  parent.Expect("connect");
  for (int i = 0; i < kConnectsDuringBulk; ++i) {
    Endpoint e(adapter, Ctx(0xC0 + i), {.depth = 1});
    e.connector = adapter.CreateConnector();
    IT_OK(Connect(e.connector.get(), e.qp.get(), port, 0, 0));
    CompleteConnect(e.connector.get());
    parent.Expect("accepted");
    IT_OK(Disconnect(e.connector.get()));
  }
  stop = true;
  sender.join();
  IT_CHECK_MSG(failed.empty(), failed);
  ND2_SGE last = {data.data(), 4, dataMr.token()};
  IT_OK(bulk.qp->Send(Ctx(0x2), &last, 1, 0));
  ExpectCompletion(bulk.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x2)}, "the Send after the last Write");
  ClientTeardown(parent, bulk);
}

// Whether this process's RoCE ports get the buffers they ask for by default: 8 MiB, forced (as
// root), and NDWV_ROCE_SOCKET_BUFFER not set lower.
bool RoceBuffersAreLarge() {
  constexpr int kDefault = 4 << 20;
  if (const char* setting = std::getenv("NDWV_ROCE_SOCKET_BUFFER"); setting && std::atoi(setting) < kDefault)
    return false;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &kDefault, sizeof kDefault) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &kDefault, sizeof kDefault);
  int granted = 0;
  socklen_t length = sizeof granted;
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &granted, &length);
  close(fd);
  return granted >= 2 * kDefault;
}

// The listening side of the connections made beside the streams: accepts and ends
// kConnectsDuringBulk of them, one by one. With `nothingShed`, on RoCE no REQ may be shed nor
// datagram dropped meanwhile.
void AcceptBesideTheStreams(Channel& peer, Adapter& adapter, IND2Listener* listener, bool nothingShed) {
  const bool roce = TransportIsRoce() && nothingShed;
  const uint64_t shedBefore = roce ? AdapterCounter("cm_reqs_shed", "RoCEv2") : 0;
  const uint64_t overflowedBefore = roce ? AdapterCounter("port_datagrams_overflowed", "RoCEv2") : 0;
  peer.Send("connect");
  for (int i = 0; i < kConnectsDuringBulk; ++i) {
    Endpoint e(adapter, Ctx(0x5C0 + i), {.depth = 1});
    e.connector = GetConnectionRequest(adapter, listener);
    IT_OK(Accept(e.connector.get(), e.qp.get(), 0, 0));
    peer.Send("accepted");
    IT_OK(Disconnect(e.connector.get()));
  }
  if (roce) {
    IT_CHECK_EQ(shedBefore, AdapterCounter("cm_reqs_shed", "RoCEv2"));
    IT_CHECK_EQ(overflowedBefore, AdapterCounter("port_datagrams_overflowed", "RoCEv2"));
  }
}

// New connections are made while an established one streams RDMA Writes at its full window into
// the same process: each Connect and Accept succeeds, the stream's data is whole, and on RoCE the
// listening process sheds no REQ for it (Port::CheckOverflow: one connection's window, at most 64
// packets, never leaves its flow's socket holding 512 KiB after the engine's turn) nor overflows a
// socket. Also run with the small buffers of a process without CAP_NET_ADMIN (tests/CMakeLists.txt);
// there it sheds no REQ either.
TEST(IntegrationConnect, ConnectionsAreMadeWhileAnotherStreamsAtItsFullWindow) {
  RunWithPeer("streaming_client", [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> target(kBulkWrite, 0), last(4);
    Mr targetMr(adapter, target.data(), target.size(), kTargetFlags);
    Mr lastMr(adapter, last.data(), last.size(), kSinkFlags);
    Endpoint bulk(adapter, Ctx(0x5B), {.depth = 2, .sge = 1});
    ND2_SGE receive = {last.data(), ULONG(last.size()), lastMr.token()};
    IT_OK(bulk.qp->Receive(Ctx(0x3), &receive, 1));
    Serve(peer, bulk, 0, 0);
    SendRemoteBuffer(bulk, {reinterpret_cast<uint64_t>(target.data()), kBulkWrite, targetMr.remoteToken(), 0}, Ctx(0x4));

    peer.Expect("streaming");
    AcceptBesideTheStreams(peer, adapter, bulk.listener.get(), true);
    ExpectCompletion(bulk.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x3), Ctx(0x5B), 4},
                     "the Send after the last Write");
    CheckPattern(target.data(), target.size(), 11, "the stream's data");
    ServerTeardown(peer, bulk);
  });
}

// ---- many connections streaming between the same two processes ----------------------------------

constexpr int kManyStreams = 128;        // more than the 64 flows a port opens: some share a socket
constexpr int kManyStreamsInFlight = 4;  // RDMA Writes of kBulkWrite bytes posted at once, each

// kManyStreams connections stream 64 KiB Writes into the parent, from one thread, while the main
// thread makes and ends kConnectsDuringBulk more connections to the same listener, one by one.
IT_PEER(many_streams_client) {
  Adapter adapter;
  std::vector<uint8_t> data(kBulkWrite);
  FillPattern(data.data(), data.size(), 13);
  uint8_t inbox[sizeof(RemoteBuffer)];
  Mr dataMr(adapter, data.data(), data.size(), kSourceFlags), inboxMr(adapter, inbox, sizeof inbox, kSinkFlags);
  Endpoint control(adapter, Ctx(0xD0), {.depth = 2, .sge = 1});
  ND2_SGE receive = {inbox, ULONG(sizeof inbox), inboxMr.token()};
  IT_OK(control.qp->Receive(Ctx(0x1), &receive, 1));
  ConnectTo(parent, control);
  const uint16_t port = uint16_t(parent.ReceiveValue("port"));
  std::vector<std::unique_ptr<Endpoint>> streams;
  for (int i = 0; i < kManyStreams; ++i) {
    streams.push_back(std::make_unique<Endpoint>(adapter, Ctx(0x1000 + i),
                                                 Shape{.depth = kManyStreamsInFlight, .sge = 1, .cqDepth = 16}));
    Endpoint& e = *streams.back();
    e.connector = adapter.CreateConnector();
    IT_OK(Connect(e.connector.get(), e.qp.get(), port, 0, 0));
    CompleteConnect(e.connector.get());
  }
  parent.Expect("all accepted");
  const RemoteBuffer target = ReceiveRemoteBuffer(control, inbox, Ctx(0x1));

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0};
  std::string failed;  // the sender's first bad completion; read after the join
  std::thread sender([&] {
    std::vector<int> inFlight(kManyStreams, 0);
    int total = 0;
    for (Deadline drained; !stop.load() || total > 0;) {
      for (int i = 0; i < kManyStreams; ++i) {
        Endpoint& e = *streams[i];
        ND2_RESULT r;
        while (e.cq->GetResults(&r, 1) == 1) {
          --inFlight[i], --total;
          if (r.Status == ND_SUCCESS && r.RequestType == Nd2RequestTypeWrite) written.fetch_add(1);
          else if (failed.empty()) failed = "a Write of stream " + std::to_string(i) + ": " + Describe(r);
        }
        if (stop.load()) continue;
        ND2_SGE sge = {data.data(), kBulkWrite, dataMr.token()};
        for (; inFlight[i] < kManyStreamsInFlight &&
               SUCCEEDED(e.qp->Write(nullptr, &sge, 1, target.address, target.token, 0));
             ++inFlight[i], ++total) {}
      }
      if (!stop.load()) {
        drained = Deadline();
        sched_yield();  // the engines need the cores
      } else if (drained.Expired()) {
        failed = std::to_string(total) + " Writes did not complete";
        return;
      }
    }
  });
  unsigned spins = 0;
  for (Deadline deadline; written.load() < 2 * kManyStreams * kManyStreamsInFlight; Pause(spins))
    IT_CHECK_MSG(!deadline.Expired() && failed.empty(), "the streams' first Writes");
  parent.Send("streaming");
  parent.Expect("connect");
  for (int i = 0; i < kConnectsDuringBulk; ++i) {
    Endpoint e(adapter, Ctx(0xC0 + i), {.depth = 1});
    e.connector = adapter.CreateConnector();
    const auto start = std::chrono::steady_clock::now();
    IT_OK(Connect(e.connector.get(), e.qp.get(), port, 0, 0));
    CompleteConnect(e.connector.get());
    parent.Expect("accepted");
    std::printf("connect %d beside the streams: %.1f ms\n", i,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    IT_OK(Disconnect(e.connector.get()));
  }
  stop = true;
  sender.join();
  IT_CHECK_MSG(failed.empty(), failed);
  std::printf("Writes completed: %llu\n", (unsigned long long)written.load());
  for (auto& e : streams) IT_OK(Disconnect(e->connector.get()));
  ClientTeardown(parent, control);
}

// More connections than a port's flows stream at their full window between the same two
// processes (two to each flow socket) while new connections are made: every Connect and Accept
// succeeds, no Write fails, and on RoCE with the default buffers no REQ is shed nor datagram
// dropped. Also run with small buffers (tests/CMakeLists.txt), where two windows overflow a flow's
// socket: the connections are made all the same (Port::Overloaded admits a REQ every 10 ms).
TEST(IntegrationConnect, ConnectionsAreMadeWhileManyMoreStreamBetweenTheSameTwoProcesses) {
  RunWithPeer("many_streams_client", [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> target(kBulkWrite, 0);
    Mr targetMr(adapter, target.data(), target.size(), kTargetFlags);
    Endpoint control(adapter, Ctx(0x5D), {.depth = 2, .sge = 1});
    const uint16_t port = StartListening(adapter, control.listener);
    peer.SendValue("port", port);
    control.connector = GetConnectionRequest(adapter, control.listener.get());
    IT_OK(Accept(control.connector.get(), control.qp.get(), 0, 0));
    peer.Send("accepted");
    peer.SendValue("port", port);  // for the streams
    std::vector<std::unique_ptr<Endpoint>> streams;
    for (int i = 0; i < kManyStreams; ++i) {
      streams.push_back(
          std::make_unique<Endpoint>(adapter, Ctx(0x2000 + i), Shape{.depth = 1, .sge = 1, .cqDepth = 4}));
      streams.back()->connector = GetConnectionRequest(adapter, control.listener.get());
      IT_OK(Accept(streams.back()->connector.get(), streams.back()->qp.get(), 0, 0));
    }
    peer.Send("all accepted");
    SendRemoteBuffer(control, {reinterpret_cast<uint64_t>(target.data()), kBulkWrite, targetMr.remoteToken(), 0},
                     Ctx(0x4));
    peer.Expect("streaming");
    // With small buffers two windows overflow a flow's socket, and the process sheds all but one
    // new REQ in 10 ms while they do.
    AcceptBesideTheStreams(peer, adapter, control.listener.get(), RoceBuffersAreLarge());
    ServerTeardown(peer, control);
    for (auto& e : streams) IT_OK(Disconnect(e->connector.get()));
  });
}

}  // namespace
}  // namespace ndit
