// roce::Port's flows: how many one port opens, what happens past that, and how long one outlives
// its connection. The port port-0 connectors share. The GRO socket a process keeps. A shared port's recent routes: what they
// answer, and for how long. The packed address its sinks are kept with.
#include <arpa/inet.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/socket.h>

#include <gtest/gtest.h>

#include <ndwv/wvstatus.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "base/settings.h"
#include "dev/address.h"
#include "dev/counters.h"
#include "dev/roce/port.h"
#include "dev/roce/rc.h"
#include "engine_hold.h"
#include "wait.h"

namespace ndwv::dev {
namespace {

sockaddr_storage Host(uint32_t ip, uint16_t port) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(ip);
  sockaddr_storage a{};
  memcpy(&a, &in, sizeof in);
  return a;
}

sockaddr_storage Loopback(uint16_t port) { return Host(INADDR_LOOPBACK, port); }

// What a QP's packets are checked against: equal exactly when SameAddress says so.
TEST(PackedAddress, EqualForTheSameAddressAndPortOnly) {
  sockaddr_storage mapped{};
  auto& in6 = reinterpret_cast<sockaddr_in6&>(mapped);
  in6.sin6_family = AF_INET6;
  in6.sin6_port = htons(4791);
  inet_pton(AF_INET6, "::ffff:127.0.0.1", &in6.sin6_addr);
  const sockaddr_storage cases[] = {Loopback(4791), Loopback(4792), Host(INADDR_LOOPBACK + 1, 4791), mapped};
  for (const auto& a : cases) {
    for (const auto& b : cases) {
      EXPECT_EQ(PackedAddress::Of(a) == PackedAddress::Of(b), SameAddress(a, b)) << Describe(a) << " " << Describe(b);
      if (SameAddress(a, b)) {
        EXPECT_EQ(AddressHash(a), AddressHash(b));
      }
    }
  }
  EXPECT_NE(PackedAddress::Of(Loopback(4791)), PackedAddress::Of(mapped));  // families differ
  sockaddr_storage none{};
  EXPECT_EQ(PackedAddress::Of(none).family, 0);
}

TEST(RocePort, APortOpensAtMostItsBoundOfFlowsAndTheRestUseItsOwnSocket) {
  int32_t status = 0;
  std::shared_ptr<roce::Port> port = roce::Port::Open(Loopback(0), false, &status);
  ASSERT_TRUE(port) << status;
  // Peer ports nobody uses: a flow is only connect()ed there, nothing is sent.
  auto peer = [](size_t i) { return Loopback(uint16_t(20000 + i)); };
  std::vector<std::shared_ptr<roce::Port>> flows;
  std::set<roce::Port*> distinct;
  for (size_t i = 0; i < roce::Port::kMaxFlows; ++i) {
    flows.push_back(roce::Port::OpenFlow(port, peer(i)));
    ASSERT_TRUE(flows.back()) << "flow " << i;
    distinct.insert(flows.back().get());
    EXPECT_EQ(PortOf(flows.back()->local()), PortOf(port->local()));
  }
  EXPECT_EQ(distinct.size(), roce::Port::kMaxFlows);
  // A peer that has a flow shares it; a new peer past the bound gets none.
  EXPECT_EQ(roce::Port::OpenFlow(port, peer(3)), flows[3]);
  EXPECT_FALSE(roce::Port::OpenFlow(port, peer(roce::Port::kMaxFlows)));
  // A flow released makes room for one more.
  flows[5].reset();
  std::shared_ptr<roce::Port> next = roce::Port::OpenFlow(port, peer(roce::Port::kMaxFlows));
  EXPECT_TRUE(next);
  EXPECT_FALSE(roce::Port::OpenFlow(port, peer(roce::Port::kMaxFlows + 1)));
}

// The connectors' ports count their flows together: taking ports in turn spreads a process's
// connections over more sockets, but adds no flows.
TEST(RocePort, TheConnectorsPortsShareOneBoundOfFlows) {
  if (base::Config().roce_connector_ports < 2) GTEST_SKIP() << "needs NDWV_ROCE_CONNECTOR_PORTS of 2 or more";
  int32_t status = 0;
  std::shared_ptr<roce::Port> a = roce::Port::Open(Loopback(0), true, &status);
  std::shared_ptr<roce::Port> b = roce::Port::Open(Loopback(0), true, &status);
  ASSERT_TRUE(a && b && a != b) << status;
  auto peer = [](size_t i) { return Loopback(uint16_t(21000 + i)); };
  std::vector<std::shared_ptr<roce::Port>> flows;
  for (size_t i = 0; i < roce::Port::kMaxFlows; ++i) {
    flows.push_back(roce::Port::OpenFlow(i % 2 ? b : a, peer(i)));
    ASSERT_TRUE(flows.back()) << "flow " << i;
  }
  EXPECT_FALSE(roce::Port::OpenFlow(a, peer(roce::Port::kMaxFlows)));
  EXPECT_FALSE(roce::Port::OpenFlow(b, peer(roce::Port::kMaxFlows)));
  flows[1].reset();  // one of b's
  EXPECT_TRUE(roce::Port::OpenFlow(a, peer(roce::Port::kMaxFlows)));
  // A port of its own (a listener's) has a bound of its own.
  std::shared_ptr<roce::Port> own = roce::Port::Open(Loopback(0), false, &status);
  ASSERT_TRUE(own) << status;
  EXPECT_TRUE(roce::Port::OpenFlow(own, peer(0)));
}

// The ports that port-0 connectors share are taken in turn, each found again by the connector
// whose turn it is next, a port's number is in use for an explicit Bind, and the adapter's totals
// count its datagrams once.
TEST(RocePort, PortZeroConnectorsTakeTheirPortsInTurnEachCountedOnce) {
  auto datagrams_sent = [] {
    return CollectCounters({Transport::Roce}, 0).front().values[size_t(Counter::PortDatagramsSent)];
  };
  int32_t status = 0;
  // NDWV_ROCE_CONNECTOR_PORTS ports, each its own, then the first again.
  const size_t turns = base::Config().roce_connector_ports;
  std::vector<std::shared_ptr<roce::Port>> ports;
  std::set<uint16_t> numbers;
  for (size_t i = 0; i < turns; ++i) {
    ports.push_back(roce::Port::Open(Loopback(0), true, &status));
    ASSERT_TRUE(ports.back()) << status;
    numbers.insert(PortOf(ports.back()->local()));
  }
  EXPECT_EQ(numbers.size(), turns);
  const std::shared_ptr<roce::Port>& first = ports.front();
  EXPECT_EQ(roce::Port::Open(Loopback(0), true, &status), first);
  EXPECT_FALSE(roce::Port::Open(first->local(), false, &status));
  EXPECT_EQ(status, WV_SHARING_VIOLATION);
  const uint64_t before = datagrams_sent();
  uint8_t bytes[16] = {};  // its last 4 take the ICRC
  roce::Port::OutDatagram datagram{};
  datagram.pieces[0] = {bytes, sizeof bytes};
  datagram.count = 1;
  datagram.size = sizeof bytes;
  ASSERT_EQ(first->SendBatch(Loopback(9), first->local(), &datagram, 1), 1);  // to the discard port
  EXPECT_EQ(datagrams_sent() - before, 1u);
}

// A connection's flow on the connectors' ports outlives it by the CM's time-wait (parked), is
// found again by the next connection to the same peer meanwhile, and is closed after it.
TEST(RocePort, AConnectorsFlowIsParkedForTheTimeWaitAndServesTheNextConnection) {
  if (base::Config().roce_timewait_ms == 0) GTEST_SKIP() << "NDWV_ROCE_TIMEWAIT_MS=0: nothing is parked";
  int32_t status = 0;
  const sockaddr_storage peer = Loopback(20999);  // nothing is sent there
  std::shared_ptr<roce::Port> connectors = roce::Port::Open(Loopback(0), true, &status);
  ASSERT_TRUE(connectors) << status;
  std::shared_ptr<roce::Port> flow = roce::Port::OpenFlow(connectors, peer);
  ASSERT_TRUE(flow);
  std::weak_ptr<roce::Port> watched = flow;
  roce::Port::Park(std::move(flow));
  ASSERT_FALSE(watched.expired());
  flow = roce::Port::OpenFlow(connectors, peer);  // the next connection to that peer
  EXPECT_EQ(flow, watched.lock());
  roce::Port::Park(std::move(flow));  // parked again, once
  connectors.reset();
  const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!watched.expired() && std::chrono::steady_clock::now() < bound)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(watched.expired()) << "the parked flow is still open after 10 s";

