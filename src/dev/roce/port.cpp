#include "dev/roce/port.h"

#include <linux/errqueue.h>
#include <linux/filter.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include <ndwv/wvstatus.h>

#include "base/capture.h"
#include "base/fork.h"
#include "base/log.h"
#include "base/random.h"
#include "base/settings.h"
#include "dev/address.h"
#include "dev/device.h"
#include "wire/bytes.h"
#include "wire/ib_cm.h"

namespace ndwv::dev::roce {

using namespace ndwv::wire::ib;

namespace {

// The ports this process has open, by local address, so that a listener's port and the shared
// NDWV_ROCE_PORT are found again rather than bound twice, and flows, by their name.
// The map and its lock outlive static teardown: the engine thread may still end a port (~Port)
// while the exiting process destroys its statics.
base::Mutex& PortsMutex() {
  static auto* mutex = new base::Mutex("roce PortsMutex()");
  return *mutex;
}
std::map<std::string, std::weak_ptr<Port>>& Ports() {
  static auto* ports = new std::map<std::string, std::weak_ptr<Port>>;
  return *ports;
}
// The ports the port-0 connectors of an address share (the kernel's choices), by that address
// and their turn; each is also in Ports(), by its own name.
std::map<std::string, std::weak_ptr<Port>>& ConnectorPorts() {
  static auto* ports = new std::map<std::string, std::weak_ptr<Port>>;
  return *ports;
}
// The key of the connectors' port whose turn it is, of NDWV_ROCE_CONNECTOR_PORTS (under
// PortsMutex()). In turn, not the fullest first: a burst to thousands of connections then meets
// that many socket buffers from the start.
std::string NextConnectorKey(const sockaddr_storage& local) {
  static unsigned turn = 0;
  return Describe(local) + " #" + std::to_string(turn++ % std::max(1u, base::Config().roce_connector_ports));
}
// The flows of all the connectors' ports, counted together against Port::kMaxFlows (under
// PortsMutex()): taking ports in turn multiplies the sockets a process has, not its flows.
size_t& ConnectorFlows() {
  static size_t flows = 0;
  return flows;
}

// The receive buffer the kernel granted the process's sockets (0: none opened yet). The same for
// all: what a port asks for is the process's setting, and what it gets depends on the process's
// privilege and the host's limits, which do not change while it runs.
std::atomic<uint32_t> g_granted_receive_buffer{0};

// 32 unpredictable bits. An active connector opens a port, and so draws a seed, for every
// connection: std::random_device costs 50-80 us a construction on the development VM (its CPU
// feature check is a VM exit), a getrandom() call 3-4 us; the thread's batch, one call in 64.
uint32_t RandomSeed() {
  static thread_local base::SecureRandom batch;
  uint32_t seed;
  if (batch.Next(&seed)) return seed;
  return uint32_t(std::random_device{}());
}

CmConfig AgentConfig() {
  const base::Settings& s = base::Config();
  // The CA GUID names this process's device to its peers (stale connection detection keys on
  // it): "ndw" and 40 random bits, so that nobody can tell it from the process ID.
  static const uint64_t guid = [] {
    std::random_device random;
    return 0x6e6477ull << 40 | ((uint64_t(random()) << 32 | random()) & 0xFFFFFFFFFFull);
  }();
  CmConfig config;
  config.response_timeout_ms = s.roce_cm_timeout_ms;
  config.max_retries = s.roce_cm_retries;
  config.timewait_ms = s.roce_timewait_ms;
  config.ca_guid = guid;
  config.id_seed = RandomSeed();
  config.max_read_limit = uint8_t(kMaxReadLimit);
  config.max_rnr_retry = s.roce_rnr_retry;
  return config;
}

// UDP_GRO on a socket turns on the kernel's UDP encapsulation hook, a static key of the whole
// machine (IPv4's, and IPv6's too for an IPv6 socket), and the close of the last socket that has
// it turns it off again. Each switch rewrites kernel code on every CPU: measured here, a socket
// opened and closed costs 830 us when no other has UDP_GRO, 6 us when one does, and all CPUs
// stall meanwhile. A process whose connections come and go one at a time (its last port closes
// with each) would pay that per connection, and so would the programs sharing its CPUs. So the
// process keeps one socket of each family it uses with UDP_GRO, unbound (nothing reaches it),
// from its first port on: one descriptor.
void HoldUdpGro(int family) {
  static std::atomic<int> held[2] = {-1, -1};
  std::atomic<int>& slot = held[family == AF_INET6 ? 1 : 0];
  if (slot.load(std::memory_order_acquire) >= 0) return;
  int fd = base::OpenSocket(family, SOCK_DGRAM | SOCK_CLOEXEC);
  if (fd < 0) return;  // out of descriptors: the next port tries again
  int one = 1;
  setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one);
  int none = -1;
  if (!slot.compare_exchange_strong(none, fd, std::memory_order_acq_rel)) base::CloseDescriptor(fd);
}

}  // namespace

int Port::OpenSocket(const sockaddr_storage& local) {
  const int family = local.ss_family;
  HoldUdpGro(family);
  int fd = base::OpenSocket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return -1;
  // Ask for big buffers; as root, past the system limit (a lost datagram costs a retransmit).
  // A process refused the forced size once is refused it every time: not asked again.
  static std::atomic<bool> force_refused{false};
  const int buffer = int(base::Config().roce_socket_buffer);
  bool forced = false;
  if (!force_refused.load(std::memory_order_relaxed)) {
    forced = setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) == 0;
    if (!forced && errno == EPERM) force_refused.store(true, std::memory_order_relaxed);
  }
  if (!forced) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
  if (g_granted_receive_buffer.load(std::memory_order_relaxed) == 0) {
    int granted = 0;
    socklen_t length = sizeof granted;
    if (getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &granted, &length) == 0 && granted > 0)
      g_granted_receive_buffer.store(uint32_t(granted), std::memory_order_relaxed);
  }
  // Never fragment: packets are sized to the path MTU (IP_PMTUDISC_DO sets DF, as RoCEv2 does).
  // Runs of datagrams sent with GSO arrive as one buffer (loopback keeps them together).
  int gro = 1;
  setsockopt(fd, SOL_UDP, UDP_GRO, &gro, sizeof gro);
  // ICMP errors are queued (IP_RECVERR): a REQ to a port nobody listens on is refused at once.
  int pmtu = IP_PMTUDISC_DO, one = 1;
  if (family == AF_INET) {
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    setsockopt(fd, IPPROTO_IP, IP_RECVERR, &one, sizeof one);
  } else {
    setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
    setsockopt(fd, IPPROTO_IPV6, IPV6_RECVERR, &one, sizeof one);
  }
  // ECN (NDWV_ROCE_ECN): our datagrams ECN-capable, and the marks on the peer's read, so that a
  // datagram a router marked Congestion Experienced draws a CNP, as on a RoCEv2 NIC. A socket
  // of IPv6 takes both, for its IPv4 peers. Not read on a loopback address, which no router is
  // on: the control message costs every receive ~0.2 us (3 % of a ping-pong on loopback).
  if (base::Config().roce_ecn) {
    const bool read_marks = !IsLoopback(local);
    int ect0 = wire::ib::kEct0;
    setsockopt(fd, IPPROTO_IP, IP_TOS, &ect0, sizeof ect0);
    if (read_marks) setsockopt(fd, IPPROTO_IP, IP_RECVTOS, &one, sizeof one);
    if (family == AF_INET6) {
      setsockopt(fd, IPPROTO_IPV6, IPV6_TCLASS, &ect0, sizeof ect0);
      if (read_marks) setsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof one);
    }
  }
  if (IsWildcard(local)) {  // the address each datagram came to (the ICRC covers it)
    if (family == AF_INET) setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof one);
    else setsockopt(fd, IPPROTO_IPV6, IPV6_RECVPKTINFO, &one, sizeof one);
  }
  return fd;
}

