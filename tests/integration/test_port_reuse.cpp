// Ports after their owner is gone: a process that held an explicit port (a listener's, or a
// connector's) is killed or exits without Disconnect, the survivor ends its side of the
// connection, and a new process binds the same port at once. On iWARP the dead process's
// connection is then in TCP TIME_WAIT on that port, which an RDMA NIC's ports do not have: it
// must not keep the Bind off (nd2-spi.md §14.1: ND_SHARING_VIOLATION means "in use", by a live
// object). On RoCE a UDP port is free the moment its socket closes; the IB CM time-wait belongs
// to the process that ended, so it holds nothing of the new one's.
//
// And port 0: the kernel's choice, made without a search of ndwv's own, 20,000 times in a row.
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

constexpr uintptr_t kServerQp = 0x5E;
constexpr uintptr_t kClientQp = 0xC1;

// A port of 127.0.0.1 that nobody holds now, for the transport's protocol: the kernel's choice
// for a socket that never connects, so that it leaves nothing behind when closed.
uint16_t FreePort() {
  int fd = socket(AF_INET, TransportIsRoce() ? SOCK_DGRAM : SOCK_STREAM, 0);
  IT_CHECK(fd >= 0);
  sockaddr_in address = Loopback(0);
  socklen_t length = sizeof address;
  IT_CHECK(bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0);
  IT_CHECK(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  close(fd);
  return PortOf(address);
}

// On iWARP, the dead process's end of the connection lingers in TIME_WAIT (or FIN_WAIT2, TCP's
// wait for the last FIN of a closed socket, which counts the same) and nothing else holds the
// port: the Bind that follows is the case under test, not an easier one.
void ExpectOnlyLeftoversOn(uint16_t port) {
  if (TransportIsRoce()) return;
  std::vector<TcpSocket> sockets = TcpSocketsOn(port);
  IT_CHECK_MSG(!sockets.empty(), "no TIME_WAIT left on port " + std::to_string(port));
  for (const TcpSocket& socket : sockets)
    IT_CHECK_MSG(socket.state == 0x05 || socket.state == 0x06,
                 "port " + std::to_string(port) + " has a socket in TCP state " + std::to_string(socket.state));
}

// One Send each way on a connection, so that it carried data. The receive is posted before the
// connection is made (iWARP has no receiver-not-ready retry).
class OneExchange {
 public:
  explicit OneExchange(Endpoint& e) : e_(e), buffer_(2 * 64), mr_(e.adapter, buffer_.data(), buffer_.size(), kSinkFlags) {
    ND2_SGE in = {buffer_.data(), 64, mr_.token()};
    IT_OK(e.qp->Receive(Ctx(0x100), &in, 1));
  }
  // The side that sends first gets its Send's and its receive's completions in either order
  // (they share the CQ).
  void Run(bool first, const char* side) {
    ND2_SGE out = {buffer_.data() + 64, 64, mr_.token()};
    auto expectReceive = [&] {
      ExpectCompletion(e_.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), e_.qpContext, 64}, side);
    };
    if (!first) expectReceive();
    IT_OK(e_.qp->Send(Ctx(0x200), &out, 1, 0));
    bool sent = false, received = !first;
    while (!sent || !received) {
      ND2_RESULT r = NextCompletion(e_.cq.get(), side);
      bool isSend = r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x200) && !sent;
      bool isReceive = r.RequestType == Nd2RequestTypeReceive && r.RequestContext == Ctx(0x100) &&
                       r.BytesTransferred == 64 && !received;
      IT_CHECK_MSG(r.Status == ND_SUCCESS && (isSend || isReceive), std::string(side) + ": " + Describe(r));
      sent |= isSend;
      received |= isReceive;
    }
  }
  // Both sides call it: neither ends before the other's Send completed (on RoCE it needs the
  // ACK of a peer still alive).
  void RunBoth(Channel& other, bool first, const char* side) {
    Run(first, side);
    other.Barrier("exchanged");
  }

 private:
  Endpoint& e_;
  std::vector<uint8_t> buffer_;
  Mr mr_;
};

