// Two hosts and real faults: two network namespaces joined by a veth pair, created and removed
// by the test, this process's side in one (its test thread enters it), the peer process in the
// other. Traffic goes only to the namespaces' own addresses. Faults: the link taken down during a
// transfer, and the peer process killed (SIGKILL). Each scenario asserts what this side sees:
// statuses, that every posted request completes exactly once, and that nothing waits unbounded.
//
// Needs root and ip(8) (CI has both); otherwise skipped. Runs on the transport the environment
// selects (NDWV_TRANSPORTS), like every integration test.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);
constexpr const char* kAddressA = "10.199.0.1";  // this side
constexpr const char* kAddressB = "10.199.0.2";  // the peer
constexpr ULONG kMessage = 4096;
constexpr int kReceives = 4;

bool Shell(const std::string& command) { return std::system((command + " >/dev/null 2>&1").c_str()) == 0; }

sockaddr_in Address(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// The namespaces of test processes that are gone: one killed, or ended by the harness's
// watchdog (which runs no destructors), leaves its pair behind.
void RemoveStaleNamespaces() {
  DIR* dir = opendir("/var/run/netns");
  if (!dir) return;
  while (const dirent* entry = readdir(dir)) {
    unsigned pid;
    char side;
    if (std::sscanf(entry->d_name, "ndwv-%u-%c", &pid, &side) == 2 && kill(pid_t(pid), 0) != 0 && errno == ESRCH)
      Shell(std::string("ip netns del ") + entry->d_name);
  }
  closedir(dir);
}

// Two namespaces and the veth pair between them, while it lives.
class Hosts {
 public:
  Hosts() : a_("ndwv-" + std::to_string(getpid()) + "-a"), b_("ndwv-" + std::to_string(getpid()) + "-b") {
    RemoveStaleNamespaces();
    ok_ = Shell("ip netns add " + a_) && Shell("ip netns add " + b_) &&
          Shell("ip link add va netns " + a_ + " type veth peer name vb netns " + b_) &&
          Shell("ip -n " + a_ + " addr add " + kAddressA + "/24 dev va") &&
          Shell("ip -n " + b_ + " addr add " + kAddressB + "/24 dev vb") &&
          Shell("ip -n " + a_ + " link set lo up") && Shell("ip -n " + b_ + " link set lo up") &&
          Shell("ip -n " + a_ + " link set va up") && Shell("ip -n " + b_ + " link set vb up");
  }
  ~Hosts() {
    Shell("ip netns del " + a_);  // takes the veth pair with it
    Shell("ip netns del " + b_);
  }
  bool ok() const { return ok_; }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  void CutLink() { IT_CHECK(Shell("ip -n " + a_ + " link set va down")); }      // our side
  void CutPeerLink() { IT_CHECK(Shell("ip -n " + b_ + " link set vb down")); }  // the far side

 private:
  std::string a_, b_;
  bool ok_ = false;
};

// This thread in a network namespace (sockets it creates live there); back on destruction.
class InNamespace {
 public:
  explicit InNamespace(const std::string& name) {
    home_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int target = open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
    IT_CHECK(home_ >= 0 && target >= 0);
    IT_CHECK(setns(target, CLONE_NEWNET) == 0);
    close(target);
  }
  ~InNamespace() {
    setns(home_, CLONE_NEWNET);
    close(home_);
  }

 private:
  int home_ = -1;
};

bool CanRun() { return geteuid() == 0 && Shell("ip netns list"); }

// ---- the peer: a server in namespace B ----------------------------------------------------------

// A listener on kAddressB (a port the host chooses), its port told to this side.
Ref<IND2Listener> ListenOnB(Adapter& adapter, Channel& parent) {
  Ref<IND2Listener> listener = adapter.CreateListener();
  sockaddr_in here = Address(kAddressB, 0);
  IT_OK(listener->Bind(reinterpret_cast<sockaddr*>(&here), sizeof here));
  IT_OK(listener->Listen(0));
  sockaddr_in bound{};
  ULONG length = sizeof bound;
  IT_OK(listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&bound), &length));
  parent.SendValue("port", PortOf(bound));
  return listener;
}