std::shared_ptr<Port> Port::Open(const sockaddr_storage& local, bool shared, int32_t* status) {
  // A port found open and refused may be its last reference by then: it goes after the lock
  // (~Port takes PortsMutex()).
  std::shared_ptr<Port> found;
  base::MutexLock lock(PortsMutex());
  // Port 0 shared: the connectors' port whose turn it is, as the kernel picked it.
  const bool pick_once = shared && PortOf(local) == 0;
  auto& listed = pick_once ? ConnectorPorts() : Ports();
  const std::string key = pick_once ? NextConnectorKey(local) : Describe(local);
  if (PortOf(local) != 0 || pick_once) {
    auto it = listed.find(key);
    if (it != listed.end() && (found = it->second.lock())) {
      *status = shared ? WV_SUCCESS : WV_SHARING_VIOLATION;
      return shared ? found : nullptr;
    }
  }
  int fd = OpenSocket(local);
  if (fd < 0) {
    *status = WV_INSUFFICIENT_RESOURCES;
    return nullptr;
  }
  sockaddr_storage bound = local;
  *status = BindUdpPort(fd, bound);
  if (*status != WV_SUCCESS) {
    base::CloseDescriptor(fd);
    return nullptr;
  }
  std::shared_ptr<Port> port(new Port(fd, bound, Describe(bound), nullptr));
  port->parks_flows_ = shared;
  static const bool hooked = std::atexit(&Port::CloseAllAtExit) == 0;
  (void)hooked;
  SetLiveCounterSource(Transport::Roce, &Port::AddLiveCounters);
  Ports()[port->name_] = port;
  if (pick_once) ConnectorPorts()[port->connectors_key_ = key] = port;
  Engine::Get().Watch(fd, EPOLLIN, port);
  NDWV_LOG(Debug, "roce port %s opened", port->name_.c_str());
  return port;
}

std::shared_ptr<Port> Port::OpenFlow(const std::shared_ptr<Port>& owner, const sockaddr_storage& peer) {
  base::MutexLock lock(PortsMutex());
  std::string name = owner->name_ + " > " + Describe(peer);
  auto it = Ports().find(name);
  if (it != Ports().end())
    if (auto flow = it->second.lock()) return flow;
  if (owner->FlowCount() >= kMaxFlows) return nullptr;
  // Until the connect(), the kernel may hand the new socket a datagram meant for the owner: a
  // flow passes on whatever its owner serves.
  int fd = owner->OpenSibling();
  if (fd >= 0 && connect(fd, reinterpret_cast<const sockaddr*>(&peer), AddressLength(peer)) != 0) {
    base::CloseDescriptor(fd);
    fd = -1;
  }
  if (fd < 0) {
    NDWV_LOG(Debug, "roce port %s: no flow to %s (%s): the port's own socket carries it", owner->name_.c_str(),
             Describe(peer).c_str(), strerror(errno));
    return nullptr;
  }
  std::shared_ptr<Port> flow(new Port(fd, owner->local_, name, owner));
  flow->connected_peer_ = peer;
  flow->connected_.store(true, std::memory_order_release);
  ++owner->FlowCount();
  Ports()[name] = flow;
  Engine::Get().Watch(fd, EPOLLIN, flow);
  NDWV_LOG(Debug, "roce port %s opened", name.c_str());
  return flow;
}

size_t& Port::FlowCount() { return connectors_key_.empty() ? flows_ : ConnectorFlows(); }

namespace {
// The parked flows (Port::Park), each once (Port::parked_): at most kMaxFlows, the connectors'
// ports' bound. Under PortsMutex().
std::vector<std::shared_ptr<Port>>& ParkedFlows() {
  static auto* parked = new std::vector<std::shared_ptr<Port>>;
  return *parked;
}
}  // namespace

Timer& Port::ParkTimer() {
  static Timer* timer = [] {
    auto* made = new Timer;
    made->fire = &Port::OnParkTimer;
    return made;
  }();
  return *timer;
}

void Port::Park(std::shared_ptr<Port> port) {
  // Declared before the lock, so released after it: ~Port takes PortsMutex().
  std::shared_ptr<Port> keep = std::move(port);
  const std::chrono::milliseconds linger(base::Config().roce_timewait_ms);
  if (!keep || !keep->owner_ || linger.count() == 0) return;
  bool first = false;
  {
    base::MutexLock lock(PortsMutex());
    if (!keep->owner_->parks_flows_) return;
    keep->parked_until_ = Clock::now() + linger;
    if (keep->parked_) return;  // parked already: it stays longer
    keep->parked_ = true;
    first = ParkedFlows().empty();
    ParkedFlows().push_back(std::move(keep));
  }
  if (first) Engine::Get().Arm(&ParkTimer(), linger);  // else armed for an earlier one
}

// Takes the parked flows for which `leaves` is true out of the park (under PortsMutex(); the
// caller releases them after it).
template <class Leaves>
std::vector<std::shared_ptr<Port>> Port::TakeParkedLocked(Leaves leaves) {
  std::vector<std::shared_ptr<Port>> taken;
  auto& parked = ParkedFlows();
  for (auto it = parked.begin(); it != parked.end();) {
    if (!leaves(**it)) {
      ++it;
      continue;
    }
    (*it)->parked_ = false;
    taken.push_back(std::move(*it));
    it = parked.erase(it);
  }
  return taken;
}

std::vector<std::shared_ptr<Port>> Port::UnparkFlowsLocked() {
  return TakeParkedLocked([this](const Port& flow) { return flow.owner_.get() == this; });
}

void Port::OnParkTimer(Timer*) {
  std::vector<std::shared_ptr<Port>> expired;  // released after the lock
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();
  {
    base::MutexLock lock(PortsMutex());
    expired = TakeParkedLocked([now](const Port& flow) { return flow.parked_until_ <= now; });
    for (const std::shared_ptr<Port>& flow : ParkedFlows()) next = std::min(next, flow->parked_until_);
  }
  if (next != Clock::time_point::max())
    Engine::Get().Arm(&ParkTimer(), std::chrono::ceil<std::chrono::milliseconds>(next - now));
}

int Port::OpenSibling() {
  int fd = OpenSocket(local_);
  if (fd < 0) return -1;
  // Every socket on the port must allow sharing it, and only this user's sockets may join; the
  // owner's own Bind did not (so another process's Bind of the port still fails).
  int one = 1;
  if (!shares_port_) shares_port_ = setsockopt(fd_, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) == 0;
  if (!shares_port_ || setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) != 0 ||
      bind(fd, reinterpret_cast<const sockaddr*>(&local_), AddressLength(local_)) != 0) {
    int error = errno;
    base::CloseDescriptor(fd);
    errno = error;
    return -1;
  }
  return fd;
}

void Port::OpenCmSocket() {
  base::MutexLock lock(PortsMutex());
  if (cm_socket_ || FlowCount() != 0) return;  // (the program counts on its index: below)
  int fd = OpenSibling();
  if (fd < 0) return;
  // The port's socket is the first of its reuseport group, this one the second: the program's
  // answers. Flows join later and are found by their peers' addresses before the program runs.
  static const sock_filter kSteerMads[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),  // BTH bytes 4-7 (the UDP payload's): the destination QP
      BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0x00FFFFFF),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kGsiQpn, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, 1),  // a MAD: the CM's socket
      BPF_STMT(BPF_RET | BPF_K, 0),  // the rest (and a datagram too short for a BTH): the port's
  };
  const sock_fprog program{uint16_t(std::size(kSteerMads)), const_cast<sock_filter*>(kSteerMads)};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &program, sizeof program) != 0) {
    NDWV_LOG(Info, "roce port %s: the CM shares the port's socket (no steering: %s)", name_.c_str(), strerror(errno));
    base::CloseDescriptor(fd);
    return;
  }
  cm_socket_.reset(new Port(fd, local_, name_ + " cm", shared_from_this()));
  ++FlowCount();
  Engine::Get().Watch(fd, EPOLLIN, cm_socket_);
  NDWV_LOG(Debug, "roce port %s opened", cm_socket_->name_.c_str());
}

