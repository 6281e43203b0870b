// The InfiniBand reliable-connected transport of one QP over a RoCE port (design-facts §5):
// requester and responder in one object, as on an HCA.
//
// Requester: every request gets its PSNs when it first goes out (a Read one per response packet);
// it stays "in flight" until acknowledged (Send, Write) or its last response is placed (Read),
// and completes in order. A NAK "PSN sequence error", a skipped Read response or the ACK timeout
// rewinds transmission to the first PSN the responder lacks (go-back-N); an RNR NAK waits the
// responder's RNR time. Retry budgets: NDWV_ROCE_RETRY_COUNT (timeouts and sequence NAKs without
// progress), NDWV_ROCE_RNR_RETRY (7 = forever); exhausted, the request ends TimeoutRetry or
// RnrRetry and the QP fails. At most ORD Reads are outstanding (more wait), and at most a window of
// packets (up to 64, fewer where socket buffers are small: WindowFor) is unacknowledged. The
// window halves when the peer reports congestion (a CNP; our own socket, for Read responses) and
// grows back by one packet per round trip.
//
// Congestion: request packets read from a socket the port found congested (Port::CheckOverflow),
// or marked Congestion Experienced by a router, get their sender a CNP (the first once a quarter
// of a window of them has come, then at most one per window), before the socket overflows and
// go-back-N resends windows.
//
// Responder: executes packets in PSN order exactly once: a duplicate is re-acknowledged (a Read is
// answered again), a gap is NAKed once. Send payload is copied into the receive; Write payload into
// the checked target; a Read is answered from the checked source, re-checked as each packet
// leaves. ACKs are coalesced: one for the highest PSN that asked, sent with the next transmission,
// by the next empty poll, or within kAckDelay.
//
// One lock guards both halves. Packets arrive from the port (engine or a CQ poller); posting runs
// on the caller's thread; timers on the engine.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "base/mutex.h"
#include "base/ring_queue.h"
#include "dev/engine.h"
#include "dev/qp.h"
#include "dev/roce/port.h"

namespace ndwv::dev::roce {

struct RcParams {
  sockaddr_storage peer{};  // the peer's UDP port
  // Our address as the peer reaches it (what the ICRC covers): a port bound to the wildcard
  // address sends from it, without looking it up per datagram.
  sockaddr_storage local{};
  uint32_t dest_qpn = 0;
  uint32_t sq_psn = 0;      // first PSN we send
  uint32_t rq_psn = 0;      // first PSN we expect
  uint32_t mtu = 1024;      // payload bytes per packet
  uint32_t ird = 1, ord = 1;
  uint32_t ack_timeout_ms = 200;
  uint8_t retry_count = 7;  // 0..7
  uint8_t rnr_retry = 7;    // 0..7, 7 = forever
  uint8_t rnr_timer = 24;   // the code our RNR NAKs carry
  uint32_t keepalive_ms = 0;  // idle this long: an acknowledged zero-length Write (0: never)
  // The active side probes when due; the passive side two grid steps later (rc.cpp), so that
  // while both are alive the active side's probe is the only one.
  bool probes_first = true;
  bool held_until_established = false;  // the passive side's (Link::HeldUntilEstablished)
};

class RcObserver {
 public:
  // The first packet arrived while the link was held until established: the connection is
  // established even if the RTU was lost (design-facts §6 item 8).
  virtual void OnFirstPacket() = 0;
  // The QP failed (retries exhausted, a fatal NAK, the peer gone) and is moving to Error.
  virtual void OnLinkFailed() = 0;
  // What SettleSent waited for: every request sent until then acknowledged, or its time up.
  virtual void OnSentSettled() = 0;
 protected:
  ~RcObserver() = default;
};

class RcLink final : public Link, public PacketSink, public std::enable_shared_from_this<RcLink> {
 public:
  RcLink(std::shared_ptr<Port> port, std::shared_ptr<QueuePair> qp, const RcParams& params,
         std::weak_ptr<RcObserver> observer);
  ~RcLink() override;