// Accepts one connection on kAddressB, receives messages until the connection ends, then reports
// what it saw: "received N", and how the connection ended.
IT_PEER(netns_server) {
  Adapter adapter;
  std::vector<uint8_t> inbox(kReceives * kMessage);
  Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint e(adapter, kServerQp, {.depth = 8, .separateCqs = true});
  for (int i = 0; i < kReceives; ++i) {
    ND2_SGE sge = {inbox.data() + i * kMessage, kMessage, mr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  e.listener = ListenOnB(adapter, parent);
  e.connector = GetConnectionRequest(adapter, e.listener.get());
  IT_OK(Accept(e.connector.get(), e.qp.get(), 4, 4));
  parent.Send("accepted");
  // Every receive completes exactly once: the messages that came, then the flush.
  int received = 0, canceled = 0;
  for (int i = 0; i < kReceives; ++i) {
    ND2_RESULT r = NextCompletion(e.receiveCq, "a receive at the server", 30000);
    IT_CHECK(r.RequestType == Nd2RequestTypeReceive);
    if (r.Status == ND_SUCCESS) {
      IT_CHECK_EQ(canceled, 0);  // nothing succeeds after the flush began
      CheckPattern(inbox.data() + (reinterpret_cast<uintptr_t>(r.RequestContext) - 0x100) * kMessage,
                   kMessage, 77 + uint64_t(received), "a message across the veth");
      received++;
    } else {
      IT_CHECK_HR(ND_CANCELED, r.Status);
      canceled++;
    }
  }
  ExpectNoCompletion(e.receiveCq, "server receive CQ after every receive completed", 50);
  parent.SendValue("received", uint64_t(received));
  HRESULT hr = Disconnect(e.connector.get());
  IT_CHECK(hr == ND_SUCCESS || hr == ND_TIMEOUT);
}

// Receives `count` messages (a receive posted for each up front: iWARP has no RNR retry, a Send
// that finds no receive ends the connection), checks each byte, reports, then waits for this
// side's Disconnect and disconnects too.
IT_PEER(netns_sink) {
  const int count = int(args.GetNumber("count"));
  Adapter adapter;
  std::vector<uint8_t> inbox(size_t(count) * kMessage);
  Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint e(adapter, kServerQp, {.depth = ULONG(count), .cqDepth = ULONG(2 * count), .separateCqs = true});
  for (int i = 0; i < count; ++i) {
    ND2_SGE sge = {inbox.data() + size_t(i) * kMessage, kMessage, mr.token()};
    IT_OK(e.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  e.listener = ListenOnB(adapter, parent);
  e.connector = GetConnectionRequest(adapter, e.listener.get());
  IT_OK(Accept(e.connector.get(), e.qp.get(), 4, 4));
  parent.Send("accepted");
  // In order and byte-exact, until all came or the connection ended (the receives are flushed).
  int received = 0;
  for (; received < count; ++received) {
    ND2_RESULT r = NextCompletion(e.receiveCq, "a message across the lossy veth", 30000);
    IT_CHECK(r.RequestType == Nd2RequestTypeReceive && r.RequestContext == Ctx(0x100 + received));
    if (r.Status == ND_CANCELED) break;
    if (r.Status != ND_SUCCESS || r.BytesTransferred != kMessage)
      IT_FAIL("a message across the lossy veth: completion " + Describe(r));
    CheckPattern(inbox.data() + size_t(received) * kMessage, kMessage, 77 + uint64_t(received),
                 "a message across the lossy veth");
  }
  parent.SendValue("received", uint64_t(received));
  ServerTeardown(parent, e);
}

// Listens on kAddressB and reports its port; leaves when told (a connection never arrives).
IT_PEER(netns_listener) {
  Adapter adapter;
  Ref<IND2Listener> listener = ListenOnB(adapter, parent);
  parent.Expect("done", 60000);
}

// Listens, takes one connection request, says so, and waits to be killed (never accepts).
IT_PEER(netns_request_then_die) {
  Adapter adapter;
  Ref<IND2Listener> listener = ListenOnB(adapter, parent);
  Ref<IND2Connector> request = GetConnectionRequest(adapter, listener.get());
  parent.Send("requested");
  parent.Expect("never", 60000);
}

// Connects from kAddressB to this side's port (told on the channel), says "connected <status>"
// when the Connect ends; completes the connection when told
// "complete", and otherwise waits to be killed (what becomes of it is not the subject).
IT_PEER(netns_client) {
  Adapter adapter;
  std::vector<uint8_t> inbox(kMessage);
  Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Endpoint e(adapter, kClientQp, {.depth = 8, .separateCqs = true});
  ND2_SGE sge = {inbox.data(), kMessage, mr.token()};
  IT_OK(e.qp->Receive(Ctx(0x900), &sge, 1));
  uint16_t port = uint16_t(parent.ReceiveValue("port"));
  e.connector = adapter.CreateConnector();
  sockaddr_in local = Address(kAddressB, 0), server = Address(kAddressA, port);
  IT_OK(e.connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
  Ov ov;
  HRESULT hr = e.connector->Connect(e.qp.get(), reinterpret_cast<sockaddr*>(&server), sizeof server, 4, 4,
                                    nullptr, 0, ov.Prepare(e.connector.get()));
  hr = ov.Finish(hr, "Connect from B", 60000);
  parent.SendValue("connected", uint32_t(hr));
  if (hr == ND_SUCCESS && parent.Receive("what next", 60000) == "complete") CompleteConnect(e.connector.get());
  parent.Expect("never", 60000);
}

// Listens on kAddressB asking for no limit (Listen(0)), where the host's backlog
// (net.core.somaxconn, which the test sets to 1 in namespace B) holds one request; takes none
// until told "take", then accepts two connections and says "accepted" after each.
IT_PEER(netns_full_listener) {
  Adapter adapter;
  Endpoint first(adapter, kServerQp, {.depth = 8, .separateCqs = true});
  Endpoint second(adapter, Ctx(0x5F), {.depth = 8, .separateCqs = true});
  Ref<IND2Listener> listener = ListenOnB(adapter, parent);
  parent.Expect("take", 60000);
  for (Endpoint* e : {&first, &second}) {
    e->connector = GetConnectionRequest(adapter, listener.get());
    IT_OK(Accept(e->connector.get(), e->qp.get(), 4, 4));
    parent.Send("accepted");
  }
  parent.Expect("done", 60000);
}

// Listens on kAddressB, accepts kMany connections one after the other, says "accepted", and waits
// to be killed.
constexpr int kMany = 8;
IT_PEER(netns_acceptor_of_many) {
  Adapter adapter;
  Ref<IND2Listener> listener = ListenOnB(adapter, parent);
  std::vector<std::unique_ptr<Endpoint>> accepted;
  for (int i = 0; i < kMany; ++i) {
    accepted.push_back(std::make_unique<Endpoint>(adapter, Ctx(0x5E00 + i), Shape{.depth = 8, .separateCqs = true}));
    accepted.back()->connector = GetConnectionRequest(adapter, listener.get());
    IT_OK(Accept(accepted.back()->connector.get(), accepted.back()->qp.get(), 4, 4));
  }
  parent.Send("accepted");
  parent.Expect("never", 60000);
}

// Listens on kAddressB, takes one request, accepts it and reports how the Accept ended
// ("accept <status>"); then releases connector, QP and listener (each to 0 references) and
// says "released" (the adapter follows as the peer exits).
IT_PEER(netns_acceptor) {
  Adapter adapter;
  Endpoint e(adapter, kServerQp, {.depth = 8, .separateCqs = true});
  e.listener = ListenOnB(adapter, parent);
  e.connector = GetConnectionRequest(adapter, e.listener.get());
  Ov ov;
  HRESULT hr = e.connector->Accept(e.qp.get(), 4, 4, nullptr, 0, ov.Prepare(e.connector.get()));
  parent.SendValue("accept", uint32_t(ov.Finish(hr, "Accept at B", 60000)));
  IT_CHECK_EQ(ULONG(0), e.connector.Reset());
  IT_CHECK_EQ(ULONG(0), e.qp.Reset());
  IT_CHECK_EQ(ULONG(0), e.listener.Reset());
  parent.Send("released");
}

// Every test runs between two namespaces of its own (hosts()), created for it and removed after
// it, or is skipped where it cannot (not root, no ip netns).
class IntegrationNetns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CanRun()) GTEST_SKIP() << "needs root and ip netns";
    hosts_.emplace();
    ASSERT_TRUE(hosts_->ok()) << "could not create the namespaces";
  }
  Hosts& hosts() { return *hosts_; }

 private:
  std::optional<Hosts> hosts_;
};

// ---- this side: the client in namespace A ------------------------------------------------------

struct Client {
  Adapter adapter;
  std::vector<uint8_t> out = std::vector<uint8_t>(8 * kMessage);
  std::vector<uint8_t> inbox = std::vector<uint8_t>(kMessage);
  Mr outMr{adapter, out.data(), out.size(), kSourceFlags};
  Mr inboxMr{adapter, inbox.data(), inbox.size(), kSinkFlags};
  Endpoint e{adapter, kClientQp, {.depth = 8, .separateCqs = true}};
  int sent = 0;

  // Issues Connect from kAddressA to the peer's port; the caller finishes it.
  HRESULT StartConnect(uint16_t port, Ov& ov) {
    e.connector = adapter.CreateConnector();
    sockaddr_in local = Address(kAddressA, 0), server = Address(kAddressB, port);
    IT_OK(e.connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
    return e.connector->Connect(e.qp.get(), reinterpret_cast<sockaddr*>(&server), sizeof server, 4, 4,
                                nullptr, 0, ov.Prepare(e.connector.get()));
  }
  // attempts > 1: a Connect that ends ND_IO_TIMEOUT is tried again, as the SPI allows (14.1);
  // across a lossy link the TCP handshake of iWARP may lose its SYNs often enough to outlast
  // NDWV_CM_TIMEOUT_MS.
  void Connect(Channel& peer, int attempts = 1) {
    ND2_SGE sge = {inbox.data(), kMessage, inboxMr.token()};
    IT_OK(e.qp->Receive(Ctx(0x900), &sge, 1));  // never filled: flushed when the connection ends
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    HRESULT hr;
    do {
      Ov ov;
      hr = ov.Finish(StartConnect(port, ov), "Connect across the veth");
    } while (hr == ND_IO_TIMEOUT && --attempts > 0);
    IT_OK(hr);
    CompleteConnect(e.connector.get());
    peer.Expect("accepted");
  }
  // The receive Connect posted (never filled) completes ND_CANCELED when the connection ends.
  void ExpectReceiveFlushed(const char* what, int ms = kWaitMs) {
    ExpectCompletion(e.receiveCq, {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x900), kClientQp, -1}, what, ms);
  }
  void PostSend() {
    uint8_t* message = out.data() + (sent % 8) * kMessage;
    FillPattern(message, kMessage, 77 + uint64_t(sent));
    ND2_SGE sge = {message, kMessage, outMr.token()};
    IT_OK(e.qp->Send(Ctx(0x200 + sent), &sge, 1, 0));
    sent++;
  }
};

TEST_F(IntegrationNetns, MessagesCrossTheVethAndBothSidesDisconnect) {
  RunWithPeer("netns_server", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer);
    for (int i = 0; i < 2; ++i) {
      c.PostSend();
      ExpectCompletion(c.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200 + i), kClientQp, -1},
                       "a send across the veth");
    }
    IT_OK(Disconnect(c.e.connector.get()));
    c.ExpectReceiveFlushed("the client's receive after Disconnect");
    IT_CHECK_EQ(uint64_t(2), peer.ReceiveValue("received", 30000));
  });
}