Port::Port(int fd, const sockaddr_storage& local, std::string name, std::shared_ptr<Port> owner)
    : fd_(fd),
      local_(local),
      wildcard_(IsWildcard(local)),
      name_(std::move(name)),
      owner_(std::move(owner)) {
  if (!owner_) agent_ = base::MakePooled<CmAgent>(*this, AgentConfig());
  deliver_work_.owner = this;
  deliver_work_.run = [](WorkItem* item) {
    Port* port = static_cast<DeliverWork*>(item)->owner;
    std::shared_ptr<Port> keep;  // released after the lock
    base::MutexLock lock(port->cm_mutex_);
    keep = std::move(port->deliver_work_.keep);
    port->DeliverEvents();
  };
}

Port::~Port() {
  delete recent_routes_.load(std::memory_order_acquire);
  {
    // What this port counted stays in the adapter's totals.
    CounterValues counts{};
    base::MutexLock lock(cm_mutex_);  // uncontended: nobody else holds the port any more
    AddCountersLocked(counts);
    for (size_t i = 0; i < kCounters; ++i)
      if (counts[i]) AdapterCounters(Transport::Roce).AddShared(Counter(i), counts[i]);
  }
  {
    base::MutexLock lock(PortsMutex());
    auto forget = [](std::map<std::string, std::weak_ptr<Port>>& listed, const std::string& key) {
      auto it = listed.find(key);
      if (it != listed.end() && it->second.expired()) listed.erase(it);
    };
    forget(Ports(), name_);
    if (!connectors_key_.empty()) forget(ConnectorPorts(), connectors_key_);
    if (owner_) --owner_->FlowCount();
  }
  Engine::Get().CloseWatched(fd_);
  NDWV_LOG(Debug, "roce port %s closed", name_.c_str());
}

// ------------------------------------------------------------------------------------- data

namespace {
// Bumped by every change of any port's sinks, after it: a receiver's cached lookup made before
// the change is not used after it.
std::atomic<uint64_t> g_sinks_generation{1};
}  // namespace

void Port::AddSink(uint32_t qpn, std::weak_ptr<PacketSink> sink, const sockaddr_storage& peer) {
  base::WriterLock lock(sinks_mutex_);
  sinks_[qpn] = {std::move(sink), PackedAddress::Of(peer)};
  g_sinks_generation.fetch_add(1, std::memory_order_release);
}

void Port::RemoveSink(uint32_t qpn) {
  base::WriterLock lock(sinks_mutex_);
  sinks_.erase(qpn);
  g_sinks_generation.fetch_add(1, std::memory_order_release);
}

std::shared_ptr<PacketSink> Port::FindSink(uint32_t qpn, PackedAddress* peer) {
  rx_mutex_.AssertHeld();
  uint64_t generation = g_sinks_generation.load(std::memory_order_acquire);
  if (sink_cache_.qpn == qpn && sink_cache_.generation == generation) {
    if (std::shared_ptr<PacketSink> sink = sink_cache_.sink.lock()) {
      *peer = sink_cache_.peer;
      return sink;
    }
  }
  // A flow's connections, else its owner's (what reached the flow before its connect()).
  for (Port* port = this; port; port = port->owner_.get()) {
    base::ReaderLock lock(port->sinks_mutex_);
    auto it = port->sinks_.find(qpn);
    if (it == port->sinks_.end()) continue;
    std::shared_ptr<PacketSink> sink = it->second.sink.lock();
    if (!sink) return nullptr;
    *peer = it->second.peer;
    sink_cache_ = {qpn, generation, sink, *peer};
    return sink;
  }
  return nullptr;
}

bool Port::ConnectTo(const sockaddr_storage& peer) {
  if (connect(fd_, reinterpret_cast<const sockaddr*>(&peer), AddressLength(peer)) != 0) return false;
  connected_.store(false, std::memory_order_release);
  connected_peer_ = peer;
  connected_.store(true, std::memory_order_release);
  return true;
}

RecentRoutes& Port::recent_routes() {
  std::atomic<RecentRoutes*>& slot = Owner().recent_routes_;
  RecentRoutes* routes = slot.load(std::memory_order_acquire);
  if (routes) return *routes;
  auto made = std::make_unique<RecentRoutes>();
  if (slot.compare_exchange_strong(routes, made.get(), std::memory_order_acq_rel)) return *made.release();
  return *routes;  // another thread's, made meanwhile
}

int Port::RouteMtu() const {
  int ip_mtu = 0;
  socklen_t length = sizeof ip_mtu;
  bool v4 = local_.ss_family == AF_INET;
  if (getsockopt(fd_, v4 ? IPPROTO_IP : IPPROTO_IPV6, v4 ? IP_MTU : IPV6_MTU, &ip_mtu, &length) != 0) return 0;
  return ip_mtu;
}

sockaddr* Port::NameFor(const sockaddr_storage& to, socklen_t* length) const {
  if (connected_.load(std::memory_order_acquire) && SameAddress(to, connected_peer_)) {
    *length = 0;
    return nullptr;
  }
  *length = AddressLength(to);
  return reinterpret_cast<sockaddr*>(const_cast<sockaddr_storage*>(&to));
}

namespace {

// A sent message's control data: the source address it must leave from (a wildcard port's), and
// the segment size of a GSO buffer.
union OutControl {
  cmsghdr header;  // alignment
  char space[CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(uint16_t))];
};

socklen_t BuildControl(OutControl& control, const sockaddr_storage* source, uint16_t segment) {
  msghdr m{};
  m.msg_control = control.space;
  m.msg_controllen = sizeof control.space;
  memset(control.space, 0, sizeof control.space);
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  socklen_t used = 0;
  auto add = [&](int level, int type, const void* data, size_t length) {
    c->cmsg_level = level;
    c->cmsg_type = type;
    c->cmsg_len = CMSG_LEN(length);
    memcpy(CMSG_DATA(c), data, length);
    used += CMSG_SPACE(length);
    c = CMSG_NXTHDR(&m, c);
  };
  if (source && source->ss_family == AF_INET) {
    in_pktinfo info{};
    info.ipi_spec_dst = reinterpret_cast<const sockaddr_in*>(source)->sin_addr;
    add(IPPROTO_IP, IP_PKTINFO, &info, sizeof info);
  } else if (source) {
    in6_pktinfo info{};
    info.ipi6_addr = reinterpret_cast<const sockaddr_in6*>(source)->sin6_addr;
    add(IPPROTO_IPV6, IPV6_PKTINFO, &info, sizeof info);
  }
  if (segment) add(SOL_UDP, UDP_SEGMENT, &segment, sizeof segment);
  return used;
}

}  // namespace

sockaddr_storage Port::AddressFor(const sockaddr_storage& peer) {
  if (!wildcard_) return local_;
  Port& owner = Owner();
  const Ip key{HostOf(peer)};
  {
    base::MutexLock lock(owner.reached_mutex_);
    if (auto it = owner.reached_.find(key); it != owner.reached_.end()) return it->second;
  }
  // Not heard from yet (we connect to it): the address the kernel would choose, kept.
  sockaddr_storage source{};
  if (!RouteSource(peer, &source)) return local_;  // no route: nothing will arrive anyway
  SetPort(source, PortOf(local_));
  Learn(peer, source);
  return source;
}