  [[nodiscard]] bool Start();  // attaches to the QP and to the port; false if the QP is in Error
  // The connection is over (closed by the CM, or its owner let go): the QP moves to Error as
  // deferred work, which flushes it and shuts this link down.
  void Fail();
  // Sends a coalesced ACK now (before the CM's DREQ/DREP: the peer must see its last requests
  // acknowledged before the connection closes).
  void FlushAcks();
  // The peer's port is closed (ICMP port unreachable): its process is gone. The oldest request
  // fails as if its retries ran out (TimeoutRetry), the QP fails. `request_psn`: the error
  // quoted our request with this PSN; unless it is one sent and not yet acknowledged the error
  // is stale or forged, and is counted and ignored.
  // The other connections to that port then probe it (Port::ProbeConnectionsTo). Not when
  // retries run out: an overloaded peer's do too, and a probe failing there would end a healthy
  // connection.
  void PeerGone(std::optional<uint32_t> request_psn = std::nullopt);
  // Another connection found the peer's port closed: an idle link probes it now (a keepalive
  // before its time); one with requests in flight is finding out already.
  void ProbeNow();
  // The peer is closing (its DREQ came). Over UDP its ACK of our last request may have been lost
  // while its DREQ arrived: flushed now, a request the peer has would end as if it had not. So
  // the close waits until every request sent so far is acknowledged (the peer's QP answers a
  // retransmission until our DREP), for a little longer than one request may wait for its
  // acknowledgement, (retry count + 2) ACK waits, however the requests wait (an RNR wait may be
  // endless). Then OnSentSettled, or OnLinkFailed if the link failed meanwhile. False, and
  // nothing reported, when nothing is unacknowledged now.
  [[nodiscard]] bool SettleSent();

  // Link
  void Kick() override;
  void PollProgress() override;
  void Reaped(bool peer_message) override;
  void StillPolled() override;
  void OnNotifyArmed() override;
  void Shutdown() override;
  // PacketSink
  void OnPackets(std::span<const wire::ib::Packet> packets, bool congested) override;
  void OnWritable() override;

  static constexpr uint32_t kWindow = 64;  // unacknowledged packets, at most
  static constexpr uint32_t kAckEvery = 16;  // a long message asks for an ACK this often, at most
  // The unacknowledged packets of `mtu` payload a connection allows itself when the receiving
  // socket is granted `receive_buffer` bytes: what it surely holds, within [2, kWindow].
  static uint32_t WindowFor(uint32_t receive_buffer, uint32_t mtu);

 private:
  void SendDueAcks() NDWV_EXCLUDES(mutex_);  // the coalesced ACKs that wait for a poll, now
  static constexpr uint64_t kKeepalive = UINT64_MAX;  // a Flight that is no request's
  struct Flight {
    uint64_t position;  // in the send queue, or kKeepalive
    WrOpcode opcode;
    uint32_t first_psn;
    uint32_t packets;   // PSNs it uses
    uint32_t sent;      // packets sent in this pass (a Read: response packets asked for)
    uint32_t received;  // Read: response packets placed
    uint32_t asked_to;  // Read: the end of the packets asked for so far
  };
  struct Response {  // a Read being answered
    uint32_t psn;
    uint64_t va;
    uint32_t rkey;
    uint32_t length;
    uint32_t packets, sent;
  };