// The link goes down with sends outstanding: the requests end within the transport's budget and
// each exactly once, the receive is flushed, NotifyDisconnect completes, and Disconnect ends
// (ND_TIMEOUT when the close is never answered). RoCE: the oldest send ends ND_IO_TIMEOUT after
// its retries, the rest ND_CANCELED. iWARP: a Send completes when TCP takes it (unless confirmed),
// and TCP gives up after NDWV_IWARP_TIMEOUT_MS; the oldest unconfirmed request, if any, ends
// ND_IO_TIMEOUT, the rest ND_CANCELED.
TEST_F(IntegrationNetns, LinkCutDuringATransferEndsEveryRequestWithinTheBudget) {
  RunWithPeer("netns_server", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer);
    c.PostSend();
    ExpectCompletion(c.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kClientQp, -1},
                     "the send before the cut");
    Ov notify;
    HRESULT hr = c.e.connector->NotifyDisconnect(notify.Prepare(c.e.connector.get()));
    IT_CHECK_HR(ND_PENDING, hr);
    hosts().CutLink();
    for (int i = 0; i < 3; ++i) c.PostSend();
    if (TransportIsRoce()) {
      ExpectCompletion(c.e.cq.get(), {ND_IO_TIMEOUT, Nd2RequestTypeSend, Ctx(0x201), kClientQp, -1},
                       "the oldest send after the cut");
      for (int i = 2; i < 4; ++i)
        ExpectCompletion(c.e.cq.get(), {ND_CANCELED, Nd2RequestTypeSend, Ctx(0x200 + i), kClientQp, -1},
                         "a later send after the cut");
    } else {
      for (int i = 1; i < 4; ++i) {
        ND2_RESULT r = NextCompletion(c.e.cq.get(), "a send after the cut", 30000);
        IT_CHECK(r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x200 + i));
        IT_CHECK(r.Status == ND_SUCCESS || r.Status == ND_IO_TIMEOUT || r.Status == ND_CANCELED);
      }
    }
    c.ExpectReceiveFlushed("the client's receive after the cut", 30000);
    IT_OK(notify.Finish(hr, "NotifyDisconnect after the cut"));
    hr = Disconnect(c.e.connector.get());
    IT_CHECK(hr == ND_TIMEOUT || hr == ND_SUCCESS);
    ExpectNoCompletion(c.e.cq.get(), "client CQ after every request completed", 50);
    // The server saw the first message; it finds the link dead on its own and flushes.
    IT_CHECK_EQ(uint64_t(1), peer.ReceiveValue("received", 60000));
  });
}

// The link goes down right after Disconnect starts: the close can never be answered, so
// Disconnect ends ND_TIMEOUT once its budget is spent (RoCE: the DREQ's retries; iWARP: the wait
// for the peer's FIN), after the flush; the peer finds the link dead on its own and flushes too.
TEST_F(IntegrationNetns, LinkCutDuringDisconnectEndsItWithTimeoutAfterTheFlush) {
  RunWithPeer("netns_server", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer);
    hosts().CutLink();
    IT_CHECK_HR(ND_TIMEOUT, Disconnect(c.e.connector.get()));
    c.ExpectReceiveFlushed("the client's receive, flushed by Disconnect");
    ExpectNoCompletion(c.e.cq.get(), "client CQ", 50);
    IT_CHECK_EQ(uint64_t(0), peer.ReceiveValue("received", 60000));
  });
}

// Connect while a link is down: ours (the host has no route to the peer), or the far one (the
// peer's address cannot be resolved). Connect fails with `expected`, as a TCP connect does,
// leaving the QP as it was; nothing else completes.
void ConnectWhileLinkDown(Hosts& hosts, bool far, HRESULT expected) {
  RunWithPeer("netns_listener", {{"netns", hosts.b()}}, [&](Channel& peer) {
    InNamespace inside(hosts.a());
    Client c;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    if (far) hosts.CutPeerLink();
    else hosts.CutLink();
    Ov ov;
    HRESULT hr = c.StartConnect(port, ov);
    IT_CHECK_HR(expected, ov.Finish(hr, "Connect while a link is down", 60000));
    ExpectNoCompletion(c.e.cq.get(), "client CQ", 50);
    peer.Send("done");
  });
}

// Our link down: no route, ND_NETWORK_UNREACHABLE at once.
TEST_F(IntegrationNetns, LinkDownBeforeConnectIsNetworkUnreachable) {
  ConnectWhileLinkDown(hosts(), false, ND_NETWORK_UNREACHABLE);
}

// The far link down: ND_HOST_UNREACHABLE once the host's neighbour discovery gives up (seconds).
TEST_F(IntegrationNetns, FarLinkDownDuringConnectIsHostUnreachable) {
  ConnectWhileLinkDown(hosts(), true, ND_HOST_UNREACHABLE);
}