// After the peer's process ended: its going is noticed, and this side ends the connection in
// order (the FIN that puts the dead side's socket into TIME_WAIT on iWARP).
void EndAfterThePeerDied(Endpoint& e, Ov& notify, HRESULT issued) {
  IT_OK(notify.Finish(issued, "NotifyDisconnect after the peer process ended"));
  IT_OK(Disconnect(e.connector.get()));
  e.connector.Reset();
  e.qp.Reset();
}

// Binds a listener or connector to 127.0.0.1:port, once: no retry.
template <class T>
void BindTo(T* object, uint16_t port) {
  sockaddr_in address = Loopback(port);
  IT_OK(object->Bind(reinterpret_cast<sockaddr*>(&address), sizeof address));
}

// How the first process ends: "kill" (SIGKILL from the test, its connection still up), "exit"
// (exit(0) with every ND object still open: atexit handlers run, nothing is disconnected) or
// "stay" (the usual orderly end).
void EndAs(Channel& parent, const std::string& how) {
  if (how == "kill") {
    parent.Send("kill me");
    parent.Expect("never", 60000);
  }
  if (how == "exit") {
    parent.Send("exiting");
    std::fflush(nullptr);
    std::exit(0);
  }
}

// Binds a listener to 127.0.0.1:port (explicitly, once: no retry), serves one connection.
IT_PEER(fixed_port_server) {
  Adapter adapter;
  Endpoint server(adapter, Ctx(kServerQp));
  OneExchange exchange(server);
  server.listener = adapter.CreateListener();
  BindTo(server.listener.get(), uint16_t(args.GetNumber("port")));
  IT_OK(server.listener->Listen(0));
  parent.Send("listening");
  server.connector = GetConnectionRequest(adapter, server.listener.get());
  IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
  parent.Send("accepted");
  exchange.RunBoth(parent, false, "server");
  EndAs(parent, args.Get("end"));
  ServerTeardown(parent, server);
}

// The client side of fixed_port_server, in the test process; returns with the connection up.
void ConnectToFixedPort(Channel& peer, Endpoint& client, uint16_t port) {
  OneExchange exchange(client);
  peer.Expect("listening");
  client.connector = client.adapter.CreateConnector();
  IT_OK(Connect(client.connector.get(), client.qp.get(), port, 4, 4));
  CompleteConnect(client.connector.get());
  peer.Expect("accepted");
  exchange.RunBoth(peer, true, "client");
}

// The peer ends as `end` says while the connection is up; this side notices and ends its side.
void LetThePeerEnd(Channel& peer, Endpoint& e, const std::string& end) {
  Ov notify;
  HRESULT issued = e.connector->NotifyDisconnect(notify.Prepare(e.connector.get()));
  IT_CHECK_HR(ND_PENDING, issued);
  if (end == "kill") {
    peer.Expect("kill me");
    KillPeer();
  } else {
    peer.Expect("exiting");
  }
  EndAfterThePeerDied(e, notify, issued);
}

void ServerPortFreeAfterTheServerEnds(const std::string& end) {
  uint16_t port = FreePort();
  Adapter adapter;
  RunWithPeer("fixed_port_server", {{"port", std::to_string(port)}, {"end", end}}, [&](Channel& peer) {
    Endpoint client(adapter, Ctx(kClientQp));
    ConnectToFixedPort(peer, client, port);
    LetThePeerEnd(peer, client, end);
  });
  ExpectOnlyLeftoversOn(port);
  // A new server process binds the same port at once, and serves.
  RunWithPeer("fixed_port_server", {{"port", std::to_string(port)}, {"end", "stay"}}, [&](Channel& peer) {
    Endpoint client(adapter, Ctx(kClientQp));
    ConnectToFixedPort(peer, client, port);
    ClientTeardown(peer, client);
  });
}

TEST(IntegrationPortReuse, ServerPortIsFreeAtOnceAfterTheServerIsKilled) {
  RunLocal([] { ServerPortFreeAfterTheServerEnds("kill"); });
}

TEST(IntegrationPortReuse, ServerPortIsFreeAtOnceAfterTheServerExitsWithoutDisconnect) {
  RunLocal([] { ServerPortFreeAfterTheServerEnds("exit"); });
}