  // A port of its own parks its flows only while it has a listener, and its last listener's
  // going lets them go at once (the port must close with its connections, for a new listener).
  std::shared_ptr<roce::Port> own = roce::Port::Open(Loopback(0), false, &status);
  ASSERT_TRUE(own) << status;
  std::shared_ptr<roce::Port> accepted = roce::Port::OpenFlow(own, peer);
  ASSERT_TRUE(accepted);
  watched = accepted;
  roce::Port::Park(std::move(accepted));
  EXPECT_TRUE(watched.expired());
  constexpr uint64_t kService = 0x0106000000004711;
  ASSERT_EQ(own->AddListener(kService, std::weak_ptr<roce::CmUser>()), WV_SUCCESS);
  accepted = roce::Port::OpenFlow(own, peer);
  ASSERT_TRUE(accepted);
  watched = accepted;
  roce::Port::Park(std::move(accepted));
  EXPECT_FALSE(watched.expired());
  own->RemoveListener(kService);
  EXPECT_TRUE(watched.expired());
}

// Which addresses are loopback: a port bound to one does not read ECN marks (no router is there).
TEST(RocePort, LoopbackAddressesAreKnown) {
  auto v4 = [](const char* ip) {
    sockaddr_storage a{};
    auto& in = reinterpret_cast<sockaddr_in&>(a);
    in.sin_family = AF_INET;
    inet_pton(AF_INET, ip, &in.sin_addr);
    return a;
  };
  auto v6 = [](const char* ip) {
    sockaddr_storage a{};
    auto& in6 = reinterpret_cast<sockaddr_in6&>(a);
    in6.sin6_family = AF_INET6;
    inet_pton(AF_INET6, ip, &in6.sin6_addr);
    return a;
  };
  EXPECT_TRUE(IsLoopback(v4("127.0.0.1")));
  EXPECT_TRUE(IsLoopback(v4("127.255.0.9")));
  EXPECT_TRUE(IsLoopback(v6("::1")));
  EXPECT_TRUE(IsLoopback(v6("::ffff:127.0.0.1")));
  EXPECT_FALSE(IsLoopback(v4("0.0.0.0")));
  EXPECT_FALSE(IsLoopback(v4("10.0.0.1")));
  EXPECT_FALSE(IsLoopback(v4("128.0.0.1")));
  EXPECT_FALSE(IsLoopback(v6("::")));
  EXPECT_FALSE(IsLoopback(v6("fd00::1")));
  EXPECT_FALSE(IsLoopback(v6("::ffff:10.0.0.1")));
  EXPECT_FALSE(IsLoopback(sockaddr_storage{}));
}