// The peer process is killed after it took the connection request and before it accepted:
// Connect fails ND_CONNECTION_REFUSED (RoCE: the REQ's next retry meets a closed port; iWARP:
// the dead process's kernel resets the connection), and nothing else completes.
TEST_F(IntegrationNetns, PeerKilledBeforeAcceptRefusesConnect) {
  RunWithPeer("netns_request_then_die", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    Ov ov;
    HRESULT hr = c.StartConnect(port, ov);
    peer.Expect("requested");
    KillPeer();
    IT_CHECK_HR(ND_CONNECTION_REFUSED, ov.Finish(hr, "Connect to a peer killed before Accept", 60000));
    ExpectNoCompletion(c.e.cq.get(), "client CQ", 50);
  });
}

// The peer process is killed while our Disconnect is in progress: Disconnect still ends (the
// close meets a closed port or a reset), after the flush.
TEST_F(IntegrationNetns, PeerKilledDuringDisconnect) {
  RunWithPeer("netns_server", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer);
    Ov ov;
    HRESULT hr = c.e.connector->Disconnect(ov.Prepare(c.e.connector.get()));
    KillPeer();
    hr = ov.Finish(hr, "Disconnect while the peer is killed", 60000);
    IT_CHECK(hr == ND_SUCCESS || hr == ND_TIMEOUT);
    c.ExpectReceiveFlushed("the client's receive, flushed by Disconnect");
    ExpectNoCompletion(c.e.cq.get(), "client CQ", 50);
  });
}

// The peer process is killed at a random point of a stream of sends (the point is printed, so
// that a failure can be replayed with NDWV_TEST_KILL_AFTER): every send posted completes exactly
// once, in order, successes first; the receive is flushed; NotifyDisconnect completes; nothing
// hangs.
TEST_F(IntegrationNetns, PeerKilledAtARandomPointOfAStream) {
  const char* fixed = std::getenv("NDWV_TEST_KILL_AFTER");
  const int killAfter = fixed ? std::atoi(fixed) : int(NowMs() % 40);
  std::printf("killing the peer after %d completed sends (NDWV_TEST_KILL_AFTER=%d replays it)\n", killAfter,
              killAfter);
  RunWithPeer("netns_sink", {{"netns", hosts().b()}, {"count", "1000"}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer);
    Ov notify;
    HRESULT hr = c.e.connector->NotifyDisconnect(notify.Prepare(c.e.connector.get()));
    IT_CHECK_HR(ND_PENDING, hr);
    int completed = 0, posted = 0;
    bool failed = false;
    for (; posted < 4; ++posted) c.PostSend();
    while (completed < posted) {
      if (completed == killAfter && !failed) KillPeer();
      ND2_RESULT r = NextCompletion(c.e.cq.get(), "a send of the stream", 30000);
      IT_CHECK(r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x200 + completed));
      if (r.Status != ND_SUCCESS) {
        IT_CHECK(r.Status == ND_IO_TIMEOUT || r.Status == ND_CANCELED);
        failed = true;
      } else {
        IT_CHECK(!failed);  // no success after the first failure: the rest are flushed
      }
      completed++;
      if (!failed && posted < killAfter + 8) {
        c.PostSend();
        posted++;
      }
    }
    c.ExpectReceiveFlushed("the client's receive after the kill", 30000);
    IT_OK(notify.Finish(hr, "NotifyDisconnect after the kill", 30000));
    hr = Disconnect(c.e.connector.get());
    IT_CHECK(hr == ND_SUCCESS || hr == ND_TIMEOUT);
    ExpectNoCompletion(c.e.cq.get(), "client CQ after every send completed", 50);
  });
}

// Random loss on the link, both ways (nft in this side's namespace): every message arrives
// intact and no request fails: loss stays within the retry budget (RoCE: sequence NAKs, ACK
// timeouts and CM retries; iWARP: TCP).
class IntegrationNetnsLoss : public IntegrationNetns, public ::testing::WithParamInterface<int> {
 protected:
  void SetUp() override {
    if (!Shell("nft list tables")) GTEST_SKIP() << "needs nft";
    IntegrationNetns::SetUp();
  }
};

TEST_P(IntegrationNetnsLoss, EveryMessageArrivesIntact) {
  const std::string percent = std::to_string(GetParam());
  const std::string ns = "ip netns exec " + hosts().a() + " nft ";
  // Drops `percent` of what crosses va, both ways (the rules go with the namespace).
  auto installLoss = [&] {
    return Shell(ns + "add table inet loss") &&
           Shell(ns + "'add chain inet loss in { type filter hook input priority 0; }'") &&
           Shell(ns + "'add chain inet loss out { type filter hook output priority 0; }'") &&
           Shell(ns + "'add rule inet loss in iifname va numgen random mod 100 < " + percent + " drop'") &&
           Shell(ns + "'add rule inet loss out oifname va numgen random mod 100 < " + percent + " drop'");
  };
  // At 20 % a packet and its answer can miss 1 + 7 tries in a row now and then (more than the
  // retry budget; iWARP: TCP gives up after NDWV_IWARP_TIMEOUT_MS, a few tries): then, and only
  // then, may a send end ND_IO_TIMEOUT; everything before it arrived intact, and the rest is
  // flushed. On iWARP the peer's TCP has a budget too, for what it sends (confirmations, with
  // NDWV_IWARP_CONFIRM=all): when it runs out there first, the peer ends the connection and
  // the send is flushed (ND_CANCELED). Below 20 %, every send succeeds.
  const bool budgetMayRunOut = GetParam() >= 20;
  const int kCount = budgetMayRunOut ? 10 : 40;
  // iWARP's handshake is TCP's and the MPA exchange: at 20 % it too may outlast the budget, and
  // the peer accepts one connection only. So there the loss starts once connected; RoCE's CM
  // (ours, with its retries) connects across it at every rate.
  const bool lossAfterConnect = budgetMayRunOut && !TransportIsRoce();
  if (!lossAfterConnect) {
    ASSERT_TRUE(installLoss()) << "could not install the nft rules";
  }
  RunWithPeer("netns_sink", {{"netns", hosts().b()}, {"count", std::to_string(kCount)}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer, 3);
    if (lossAfterConnect) IT_CHECK_MSG(installLoss(), "could not install the nft rules");
    int succeeded = 0;
    bool ranOut = false;
    for (int i = 0; i < kCount && !ranOut; ++i) {
      c.PostSend();
      ND2_RESULT r = NextCompletion(c.e.cq.get(), "a send across the lossy veth", 30000);
      IT_CHECK(r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x200 + i));
      if (r.Status == ND_SUCCESS) {
        succeeded++;
      } else {
        const bool peerRanOut = !TransportIsRoce() && r.Status == ND_CANCELED;
        IT_CHECK_MSG(budgetMayRunOut && (r.Status == ND_IO_TIMEOUT || peerRanOut),
                     "a send across the lossy veth ended " + StatusName(r.Status));
        std::printf("[ INFO     ] the retry budget ran out %s, after %d sends\n",
                    peerRanOut ? "at the peer (it ended the connection)" : "here", succeeded);
        ranOut = true;
      }
    }
    // The close exchange crosses the lossy link too: it may outlast its budget (ND_TIMEOUT, a
    // success status: the QP is flushed all the same).
    HRESULT hr = Disconnect(c.e.connector.get());
    IT_CHECK_MSG(hr == ND_SUCCESS || hr == ND_TIMEOUT, "Disconnect over the lossy link: " + StatusName(hr));
    peer.Send("client disconnected");
    c.ExpectReceiveFlushed("the client's receive after Disconnect");
    // A send whose every acknowledgement was lost may still have arrived.
    uint64_t received = peer.ReceiveValue("received", 60000);
    if (ranOut) {
      IT_CHECK(received == uint64_t(succeeded) || received == uint64_t(succeeded) + 1);
    } else if (budgetMayRunOut && !SendsConfirmed() && received < uint64_t(kCount)) {
      // Sends that complete when handed to TCP completed before the budget ran out; the
      // connection ended with some still unacknowledged. The peer got the ones before them, each
      // intact and in order (it checks), and then its receives were flushed: a stream cut short
      // is a broken one (our FIN follows the data).
      std::printf("[ INFO     ] TCP gave up after %llu of %d sends reached the peer\n",
                  static_cast<unsigned long long>(received), kCount);
    } else {
      IT_CHECK_EQ(uint64_t(kCount), received);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Percent, IntegrationNetnsLoss, ::testing::Values(1, 10, 20),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Loss" + std::to_string(info.param) + "Percent";
                         });