void Port::Learn(const sockaddr_storage& peer, const sockaddr_storage& reached) {
  Port& owner = Owner();
  const Ip key{HostOf(peer)};
  base::MutexLock lock(owner.reached_mutex_);
  if (auto it = owner.reached_.find(key); it != owner.reached_.end()) it->second = reached;
  else if (owner.reached_.size() < kMaxReached) owner.reached_.emplace(key, reached);
}

bool Port::Send(const sockaddr_storage& to, uint8_t* datagram, size_t size) {
  sockaddr_storage pinned;  // a wildcard port's source for `to`
  const sockaddr_storage& source = wildcard_ ? (pinned = AddressFor(to)) : local_;
  IcrcAddresses addrs{reinterpret_cast<const sockaddr*>(&source), reinterpret_cast<const sockaddr*>(&to)};
  StoreIcrc(addrs, {datagram, size});
  base::CaptureUdp(source, to, {datagram, size});
  for (;;) {
    socklen_t length;
    sockaddr* name = NameFor(to, &length);
    ssize_t n;
    if (wildcard_) {
      iovec iov{datagram, size};
      msghdr m{};
      m.msg_name = name;
      m.msg_namelen = length;
      m.msg_iov = &iov;
      m.msg_iovlen = 1;
      OutControl control;
      m.msg_control = control.space;
      m.msg_controllen = BuildControl(control, &source, 0);
      n = sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    } else {
      n = sendto(fd_, datagram, size, MSG_DONTWAIT | MSG_NOSIGNAL, name, length);
    }
    if (n >= 0) {
      Owner().counters_.sent.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    if (errno == EINTR) continue;
    Owner().counters_.send_failed.fetch_add(1, std::memory_order_relaxed);
    // Full: the caller waits for room. Anything else (an unreachable peer...) loses the datagram,
    // as a wire would; retransmission and its retry budget decide what that means.
    return !(errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS);
  }
}

namespace {

// Stores the ICRC of a datagram in pieces in the last 4 bytes of its last piece.
void StoreIcrcOf(const IcrcAddresses& addrs, Port::OutDatagram& d) {
  iovec& last = d.pieces[d.count - 1];
  std::span<const uint8_t> pieces[Port::kMaxPieces];
  for (int i = 0; i < d.count; ++i) pieces[i] = {static_cast<const uint8_t*>(d.pieces[i].iov_base), d.pieces[i].iov_len};
  pieces[d.count - 1] = pieces[d.count - 1].first(last.iov_len - kIcrcLen);
  wire::StoreLe32(static_cast<uint8_t*>(last.iov_base) + last.iov_len - kIcrcLen, ComputeIcrc(addrs, {pieces, size_t(d.count)}));
}

// The datagrams the socket took, when capturing (a datagram in pieces is laid end to end first).
void CaptureSent(const sockaddr_storage& from, const sockaddr_storage& to, const Port::OutDatagram* datagrams,
                 int count) {
  if (!base::Capture()) [[likely]]
    return;
  std::vector<uint8_t> flat;
  for (int i = 0; i < count; ++i) {
    flat.clear();
    for (int j = 0; j < datagrams[i].count; ++j) {
      const auto* piece = static_cast<const uint8_t*>(datagrams[i].pieces[j].iov_base);
      flat.insert(flat.end(), piece, piece + datagrams[i].pieces[j].iov_len);
    }
    base::CaptureUdp(from, to, flat);
  }
}

}  // namespace

// One message per run of datagrams: equal sizes (the last may be shorter), sent as one GSO buffer
// that the kernel cuts into datagrams (a loopback receiver with UDP_GRO gets it whole).
constexpr size_t kGsoMaxBytes = 65000;

Port::GsoRun Port::FirstRun(const OutDatagram* datagrams, int count) const {
  if (count == 0) return {0, 0};
  if (!gso_.load(std::memory_order_relaxed)) return {1, datagrams[0].size};
  int n = 1;
  size_t bytes = datagrams[0].size;
  while (n < count && datagrams[n].size <= datagrams[0].size && bytes + datagrams[n].size <= kGsoMaxBytes) {
    bytes += datagrams[n].size;
    if (datagrams[n++].size < datagrams[0].size) break;  // only the last datagram of a run may be shorter
  }
  return {n, bytes};
}

int Port::SlotEndingFirstRun(const OutDatagram* datagrams, int count, size_t size) const {
  if (!gso_.load(std::memory_order_relaxed) || count == 0) return 0;
  const GsoRun run = FirstRun(datagrams, count);
  const int n = run.datagrams;
  bool open = datagrams[n - 1].size == datagrams[0].size;  // not ended by a shorter one
  return open && size <= datagrams[0].size && run.bytes + size <= kGsoMaxBytes ? n : 0;
}

int Port::SendBatch(const sockaddr_storage& to, const sockaddr_storage& from, OutDatagram* datagrams, int count) {
  const sockaddr_storage& source = wildcard_ ? from : local_;
  IcrcAddresses addrs{reinterpret_cast<const sockaddr*>(&source), reinterpret_cast<const sockaddr*>(&to)};
  count = std::min(count, kMaxBatch);  // callers batch at most this many
  mmsghdr messages[kMaxBatch];
  iovec iov[kMaxBatch * kMaxPieces];
  int first[kMaxBatch + 1];  // datagram index each message starts at
  OutControl control[kMaxBatch];
  int nmsg = 0, niov = 0;
  socklen_t name_length;
  sockaddr* name = NameFor(to, &name_length);
  for (int i = 0; i < count;) {
    const int n = FirstRun(datagrams + i, count - i).datagrams;
    mmsghdr& m = messages[nmsg];
    m = {};
    m.msg_hdr.msg_iov = iov + niov;
    for (int k = i; k < i + n; ++k) {
      StoreIcrcOf(addrs, datagrams[k]);
      for (int j = 0; j < datagrams[k].count; ++j) iov[niov++] = datagrams[k].pieces[j];
    }
    m.msg_hdr.msg_iovlen = size_t(iov + niov - m.msg_hdr.msg_iov);
    m.msg_hdr.msg_name = name;
    m.msg_hdr.msg_namelen = name_length;
    if (n > 1 || wildcard_) {
      m.msg_hdr.msg_control = control[nmsg].space;
      m.msg_hdr.msg_controllen =
          BuildControl(control[nmsg], wildcard_ ? &source : nullptr, n > 1 ? uint16_t(datagrams[i].size) : 0);
    }
    first[nmsg++] = i;
    i += n;
  }
  first[nmsg] = count;
  int done = 0;  // messages
  while (done < nmsg) {
    int n;
    if (nmsg - done == 1) {
      // One message (the common case): the single-message calls cost the kernel less than
      // sendmmsg, and sendto() less than sendmsg when there is one buffer and no GSO control.
      const msghdr& m = messages[done].msg_hdr;
      ssize_t sent = m.msg_controllen || m.msg_iovlen > 1
                         ? sendmsg(fd_, &m, MSG_DONTWAIT | MSG_NOSIGNAL)
                         : sendto(fd_, m.msg_iov[0].iov_base, m.msg_iov[0].iov_len, MSG_DONTWAIT | MSG_NOSIGNAL,
                                  name, name_length);
      n = sent < 0 ? -1 : 1;
    } else {
      n = sendmmsg(fd_, messages + done, unsigned(nmsg - done), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    if (n > 0) {
      done += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EIO || errno == EINVAL) && first[done + 1] - first[done] > 1) {
      // No GSO here (a device without checksum offload): from now on one datagram per message.
      gso_.store(false, std::memory_order_relaxed);
      NDWV_LOG(Info, "roce port %s: UDP GSO refused (%s); sending datagrams one by one",
               name_.c_str(), strerror(errno));
      return first[done] + SendBatch(to, from, datagrams + first[done], count - first[done]);
    }
    Owner().counters_.send_failed.fetch_add(1, std::memory_order_relaxed);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) break;
    done++;  // this message is lost (an unreachable peer...), as on a wire; go on with the rest
  }
  CaptureSent(source, to, datagrams, first[done]);  // the datagrams the socket took
  Owner().counters_.sent.fetch_add(uint64_t(first[done]), std::memory_order_relaxed);
  return first[done];
}

void Port::WaitWritable(std::weak_ptr<PacketSink> sink) {
  base::MutexLock lock(handoff_.mutex());
  waiting_writable_.push_back(std::move(sink));
  if (!watching_out_) {
    watching_out_ = true;
    ApplyWatchLocked();
  }
}

void Port::Posted() { handoff_.Posted(); }

void Port::PolledEmpty(bool placed_peer_message, bool lendable) {
  handoff_.EmptyPoll(*this, placed_peer_message, lendable);
}

bool Port::Reaped(bool peer_message) { return handoff_.Reaped(*this, peer_message); }

void Port::NotifyArmed() { handoff_.NotifyArmed(*this); }

void Port::ProbeConnectionsTo(const sockaddr_storage& peer) {
  // Every port of the process with a CM (connectors take NDWV_ROCE_CONNECTOR_PORTS of them in
  // turn, so a peer's connections are spread over all): a few dozen.
  std::vector<std::shared_ptr<Port>> ports;
  {
    base::MutexLock lock(PortsMutex());
    for (auto& [name, weak] : Ports())
      if (auto port = weak.lock(); port && !port->owner_) ports.push_back(std::move(port));
  }
  std::vector<std::shared_ptr<CmUser>> users;
  for (auto& port : ports) {
    base::MutexLock lock(port->cm_mutex_);
    for (uint32_t id : port->agent_->ConnectionsToProbe(peer))
      if (auto it = port->users_.find(id); it != port->users_.end())
        if (auto user = it->second.lock()) users.push_back(std::move(user));
  }
  if (!users.empty())
    NDWV_LOG(Info, "roce: %s is closed: %zu connections to it probe it now", Describe(peer).c_str(),
             users.size());
  for (auto& user : users) user->ProbePeer();
}

void Port::ApplyWatchLocked() {
  handoff_.mutex().AssertHeld();
  Engine::Get().Modify(fd_, (handoff_.engine_reads() ? uint32_t(EPOLLIN) : 0u) | (watching_out_ ? uint32_t(EPOLLOUT) : 0u));
}

void Port::EngineReturned(bool by_timer) {
  const std::atomic<uint64_t>& received = Owner().counters_.received;
  uint64_t before = received.load(std::memory_order_relaxed);
  DriveReceive();  // what arrived while nobody watched
  // The pollers stopped while datagrams came: the application waited without polling (on
  // memory) and paid up to a look's delay for it (PollerRule).
  if (by_timer && received.load(std::memory_order_relaxed) != before)
    AdapterCounters(Transport::Roce).AddShared(Counter::LateEngineTakeovers);
}

struct Port::Run {
  static constexpr size_t kMax = 64;  // a GRO buffer's datagrams at most
  uint32_t qpn = 0;
  std::shared_ptr<PacketSink> sink;   // held for the length of one receive call
  PackedAddress peer;
  wire::ib::Packet packets[kMax];
  size_t count = 0;
  bool congested = false;  // read from a congested socket: the sinks tell their senders (CNP)
};

// The receive buffers, per thread (only the port's receiver uses them, for the length of a call):
// each takes a GRO buffer, a run of datagrams the kernel kept together. The message headers are
// set up once; a call only resets what the kernel overwrites.
struct Port::RxBuffer {
  static constexpr size_t kSize = 65536;
  // The engine asks for two at once: fewer back means the socket is empty, which saves the call
  // that would find it so (an idle connection's probe or ACK is one datagram per wake-up).
  static constexpr unsigned kSlots = 2;
  struct Slot {
    alignas(64) uint8_t data[kSize];
    // GRO, PKTINFO, the TOS or traffic class (ECN)
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(in6_pktinfo)) + CMSG_SPACE(sizeof(int))];
    iovec iov;
    sockaddr_storage from{};
  };
  Slot slot[kSlots];
  mmsghdr messages[kSlots]{};
  Run run;
  RxBuffer() {
    for (unsigned i = 0; i < kSlots; ++i) {
      slot[i].iov = {slot[i].data, kSize};
      msghdr& m = messages[i].msg_hdr;
      m.msg_iov = &slot[i].iov;
      m.msg_iovlen = 1;
      m.msg_name = &slot[i].from;
      m.msg_control = slot[i].control;
    }
  }
  void Reset() {
    for (unsigned i = 0; i < kSlots; ++i) {
      messages[i].msg_hdr.msg_namelen = sizeof slot[i].from;
      messages[i].msg_hdr.msg_controllen = sizeof slot[i].control;
    }
  }
};
thread_local std::unique_ptr<Port::RxBuffer> Port::t_rx_;