// Datagrams the kernel drops because a port's socket is full are counted, and the process then
// sheds new connections for a while (the CM drops new REQs: test_roce_cm.cpp).
TEST(RocePort, DatagramsTheKernelDropsAreCountedAndNewConnectionsShedAWhile) {
  int32_t status = 0;
  std::shared_ptr<roce::Port> port = roce::Port::Open(Loopback(0), false, &status);
  ASSERT_TRUE(port) << status;
  int sender = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(sender, 0);
  const sockaddr_storage to = port->local();
  auto send_one = [&] {
    static const char kJunk[1400] = {};  // no packet: counted as malformed once read
    return sendto(sender, kJunk, sizeof kJunk, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to),
                  sizeof(sockaddr_in)) == ssize_t(sizeof kJunk);
  };
  // The engine busy elsewhere: far more than the socket's buffer (8 MiB at most) arrives.
  auto hold = std::make_shared<EngineHold>();
  ASSERT_TRUE(hold->Engage());
  for (int i = 0; i < 20000; ++i) send_one();
  const uint64_t released_at = port->NowMs();
  hold->Release();
  ASSERT_TRUE(WaitUntil([&] { return port->counters().overflowed.load() > 0; }, std::chrono::seconds(10)))
      << "no drop reported";
  EXPECT_LT(port->counters().overflowed.load(), 20000u);
  EXPECT_GE(roce::Port::ShedUntilMs(), released_at + 100) << "new connections are not shed";
  close(sender);
}