// A router with ECN on the link, both ways (nft in this side's namespace): it marks 10 % of the
// ECN-capable datagrams Congestion Experienced, and drops 10 % of the others. ndwv's datagrams are
// ECN-capable (NDWV_ROCE_ECN), so none of them is lost: the peer never sees a gap (no sequence
// NAK comes back), and the marks draw its congestion notifications (CNPs). RoCE only: iWARP's
// TCP has ECN of its own. (On a loopback address marks are not read: no router is there.)
class IntegrationNetnsEcn : public IntegrationNetns {
 protected:
  void SetUp() override {
    if (!TransportIsRoce()) GTEST_SKIP() << "RoCE only: iWARP's TCP has ECN of its own";
    const char* ecn = std::getenv("NDWV_ROCE_ECN");
    const std::string off = ecn ? ecn : "1";
    if (off == "0" || off == "false" || off == "no") GTEST_SKIP() << "NDWV_ROCE_ECN=" << off;
    if (!Shell("nft list tables")) GTEST_SKIP() << "needs nft";
    IntegrationNetns::SetUp();
  }
};

TEST_F(IntegrationNetnsEcn, BehindARouterWithEcnNothingIsLostAndMarksDrawCnps) {
  const std::string ns = "ip netns exec " + hosts().a() + " nft ";
  ASSERT_TRUE(Shell(ns + "add table inet router") &&
              Shell(ns + "'add chain inet router in { type filter hook input priority 0; }'") &&
              Shell(ns + "'add chain inet router out { type filter hook output priority 0; }'") &&
              Shell(ns + "'add rule inet router in iifname va ip ecn ect0 numgen random mod 100 < 10 ip ecn set ce'") &&
              Shell(ns + "'add rule inet router in iifname va ip ecn not-ect numgen random mod 100 < 10 drop'") &&
              Shell(ns + "'add rule inet router out oifname va ip ecn ect0 numgen random mod 100 < 10 ip ecn set ce'") &&
              Shell(ns + "'add rule inet router out oifname va ip ecn not-ect numgen random mod 100 < 10 drop'"))
      << "could not install the nft rules";
  // A Send of 4 KiB may cross the router as one datagram (GSO), and a connection's first CNP waits
  // for a quarter of a window (16 packets): with 40 Sends no mark came late enough in ~2 % of
  // runs (0.9^36); with 200, in 0.9^196 ~ 1e-9.
  constexpr int kCount = 200;
  RunWithPeer("netns_sink", {{"netns", hosts().b()}, {"count", std::to_string(kCount)}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    // The process's totals: what this test adds to them (an earlier test in the process may have
    // counted losses of its own).
    const uint64_t naksBefore = AdapterCounter("naks_received_sequence", "RoCEv2");
    const uint64_t cnpsBefore = AdapterCounter("cnps_received", "RoCEv2");
    Client c;
    c.Connect(peer);
    for (int i = 0; i < kCount; ++i) {
      c.PostSend();
      ND2_RESULT r = NextCompletion(c.e.cq.get(), "a send behind the router", 30000);
      IT_CHECK(r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x200 + i));
      IT_CHECK_MSG(r.Status == ND_SUCCESS, "a send behind the router ended " + StatusName(r.Status));
    }
    IT_OK(Disconnect(c.e.connector.get()));
    peer.Send("client disconnected");
    c.ExpectReceiveFlushed("the client's receive after Disconnect");
    IT_CHECK_EQ(uint64_t(kCount), peer.ReceiveValue("received", 60000));
    IT_CHECK_MSG(AdapterCounter("naks_received_sequence", "RoCEv2") == naksBefore,
                 "the peer saw a gap: a datagram of ours was dropped, not marked");
    IT_CHECK_MSG(AdapterCounter("cnps_received", "RoCEv2") > cnpsBefore, "the marks on our datagrams drew no CNP");
  });
}

// The peer process is killed: this side learns it (RoCE: ICMP port unreachable from the peer's
// host, or the retry budget; iWARP: the peer's kernel resets the TCP connection), its receive is
// flushed, NotifyDisconnect completes, later requests complete (none hangs), Disconnect succeeds.
TEST_F(IntegrationNetns, PeerKilledDuringATransfer) {
  RunWithPeer("netns_server", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    c.Connect(peer);
    c.PostSend();
    ExpectCompletion(c.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kClientQp, -1},
                     "the send before the kill");
    Ov notify;
    HRESULT hr = c.e.connector->NotifyDisconnect(notify.Prepare(c.e.connector.get()));
    IT_CHECK_HR(ND_PENDING, hr);
    KillPeer();
    c.PostSend();
    ND2_RESULT r = NextCompletion(c.e.cq.get(), "the send after the kill", 30000);
    IT_CHECK(r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x201));
    // RoCE: ND_IO_TIMEOUT. iWARP: handed to TCP before the reset arrived (success), or flushed.
    if (TransportIsRoce()) IT_CHECK_HR(ND_IO_TIMEOUT, r.Status);
    else IT_CHECK(r.Status == ND_SUCCESS || r.Status == ND_CANCELED || r.Status == ND_IO_TIMEOUT);
    c.ExpectReceiveFlushed("the client's receive after the kill");
    IT_OK(notify.Finish(hr, "NotifyDisconnect after the kill"));
    hr = Disconnect(c.e.connector.get());
    IT_CHECK(hr == ND_SUCCESS || hr == ND_TIMEOUT);
    ExpectNoCompletion(c.e.cq.get(), "client CQ after every request completed", 50);
  });
}