void Port::DriveReceive(bool once) {
  // The receiver in charge reads: the engine until the socket is empty or kEngineReads calls
  // have been made; a poller one buffer. What either leaves is read by the next poll or by the
  // engine, whose epoll watch is level-triggered.
  if (!rx_mutex_.try_lock()) return;
  base::MutexLock lock(rx_mutex_, std::adopt_lock);
  if (!t_rx_) t_rx_ = std::make_unique<RxBuffer>();  // one per receiving thread
  RxBuffer& rx = *t_rx_;
  // The engine looks at the socket's depth (CheckOverflow) when a turn has read an eighth of its
  // buffer or kEngineReads buffers: what is read after a look that found it congested, up to a
  // turn that empties it, is read from a congested socket.
  size_t bytes = 0, look_at = once ? SIZE_MAX : ReceiveBuffer() / 8;
  rx.run.congested = congested_;
  for (int errors = 0, reads = 0;;) {
    rx.Reset();
    // A poller asks for one message: recvmsg costs less than recvmmsg on the (most frequent)
    // empty poll, and a GRO buffer already brings a run of datagrams at once.
    int got;
    if (once) {
      ssize_t n = recvmsg(fd_, &rx.messages[0].msg_hdr, MSG_DONTWAIT);
      if (n >= 0) rx.messages[0].msg_len = unsigned(n);
      got = n < 0 ? -1 : 1;
    } else {
      got = recvmmsg(fd_, rx.messages, RxBuffer::kSlots, MSG_DONTWAIT, nullptr);
    }
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK && ++errors < 8) {
        ReadErrors();  // an ICMP error is pending; data may follow it
        continue;
      }
      if (!once) congested_ = false;  // emptied
      break;
    }
    for (int i = 0; i < got; ++i) {
      Handle(rx.messages[i], rx.slot[i].data, rx.slot[i].from, rx.run);
      bytes += rx.messages[i].msg_len;
    }
    if (once) break;
    if (got < int(RxBuffer::kSlots)) {
      congested_ = false;  // emptied
      break;
    }
    if (++reads == kEngineReads) {
      congested_ = CheckOverflow(true);  // the socket is behind: it may have been full
      break;
    }
    if (bytes >= look_at) {
      look_at = SIZE_MAX;
      rx.run.congested = congested_ = CheckOverflow(false);
    }
  }
  rx.run.sink.reset();  // a link is not kept alive by the port between calls
}

