// A RoCE port: one UDP socket of the device, carrying the IB CM's MADs (to QP 1) and the RC
// packets of every connection made through it (to their QPN).
//
// Who has one (DESIGN.md "Addressing in user space"): a listener owns the UDP port it is bound
// to, and the connections it accepts use that port too; the active connectors bound to port 0 on
// an address share a few ports of the process, taken in turn (NDWV_ROCE_CONNECTOR_PORTS, the
// kernel's choices; or NDWV_ROCE_PORT's one), and a connector bound to a given port has that
// port to itself. A peer learns our port from the source address of the CM exchange.
//
// A flow is a second socket on a port that serves many peers (a listener's, or one the
// connectors share), connected to one peer's port (SO_REUSEPORT): the connections with that peer
// send and receive through it. The kernel then routes once, not per datagram (an unconnected
// send costs ~0.5 us more on loopback), and a poller reads only its peer's packets. The owning
// port's socket keeps everything else: requests from new peers, and the CM (a flow hands the
// MADs and ICMP errors it receives to its owner, and counts in its owner's counters). A
// listener's port has one more socket, the CM's (OpenCmSocket), unconnected, that the MADs from
// peers without a flow are steered to.
//
// Receive runs on the engine, or on a CQ poller lending its thread; it decodes and checks each
// datagram (ICRC, headers) and hands it to the CM agent or to the QP's link. The CM agent is a
// pure state machine (cm.h); the port gives it a clock and a socket, and delivers its events to
// the endpoints in order, outside the agent's lock.
#pragma once
#include <sys/socket.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/keyed_hash.h"
#include "base/lazy_deque.h"
#include "base/mutex.h"
#include "base/object_pool.h"
#include "dev/address.h"
#include "dev/counters.h"
#include "dev/cq.h"
#include "dev/engine.h"
#include "dev/poller_handoff.h"
#include "dev/roce/cm.h"
#include "dev/roce/recent_routes.h"
#include "wire/ib.h"

namespace ndwv::dev::roce {

// Whoever consumes the RC packets for one QPN (the QP's link).
class PacketSink {
 public:
  // A run of packets, in the order they are to be processed (those of one receive buffer: a
  // request and the ACK it travels with take the link's lock once). `congested`: they were read
  // from a socket found congested (Port::CheckOverflow), which their sender is to be told.
  virtual void OnPackets(std::span<const wire::ib::Packet> packets, bool congested) = 0;
  virtual void OnWritable() = 0;  // the socket has room again after a Send returned false
 protected:
  ~PacketSink() = default;
};

// Whoever consumes the CM events of one communication ID or one listened service.
class CmUser {
 public:
  virtual void OnCmEvent(const CmEvent& event) = 0;
  // An ICMP error about a datagram this connection sent, matched to it by what the error quoted
  // back (Port::ReadErrors).
  struct Unreachable {
    // ECONNREFUSED (port unreachable: nothing listens there), EHOSTUNREACH or ENETUNREACH (no
    // way to that host).
    int error = 0;
    std::optional<uint32_t> request_psn;  // an RC request's PSN; none for a CM message
  };
  virtual void OnUnreachable(const Unreachable& what) = 0;
  // Another connection to the same peer port found it closed (Port::ProbeConnectionsTo): probe
  // it now.
  virtual void ProbePeer() = 0;
 protected:
  ~CmUser() = default;
};

// Drops, counted by reason (also readable by tests).
struct PortCounters {
  std::atomic<uint64_t> received{0}, sent{0}, send_failed{0};
  std::atomic<uint64_t> overflowed{0};  // dropped by the kernel: a receive buffer was full
  std::atomic<uint64_t> congestion_marked{0};  // arrived marked Congestion Experienced (ECN)
  std::atomic<uint64_t> bad_packet{0}, bad_icrc{0}, unknown_qp{0}, wrong_source{0}, bad_mad{0};
};

class Port final : public IoHandler, public CmEnv, public std::enable_shared_from_this<Port> {
 public:
  // The port bound to `local` (an address of the host). Port 0: a new port, the kernel's choice.
  // WV status in *status.
  // `shared`: a port of the process's port-0 connectors on that address: NDWV_ROCE_PORT's, which
  // they all use, or with port 0 the one whose turn it is of NDWV_ROCE_CONNECTOR_PORTS, each
  // picked by the kernel when it is first opened and kept while one holds it; otherwise a port
  // already open in this process is in use (WV_SHARING_VIOLATION).
  static std::shared_ptr<Port> Open(const sockaddr_storage& local, bool shared, int32_t* status);
  // The flow of `owner` to `peer`, opened or shared; null if the host refuses one or the owner
  // has kMaxFlows (the connectors' ports of a process, all together): the connection then uses
  // the owner's socket.
  // Why a bound: a datagram to the port that no connected socket matches (every new peer's REQ;
  // on kernels before 6.13, every datagram) makes the kernel walk all the sockets on the port,
  // and so does each flow's bind: with 8,000 flows a REQ cost the sender ~2 ms.
  static constexpr size_t kMaxFlows = 64;
  static std::shared_ptr<Port> OpenFlow(const std::shared_ptr<Port>& owner, const sockaddr_storage& peer);
  // A connection lets go of the port its data went through. A flow of the connectors' ports, or
  // of a port while it has a listener, then stays open for the CM's time-wait
  // (NDWV_ROCE_TIMEWAIT_MS), so that the next connection with that peer port finds it (a client
  // that connects, works, disconnects and releases, again and again, opened and closed a socket
  // on each side each time: eleven system calls); no more than kMaxFlows per port, their own
  // bound. The last RemoveListener lets its port's go. Other ports go as before.
  static void Park(std::shared_ptr<Port> port);
  ~Port();
  // Ports and flows come and go with connections: from the pool (base/object_pool.h).
  static void* operator new(size_t bytes) { return base::PoolAllocate(bytes); }
  static void operator delete(void* port, size_t bytes) { base::PoolFree(port, bytes); }