// ---- this side as the passive one, and setup interrupted -----------------------------------------
//
// What a request whose connection is lost or abandoned during setup ends with (nd2-spi 14.1,
// 14.2, 15.4; docs/teardown.md, "Connection setup faults"):
// * the peer went silent (the link cut): the Accept waits for a CompleteConnect that never comes,
//   ND_IO_TIMEOUT ("peer never completed"), once the transport's budget is spent (RoCE: the REP's
//   retries; iWARP: TCP gives up on the Reply or, sent, on keepalives, NDWV_IWARP_TIMEOUT_MS);
// * the peer's process killed: it abandoned the establishment. RoCE learns it from the peer's
//   host (ICMP port unreachable for our REP): ND_CONNECTION_ABORTED. On iWARP the dead process's
//   kernel closes its socket just as a released connector does, and for that the tool tests
//   expect ND_CONNECTION_REFUSED (15.4): the same status, since nothing tells the two apart;
// * a GetConnectionRequest is about the listener, not a connection: no request, no completion,
//   until it is canceled (ND_CANCELED).
// Every request completes exactly once (one packet on a completion port each), and every object
// is released afterwards without waiting on the dead connection.

constexpr ULONG_PTR kKey = 0x5E7;
constexpr int kSetupBudgetMs = 30000;  // the longest budget above with the defaults, and margin

// The completion packets of this side's overlapped requests, from a port on the adapter's file:
// a request that completes brings exactly one.
class Packets {
 public:
  explicit Packets(const Adapter& adapter) : port_(CreateIoCompletionPort(INVALID_HANDLE_VALUE, nullptr, 0, 0)) {
    IT_CHECK(port_ != nullptr);
    IT_CHECK(CreateIoCompletionPort(adapter.file(), port_, kKey, 0) == port_);
  }
  ~Packets() { CloseHandle(port_); }
  Packets(const Packets&) = delete;
  Packets& operator=(const Packets&) = delete;

  // The final status of the request issued with `ov` that returned `issued`, asked of `object`
  // (any object of the adapter: the OVERLAPPED says which request). Bounded.
  HRESULT Finish(IND2Overlapped* object, OVERLAPPED* ov, HRESULT issued, const std::string& what,
                 int ms = kWaitMs) {
    if (issued != ND_PENDING) return issued;  // refused, or done inline: no packet follows
    Deadline deadline(ms);
    while (!completed_.count(ov)) {
      if (deadline.Expired()) IT_FAIL(what + " did not complete within " + std::to_string(ms) + " ms");
      Take(std::min(deadline.LeftMs(), 100), what);
    }
    HRESULT hr = object->GetOverlappedResult(ov, FALSE);
    IT_CHECK_MSG(hr != ND_PENDING, what + ": a packet came, the request still pending");
    return hr;
  }
  // Whether the packet of `ov` has come (what is queued now; no wait).
  bool Completed(OVERLAPPED* ov, const std::string& what) {
    while (Take(0, what)) {
    }
    return completed_.count(ov) != 0;
  }
  // No packet within a bounded look (not a timing assertion): nothing completed twice or late.
  void ExpectNone(const std::string& what, int ms = 50) {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* got = nullptr;
    BOOL ok = GetQueuedCompletionStatus(port_, &bytes, &key, &got, DWORD(ms));
    IT_CHECK_MSG(!ok && got == nullptr, what + ": an unexpected completion packet");
  }

 private:
  bool Take(int ms, const std::string& what) {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* got = nullptr;
    BOOL ok = GetQueuedCompletionStatus(port_, &bytes, &key, &got, DWORD(ms));
    if (!ok && got == nullptr) return false;
    IT_CHECK_EQ(kKey, key);
    IT_CHECK_MSG(completed_.insert(got).second, what + ": a request completed twice");
    return true;
  }

  HANDLE port_;
  std::set<OVERLAPPED*> completed_;
};

// This side: a listener on kAddressA, a QP with one receive posted, requests through Packets.
struct Server {
  Adapter adapter;
  std::vector<uint8_t> inbox = std::vector<uint8_t>(kMessage);
  Mr inboxMr{adapter, inbox.data(), inbox.size(), kSinkFlags};
  Endpoint e{adapter, kServerQp, {.depth = 8, .separateCqs = true}};
  Packets packets{adapter};  // after the registration: its completion is not one of ours
  OVERLAPPED request{}, accept{};

  Server() {
    ND2_SGE sge = {inbox.data(), kMessage, inboxMr.token()};
    IT_OK(e.qp->Receive(Ctx(0x900), &sge, 1));
  }
  // Listens on kAddressA (a port the host chooses) and has a GetConnectionRequest pending;
  // returns the port.
  uint16_t Listen() {
    e.listener = adapter.CreateListener();
    sockaddr_in here = Address(kAddressA, 0);
    IT_OK(e.listener->Bind(reinterpret_cast<sockaddr*>(&here), sizeof here));
    IT_OK(e.listener->Listen(0));
    sockaddr_in bound{};
    ULONG length = sizeof bound;
    IT_OK(e.listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&bound), &length));
    e.connector = adapter.CreateConnector();
    requestIssued = e.listener->GetConnectionRequest(e.connector.get(), &request);
    IT_CHECK_HR(ND_PENDING, requestIssued);
    return PortOf(bound);
  }
  // The peer's request arrived: GetConnectionRequest completes.
  void TakeRequest() {
    IT_OK(packets.Finish(e.listener.get(), &request, requestIssued, "GetConnectionRequest"));
  }
  HRESULT StartAccept() { return acceptIssued = e.connector->Accept(e.qp.get(), 4, 4, nullptr, 0, &accept); }
  HRESULT FinishAccept(const char* what) {
    return packets.Finish(e.connector.get(), &accept, acceptIssued, what, kSetupBudgetMs);
  }
  // After a failed setup: the receive was flushed (the QP failed with the connection), once; no
  // request completes again; then every object is released, each Release returning (the
  // harness's watchdog bounds them) with nothing left pending.
  void ExpectFlushedAndRelease(const char* what) {
    ExpectCompletion(e.receiveCq, {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x900), kServerQp, -1}, what);
    ExpectNoCompletion(e.receiveCq, "server receive CQ after the flush", 50);
    ExpectNoCompletion(e.cq.get(), "server CQ", 50);
    packets.ExpectNone("this side's requests after the fault");
    IT_CHECK_EQ(ULONG(0), e.connector.Reset());
    IT_CHECK_EQ(ULONG(0), e.qp.Reset());
    IT_CHECK_EQ(ULONG(0), e.listener.Reset());
    packets.ExpectNone("this side's requests after their objects' release");
  }

  HRESULT requestIssued = ND_PENDING, acceptIssued = ND_PENDING;
};

// This side serves the peer netns_client: its request arrives, `fault` strikes (issuing the
// Accept before or after it), and the Accept must end `expected` (bounded); then the receive is
// flushed and every object released.
void AcceptDespite(Hosts& hosts, HRESULT expected, const char* what,
                   const std::function<void(Channel& peer, Server& s)>& fault) {
  RunWithPeer("netns_client", {{"netns", hosts.b()}}, [&](Channel& peer) {
    InNamespace inside(hosts.a());
    Server s;
    peer.SendValue("port", s.Listen());
    s.TakeRequest();
    fault(peer, s);
    IT_CHECK_HR(expected, s.FinishAccept(what));
    s.ExpectFlushedAndRelease("the server's receive after the Accept failed");
    KillPeer();  // if still alive: what becomes of it is not the subject
  });
}