// Binds a connector to 127.0.0.1:local (explicitly, once), connects to the port it is told.
IT_PEER(fixed_port_client) {
  Adapter adapter;
  Endpoint client(adapter, Ctx(kClientQp));
  OneExchange exchange(client);
  client.connector = adapter.CreateConnector();
  BindTo(client.connector.get(), uint16_t(args.GetNumber("local")));
  sockaddr_in server = Loopback(uint16_t(parent.ReceiveValue("port")));
  Ov ov;
  HRESULT hr = client.connector->Connect(client.qp.get(), reinterpret_cast<sockaddr*>(&server), sizeof server,
                                         4, 4, nullptr, 0, ov.Prepare(client.connector.get()));
  IT_OK(ov.Finish(hr, "Connect from the fixed port"));
  CompleteConnect(client.connector.get());
  parent.Expect("accepted");
  exchange.RunBoth(parent, true, "client");
  EndAs(parent, args.Get("end"));
  ClientTeardown(parent, client);
}

void ClientPortFreeAfterTheClientEnds(const std::string& end) {
  uint16_t local = FreePort();
  RunWithPeer("fixed_port_client", {{"local", std::to_string(local)}, {"end", end}}, [&](Channel& peer) {
    Adapter adapter;
    Endpoint server(adapter, Ctx(kServerQp));
    OneExchange exchange(server);
    Serve(peer, server);
    exchange.RunBoth(peer, false, "server");
    LetThePeerEnd(peer, server, end);
  });
  ExpectOnlyLeftoversOn(local);
  // A new client process binds the same port at once. It connects to another listener: the old
  // connection's address pair is what TIME_WAIT protects, and a Connect over it may be refused.
  RunWithPeer("fixed_port_client", {{"local", std::to_string(local)}, {"end", "stay"}}, [&](Channel& peer) {
    Adapter adapter;
    Endpoint server(adapter, Ctx(kServerQp));
    OneExchange exchange(server);
    Serve(peer, server);
    exchange.RunBoth(peer, false, "server");
    ServerTeardown(peer, server);
  });
}

TEST(IntegrationPortReuse, ClientPortIsFreeAtOnceAfterTheClientIsKilled) {
  RunLocal([] { ClientPortFreeAfterTheClientEnds("kill"); });
}

TEST(IntegrationPortReuse, ClientPortIsFreeAtOnceAfterTheClientExitsWithoutDisconnect) {
  RunLocal([] { ClientPortFreeAfterTheClientEnds("exit"); });
}


// ---- port 0: the kernel's choice -----------------------------------------------------------------

// A network namespace of the test's own, with its loopback up, while it lives: the peer that
// fills ports runs there, and takes nothing from the host's other programs.
class OwnNamespace {
 public:
  OwnNamespace() : name_("ndwv-" + std::to_string(getpid()) + "-ports") {
    ok_ = geteuid() == 0 && Shell("ip netns add " + name_) && Shell("ip -n " + name_ + " link set lo up");
  }
  ~OwnNamespace() { Shell("ip netns del " + name_); }
  bool ok() const { return ok_; }
  const std::string& name() const { return name_; }

 private:
  static bool Shell(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str()) == 0;
  }
  std::string name_;
  bool ok_ = false;
};

constexpr int kCycles = 20000;