  // Requester
  // Sends what is due, while the socket takes it: PumpQueued builds the datagrams, FlushTx sends
  // them (before the lock is released).
  void Pump(bool send_ack = true) NDWV_REQUIRES(mutex_);
  void PumpQueued(bool send_ack) NDWV_REQUIRES(mutex_);
  void SendRequests() NDWV_REQUIRES(mutex_);
  bool FlushTx() NDWV_REQUIRES(mutex_);
  bool SendRequestPacket(Flight& flight) NDWV_REQUIRES(mutex_);
  bool SendResponsePacket(Response& response) NDWV_REQUIRES(mutex_);
  bool SendAck(uint8_t syndrome, uint32_t psn) NDWV_REQUIRES(mutex_);
  void SendCnp() NDWV_REQUIRES(mutex_);
  // Congestion on the way to the peer (its CNP) or from it (our socket, behind on Read
  // responses): the window halves, unless it changed after the packets the report may be about.
  void Narrow() NDWV_REQUIRES(mutex_);
  void SetWindow(uint32_t packets) NDWV_REQUIRES(mutex_);
  // Counts a request packet [psn, end_psn) that went out: a retransmission if below the PSNs
  // already sent.
  void CountRequestPacket(uint32_t psn, uint32_t end_psn) NDWV_REQUIRES(mutex_);
  // Queues one datagram; false if the socket is full. `request`: a request packet (resent from
  // its PSN if the socket does not take it).
  bool Transmit(const wire::ib::Headers& h, const uint8_t* inline_data, const Sge* sge,
                uint32_t num_sge, uint64_t offset, uint32_t length, bool request) NDWV_REQUIRES(mutex_);
  void OnAck(const wire::ib::Packet& packet) NDWV_REQUIRES(mutex_);
  void OnReadResponse(const wire::ib::Packet& packet) NDWV_REQUIRES(mutex_);
  void Retire() NDWV_REQUIRES(mutex_);                 // completes finished flights at the front, in order
  void Rewind(uint32_t psn) NDWV_REQUIRES(mutex_);     // transmit again from psn
  uint32_t ResumePsn(const Flight& flight) const NDWV_REQUIRES(mutex_);
  void Progress() NDWV_REQUIRES(mutex_);               // something was acknowledged: retry budget and timer restart
  Clock::time_point RetransmitAt() const NDWV_REQUIRES(mutex_);
  void StartTiming(const Flight& flight, Clock::time_point now) NDWV_REQUIRES(mutex_);
  void FailFront(WcStatus status) NDWV_REQUIRES(mutex_);
  // Tells the observer, outside the lock, that the link failed or what SettleSent waited for came.
  void Report();
  // Has what SettleSent waits for come? `now`: the timer's; the receive path looks only at the
  // acknowledgements.
  void CheckSettled(Clock::time_point now = {}) NDWV_REQUIRES(mutex_);
  Clock::time_point SettleBy() const NDWV_REQUIRES(mutex_);
  // Responder
  void OnRequest(const wire::ib::Packet& packet) NDWV_REQUIRES(mutex_);
  bool ExecuteSend(const wire::ib::Packet& packet) NDWV_REQUIRES(mutex_);
  bool ExecuteWrite(const wire::ib::Packet& packet) NDWV_REQUIRES(mutex_);
  bool ExecuteRead(const wire::ib::Packet& packet, bool duplicate) NDWV_REQUIRES(mutex_);
  // fatal: the receive in progress completes `receive_status` and the QP fails.
  void Nak(wire::ib::NakCode code, uint32_t psn, bool fatal,
           WcStatus receive_status = WcStatus::LocalLength) NDWV_REQUIRES(mutex_);
  // Timer
  void EnsureTimer(Clock::time_point deadline) NDWV_REQUIRES(mutex_);
  static void OnTimer(Timer* timer);
  void HandleTimer(Clock::time_point now) NDWV_REQUIRES(mutex_);
  bool RetransmitDue(Clock::time_point now) const NDWV_REQUIRES(mutex_);

  std::shared_ptr<Port> port_;
  std::shared_ptr<QueuePair> qp_;  // held while attached; dropped by Shutdown
  const RcParams params_;
  std::weak_ptr<RcObserver> observer_;
  const uint32_t qpn_;
  // Unacknowledged packets allowed at most (WindowFor, by our ports' receive buffer: the peer's is
  // assumed the same).
  const uint32_t window_limit_;

  base::Mutex mutex_{"roce::RcLink::mutex_"};
  // The window now, in [2, window_limit_], and how often a long message asks for an ACK in it
  // (AckEvery). The first PSN sent after the window last changed, and whether it has been
  // acknowledged: then a round trip has passed, the window may grow by one, and a congestion
  // report is taken to be about packets sent with the new window.
  uint32_t window_ NDWV_GUARDED_BY(mutex_);
  uint32_t ack_every_ NDWV_GUARDED_BY(mutex_);
  uint32_t window_changed_at_ NDWV_GUARDED_BY(mutex_);
  bool window_settled_ NDWV_GUARDED_BY(mutex_) = false;
  // Responder: the PSN expected when we last sent a CNP (or first expected). The next waits until
  // a window of the peer's packets has arrived since (the peer halves its window at most once a
  // round trip), the first a quarter of one.
  uint32_t cnp_sent_at_ NDWV_GUARDED_BY(mutex_);
  bool cnp_sent_ NDWV_GUARDED_BY(mutex_) = false;
  bool shut_ NDWV_GUARDED_BY(mutex_) = false;
  bool stalled_ NDWV_GUARDED_BY(mutex_) = false;         // the socket was full
  bool failed_ NDWV_GUARDED_BY(mutex_) = false;          // the QP failed: nothing more goes out