  const sockaddr_storage& local() const { return local_; }
  // A port bound to the wildcard address (a listener on every address of the host): the ICRC
  // covers the IP addresses (RoCEv2), so each datagram is checked with the address it came to
  // (IP_PKTINFO) and sent from an address chosen for its peer and pinned (IP_PKTINFO again).
  bool wildcard() const { return wildcard_; }
  // Our address (and port) as `peer` reaches it: where its CM messages last came to, else the
  // route's source for it. For a wildcard port; others answer local().
  sockaddr_storage AddressFor(const sockaddr_storage& peer);
  // The port serves one connection only (an active connector's own port): the socket is
  // connected to the peer's port, so the kernel routes once, not per datagram, and delivers
  // nothing from anyone else. False if there is no route to the peer (errno says why).
  bool ConnectTo(const sockaddr_storage& peer);
  // A connected socket's (ConnectTo, a flow's): the route's IP MTU; 0 if unknown.
  int RouteMtu() const;
  // A shared port's routes found lately (a listener's, or its connectors'; its owner's, for a
  // flow): made on first use, so that a port of one connection holds none.
  RecentRoutes& recent_routes();
  // A port's include its flows'.
  const PortCounters& counters() const { return owner_ ? owner_->counters_ : counters_; }

  // ---- RC data ----
  // Packets for `qpn` go to `sink`, if they come from `peer` (others are dropped and counted).
  void AddSink(uint32_t qpn, std::weak_ptr<PacketSink> sink, const sockaddr_storage& peer);
  void RemoveSink(uint32_t qpn);
  // Sends one datagram: `datagram` holds BTH .. pad and 4 bytes more, where the ICRC is stored.
  // False if the socket is full: then WaitWritable, and OnWritable follows when it has room.
  bool Send(const sockaddr_storage& to, uint8_t* datagram, size_t size);
  // A datagram in pieces: the first holds the BTH and the headers after it, the last ends with
  // the 4 bytes where the ICRC is stored (both in the sender's own, writable buffer); between
  // them the payload, wherever it lies (a request's, straight from the memory its SGEs name: the
  // kernel's copy is then the only one).
  static constexpr int kMaxPieces = 18;  // headers, a piece per SGE, pad and ICRC
  struct OutDatagram {
    iovec pieces[kMaxPieces];
    int count;    // pieces
    size_t size;  // bytes in all
  };
  // Sends `count` (at most kMaxBatch) datagrams; returns how many the socket took (the first
  // ones). Runs of equal-size datagrams go as one UDP GSO send where the kernel can. `from` is
  // our address as `to` reaches it (the connection's, AddressFor when it was set up): a wildcard
  // port sends from it; others from local().
  static constexpr int kMaxBatch = 17;  // a 64 KiB message of 4 KiB packets and an ACK ahead of it
  int SendBatch(const sockaddr_storage& to, const sockaddr_storage& from, OutDatagram* datagrams, int count);
  // The datagrams SendBatch sends as its first GSO buffer (how many, their bytes); and where a
  // datagram of `size` could join that buffer as its last (0 when it cannot: it would go alone).
  struct GsoRun {
    int datagrams;
    size_t bytes;
  };
  GsoRun FirstRun(const OutDatagram* datagrams, int count) const;
  int SlotEndingFirstRun(const OutDatagram* datagrams, int count, size_t size) const;
  void WaitWritable(std::weak_ptr<PacketSink> sink);
  // Reads and dispatches what has arrived (the engine, or a CQ poller lending its thread). The
  // engine reads until the socket is empty, at most kEngineReads times (two buffers each): a
  // socket that peers keep full (a burst of thousands of connects, a flood) must not hold the
  // engine's loop, whose other sockets, timers and held wake-ups of the application wait for it
  // to return (an application asleep on a CQ saw it overrun). Its level-triggered watch reports
  // the rest at once. A poller (`once`) reads one buffer (a GRO buffer may hold many datagrams)
  // and returns to its completions: the empty read that would follow costs a system call on
  // every message's path, and the next poll reads again anyway.
  static constexpr int kEngineReads = 32;
  void DriveReceive(bool once = false);
  // Who reads the socket, the engine or the pollers (the rule: PollerRule, dev/poller_handoff.h). A poller
  // found its CQ empty and drove this port; `placed_peer_message`: its receive ended a message
  // the peer started. Then, if its CQ lends its pollers (`lendable`), the engine stops watching
  // the socket: on a busy machine a wake-up per datagram costs more than the datagram.
  void PolledEmpty(bool placed_peer_message, bool lendable);
  // A poll that found completions: may end the pollers' hold (true if it did).
  bool Reaped(bool peer_message);
  void Posted();  // the application posted
  void NotifyArmed();  // someone will wait for an event (CQ Notify): the engine must watch
  // A connection found `peer` (a port) closed, its process gone (an ICMP port unreachable that
  // quoted its request): the others established with it probe it now
  // (CmAgent::ConnectionsToProbe), so that all of them find out within one probe's retries, not
  // each at its own keepalive (with 10,000 connections a process probes each every 20 s). Call
  // holding no lock.
  static void ProbeConnectionsTo(const sockaddr_storage& peer);