// One connection made and ended in this process: the connector binds port 0 and connects to the
// listener, which accepts on a new connector; both disconnect, then release everything.
void ConnectAndDisconnectOnce(Adapter& adapter, IND2CompletionQueue* cq, IND2Listener* listener, uint16_t port) {
  Ref<IND2QueuePair> clientQp, serverQp;
  IT_OK(adapter->CreateQueuePair(IID_IND2QueuePair, cq, cq, Ctx(kClientQp), 1, 1, 1, 1, 0, clientQp.Out()));
  IT_OK(adapter->CreateQueuePair(IID_IND2QueuePair, cq, cq, Ctx(kServerQp), 1, 1, 1, 1, 0, serverQp.Out()));
  Ref<IND2Connector> client = adapter.CreateConnector(), server = adapter.CreateConnector();
  Ov request, connect, accept, complete, clientEnd, serverEnd;
  HRESULT requested = listener->GetConnectionRequest(server.get(), request.Prepare(listener));
  sockaddr_in any = Loopback(0), to = Loopback(port);
  IT_OK(client->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));
  HRESULT connecting = client->Connect(clientQp.get(), reinterpret_cast<sockaddr*>(&to), sizeof to, 0, 0,
                                       nullptr, 0, connect.Prepare(client.get()));
  IT_OK(request.Finish(requested, "GetConnectionRequest"));
  HRESULT accepting = server->Accept(serverQp.get(), 0, 0, nullptr, 0, accept.Prepare(server.get()));
  IT_OK(connect.Finish(connecting, "Connect"));
  IT_OK(complete.Finish(client->CompleteConnect(complete.Prepare(client.get())), "CompleteConnect"));
  IT_OK(accept.Finish(accepting, "Accept"));
  HRESULT clientEnding = client->Disconnect(clientEnd.Prepare(client.get()));
  HRESULT serverEnding = server->Disconnect(serverEnd.Prepare(server.get()));
  IT_OK(clientEnd.Finish(clientEnding, "the client's Disconnect"));
  IT_OK(serverEnd.Finish(serverEnding, "the server's Disconnect"));
}

// Every port of 49152–65535 (the range the SPI names for port 0) held by a socket of another
// program, and 20,000 connections made and ended in a row after it: each Bind to port 0 takes
// its port where the kernel has one (its own ephemeral range: net.ipv4.ip_local_port_range),
// with no search of its own, whatever holds the ports, live sockets or TIME_WAIT leftovers (the
// ones of the connections before it pile up as it goes).
IT_PEER(port_zero_cycles) {
  alarm(170);  // longer than the harness's budget for a peer: 20,000 cycles under the sanitizers
  rlimit files{};
  getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  setrlimit(RLIMIT_NOFILE, &files);
  std::vector<int> holders;
  for (int port = 49152; port <= 65535; ++port) {
    int fd = socket(AF_INET, TransportIsRoce() ? SOCK_DGRAM : SOCK_STREAM, 0);
    IT_CHECK_MSG(fd >= 0, "socket for port " + std::to_string(port) + ": " + std::strerror(errno));
    sockaddr_in address = Loopback(uint16_t(port));
    IT_CHECK_MSG(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0,
                 "bind to port " + std::to_string(port) + ": " + std::strerror(errno));
    holders.push_back(fd);
  }
  Adapter adapter;
  Ref<IND2CompletionQueue> cq = adapter.CreateCq(4);
  Ref<IND2Listener> listener;
  uint16_t port = StartListening(adapter, listener);
  IT_CHECK_MSG(port < 49152, "the listener's port " + std::to_string(port));
  int made = 0;
  for (int i = 0; i < kCycles; ++i, ++made) ConnectAndDisconnectOnce(adapter, cq.get(), listener.get(), port);
  IT_CHECK_EQ(kCycles, made);
  ND2_RESULT stray{};
  IT_CHECK_EQ(0u, cq->GetResults(&stray, 1));  // the QPs had no requests
  parent.SendValue("connections", uint64_t(made));
  for (int fd : holders) close(fd);
}

TEST(IntegrationPortReuse, PortZeroIsTheKernelsChoiceTwentyThousandTimesInARow) {
  OwnNamespace ns;
  if (!ns.ok()) GTEST_SKIP() << "needs root and ip(8) for a network namespace of its own";
  // The peer holds 16,384 of its descriptors (20,000 on the CI machine) to keep the ports
  // 49152-65535; on RoCE each ended connection keeps its port for the CM time-wait (1 s by
  // default), ~3,000 ports at this test's pace, which now and then ran it out of descriptors
  // (ND_INSUFFICIENT_RESOURCES at a Bind). A short time-wait leaves the test what it is about.
  RunWithPeer("port_zero_cycles", {{"netns", ns.name()}, {"env:NDWV_ROCE_TIMEWAIT_MS", "100"}}, [](Channel& peer) {
    IT_CHECK_EQ(uint64_t(kCycles), peer.ReceiveValue("connections", 170000));
  });
}

}  // namespace
}  // namespace ndit