void Port::Handle(const mmsghdr& message, const uint8_t* data, const sockaddr_storage& from, Run& run) {
  rx_mutex_.AssertHeld();
  const msghdr& h = message.msg_hdr;
  size_t length = message.msg_len;
  if (h.msg_flags & MSG_TRUNC) {
    Owner().counters_.bad_packet.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // A GRO buffer holds datagrams of `segment` bytes (the last may be shorter). On a wildcard
  // port, the address they came to.
  size_t segment = length;
  const sockaddr_storage* to = &local_;
  sockaddr_storage reached;  // a wildcard port's: local_ with the address from IP_PKTINFO
  bool marked = false;       // Congestion Experienced (ECN)
  for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int size;
      memcpy(&size, CMSG_DATA(c), sizeof size);
      if (size > 0) segment = size_t(size);
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO && local_.ss_family == AF_INET) {
      in_pktinfo info;
      memcpy(&info, CMSG_DATA(c), sizeof info);
      reached = local_;
      reinterpret_cast<sockaddr_in&>(reached).sin_addr = info.ipi_addr;
      to = &reached;
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_PKTINFO && local_.ss_family == AF_INET6) {
      in6_pktinfo info;
      memcpy(&info, CMSG_DATA(c), sizeof info);
      reached = local_;
      reinterpret_cast<sockaddr_in6&>(reached).sin6_addr = info.ipi6_addr;
      to = &reached;
    } else if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS && c->cmsg_len >= CMSG_LEN(1)) {
      marked = wire::ib::CongestionExperienced(*CMSG_DATA(c));
    } else if (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int tclass;
      memcpy(&tclass, CMSG_DATA(c), sizeof tclass);
      marked = wire::ib::CongestionExperienced(uint8_t(tclass));
    }
  }
  // A message a router marked: its packets' senders are told, as a congested socket's are.
  const bool congested = run.congested;
  if (marked) {
    Owner().counters_.congestion_marked.fetch_add(1, std::memory_order_relaxed);
    run.congested = true;
  }
  if (length == 0) Dispatch(from, *to, {data, 0}, run);  // an empty datagram: a runt, counted as malformed
  // Answers first (ACK, NAK, Read Response): a peer sends its ACK after the request it travels
  // with (sharing one GSO buffer), yet it was due first; seen first, our request completes
  // before the peer's next message does, as when each crosses the wire alone. The two
  // directions are independent in the protocol, so the order between them is ours to choose.
  for (int answers = 1; answers >= 0; --answers)
    for (size_t at = 0; at < length; at += segment) {
      std::span<const uint8_t> datagram{data + at, std::min(segment, length - at)};
      bool answer = !datagram.empty() && IsAnswer(Opcode(datagram[0]));  // by the BTH's opcode
      if (answer == bool(answers)) Dispatch(from, *to, datagram, run);
    }
  Deliver(run);  // the buffer is read again by the next call
  run.congested = congested;
}

void Port::ReadErrors() {
  for (;;) {
    sockaddr_storage to{};  // where the datagram the error is about went
    char control[512];
    // What the error quotes back of that datagram: a CM MAD whole (a host or an RFC 1812
    // router quotes up to 576 bytes of IPv4, 1280 of IPv6); of an RC packet its BTH is enough.
    uint8_t quoted[kBthLen + kDethLen + kMadLen];
    iovec iov{quoted, sizeof quoted};
    msghdr msg{};
    msg.msg_name = &to;
    msg.msg_namelen = sizeof to;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t length = recvmsg(fd_, &msg, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (length < 0) break;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (!((c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR) ||
            (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_RECVERR)))
        continue;
      const auto* error = reinterpret_cast<const sock_extended_err*>(CMSG_DATA(c));
      if (error->ee_errno == ECONNREFUSED || error->ee_errno == EHOSTUNREACH || error->ee_errno == ENETUNREACH)
        OnUnreachable(to, int(error->ee_errno), {quoted, size_t(length)});
    }
  }
}

void Port::OnUnreachable(const sockaddr_storage& to, int error, std::span<const uint8_t> quoted) {
  // The error names one connection by what it quotes, found in O(1) and checked the way a TCP
  // stack checks the sequence number an ICMP error quotes (RFC 5927): our unpredictable
  // communication ID in a CM message, the peer's QPN and a PSN still in flight in an RC request.
  // Anyone can send ICMP errors; one that names nothing costs a lookup and is counted.
  Port& cm = Owner();
  CmUser::Unreachable what{error, std::nullopt};
  std::shared_ptr<CmUser> user;
  Bth bth;
  if (DecodeBth(quoted, bth) == PacketError::Ok) {
    base::MutexLock lock(cm.cm_mutex_);
    uint32_t id = 0;
    constexpr size_t kMadAt = kBthLen + kDethLen;
    if (bth.dest_qp == kGsiQpn) {
      CmMessage m;
      if (quoted.size() >= kMadAt + kMadLen && DecodeCm(quoted.subspan(kMadAt, kMadLen), m) == CmError::Ok)
        id = cm.agent_->CmMessageSentTo(to, SenderCommId(m));
    } else if (!IsAnswer(bth.opcode)) {  // an answer (ACK, Read Response) carries the peer's PSN
      id = cm.agent_->ConnectionTo(to, bth.dest_qp);
      what.request_psn = bth.psn;
    }
    if (id)
      if (auto it = cm.users_.find(id); it != cm.users_.end()) user = it->second.lock();
  }
  if (!user) {
    AdapterCounters(Transport::Roce).AddShared(Counter::IcmpErrorsIgnored);  // where the link counts a stale PSN
    return;
  }
  NDWV_LOG(Debug, "roce port %s: %s is unreachable (%s)", name_.c_str(), Describe(to).c_str(), strerror(error));
  user->OnUnreachable(what);
}

namespace {
// The ports open now (held, so that none closes while the caller works on it).
std::vector<std::shared_ptr<Port>> OpenPorts() {
  std::vector<std::shared_ptr<Port>> ports;
  base::MutexLock lock(PortsMutex());
  for (auto& [name, weak] : Ports())
    if (auto port = weak.lock()) ports.push_back(std::move(port));
  return ports;
}
}  // namespace

void Port::CloseAllAtExit() {
  for (auto& port : OpenPorts()) {
    base::MutexLock lock(port->cm_mutex_);
    for (auto& [id, user] : port->users_) port->agent_->Destroy(id);
  }
}

void Port::AddLiveCounters(CounterValues& sum) {
  for (auto& port : OpenPorts()) {
    base::MutexLock lock(port->cm_mutex_);
    port->AddCountersLocked(sum);
  }
}

static_assert(size_t(Counter::CmDrepSent) - size_t(Counter::CmReqSent) + 1 == CmCounters::kAttrs &&
              size_t(Counter::CmDrepReceived) - size_t(Counter::CmReqReceived) + 1 == CmCounters::kAttrs,
              "the CM message counters follow CmAttr order");