  // ---- CM (not on a flow: its owner has the agent) ----
  // Runs `call` on the agent under its lock. The events it causes are delivered later, as
  // deferred work, so a consumer may call this while holding its own lock.
  template <class Call>
  auto Cm(Call&& call) {
    base::MutexLock lock(cm_mutex_);
    if constexpr (std::is_void_v<decltype(call(*agent_))>) {
      call(*agent_);
      CollectEvents();
    } else {
      auto result = call(*agent_);
      CollectEvents();
      return result;
    }
  }
  // Sends a REQ (CmAgent::Connect); `user` gets the events of the new ID. 0 if refused.
  uint32_t Connect(const sockaddr_storage& to, const ConnectArgs& args, std::weak_ptr<CmUser> user);
  // The user of a communication ID's events; of a listened service's new requests.
  void AddUser(uint32_t comm_id, std::weak_ptr<CmUser> user);
  void RemoveUser(uint32_t comm_id);
  int32_t AddListener(uint64_t service_id, std::weak_ptr<CmUser> user);  // WV status
  void RemoveListener(uint64_t service_id);

  // CmEnv (called by the agent, under cm_mutex_)
  uint64_t NowMs() override;
  bool Overloaded() override;  // until ShedUntilMs(), or while kMaxUndeliveredEvents wait
  // Until when (NowMs) the process sheds new connections: a while after one of its sockets was
  // found behind (dropping datagrams, or holding more than kDeepQueueBytes after the engine's
  // turn: CheckOverflow).
  static uint64_t ShedUntilMs();
  static constexpr uint32_t kDeepQueueBytes = 512 << 10;
  // CM events the agent raised that no thread has delivered yet: past this, new REQs are shed.
  static constexpr size_t kMaxUndeliveredEvents = 1024;
  // The receive buffer the kernel grants the process's ports (twice NDWV_ROCE_SOCKET_BUFFER, or
  // less without CAP_NET_ADMIN), in bytes: what a connection's window is sized by (RcLink).
  static uint32_t ReceiveBuffer();
  void SendMad(const sockaddr_storage& to, const wire::ib::CmMessage& msg) override
      NDWV_REQUIRES(cm_mutex_);

  // IoHandler
  void OnIo(uint32_t events) override;

