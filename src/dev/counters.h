// Counters of the device: per connection (one block owned by each QP's link) and per adapter (one
// registry per transport). Every counter has a stable name (docs/counters.md); the public API is
// ndwv_counters_* (include/ndwv/ndwv.h, src/wv/counters.cpp).
//
// Cost on the data path: one add. A block's counters are atomics read with relaxed loads, so a
// reader on any thread never needs the owner's lock; a writer that already holds its object's lock
// (the link's) increments with Add, a plain load and store, and writers with no common lock use
// AddShared (an atomic add). Counting never takes a lock.
//
// A live connection's block is listed in its transport's registry (a row of its own) and summed
// into the adapter totals when they are read; when the connection ends, its counts are added to
// the totals once. Objects without a row (RoCE ports and their CM agent, iWARP connection setup)
// count into the totals directly, or report through a live source when the totals are read.
#pragma once
#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ndwv::dev {

enum class Transport { Iwarp, Roce };

// Every counter; the order is the order they are printed in. Names: CounterName.
enum class Counter : uint16_t {
  // Data path, both transports, per connection.
  TxPackets, TxBytes, RxPackets, RxBytes,
  TxSends, TxWrites, TxReads, RxSends, RxWrites, RxReads,
  Flushes, FlushedRequests,
  // RoCE RC transport, per connection.
  Retransmits, AckTimeouts, KeepalivesSent, RxDuplicates, RxOutOfSequence,
  NaksSentSequence, NaksSentRnr, NaksSentAccess, NaksSentInvalid, NaksSentRemoteOp,
  NaksReceivedSequence, NaksReceivedRnr, NaksReceivedAccess, NaksReceivedInvalid, NaksReceivedRemoteOp,
  RetryExceeded, RnrRetryExceeded,
  // iWARP stream, per connection.
  TxConfirmReads, RxConfirmReads, TxCoalesced,
  TerminatesSentRdmap, TerminatesSentDdp, TerminatesSentLlp,
  TerminatesReceivedRdmap, TerminatesReceivedDdp, TerminatesReceivedLlp,
  DropsBadCrc, DropsBadDdp,
  // iWARP connection setup, per adapter.
  MpaRequestsSent, MpaRequestsReceived, MpaRepliesSent, MpaRepliesReceived,
  MpaRejectsSent, MpaRejectsReceived, DropsBadMpa,
  // RoCE ports (UDP sockets), per adapter.
  PortDatagramsSent, PortDatagramsReceived, PortSendFailed,
  DropsBadPacket, DropsBadIcrc, DropsUnknownQp, DropsWrongSource, DropsBadMad,
  // RoCE IB CM, per adapter; the message counters in CmAttr order (REQ .. DREP).
  CmReqSent, CmMraSent, CmRejSent, CmRepSent, CmRtuSent, CmDreqSent, CmDrepSent,
  CmReqReceived, CmMraReceived, CmRejReceived, CmRepReceived, CmRtuReceived, CmDreqReceived,
  CmDrepReceived,
  CmRetransmits, CmDuplicateAnswers, CmReqTimeouts, CmRepTimeouts, CmDreqTimeouts, CmDrops,
  // Added later, at the end: a counter's index never changes (ndwv.h).
  AcceptsRefused,  // iWARP connection setup, per adapter
  ReadsBeyondIrd,  // iWARP stream, per connection
  // iWARP connection setup, per adapter: the listener's bounds (docs/security.md).
  ListenBacklogFull, MpaRequestTimeouts, MpaRequestsAbandoned, MpaRequestsExpired,
  // RoCE IB CM, per adapter: the bounds a peer ran into (CmLimit, CmDrop::WrongSource), and REQs
  // whose RDMA-CM IP header names another address than the datagram came from.
  CmReqsInvalid, CmReqsBacklogFull, CmReqsExpired, CmDropsWrongSource, CmClampedTimeouts,
  CmClampedRetries, CmClampedMraTimeouts, CmMrasIgnored, CmClampedReadLimits, CmClampedRnrRetries,
  CmPeerAddressMismatches,
  // Both transports, per adapter: the engine took a socket back from pollers that had stopped,
  // and found the peer's data waiting for it (dev/poller_handoff.h, PollerRule): the application waited
  // without polling, and its wait lasted up to one look of the idle timer longer.
  LateEngineTakeovers,
  // Both transports, per adapter: a connection endpoint changed state in a way its transition
  // table does not list (a release build logs it and goes on; checked builds abort).
  IllegalEndpointTransitions,
  // RoCE ports, per adapter: ICMP errors about datagrams no connection of ours has outstanding.
  IcmpErrorsIgnored,
  // RoCE ports and IB CM, per adapter: datagrams the kernel dropped for want of room in a socket's
  // receive buffer, and the new REQs dropped meanwhile (CmLimit::Overloaded).
  PortDatagramsOverflowed, CmReqsShed,
  // Per adapter: a listener asked for no limit (Listen(0)) held the host's backlog and let a
  // connection wait instead of refusing it. iWARP: it stopped accepting (the kernel's queue holds
  // the connections); RoCE: a REQ postponed (an MRA asks its sender to repeat it).
  ListenBacklogWaits, CmReqsBacklogWaits,
  // RoCE, per adapter: keepalive probes sent early because another connection to the same peer
  // port found it closed (Port::ProbeConnectionsTo).
  PeerProbes,
  // RoCE RC transport, per connection: congestion notifications (CNPs) sent because our receive
  // socket was congested, and received, each of which may have narrowed our window.
  CnpsSent, CnpsReceived,
  // RoCE ports, per adapter: messages that arrived marked Congestion Experienced (ECN).
  PortDatagramsCongestionMarked,
  Count
};
inline constexpr size_t kCounters = size_t(Counter::Count);