void Port::AddCountersLocked(CounterValues& sum) const {
  cm_mutex_.AssertHeld();
  if (owner_) return;  // a flow: its owner has its counts
  auto add = [&](Counter c, uint64_t n) { sum[size_t(c)] += n; };
  add(Counter::PortDatagramsSent, counters_.sent.load(std::memory_order_relaxed));
  add(Counter::PortDatagramsReceived, counters_.received.load(std::memory_order_relaxed));
  add(Counter::PortSendFailed, counters_.send_failed.load(std::memory_order_relaxed));
  add(Counter::PortDatagramsOverflowed, counters_.overflowed.load(std::memory_order_relaxed));
  add(Counter::PortDatagramsCongestionMarked, counters_.congestion_marked.load(std::memory_order_relaxed));
  add(Counter::DropsBadPacket, counters_.bad_packet.load(std::memory_order_relaxed));
  add(Counter::DropsBadIcrc, counters_.bad_icrc.load(std::memory_order_relaxed));
  add(Counter::DropsUnknownQp, counters_.unknown_qp.load(std::memory_order_relaxed));
  add(Counter::DropsWrongSource, counters_.wrong_source.load(std::memory_order_relaxed));
  add(Counter::DropsBadMad, counters_.bad_mad.load(std::memory_order_relaxed));
  const CmCounters& cm = agent_->counters();
  for (size_t i = 0; i < CmCounters::kAttrs; ++i) {
    add(Counter(size_t(Counter::CmReqSent) + i), cm.sent[i]);
    add(Counter(size_t(Counter::CmReqReceived) + i), cm.received[i]);
  }
  add(Counter::CmRetransmits, cm.retransmits);
  add(Counter::CmDuplicateAnswers, cm.duplicate_answers);
  add(Counter::CmReqTimeouts, cm.req_timeouts);
  add(Counter::CmRepTimeouts, cm.rep_timeouts);
  add(Counter::CmDreqTimeouts, cm.dreq_timeouts);
  for (uint64_t dropped : cm.drops) add(Counter::CmDrops, dropped);
  add(Counter::CmDropsWrongSource, cm.Dropped(CmDrop::WrongSource));
  add(Counter::CmReqsInvalid, cm.Limited(CmLimit::InvalidReq));
  add(Counter::CmReqsBacklogFull, cm.Limited(CmLimit::BacklogFull));
  add(Counter::CmReqsExpired, cm.Limited(CmLimit::RequestExpired));
  add(Counter::CmClampedTimeouts, cm.Limited(CmLimit::ResponseTimeout));
  add(Counter::CmClampedRetries, cm.Limited(CmLimit::Retries));
  add(Counter::CmClampedMraTimeouts, cm.Limited(CmLimit::MraTimeout));
  add(Counter::CmMrasIgnored, cm.Limited(CmLimit::MraCount));
  add(Counter::CmClampedReadLimits, cm.Limited(CmLimit::ReadLimits));
  add(Counter::CmClampedRnrRetries, cm.Limited(CmLimit::RnrRetry));
  add(Counter::CmReqsShed, cm.Limited(CmLimit::Overloaded));
  add(Counter::CmReqsBacklogWaits, cm.Limited(CmLimit::BacklogWait));
}