 private:
  Port(int fd, const sockaddr_storage& local, std::string name, std::shared_ptr<Port> owner);
  // A UDP socket with the options every port needs; `wildcard`: each datagram's destination too.
  static int OpenSocket(const sockaddr_storage& local);
  // The port that has the CM and the counters: this one, or a flow's owner.
  Port& Owner() { return owner_ ? *owner_ : *this; }
  // A second socket on this port's UDP port (SO_REUSEPORT), bound; -1 (errno) if refused.
  // Under PortsMutex().
  int OpenSibling();
  // A listener's port gets a socket of its own for the CM: a classic BPF program on the port's
  // reuseport group steers every datagram to QP 1 there, so that a flood of REQs (a peer's
  // connect storm, or an attacker's) fills that socket's buffer while the packets of the
  // connections accepted on the port (those without a flow) still find room in the port's.
  // Where the host refuses it, everything arrives on the port's socket as before. Opened by the
  // first AddListener while the port has no flow (the program's indexes count on it), closed
  // by the last RemoveListener; it counts as a flow against kMaxFlows.
  void OpenCmSocket();
  void OnMad(const sockaddr_storage& from, std::span<const uint8_t> mad) NDWV_EXCLUDES(cm_mutex_);
  // A receiving thread's buffer, and the packets decoded from it for one sink, handed over
  // together (port.cpp).
  struct RxBuffer;
  struct Run;
  static thread_local std::unique_ptr<RxBuffer> t_rx_;
  // One received message (a datagram, or a GRO buffer of them) to the sinks and the CM.
  void Handle(const mmsghdr& message, const uint8_t* data, const sockaddr_storage& from, Run& run)
      NDWV_REQUIRES(rx_mutex_);
  void Dispatch(const sockaddr_storage& from, const sockaddr_storage& to, std::span<const uint8_t> datagram,
                Run& run) NDWV_REQUIRES(rx_mutex_);
  static void Deliver(Run& run);
  // The sink of `qpn` (and the peer it takes packets from), or null.
  std::shared_ptr<PacketSink> FindSink(uint32_t qpn, PackedAddress* peer) NDWV_REQUIRES(rx_mutex_);
  // Counts what the kernel dropped on this socket since the last look (a full receive buffer), and
  // if anything, or if the socket is still deep in datagrams when the engine's turn ended
  // (`turn_ended`), sheds new connections a while (ShedUntilMs). True if the socket is congested:
  // it dropped, or still holds more than a quarter of its buffer (docs/roce.md, "Data path").
  bool CheckOverflow(bool turn_ended) NDWV_REQUIRES(rx_mutex_);
  // ICMP errors queued by IP_RECVERR, each to the one connection whose datagram it quotes.
  void ReadErrors();
  void OnUnreachable(const sockaddr_storage& to, int error, std::span<const uint8_t> quoted);
  // At process exit, every connection of every port is closed as Destroy does (a DREQ for an
  // established one), so that peers learn of it without waiting out their retries.
  static void CloseAllAtExit();
  // Adapter counters: the live ports' (LiveCounterSource), and one port's under cm_mutex_.
  static void AddLiveCounters(CounterValues& sum);
  void AddCountersLocked(CounterValues& sum) const NDWV_REQUIRES(cm_mutex_);
  // Queues the agent's events, schedules their delivery.
  void CollectEvents() NDWV_REQUIRES(cm_mutex_);
  // Delivers the queued events, releasing cm_mutex_ around each user's OnCmEvent.
  void DeliverEvents() NDWV_REQUIRES(cm_mutex_);
  void RearmCmTimer() NDWV_REQUIRES(cm_mutex_);
  static void OnCmTimer(Timer* timer);

  // The destination of a datagram to `to`: none when the socket is connected to it.
  sockaddr* NameFor(const sockaddr_storage& to, socklen_t* length) const;