// The process's descriptor of the UDP socket bound to `local`, or -1.
int UdpSocketBoundTo(const sockaddr_storage& local) {
  for (int fd = 0; fd < 4096; ++fd) {
    int protocol = 0;
    socklen_t length = sizeof protocol;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &length) != 0 || protocol != IPPROTO_UDP) continue;
    sockaddr_storage bound{};
    length = sizeof bound;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0 && length == sizeof(sockaddr_in) &&
        memcmp(&bound, &local, sizeof(sockaddr_in)) == 0)
      return fd;
  }
  return -1;
}

// A socket the engine could not empty in its turn and that still holds more than 512 KiB
// (Port::kDeepQueueBytes) sheds new connections too, before anything is dropped: a deep queue is
// seconds of datagrams whose answers all come too late (Port::CheckOverflow).
TEST(RocePort, ASocketStillDeepAfterTheEnginesTurnShedsNewConnectionsBeforeItDrops) {
  int32_t status = 0;
  std::shared_ptr<roce::Port> port = roce::Port::Open(Loopback(0), false, &status);
  ASSERT_TRUE(port) << status;
  const sockaddr_storage to = port->local();
  const int fd = UdpSocketBoundTo(to);
  ASSERT_GE(fd, 0);
  int buffer = 0;
  socklen_t length = sizeof buffer;
  ASSERT_EQ(getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, &length), 0);
  ASSERT_GT(int64_t(buffer) * 3 / 4, int64_t(roce::Port::kDeepQueueBytes)) << "a buffer too small to be deep";
  auto queued = [&] {
    uint32_t info[SK_MEMINFO_VARS] = {};
    socklen_t size = sizeof info;
    return getsockopt(fd, SOL_SOCKET, SO_MEMINFO, info, &size) == 0 ? int64_t(info[SK_MEMINFO_RMEM_ALLOC]) : -1;
  };
  int sender = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(sender, 0);
  static const char kJunk[1400] = {};  // no packet: counted as malformed once read
  // The engine busy elsewhere: three quarters of the buffer arrive, far more than one turn reads.
  auto hold = std::make_shared<EngineHold>();
  ASSERT_TRUE(hold->Engage());
  for (int i = 0; i < 100000 && queued() <= int64_t(buffer) * 3 / 4; ++i)
    sendto(sender, kJunk, sizeof kJunk, MSG_DONTWAIT, reinterpret_cast<const sockaddr*>(&to), sizeof(sockaddr_in));
  const bool filled = queued() > int64_t(buffer) * 3 / 4;
  const uint64_t released_at = port->NowMs();
  hold->Release();
  ASSERT_TRUE(filled) << "the socket did not fill";
  EXPECT_TRUE(WaitUntil([&] { return roce::Port::ShedUntilMs() >= released_at + 100; }, std::chrono::seconds(10)))
      << "new connections are not shed";
  EXPECT_TRUE(WaitUntil([&] { return queued() == 0; }, std::chrono::seconds(10))) << "the socket was not read";
  EXPECT_EQ(port->counters().overflowed.load(), 0u) << "the socket overflowed: this test is for a deep one";
  close(sender);
}