// A killed peer abandoned the establishment (see above): the status per transport.
HRESULT Abandoned() { return TransportIsRoce() ? ND_CONNECTION_ABORTED : ND_CONNECTION_REFUSED; }

// (Item 1) The link is cut after the request arrived and before Accept: the Reply can never
// reach the peer, and the Accept ends ND_IO_TIMEOUT (the peer never completed).
TEST_F(IntegrationNetns, LinkCutBeforeAcceptTimesItOut) {
  AcceptDespite(hosts(), ND_IO_TIMEOUT, "Accept after the link was cut", [&](Channel&, Server& s) {
    hosts().CutLink();
    s.StartAccept();
  });
}

// (Item 2) The link is cut after Accept was issued and the peer's Connect completed, before its
// CompleteConnect (RoCE: the RTU; iWARP: the RTR) can arrive: the Accept ends ND_IO_TIMEOUT.
TEST_F(IntegrationNetns, LinkCutBeforeTheRtuTimesTheAcceptOut) {
  AcceptDespite(hosts(), ND_IO_TIMEOUT, "Accept whose RTU was cut off", [&](Channel& peer, Server& s) {
    IT_CHECK_HR(ND_PENDING, s.StartAccept());
    IT_CHECK_HR(ND_SUCCESS, HRESULT(peer.ReceiveValue("connected", 30000)));
    hosts().CutLink();
    peer.Send("complete");  // into the cut link
  });
}

// (Item 3) A GetConnectionRequest pending across a cut link: no request arrives, so it stays
// pending (a bounded look); Cancel ends it ND_CANCELED before returning, and the release of the
// listener ends another one ND_CANCELED.
TEST_F(IntegrationNetns, LinkCutLeavesGetConnectionRequestPendingUntilCanceled) {
  RunLocal([&] {
    InNamespace inside(hosts().a());
    Server s;
    s.Listen();
    hosts().CutLink();
    s.packets.ExpectNone("GetConnectionRequest across the cut link", 200);
    IT_CHECK(!s.packets.Completed(&s.request, "GetConnectionRequest"));
    IT_OK(s.e.listener->CancelOverlappedRequests());
    IT_CHECK_MSG(s.packets.Completed(&s.request, "GetConnectionRequest"), "Cancel returned before it completed");
    IT_CHECK_HR(ND_CANCELED, s.e.listener->GetOverlappedResult(&s.request, FALSE));
    OVERLAPPED again{};
    Ref<IND2Connector> second = s.adapter.CreateConnector();
    HRESULT hr = s.e.listener->GetConnectionRequest(second.get(), &again);
    IT_CHECK_HR(ND_PENDING, hr);
    IT_CHECK_EQ(ULONG(0), s.e.listener.Reset());
    IT_CHECK_HR(ND_CANCELED, s.packets.Finish(second.get(), &again, hr, "GetConnectionRequest of a released listener"));
    s.packets.ExpectNone("the listener's requests after its release");
    IT_CHECK_EQ(ULONG(0), second.Reset());
    IT_CHECK_EQ(ULONG(0), s.e.connector.Reset());
    IT_CHECK_EQ(ULONG(0), s.e.qp.Reset());
  });
}

// (Item 3) The peer's process is killed after its request arrived (GetConnectionRequest
// completed) and before Accept: the Accept ends with the abandonment's status.
TEST_F(IntegrationNetns, PeerKilledBeforeAcceptEndsTheAccept) {
  AcceptDespite(hosts(), Abandoned(), "Accept of a killed peer's request", [&](Channel&, Server& s) {
    KillPeer();
    s.StartAccept();
  });
}

// (Item 5) The peer's process is killed while our Accept is pending (its Connect completed, no
// CompleteConnect yet): the Accept ends with the abandonment's status.
TEST_F(IntegrationNetns, PeerKilledWhileAcceptIsPendingEndsIt) {
  AcceptDespite(hosts(), Abandoned(), "Accept whose peer was killed", [&](Channel& peer, Server& s) {
    IT_CHECK_HR(ND_PENDING, s.StartAccept());
    IT_CHECK_HR(ND_SUCCESS, HRESULT(peer.ReceiveValue("connected", 30000)));
    KillPeer();
  });
}

// (Item 4) The active side: the link is cut after Connect completed and before CompleteConnect.
// CompleteConnect is a local step and succeeds (its RTU/RTR is lost); the dead link is then found
// like any other (RoCE: the keepalive's retries; iWARP: TCP gives up on the unacknowledged RTR):
// NotifyDisconnect completes, the receive is flushed, Disconnect ends ND_TIMEOUT or ND_SUCCESS,
// and every object is released. The peer's Accept ends ND_IO_TIMEOUT (it never saw the RTU).
TEST_F(IntegrationNetns, LinkCutBeforeCompleteConnect) {
  RunWithPeer("netns_acceptor", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client c;
    Packets packets(c.adapter);
    ND2_SGE sge = {c.inbox.data(), kMessage, c.inboxMr.token()};
    IT_OK(c.e.qp->Receive(Ctx(0x900), &sge, 1));
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    c.e.connector = c.adapter.CreateConnector();
    sockaddr_in local = Address(kAddressA, 0), server = Address(kAddressB, port);
    IT_OK(c.e.connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
    OVERLAPPED connect{}, complete{}, notify{}, disconnect{};
    HRESULT hr = c.e.connector->Connect(c.e.qp.get(), reinterpret_cast<sockaddr*>(&server), sizeof server, 4, 4,
                                        nullptr, 0, &connect);
    IT_OK(packets.Finish(c.e.connector.get(), &connect, hr, "Connect"));
    hosts().CutLink();
    hr = c.e.connector->CompleteConnect(&complete);
    IT_OK(packets.Finish(c.e.connector.get(), &complete, hr, "CompleteConnect across the cut link"));
    hr = c.e.connector->NotifyDisconnect(&notify);
    IT_OK(packets.Finish(c.e.connector.get(), &notify, hr, "NotifyDisconnect after the cut", kSetupBudgetMs));
    c.ExpectReceiveFlushed("the client's receive after the cut");
    hr = c.e.connector->Disconnect(&disconnect);
    hr = packets.Finish(c.e.connector.get(), &disconnect, hr, "Disconnect after the cut", kSetupBudgetMs);
    IT_CHECK_MSG(hr == ND_SUCCESS || hr == ND_TIMEOUT, "Disconnect after the cut: " + StatusName(hr));
    ExpectNoCompletion(c.e.cq.get(), "client CQ", 50);
    packets.ExpectNone("this side's requests after the fault");
    IT_CHECK_EQ(ULONG(0), c.e.connector.Reset());
    IT_CHECK_EQ(ULONG(0), c.e.qp.Reset());
    packets.ExpectNone("this side's requests after their objects' release");
    IT_CHECK_HR(ND_IO_TIMEOUT, HRESULT(peer.ReceiveValue("accept", kSetupBudgetMs)));
    peer.Expect("released");
  });
}