  const int fd_;
  const sockaddr_storage local_;
  const bool wildcard_;
  // A wildcard port's: our address as each peer (by IP) reaches it (AddressFor). Learned from
  // CM messages, at most kMaxReached peers (beyond, the route's choice for each datagram).
  struct Ip {
    sockaddr_storage address;  // port 0
    bool operator==(const Ip& other) const { return SameAddress(address, other.address); }
  };
  struct IpHash {
    size_t operator()(const Ip& ip) const { return AddressHash(ip.address); }
  };
  static constexpr size_t kMaxReached = 4096;
  void Learn(const sockaddr_storage& peer, const sockaddr_storage& reached);  // on the owner
  base::Mutex reached_mutex_{"roce::Port::reached_mutex_"};
  base::PooledHashMap<Ip, sockaddr_storage, IpHash> reached_ NDWV_GUARDED_BY(reached_mutex_);
  const std::string name_;                // in the process's list of ports
  std::string connectors_key_;  // the port-0 connectors' of this address (Open); set once, under PortsMutex()
  const std::shared_ptr<Port> owner_;  // a flow's owning port (null for a port)
  std::atomic<bool> connected_{false};
  sockaddr_storage connected_peer_{};  // set before connected_
  bool shares_port_ = false;  // a port: SO_REUSEPORT set for its flows (under PortsMutex())
  size_t flows_ = 0;          // a port: its flows open (under PortsMutex())
  // Park: whether this port's flows are parked (a shared port's; a listener's port while it
  // listens); a parked flow's, when the park lets it go unless parked again. Under PortsMutex().
  bool parks_flows_ = false;
  Clock::time_point parked_until_{};
  bool parked_ = false;
  static Timer& ParkTimer();
  static void OnParkTimer(Timer* timer);
  // Takes this port's parked flows out of the park (under PortsMutex(); released by the caller
  // after it).
  std::vector<std::shared_ptr<Port>> UnparkFlowsLocked();
  template <class Leaves>
  static std::vector<std::shared_ptr<Port>> TakeParkedLocked(Leaves leaves);
  std::shared_ptr<Port> cm_socket_;  // a listener's port: OpenCmSocket's (under PortsMutex())
  // What this port's flows count against kMaxFlows: flows_, or the connectors' ports' common
  // count (under PortsMutex()).
  size_t& FlowCount();
  PortCounters counters_;  // a flow's are its owner's
  std::atomic<RecentRoutes*> recent_routes_{nullptr};  // owned; recent_routes()

  base::SharedMutex sinks_mutex_;
  base::Mutex rx_mutex_{"roce::Port::rx_mutex_"};  // one receiver at a time
  struct SinkEntry {  // one cache line: with many connections each packet's lookup misses
    std::weak_ptr<PacketSink> sink;
    PackedAddress peer;
  };
  base::PooledHashMap<uint32_t, SinkEntry> sinks_ NDWV_GUARDED_BY(sinks_mutex_);
  // The sink found last, kept across receive calls (rx_mutex_): a connection's packets follow
  // one another, and a lookup costs a shared lock and a hash. Valid while the process's sink
  // tables are unchanged (their generation).
  struct SinkCache {
    uint32_t qpn = 0;
    uint64_t generation = 0;
    std::weak_ptr<PacketSink> sink;
    PackedAddress peer;
  } sink_cache_ NDWV_GUARDED_BY(rx_mutex_);
  uint32_t overflowed_seen_ NDWV_GUARDED_BY(rx_mutex_) = 0;  // the socket's drop count, last seen
  bool congested_ NDWV_GUARDED_BY(rx_mutex_) = false;       // found so, and not emptied since
  // The engine's watch: who reads (PollerHandoff, dev/poller_handoff.h) and whether it waits
  // for room to send, under the hand-off's lock.
  PollerHandoff<Port> handoff_{this};
  std::vector<std::weak_ptr<PacketSink>> waiting_writable_ NDWV_GUARDED_BY(handoff_.mutex());
  bool watching_out_ NDWV_GUARDED_BY(handoff_.mutex()) = false;
  friend class PollerHandoff<Port>;
  // Under handoff_.mutex(), asserted (at the hand-off's call the analysis cannot tell that its
  // lock is this handoff_'s).
  void ApplyWatchLocked();
  void EngineReturned(bool by_timer);

  std::atomic<bool> gso_{true};  // the kernel takes UDP_SEGMENT sends (checked on first use)

  base::Mutex cm_mutex_{"roce::Port::cm_mutex_"};
  // From the pool (base/object_pool.h); held by the port alone.
  std::shared_ptr<CmAgent> agent_ NDWV_GUARDED_BY(cm_mutex_);
  base::PooledHashMap<uint32_t, std::weak_ptr<CmUser>, base::KeyedHasher> users_ NDWV_GUARDED_BY(cm_mutex_);
  base::PooledHashMap<uint64_t, std::weak_ptr<CmUser>> listeners_ NDWV_GUARDED_BY(cm_mutex_);
  base::LazyDeque<CmEvent> events_ NDWV_GUARDED_BY(cm_mutex_);
  bool delivering_ NDWV_GUARDED_BY(cm_mutex_) = false;
  struct DeliverWork : WorkItem {
    Port* owner = nullptr;
    std::shared_ptr<Port> keep;  // set while queued
  } deliver_work_;
  using PortTimer = OwnedTimer<Port>;
  PortTimer cm_timer_ NDWV_GUARDED_BY(cm_mutex_){&Port::OnCmTimer, this};
  uint64_t cm_timer_deadline_ NDWV_GUARDED_BY(cm_mutex_) = 0;  // what cm_timer_ is armed for (NowMs)
};

}  // namespace ndwv::dev::roce