const char* CounterName(Counter c);
// Whether `c` applies to `transport`, and whether a connection (not only the adapter) has it.
bool CounterApplies(Counter c, Transport transport);
bool CounterPerConnection(Counter c);

using CounterValues = std::array<uint64_t, kCounters>;

class CounterBlock {
 public:
  // The owner's lock serializes every writer of `c`: a plain add, no locked instruction.
  void Add(Counter c, uint64_t n = 1) {
    std::atomic<uint64_t>& v = values_[size_t(c)];
    v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  }
  // Writers of `c` share no lock.
  void AddShared(Counter c, uint64_t n = 1) { values_[size_t(c)].fetch_add(n, std::memory_order_relaxed); }
  uint64_t Get(Counter c) const { return values_[size_t(c)].load(std::memory_order_relaxed); }
  void AddTo(CounterValues& sum) const {
    for (size_t i = 0; i < kCounters; ++i) sum[i] += values_[i].load(std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> values_[kCounters] = {};
};

// The adapter totals of `transport`, for objects that have no row: counted directly (AddShared).
CounterBlock& AdapterCounters(Transport transport);

// The counters a connection has (CounterPerConnection): the data path's, RoCE's and the iWARP
// stream's (TxPackets .. DropsBadDdp), and those added later (kLaterPerConnection). A connection
// keeps a slot for each of these only: 44 of the 103 (a block of them all was 800 bytes a
// connection).
inline constexpr Counter kLaterPerConnection[] = {Counter::ReadsBeyondIrd, Counter::CnpsSent,
                                                  Counter::CnpsReceived};
inline constexpr size_t kFirstLaterSlot = size_t(Counter::DropsBadDdp) + 1;
inline constexpr size_t kConnectionSlots = kFirstLaterSlot + std::size(kLaterPerConnection);
constexpr int ConnectionSlot(Counter c) {
  if (c <= Counter::DropsBadDdp) return int(c);
  for (size_t i = 0; i < std::size(kLaterPerConnection); ++i)
    if (c == kLaterPerConnection[i]) return int(kFirstLaterSlot + i);
  return -1;
}
constexpr Counter CounterOfSlot(size_t slot) {
  return slot < kFirstLaterSlot ? Counter(slot) : kLaterPerConnection[slot - kFirstLaterSlot];
}

// The counters of one connection (one QP's link), with the connection's identity: listed in its
// transport's registry from Register until destruction, which adds its counts to the totals.
// Add and AddShared as CounterBlock's; a counter a connection does not have goes to its
// transport's totals.
class ConnectionCounters {
 public:
  ConnectionCounters() = default;
  ConnectionCounters(const ConnectionCounters&) = delete;
  ConnectionCounters& operator=(const ConnectionCounters&) = delete;
  ~ConnectionCounters();

  // Once, when the connection is set up (before its first packet). `peer_qpn`: 0 if unknown
  // (iWARP puts no QPN on the wire).
  void Register(Transport transport, uint32_t qpn, uint32_t peer_qpn, const sockaddr_storage& local,
                const sockaddr_storage& peer);
  bool registered() const { return registered_; }
  // "roce qp 5 [127.0.0.1:49152 -> 127.0.0.1:4791 qp 7]", for log lines: made when one is
  // written (kept, it was a heap string per connection, and making it showed in each setup).
  std::string Identity() const;
  uint32_t qpn() const { return qpn_; }
  uint32_t peer_qpn() const { return peer_qpn_; }
  sockaddr_storage local() const { return Expanded(local_); }
  sockaddr_storage peer() const { return Expanded(peer_); }

  void Add(Counter c, uint64_t n = 1) {
    if (int slot = ConnectionSlot(c); slot >= 0) {
      std::atomic<uint64_t>& v = values_[slot];
      v.store(v.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    } else {
      AdapterCounters(transport_).AddShared(c, n);
    }
  }
  void AddShared(Counter c, uint64_t n = 1) {
    if (int slot = ConnectionSlot(c); slot >= 0) values_[slot].fetch_add(n, std::memory_order_relaxed);
    else AdapterCounters(transport_).AddShared(c, n);
  }
  uint64_t Get(Counter c) const {
    int slot = ConnectionSlot(c);
    return slot >= 0 ? values_[slot].load(std::memory_order_relaxed) : 0;
  }
  void AddTo(CounterValues& sum) const {
    for (size_t i = 0; i < kConnectionSlots; ++i)
      sum[size_t(CounterOfSlot(i))] += values_[i].load(std::memory_order_relaxed);
  }

 private:
  friend struct CounterRegistry;
  std::atomic<uint64_t> values_[kConnectionSlots] = {};
  bool registered_ = false;
  Transport transport_ = Transport::Iwarp;
  uint32_t qpn_ = 0, peer_qpn_ = 0;
  // An IPv4 or IPv6 address and port: 28 bytes, where a sockaddr_storage takes 128.
  union IpAndPort {
    sockaddr_in in;
    sockaddr_in6 in6;
  };
  static sockaddr_storage Expanded(const IpAndPort& address);
  IpAndPort local_{}, peer_{};
  ConnectionCounters* prev_ = nullptr;  // the registry's list (under its mutex)
  ConnectionCounters* next_ = nullptr;
};

// Adds the counts of a transport's live objects that have no row (RoCE ports) to `sum`; called
// without any registry lock held, so it may take its objects' locks.
using LiveCounterSource = void (*)(CounterValues& sum);
void SetLiveCounterSource(Transport transport, LiveCounterSource source);

struct CounterRow {
  Transport transport;
  bool adapter;  // the adapter's totals (no connection fields)
  uint32_t qpn, peer_qpn;
  sockaddr_storage local, peer;
  CounterValues values;
};

// One totals row per transport in `transports`, then one row per live connection.
// With `max_connections`, at most that many connections' rows (the totals always count them all),
// and `*rows` tells how many rows there are in all.
std::vector<CounterRow> CollectCounters(const std::vector<Transport>& transports,
                                        size_t max_connections = SIZE_MAX, size_t* rows = nullptr);

// The report of NDWV_COUNTERS: `format` "text" (every row), "adapters" (totals only) or "json".
// False for an unknown format.
bool WriteCounters(FILE* out, const char* format, const std::vector<Transport>& transports);

// NDWV_COUNTERS=exit|signal: arranges for the report at exit or on SIGUSR2 (once per process).
void StartCounterReports(const std::vector<Transport>& transports);

}  // namespace ndwv::dev