  // requester
  base::RingQueue<Flight> flights_ NDWV_GUARDED_BY(mutex_);
  size_t resend_from_ NDWV_GUARDED_BY(mutex_) = 0;       // first flight with packets left to send in this pass
  uint64_t next_position_ NDWV_GUARDED_BY(mutex_) = 0;   // next send queue entry to start
  uint32_t next_psn_ NDWV_GUARDED_BY(mutex_);
  uint32_t acked_psn_ NDWV_GUARDED_BY(mutex_);           // every PSN up to here is acknowledged
  uint32_t reads_outstanding_ NDWV_GUARDED_BY(mutex_) = 0;
  uint8_t retries_left_ NDWV_GUARDED_BY(mutex_), rnr_left_ NDWV_GUARDED_BY(mutex_);
  bool rnr_waiting_ NDWV_GUARDED_BY(mutex_) = false;
  // The oldest request has waited for an acknowledgement since then (its transmission, the last
  // progress or the last retry); it is sent again at RetransmitAt().
  Clock::time_point waiting_since_ NDWV_GUARDED_BY(mutex_){}, rnr_until_ NDWV_GUARDED_BY(mutex_){};
  // One request at a time is timed for the ACK wait (ack_wait.h): the last PSN of it, when it
  // first went out and when an ACK timeout last sent it again ({}: not yet).
  bool timing_ NDWV_GUARDED_BY(mutex_) = false;
  uint32_t timed_psn_ NDWV_GUARDED_BY(mutex_) = 0;
  Clock::time_point timed_since_ NDWV_GUARDED_BY(mutex_){}, timed_resent_ NDWV_GUARDED_BY(mutex_){};
  uint32_t rewound_for_ NDWV_GUARDED_BY(mutex_) = UINT32_MAX;  // the PSN a skipped Read response already rewound to
  uint32_t sent_end_psn_ NDWV_GUARDED_BY(mutex_);        // one past the highest request PSN ever sent (retransmit count)

  // responder
  uint32_t epsn_ NDWV_GUARDED_BY(mutex_);                // next PSN expected
  uint32_t msn_ NDWV_GUARDED_BY(mutex_) = 0;
  bool nak_sent_ NDWV_GUARDED_BY(mutex_) = false;        // a sequence NAK is out for epsn_
  std::atomic<bool> ack_due_{false};  // written under mutex_; PollProgress peeks without it
  Clock::time_point ack_by_ NDWV_GUARDED_BY(mutex_){};
  bool have_recv_ NDWV_GUARDED_BY(mutex_) = false;
  RecvWqe recv_ NDWV_GUARDED_BY(mutex_);
  uint32_t recv_offset_ NDWV_GUARDED_BY(mutex_) = 0;
  bool in_write_ NDWV_GUARDED_BY(mutex_) = false;
  uint64_t write_va_ NDWV_GUARDED_BY(mutex_) = 0;
  uint32_t write_rkey_ NDWV_GUARDED_BY(mutex_) = 0, write_length_ NDWV_GUARDED_BY(mutex_) = 0, write_offset_ NDWV_GUARDED_BY(mutex_) = 0;
  base::RingQueue<Response> responses_ NDWV_GUARDED_BY(mutex_);
  bool first_packet_seen_ NDWV_GUARDED_BY(mutex_) = false;
  Clock::time_point last_rx_ NDWV_GUARDED_BY(mutex_);    // keepalive: when a packet last arrived
  bool probe_now_ NDWV_GUARDED_BY(mutex_) = false;       // ProbeNow: the keepalive is due at once
  bool counted_live_ NDWV_GUARDED_BY(mutex_) = false;    // in the process's count of links that keep alive
  std::atomic<bool> failure_to_report_{false};
  // SettleSent: the requests below settle_psn_ are waited for, until SettleBy().
  bool settling_ NDWV_GUARDED_BY(mutex_) = false;
  uint32_t settle_psn_ NDWV_GUARDED_BY(mutex_) = 0;
  Clock::time_point settle_since_ NDWV_GUARDED_BY(mutex_){};
  std::atomic<bool> settled_to_report_{false};

  using LinkTimer = OwnedTimer<RcLink>;
  LinkTimer timer_ NDWV_GUARDED_BY(mutex_){&RcLink::OnTimer, this};
  Clock::time_point timer_deadline_ NDWV_GUARDED_BY(mutex_){};
};

}  // namespace ndwv::dev::roce