// A connection's window is what the receiving socket's buffer surely holds, on this kernel: that
// many packets of each IB MTU, sent one by one (the dearest way: each its own kernel buffer), to
// a socket granted what a process without CAP_NET_ADMIN gets on Debian's defaults, fit and none
// is dropped; sent in runs (GSO), as a stream's are, they take at most half of it. With the
// buffer a port gets by default the window is the full 64 packets.
TEST(RoceWindow, AWindowOfPacketsFitsTheReceivingBuffer) {
  EXPECT_EQ(roce::RcLink::WindowFor(2 * (4u << 20), 4096), roce::RcLink::kWindow);
  EXPECT_EQ(roce::RcLink::WindowFor(roce::Port::ReceiveBuffer(), 4096), roce::RcLink::kWindow)
      << "the default buffer: " << roce::Port::ReceiveBuffer();
  EXPECT_EQ(roce::RcLink::WindowFor(4096, 4096), 2u) << "never below 2";
  const int asked = 212992;  // net.core.rmem_max's default
  for (uint32_t mtu : {256u, 1024u, 2048u, 4096u}) {
    SCOPED_TRACE("MTU " + std::to_string(mtu));
    const int receiver = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int sender = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(receiver, 0);
    ASSERT_GE(sender, 0);
    if (setsockopt(receiver, SOL_SOCKET, SO_RCVBUFFORCE, &asked, sizeof asked) != 0) {
      ASSERT_EQ(setsockopt(receiver, SOL_SOCKET, SO_RCVBUF, &asked, sizeof asked), 0);
    }
    int granted = 0;
    socklen_t length = sizeof granted;
    ASSERT_EQ(getsockopt(receiver, SOL_SOCKET, SO_RCVBUF, &granted, &length), 0);
    sockaddr_storage to = Loopback(0);
    ASSERT_EQ(bind(receiver, reinterpret_cast<const sockaddr*>(&to), sizeof(sockaddr_in)), 0);
    length = sizeof to;
    ASSERT_EQ(getsockname(receiver, reinterpret_cast<sockaddr*>(&to), &length), 0);
    const uint32_t window = roce::RcLink::WindowFor(uint32_t(granted), mtu);
    if (mtu == 4096) {
      EXPECT_LT(window, roce::RcLink::kWindow) << "granted " << granted;
    }
    // A full-size RoCE datagram: IB headers with a RETH, the payload, the ICRC.
    const int size = int(12 + 16 + mtu + 4);
    std::vector<char> datagrams(size_t(size) * std::max(window, 16u));
    auto queued = [&] {
      uint32_t info[SK_MEMINFO_VARS] = {};
      socklen_t info_length = sizeof info;
      EXPECT_EQ(getsockopt(receiver, SOL_SOCKET, SO_MEMINFO, info, &info_length), 0);
      EXPECT_EQ(info[SK_MEMINFO_DROPS], 0u);
      return info[SK_MEMINFO_RMEM_ALLOC];
    };
    auto drain = [&] {
      while (recv(receiver, datagrams.data(), datagrams.size(), 0) > 0) {
      }
    };
    for (uint32_t i = 0; i < window; ++i)
      ASSERT_EQ(sendto(sender, datagrams.data(), size, 0, reinterpret_cast<const sockaddr*>(&to), sizeof(sockaddr_in)),
                ssize_t(size));
    EXPECT_LE(queued(), uint32_t(granted)) << window << " packets sent one by one";
    drain();
    // The same window in runs of up to 16 (UDP_SEGMENT: one buffer a run, as RcLink sends a stream,
    // kept whole by the receiver's UDP_GRO, as a port's is).
    const int one = 1;
    ASSERT_EQ(setsockopt(receiver, SOL_UDP, UDP_GRO, &one, sizeof one), 0);
    ASSERT_EQ(setsockopt(sender, SOL_UDP, UDP_SEGMENT, &size, sizeof size), 0);
    const uint32_t per_run = std::min(16u, uint32_t(65507 / size));  // a UDP datagram's limit
    for (uint32_t sent = 0; sent < window; sent += per_run) {
      const size_t run = size_t(std::min(per_run, window - sent)) * size;
      ASSERT_EQ(sendto(sender, datagrams.data(), run, 0, reinterpret_cast<const sockaddr*>(&to), sizeof(sockaddr_in)),
                ssize_t(run));
    }
    EXPECT_LE(queued(), uint32_t(granted) / 2) << window << " packets sent in runs";
    close(sender);
    close(receiver);
  }
}