void Port::Dispatch(const sockaddr_storage& from, const sockaddr_storage& to, std::span<const uint8_t> datagram,
                    Run& run) {
  rx_mutex_.AssertHeld();
  PortCounters& counts = Owner().counters_;
  base::CaptureUdp(from, to, datagram);
  counts.received.fetch_add(1, std::memory_order_relaxed);
  IcrcAddresses addrs{reinterpret_cast<const sockaddr*>(&from), reinterpret_cast<const sockaddr*>(&to)};
  Packet packet;
  PacketError error = DecodePacket(datagram, &addrs, packet);
  if (error != PacketError::Ok) {
    (error == PacketError::BadIcrc ? counts.bad_icrc : counts.bad_packet).fetch_add(1, std::memory_order_relaxed);
    NDWV_LOG(Trace, "roce port %s: dropped a packet from %s (%s)", name_.c_str(),
             Describe(from).c_str(), ToString(error));
    return;
  }
  const Bth& bth = packet.headers.bth;
  if (bth.dest_qp == kGsiQpn) {
    if (bth.opcode != Opcode::UdSendOnly || packet.headers.deth.qkey != kGsiQkey ||
        packet.payload.size() < kMadLen) {
      counts.bad_mad.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    Deliver(run);  // what came before the MAD is processed before it (a DREQ after the data)
    if (wildcard_) Learn(from, to);  // where our answers leave from
    Owner().OnMad(from, packet.payload.first(kMadLen));
    return;
  }
  if (!run.sink || run.qpn != bth.dest_qp) {
    Deliver(run);
    run.qpn = bth.dest_qp;
    run.sink = FindSink(bth.dest_qp, &run.peer);
  }
  if (!run.sink) {
    counts.unknown_qp.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (PackedAddress::Of(from) != run.peer) {  // a QP takes packets from its peer's port only
    counts.wrong_source.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  run.packets[run.count++] = packet;
  if (run.count == Run::kMax) Deliver(run);
}

void Port::Deliver(Run& run) {
  if (run.count == 0) return;
  run.sink->OnPackets({run.packets, run.count}, run.congested);
  run.count = 0;
}

void Port::OnMad(const sockaddr_storage& from, std::span<const uint8_t> mad) {
  base::MutexLock lock(cm_mutex_);
  agent_->OnMad(from, mad);
  // The engine holds no lock anyone waits for (only this port's, or a flow's, rx_mutex_, which
  // others only try): it delivers now. A poller holds its CQ's sources_mutex_: the work pool
  // delivers.
  if (Engine::Get().OnEngineThread()) DeliverEvents();
  else CollectEvents();
}

void Port::OnIo(uint32_t events) {
  // The CM's socket: what reached the port's own socket before a MAD is taken first (a peer's
  // last Send before its DREQ), as it would be were both on one socket.
  if (owner_ && !connected_.load(std::memory_order_acquire) && (events & EPOLLIN)) owner_->DriveReceive();
  if (events & EPOLLOUT) {
    std::vector<std::weak_ptr<PacketSink>> waiting;
    {
      base::MutexLock lock(handoff_.mutex());
      waiting.swap(waiting_writable_);
      watching_out_ = false;
      ApplyWatchLocked();
    }
    for (auto& w : waiting)
      if (auto sink = w.lock()) sink->OnWritable();
  }
  if (events & (EPOLLIN | EPOLLERR)) DriveReceive();
}

// --------------------------------------------------------------------------------------- CM

void Port::AddUser(uint32_t comm_id, std::weak_ptr<CmUser> user) {
  base::MutexLock lock(cm_mutex_);
  users_[comm_id] = std::move(user);
}

void Port::RemoveUser(uint32_t comm_id) {
  base::MutexLock lock(cm_mutex_);
  users_.erase(comm_id);
}

int32_t Port::AddListener(uint64_t service_id, std::weak_ptr<CmUser> user) {
  {
    base::MutexLock lock(cm_mutex_);
    auto it = listeners_.find(service_id);
    if (it != listeners_.end() && !it->second.expired()) return WV_ADDRESS_ALREADY_ASSOCIATED;
    listeners_[service_id] = std::move(user);
    if (agent_->Listen(service_id) != WV_SUCCESS) return WV_ADDRESS_ALREADY_ASSOCIATED;
  }
  OpenCmSocket();
  base::MutexLock lock(PortsMutex());
  parks_flows_ = true;
  return WV_SUCCESS;
}

void Port::RemoveListener(uint64_t service_id) {
  bool listening;
  {
    base::MutexLock lock(cm_mutex_);
    listeners_.erase(service_id);
    agent_->StopListening(service_id);
    listening = !listeners_.empty();
  }
  if (listening) return;
  // Closed after the lock (~Port takes it): the CM's socket, and the flows parked here, which
  // would hold the port open past its listener (a new one could not have it).
  std::shared_ptr<Port> cm_socket;
  std::vector<std::shared_ptr<Port>> parked;
  base::MutexLock lock(PortsMutex());
  cm_socket = std::move(cm_socket_);
  parks_flows_ = false;
  parked = UnparkFlowsLocked();
}

uint64_t Port::NowMs() {
  return uint64_t(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count());
}

namespace {
// Until when (NowMs) the process sheds new connections: kShedMs after one of its sockets was
// found behind, i.e. still holding more than kDeepQueueBytes after the engine's turn, or dropping
// datagrams. Every connection's packets wait in the same queues and are dropped alike; a new
// connection's take a whole setup and teardown of them, and a peer that cannot get its REQ
// through repeats it later (cm.cpp), while an established connection whose packet is dropped
// again and again ends (retry count exceeded). Not only once the queue overflows: full 8 MiB
// buffers hold seconds of small datagrams, every answer in them comes after its sender's timer
// and is repeated, and the repeats keep the process behind (Microsoft's ndconn: 350 MB queued
// in a server's 65 sockets before the first drop, and no way back; bench/README.md). One value
// for the process: its sockets are read by one engine, and one socket behind means it has
// fallen behind on all of them.
//
// Deep is an amount (kDeepQueueBytes), not a share of the buffer: 512 KiB is a sixteenth of
// the 8 MiB a port gets by default, a connection's whole window of full-size packets (what one
// stream may leave queued), and far more than a healthy engine leaves after its turn. A share
// would shed for one stream where buffers are small: a process without CAP_NET_ADMIN on Debian's
// defaults gets 416 KiB, whose sixteenth is three packets. Such a buffer never holds seconds of
// datagrams; what it cannot hold is dropped, and drops shed.
constexpr uint64_t kShedMs = 100;
std::atomic<uint64_t> g_shed_until_ms{0};

// While behind, the process still admits one new REQ every kAdmitEveryMs: sockets that overflow
// because established connections stream into them (congestion, where buffers are small, not a
// flood) would otherwise shed every try of a REQ until its Connect ends ND_IO_TIMEOUT, and 100
// new connections a second add little to an overloaded engine's work.
constexpr uint64_t kAdmitEveryMs = 10;
std::atomic<uint64_t> g_admitted_at_ms{0};
}  // namespace

bool Port::CheckOverflow(bool turn_ended) {
  // Asked only in an engine turn that read much (an eighth of the buffer, or kEngineReads
  // buffers: a full socket is read so), so that an idle or ping-pong connection's reads pay
  // nothing for it (SO_RXQ_OVFL would add a control message to every datagram).
  uint32_t info[SK_MEMINFO_VARS] = {};
  socklen_t length = sizeof info;
  if (getsockopt(fd_, SOL_SOCKET, SO_MEMINFO, info, &length) != 0 || length <= SK_MEMINFO_DROPS * sizeof info[0])
    return false;
  const uint32_t dropped = info[SK_MEMINFO_DROPS] - overflowed_seen_;
  overflowed_seen_ = info[SK_MEMINFO_DROPS];
  if (dropped) Owner().counters_.overflowed.fetch_add(dropped, std::memory_order_relaxed);
  // Deep only once the turn ended with the socket not emptied: a look in the middle of a turn
  // finds a stream's windows not yet read, which is no overload.
  const bool deep = turn_ended && info[SK_MEMINFO_RMEM_ALLOC] > kDeepQueueBytes;
  if (dropped || deep) g_shed_until_ms.store(NowMs() + kShedMs, std::memory_order_relaxed);
  return dropped || info[SK_MEMINFO_RMEM_ALLOC] > ReceiveBuffer() / 4;
}

uint32_t Port::ReceiveBuffer() {
  const uint32_t granted = g_granted_receive_buffer.load(std::memory_order_relaxed);
  return granted ? granted : 2 * base::Config().roce_socket_buffer;  // what the kernel would grant
}

uint64_t Port::ShedUntilMs() { return g_shed_until_ms.load(std::memory_order_relaxed); }

bool Port::Overloaded() {
  cm_mutex_.AssertHeld();  // the agent asks under it
  // A REQ read by a CQ's poller waits, with its CEP, for the work pool to deliver it to the
  // listener (CollectEvents), whose backlog then refuses the excess. A flood read so faster than
  // the pool delivers would hold a CEP per REQ until then: past this many the port is behind.
  if (events_.size() >= kMaxUndeliveredEvents) return true;
  const uint64_t now = NowMs();
  if (now >= ShedUntilMs()) return false;
  uint64_t admitted = g_admitted_at_ms.load(std::memory_order_relaxed);
  return now - admitted < kAdmitEveryMs ||
         !g_admitted_at_ms.compare_exchange_strong(admitted, now, std::memory_order_relaxed);
}

void Port::SendMad(const sockaddr_storage& to, const CmMessage& msg) {
  cm_mutex_.AssertHeld();
  // UD SEND ONLY to QP 1 (BTH + DETH), the 256-byte MAD, then the ICRC.
  uint8_t datagram[kBthLen + kDethLen + kMadLen + kIcrcLen];
  Headers h;
  h.bth.opcode = Opcode::UdSendOnly;
  h.bth.dest_qp = kGsiQpn;
  h.deth.qkey = kGsiQkey;
  h.deth.src_qp = kGsiQpn;
  size_t header = EncodeHeaders(h, datagram);
  EncodeCm(msg, std::span<uint8_t, kMadLen>(datagram + header, kMadLen));
  Send(to, datagram, header + kMadLen + kIcrcLen);  // if full: lost; the CM retransmits
}

uint32_t Port::Connect(const sockaddr_storage& to, const ConnectArgs& args, std::weak_ptr<CmUser> user) {
  base::MutexLock lock(cm_mutex_);
  uint32_t id = agent_->Connect(to, args);
  if (id) users_[id] = std::move(user);
  CollectEvents();
  return id;
}

void Port::CollectEvents() {
  cm_mutex_.AssertHeld();
  CmEvent event;
  while (agent_->PopEvent(&event)) events_.push_back(event);
  RearmCmTimer();
  if (!events_.empty() && !delivering_ && !deliver_work_.keep) {
    deliver_work_.keep = shared_from_this();
    Engine::Get().Defer(&deliver_work_);
  }
}

void Port::DeliverEvents() {
  cm_mutex_.AssertHeld();
  CmEvent event;
  while (agent_->PopEvent(&event)) events_.push_back(event);
  RearmCmTimer();
  if (delivering_) return;  // the thread delivering now delivers these too, in order
  delivering_ = true;
  while (!events_.empty()) {
    CmEvent next = events_.front();
    events_.pop_front();
    std::shared_ptr<CmUser> user;
    if (next.kind == CmEventKind::ReqReceived) {
      auto it = listeners_.find(next.msg.req.service_id);
      if (it != listeners_.end()) user = it->second.lock();
    } else {
      auto it = users_.find(next.id);
      if (it != users_.end()) user = it->second.lock();
    }
    if (!user) {
      // Nobody holds this ID any more (the endpoint was released): the agent winds it down.
      if (next.kind == CmEventKind::ReqReceived) agent_->Destroy(next.id);
      continue;
    }
    cm_mutex_.unlock();
    user->OnCmEvent(next);
    cm_mutex_.lock();
    while (agent_->PopEvent(&event)) events_.push_back(event);
  }
  events_.ReleaseIfEmpty();
  delivering_ = false;
  RearmCmTimer();
}

void Port::RearmCmTimer() {
  cm_mutex_.AssertHeld();
  uint64_t deadline = agent_->NextDeadlineMs();
  if (deadline == UINT64_MAX) return;  // a timer that fires early finds nothing due: harmless
  // Armed in time already: most CM events add a later deadline (a new connection's) or none, and
  // each arming is a trip through the engine's timer heap and lock.
  if (cm_timer_.pending() && cm_timer_deadline_ <= deadline) return;
  cm_timer_deadline_ = deadline;
  uint64_t now = NowMs();
  cm_timer_.Arm(shared_from_this(), std::chrono::milliseconds(deadline > now ? deadline - now : 0));
}

void Port::OnCmTimer(Timer* timer) {
  Port* self = PortTimer::OwnerOf(timer);
  std::shared_ptr<Port> keep;
  {
    base::MutexLock lock(self->cm_mutex_);
    keep = self->cm_timer_.TakeFiring();
  }
  if (!keep) return;
  base::MutexLock lock(keep->cm_mutex_);
  keep->agent_->OnTimer();
  keep->DeliverEvents();
}

}  // namespace ndwv::dev::roce