// ND's Listen(0) asks for no limit: a Connect beyond a full backlog (the host's somaxconn, 1 in
// namespace B here) waits. On RoCE the listener postpones its REQ with an MRA; the Connect, once
// its budget is spent, ends ND_TIMEOUT ("try again"; a silent peer's ends ND_IO_TIMEOUT), and
// issued again on the same connector after the listener took a request, it gets in. On iWARP it
// waits in the kernel's accept queue. Both connections are then made, in whichever order.
TEST_F(IntegrationNetns, AConnectBeyondAFullListenerWaitsOrEndsTryAgain) {
  IT_CHECK(Shell("ip netns exec " + hosts().b() + " sysctl -qw net.core.somaxconn=1"));
  RunWithPeer("netns_full_listener", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    Client clients[2];
    Ov connects[2];
    // Which of `candidates` completes first (bounded by the longest setup budget).
    auto first_done = [&](std::initializer_list<int> candidates) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSetupBudgetMs);
      for (;;) {
        for (int i : candidates)
          if (connects[i].Completed()) return i;
        IT_CHECK_MSG(std::chrono::steady_clock::now() < deadline, "no Connect completed within the budget");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    const uint16_t port = uint16_t(peer.ReceiveValue("port"));
    for (int i = 0; i < 2; ++i) IT_CHECK_HR(ND_PENDING, clients[i].StartConnect(port, connects[i]));
    int postponed = -1;  // RoCE: the Connect that ended while the listener was full
    if (TransportIsRoce()) {
      postponed = first_done({0, 1});
      IT_CHECK_HR(ND_TIMEOUT, connects[postponed].Finish(ND_PENDING, "the Connect beyond the backlog"));
      IT_CHECK_MSG(!connects[1 - postponed].Completed(), "the Connect the listener holds waits");
    } else {
      IT_CHECK_MSG(!connects[0].Completed() && !connects[1].Completed(), "the Connect beyond the backlog waits");
    }
    peer.Send("take");
    // The listener accepts one at a time, each Accept ending with our CompleteConnect.
    auto complete = [&](int i) {
      IT_OK(connects[i].Finish(ND_PENDING, "Connect"));
      CompleteConnect(clients[i].e.connector.get());
      peer.Expect("accepted");
    };
    if (postponed < 0) {
      const int first = first_done({0, 1});
      complete(first);
      complete(1 - first);
    } else {
      complete(1 - postponed);
      Client& again = clients[postponed];  // issued again on the same connector, as the SPI allows
      sockaddr_in server = Address(kAddressB, port);
      IT_CHECK_HR(ND_PENDING, again.e.connector->Connect(again.e.qp.get(), reinterpret_cast<sockaddr*>(&server),
                                                         sizeof server, 4, 4, nullptr, 0,
                                                         connects[postponed].Prepare(again.e.connector.get())));
      complete(postponed);
    }
    for (Client& c : clients) IT_OK(Disconnect(c.e.connector.get()));
    peer.Send("done");
  });
}

// The process at the other end of many connections dies while the application talks on one of
// them: every connection reports its end (NotifyDisconnect), and the receive each had posted is
// flushed. iWARP: the dead process's kernel resets them all. RoCE: its kernel says nothing; the
// connection that talks finds the port closed (or its retries run out), and the idle others to the
// same port then probe it at once (counter peer_probes) rather than each at its own keepalive,
// which with 10,000 connections comes every 20 s (bench/README.md, "A peer crash").
TEST_F(IntegrationNetns, PeerKilledEndsEveryConnectionToItOnceOneFindsOut) {
  RunWithPeer("netns_acceptor_of_many", {{"netns", hosts().b()}}, [&](Channel& peer) {
    InNamespace inside(hosts().a());
    std::vector<std::unique_ptr<Client>> clients;
    const uint16_t port = uint16_t(peer.ReceiveValue("port"));
    for (int i = 0; i < kMany; ++i) {
      clients.push_back(std::make_unique<Client>());
      Client& c = *clients.back();
      ND2_SGE sge = {c.inbox.data(), kMessage, c.inboxMr.token()};
      IT_OK(c.e.qp->Receive(Ctx(0x900), &sge, 1));  // flushed when the connection ends
      Ov connect;
      IT_OK(connect.Finish(c.StartConnect(port, connect), "Connect"));
      CompleteConnect(c.e.connector.get());
    }
    peer.Expect("accepted");
    std::vector<Ov> notify(kMany);
    for (int i = 0; i < kMany; ++i)
      IT_CHECK_HR(ND_PENDING, clients[i]->e.connector->NotifyDisconnect(notify[i].Prepare(clients[i]->e.connector.get())));
    const uint64_t probes = TransportIsRoce() ? AdapterCounter("peer_probes", "RoCEv2") : 0;
    KillPeer();
    clients[0]->PostSend();
    for (int i = 0; i < kMany; ++i) {
      IT_OK(notify[i].Finish(ND_PENDING, "NotifyDisconnect after the kill", kSetupBudgetMs));
      clients[i]->ExpectReceiveFlushed("a receive after the kill");
    }
    if (TransportIsRoce()) IT_CHECK_MSG(AdapterCounter("peer_probes", "RoCEv2") > probes, "the idle connections probed the dead peer");
  });
}

// The Accept's own time limit, the peer passive this time with short timeouts (its settings are
// its environment's): iWARP with TCP's own budget of minutes (NDWV_IWARP_TIMEOUT_MS=0), so that
// the Accept's timer (6 x NDWV_CM_TIMEOUT_MS) is what ends it, the path on which a timed-out
// Accept once blocked the engine (ade7c16); RoCE with the REP's retries cut short. The link is
// cut after our Connect completed: the peer's Accept ends ND_IO_TIMEOUT, and it then releases
// connector, QP and listener.
TEST_F(IntegrationNetns, AcceptTimeLimitEndsAnAcceptCutOffFromItsPeer) {
  RunWithPeer("netns_acceptor",
              {{"netns", hosts().b()},
               {"env:NDWV_IWARP_TIMEOUT_MS", "0"},
               {"env:NDWV_CM_TIMEOUT_MS", "200"},
               {"env:NDWV_ROCE_CM_TIMEOUT_MS", "100"},
               {"env:NDWV_ROCE_CM_RETRIES", "2"}},
              [&](Channel& peer) {
                InNamespace inside(hosts().a());
                Client c;
                uint16_t port = uint16_t(peer.ReceiveValue("port"));
                Ov ov;
                IT_OK(ov.Finish(c.StartConnect(port, ov), "Connect"));
                hosts().CutLink();
                IT_CHECK_HR(ND_IO_TIMEOUT, HRESULT(peer.ReceiveValue("accept", kSetupBudgetMs)));
                peer.Expect("released");
              });
}

}  // namespace
}  // namespace ndit