// The process's UDP sockets of `family` that have UDP_GRO on and no port: the one HoldUdpGro keeps.
size_t UnboundGroSockets(int family, size_t* descriptors) {
  size_t found = 0;
  *descriptors = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    int value = 0;
    socklen_t length = sizeof value;
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &value, &length) != 0) continue;
    ++*descriptors;
    if (value != family) continue;
    length = sizeof value;
    if (getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &value, &length) != 0 || value != IPPROTO_UDP) continue;
    length = sizeof value;
    if (getsockopt(fd, SOL_UDP, UDP_GRO, &value, &length) != 0 || value != 1) continue;
    sockaddr_storage bound{};
    length = sizeof bound;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0 && PortOf(bound) == 0) ++found;
  }
  return found;
}

// The machine's UDP encapsulation key (which UDP_GRO turns on) must not switch with each port
// opened and closed: that rewrites kernel code on every CPU. After its last port closes, the
// process keeps one GRO socket of the family, the same one however many ports come and go.
TEST(RocePort, TheProcessKeepsOneGroSocketOfAFamilyAfterItsLastPortCloses) {
  int32_t status = 0;
  size_t descriptors_after_first = 0, descriptors = 0;
  for (int i = 0; i < 20; ++i) {
    std::shared_ptr<roce::Port> port = roce::Port::Open(Loopback(0), true, &status);
    ASSERT_TRUE(port) << status;
    port.reset();
    EXPECT_EQ(UnboundGroSockets(AF_INET, &descriptors), 1u) << "after port " << i;
    if (i == 0) descriptors_after_first = descriptors;
    // Never more than after the first: a descriptor left per port would add up. Fewer is
    // another test's socket closing meanwhile (its teardown's last step runs on the engine),
    // when the tests share a process.
    EXPECT_LE(descriptors, descriptors_after_first) << "after port " << i;
  }
}

// A route is the host's, whatever the peer's port; another host's is never answered for it.
TEST(RoceRecentRoutes, AnswerForTheSameHostOnlyAndNeverWithAnotherHostsCode) {
  roce::RecentRoutes routes;
  routes.Remember(Host(0x0A000001, 4791), 3);
  EXPECT_EQ(routes.Find(Host(0x0A000001, 50000)), std::optional<uint8_t>(3));
  EXPECT_EQ(routes.Find(Host(0x0A000002, 4791)), std::nullopt);
  // Far more hosts than entries: a host's entry may be taken by another's, but a host is answered
  // with its own code or not at all.
  constexpr uint32_t kHosts = 1000;
  for (uint32_t i = 0; i < kHosts; ++i) routes.Remember(Host(0x0B000000 + i, 1), uint8_t(1 + i % 5));
  size_t answered = 0;
  for (uint32_t i = 0; i < kHosts; ++i) {
    std::optional<uint8_t> code = routes.Find(Host(0x0B000000 + i, 2));
    if (!code) continue;
    ++answered;
    EXPECT_EQ(*code, uint8_t(1 + i % 5)) << "host " << i;
  }
  EXPECT_GT(answered, 0u);
  EXPECT_LT(answered, size_t(kHosts));  // a fixed table: it holds no more than its entries
}

TEST(RoceRecentRoutes, ARouteIsForgottenAfterItsLifetime) {
  roce::RecentRoutes routes;
  routes.Remember(Host(0x0A000001, 1), 4);
  ASSERT_EQ(routes.Find(Host(0x0A000001, 1)), std::optional<uint8_t>(4));
  std::this_thread::sleep_for(roce::RecentRoutes::kLifetime + std::chrono::milliseconds(100));
  EXPECT_EQ(routes.Find(Host(0x0A000001, 1)), std::nullopt);
}

}  // namespace
}  // namespace ndwv::dev
