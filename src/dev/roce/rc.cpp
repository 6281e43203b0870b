#include "dev/roce/rc.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <shared_mutex>
#include <utility>

#include "base/log.h"
#include "dev/address.h"
#include "dev/roce/ack_wait.h"

namespace ndwv::dev::roce {

using namespace ndwv::wire::ib;

namespace {

constexpr std::chrono::milliseconds kAckDelay{20};  // longest a coalesced ACK waits
// Set while a CQ poller drives receive: the ACKs it makes due wait for its next poll (or the next
// transmission), so the poller returns with its completion without paying for them first.
thread_local bool t_polling = false;
// Set when that poller's receive placed a message the peer started, or a packet of one (a Send,
// an RDMA Write with data, a Read Request for data): the evidence of PollerRule
// (dev/poller_handoff.h). A packet is enough: the ACK of our Send may come ahead of the rest of
// the answer (PumpQueued), and the wait that reaps that Send is not one for our own request.
thread_local bool t_placed_peer_message = false;
void PlacedPeerMessage() {
  if (t_polling) t_placed_peer_message = true;
}

// Bookkeeping times (ACK timeout, keepalive, coalesced ACK deadline) need no more than the
// scheduler tick's resolution, which the coarse clock reads cheaper; same epoch as Clock.
Clock::time_point CoarseNow() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return Clock::time_point(std::chrono::seconds(t.tv_sec) + std::chrono::nanoseconds(t.tv_nsec));
}

// Datagrams a link builds under its lock go out together before the lock is released: an ACK
// and the reply it precedes cost one system call, and a run of full-size packets of a Write or
// Read Response goes out as one UDP GSO send (see Port::SendBatch). Headers (and a payload that
// is copied) are built here; a larger request payload is handed to the socket where it lies.
// Per thread, so that a QP costs no buffer of its own.
struct TxBatch {
  static constexpr int kMax = Port::kMaxBatch;
  static constexpr size_t kMaxBuilt = kBthLen + kRethLen + 4096 + 4 + kIcrcLen;
  int count = 0;
  size_t used = 0;
  Port::OutDatagram datagram[kMax];
  bool request[kMax];  // a request packet (Send, Write, Read Request): resent if not taken
  uint32_t psn[kMax];
  alignas(64) uint8_t data[kMax * kMaxBuilt];
};
static_assert(Port::kMaxPieces >= int(kMaxSge) + 2);
// Below this, a payload is copied next to its headers: one piece costs the kernel less than
// three, and the copy is cheap.
constexpr uint32_t kGatherFrom = 512;
thread_local std::unique_ptr<TxBatch> t_tx_batch;
TxBatch& Tx() {
  if (!t_tx_batch) t_tx_batch = std::make_unique<TxBatch>();  // one per thread that transmits
  return *t_tx_batch;
}

// Copies `length` bytes into an SGE list at `offset`, each piece checked for local write access
// under the placement lock (so the region cannot be deregistered mid-copy). False if refused.
bool ScatterChecked(ProtectionDomain& pd, const Sge* sge, uint32_t num_sge, uint64_t offset,
                    const uint8_t* data, uint64_t length) {
  base::ReaderLock placement(pd.placement_lock());
  uint64_t skip = offset;
  for (uint32_t i = 0; i < num_sge && length; ++i) {
    if (skip >= sge[i].length) {
      skip -= sge[i].length;
      continue;
    }
    uint64_t n = std::min<uint64_t>(sge[i].length - skip, length);
    if (pd.CheckLocalLocked(sge[i].lkey, sge[i].addr + skip, n, true) != KeyCheck::Ok) return false;
    memcpy(reinterpret_cast<uint8_t*>(sge[i].addr + skip), data, n);
    data += n;
    length -= n;
    skip = 0;
  }
  return length == 0;
}

// The process's measure of how long acknowledgements take (ack_wait.h).
AckWait g_ack_wait;

// Liveness must cost a bounded share of a core however many connections a process holds. A
// connection probes its peer after NDWV_ROCE_KEEPALIVE_MS of silence, or after kKeepaliveSpacing
// per connection that keeps alive, whichever is longer: the process then sends at most one probe
// per spacing (an exchange costs each process ~20 us of timer, send, receive and ACK: ~1 % of a
// core), and 10,000 connections probe every 20 s. A peer's own probes answer ours (any packet
// heard counts), so one exchange per interval serves both ends: the passive side's probe falls due
// two grid steps after the active side's. Probes fall due on a grid (an eighth of the interval,
// 250 ms at most), so that the engine wakes for many at once rather than once per connection.
constexpr std::chrono::microseconds kKeepaliveSpacing{2000};
constexpr std::chrono::microseconds kKeepaliveGrid{250000};
std::atomic<uint32_t> g_keepalive_links{0};

// When a connection that last heard from its peer at `heard` must probe it.
Clock::time_point KeepaliveDue(Clock::time_point heard, const RcParams& params) {
  auto interval = std::max<std::chrono::microseconds>(std::chrono::milliseconds(params.keepalive_ms),
                                                      kKeepaliveSpacing * g_keepalive_links.load(std::memory_order_relaxed));
  auto grid = std::min(interval / 8, kKeepaliveGrid).count();
  auto due = std::chrono::duration_cast<std::chrono::microseconds>((heard + interval).time_since_epoch()).count();
  due = (due + grid - 1) / grid * grid;
  return Clock::time_point(std::chrono::microseconds(params.probes_first ? due : due + 2 * grid));
}

uint32_t PacketsFor(uint64_t length, uint32_t mtu) {
  return length == 0 ? 1 : uint32_t((length + mtu - 1) / mtu);
}

// The transport divides by the MTU and builds packets of up to 4096 bytes of payload (TxBatch):
// only an IB MTU (256 .. 4096, a power of two) is installed. The CM refuses a REQ that asks for
// another; this is the last line against a bug that would let one through.
RcParams Checked(RcParams params) {
  uint32_t mtu = std::bit_floor(std::clamp<uint32_t>(params.mtu, 256, 4096));
  if (mtu != params.mtu) NDWV_LOG(Error, "roce rc: MTU %u is no IB MTU; %u is used", params.mtu, mtu);
  params.mtu = mtu;
  return params;
}

// The most a datagram of `mtu` payload sent alone costs the receiving socket's buffer: the
// kernel accounts the buffer it was allocated in, a power of two on loopback (a 4 KiB packet
// takes 8,448 bytes), plus its bookkeeping. A run sent together (GSO) costs about half as much.
uint32_t ReceiveCost(uint32_t mtu) { return std::bit_ceil(mtu + 512) + 512; }

// How often a long message asks for an ACK with `window` packets allowed unacknowledged: at least
// twice a window, so that it never closes on packets none of which asks, and a power of two (a
// mask per packet sent, not a division).
uint32_t AckEvery(uint32_t window) { return std::bit_floor(std::min(RcLink::kAckEvery, window / 2)); }

WcStatus StatusForNak(uint8_t code) {
  switch (NakCode(code)) {
    case NakCode::RemoteAccessError: return WcStatus::RemoteAccess;
    case NakCode::RemoteOperationalError: return WcStatus::RemoteOp;
    default: return WcStatus::RemoteInvalidRequest;
  }
}

}  // namespace

uint32_t RcLink::WindowFor(uint32_t receive_buffer, uint32_t mtu) {
  // Packets sent one by one could fill the buffer; a stream's go in runs, and fill half of it,
  // which leaves room for the other connections' packets and the CM's. Half the buffer at the
  // dearer cost (24 packets at 416 KiB) cost a quarter of a stream's rate (bench/README.md).
  return std::clamp<uint32_t>(receive_buffer / ReceiveCost(mtu), 2, kWindow);
}

RcLink::RcLink(std::shared_ptr<Port> port, std::shared_ptr<QueuePair> qp, const RcParams& params,
               std::weak_ptr<RcObserver> observer)
    : Link(params.held_until_established),
      port_(std::move(port)),
      qp_(std::move(qp)),
      params_(Checked(params)),
      observer_(std::move(observer)),
      qpn_(qp_->qpn()),
      window_limit_(WindowFor(Port::ReceiveBuffer(), params_.mtu)),
      window_(window_limit_),
      ack_every_(AckEvery(window_)),
      window_changed_at_(params.sq_psn & kPsnMask),
      cnp_sent_at_(params.rq_psn & kPsnMask),
      next_psn_(params.sq_psn & kPsnMask),
      acked_psn_(PsnAdd(params.sq_psn, kPsnMask)),  // sq_psn - 1
      retries_left_(params.retry_count),
      rnr_left_(params.rnr_retry),
      sent_end_psn_(next_psn_),
      epsn_(params.rq_psn & kPsnMask) {
}

RcLink::~RcLink() {
  Shutdown();
  Port::Park(std::move(port_));  // a flow may serve the next connection to that peer
}

bool RcLink::Start() {
  counters_.Register(Transport::Roce, qpn_, params_.dest_qpn, port_->local(), params_.peer);
  if (!qp_->Attach(shared_from_this())) return false;
  port_->AddSink(qpn_, weak_from_this(), params_.peer);
  if (params_.keepalive_ms) {
    base::MutexLock lock(mutex_);
    counted_live_ = true;
    g_keepalive_links.fetch_add(1, std::memory_order_relaxed);
    last_rx_ = CoarseNow();
    EnsureTimer(KeepaliveDue(last_rx_, params_));
  }
  NDWV_LOG(Debug, "%s: RC link up, mtu %u, sq psn %u, rq psn %u, ird %u, ord %u", counters_.Identity().c_str(),
           params_.mtu, params_.sq_psn, params_.rq_psn, params_.ird, params_.ord);
  return true;
}

void RcLink::Fail() {
  base::MutexLock lock(mutex_);
  if (!shut_) qp_->DeferError();
}

void RcLink::Shutdown() {
  {
    base::MutexLock lock(mutex_);
    if (shut_) return;
    shut_ = true;
    if (counted_live_) g_keepalive_links.fetch_sub(1, std::memory_order_relaxed);
    if (have_recv_) {  // a message was arriving into it: flushed with the rest
      qp_->CompleteReceive(recv_, 0, WcStatus::Flushed, false);
      have_recv_ = false;
      counters_.AddShared(Counter::FlushedRequests);
    }
    qp_.reset();
    timer_.Disarm();
  }
  port_->RemoveSink(qpn_);
}

// ------------------------------------------------------------------------------- transmit

void RcLink::Kick() {
  base::MutexLock lock(mutex_);
  Pump();
}

void RcLink::SendDueAcks() {
  // The lock only when one is due: an empty poll is the hot path.
  if (!ack_due_.load(std::memory_order_relaxed)) return;
  base::MutexLock lock(mutex_);
  if (ack_due_) Pump();
}

void RcLink::PollProgress() {
  SendDueAcks();  // made due by the previous poll, after their messages were consumed
  t_polling = true;
  port_->DriveReceive(true);
  t_polling = false;
  port_->PolledEmpty(std::exchange(t_placed_peer_message, false), Lendable());
}

void RcLink::Reaped(bool peer_message) {
  // The application may wait on memory now, without a poll to send the ACKs its polls made due:
  // they go now, as for a Notify (the peer's request would otherwise wait for our next one).
  if (port_->Reaped(peer_message)) SendDueAcks();
}

void RcLink::StillPolled() { port_->Posted(); }

void RcLink::OnNotifyArmed() {
  {
    base::MutexLock lock(mutex_);
    Pump();  // nobody will poll: nothing may wait for a poll
  }
  port_->NotifyArmed();
}

void RcLink::PeerGone(std::optional<uint32_t> request_psn) {
  {
    base::MutexLock lock(mutex_);
    if (shut_) return;
    if (request_psn && !(PsnDiff(*request_psn, acked_psn_) > 0 && PsnDiff(*request_psn, sent_end_psn_) < 0)) {
      counters_.Add(Counter::IcmpErrorsIgnored);
      return;
    }
    NDWV_LOG(Info, "%s: the peer's port is closed", counters_.Identity().c_str());
    if (!flights_.empty()) {
      FailFront(WcStatus::TimeoutRetry);
    } else {
      qp_->DeferError();
      failure_to_report_ = true;
      failed_ = true;
    }
  }
  Report();
  Port::ProbeConnectionsTo(params_.peer);  // its process is gone: the other connections to it too
}

void RcLink::ProbeNow() {
  base::MutexLock lock(mutex_);
  if (!params_.keepalive_ms || shut_ || failed_ || !flights_.empty() || probe_now_) return;
  probe_now_ = true;
  EnsureTimer(Clock::now());
}

void RcLink::Report() {
  if (failure_to_report_.exchange(false))
    if (auto observer = observer_.lock()) observer->OnLinkFailed();
  // Read before the exchange: the receive path passes here for every batch of packets.
  if (settled_to_report_.load(std::memory_order_relaxed) && settled_to_report_.exchange(false))
    if (auto observer = observer_.lock()) observer->OnSentSettled();
}

bool RcLink::SettleSent() {
  base::MutexLock lock(mutex_);
  if (shut_ || failed_ || flights_.empty()) return false;
  settling_ = true;
  settle_psn_ = next_psn_;
  settle_since_ = Clock::now();
  EnsureTimer(SettleBy());
  return true;
}

Clock::time_point RcLink::SettleBy() const {
  mutex_.AssertHeld();
  // One ACK wait more than the retries take, so that a request being retried ends with its own
  // status; counted in waits as long as they are now, as its retransmissions are (a busy engine
  // stretches them while the settle runs).
  return settle_since_ + (params_.retry_count + 2) * g_ack_wait.For(std::chrono::milliseconds(params_.ack_timeout_ms));
}

void RcLink::CheckSettled(Clock::time_point now) {
  mutex_.AssertHeld();
  if (!settling_) return;
  if (!failed_ && !flights_.empty() && PsnDiff(flights_.front().first_psn, settle_psn_) < 0 && now < SettleBy())
    return;
  settling_ = false;
  if (!failed_) settled_to_report_ = true;  // a failure is reported as one
}

void RcLink::FlushAcks() {
  base::MutexLock lock(mutex_);
  if (ack_due_) Pump();
}

void RcLink::OnWritable() {
  base::MutexLock lock(mutex_);
  stalled_ = false;
  Pump();
}

bool RcLink::Transmit(const Headers& h, const uint8_t* inline_data, const Sge* sge,
                      uint32_t num_sge, uint64_t offset, uint32_t length, bool request) {
  mutex_.AssertHeld();
  TxBatch& t_tx = Tx();
  if (t_tx.count == TxBatch::kMax && !FlushTx()) return false;
  int slot = t_tx.count;
  uint8_t* built = t_tx.data + t_tx.used;
  size_t header = EncodeHeaders(h, {built, TxBatch::kMaxBuilt});
  Port::OutDatagram& d = t_tx.datagram[slot];
  // A request's payload leaves from its registered memory. A Read Response's is copied: its
  // source is checked under the placement lock, which is not held when the batch is sent.
  bool gather = request && !inline_data && length >= kGatherFrom;
  uint8_t* out = built + header;
  d.count = 0;
  if (gather) d.pieces[d.count++] = {built, header};
  for (uint32_t left = length; left;) {
    auto [base, n] = inline_data ? std::pair<uint8_t*, uint64_t>{const_cast<uint8_t*>(inline_data) + offset, left}
                                 : PieceAt(sge, num_sge, offset);
    n = std::min<uint64_t>(n, left);
    if (gather) {
      d.pieces[d.count++] = {base, n};
    } else {
      memcpy(out, base, n);
      out += n;
    }
    offset += n;
    left -= uint32_t(n);
  }
  size_t pad = (4 - length % 4) % 4;  // the BTH carries the pad count already
  memset(out, 0, pad);
  size_t tail = pad + kIcrcLen;  // the ICRC is stored by the port
  if (gather) d.pieces[d.count++] = {out, tail};
  else d.pieces[d.count++] = {built, size_t(out - built) + tail};
  d.size = header + length + tail;
  NDWV_LOG(Trace, "%s: send %s psn %u len %u%s", counters_.Identity().c_str(), ToString(h.bth.opcode), h.bth.psn,
           length, h.bth.ack_req ? " ackreq" : "");
  counters_.Add(Counter::TxPackets);
  counters_.Add(Counter::TxBytes, length);
  t_tx.used += size_t(out - built) + tail;
  t_tx.request[slot] = request;
  t_tx.psn[slot] = h.bth.psn;
  t_tx.count++;
  return true;
}

bool RcLink::FlushTx() {
  mutex_.AssertHeld();
  TxBatch& t_tx = Tx();
  if (t_tx.count >= 2 && t_tx.request[1] &&
      *static_cast<const uint8_t*>(t_tx.datagram[0].pieces[0].iov_base) == uint8_t(Opcode::Acknowledge)) {
    // An ACK before our requests: it was due first (PumpQueued). It ends their first GSO buffer
    // where it fits (one trip through the stack for both; the peer takes a buffer's answers
    // before its requests, Port::Handle), else it goes alone, first.
    if (int end = port_->SlotEndingFirstRun(t_tx.datagram + 1, t_tx.count - 1, t_tx.datagram[0].size)) {
      std::rotate(t_tx.datagram, t_tx.datagram + 1, t_tx.datagram + 1 + end);
      std::rotate(t_tx.request, t_tx.request + 1, t_tx.request + 1 + end);
      std::rotate(t_tx.psn, t_tx.psn + 1, t_tx.psn + 1 + end);
    }
  }
  int count = std::exchange(t_tx.count, 0);
  t_tx.used = 0;
  if (!count) return true;
  int sent = port_->SendBatch(params_.peer, params_.local, t_tx.datagram, count);
  if (sent == count) return true;
  // The socket is full. Requests it did not take go out again (from the first of them); ACKs and
  // Read Responses are as good as lost on a wire (the next ACK, or the requester, repairs them).
  for (int i = sent; i < count; ++i)
    if (t_tx.request[i]) {
      Rewind(t_tx.psn[i]);
      break;
    }
  stalled_ = true;
  port_->WaitWritable(weak_from_this());
  return false;
}

void RcLink::SendCnp() {
  mutex_.AssertHeld();
  // A sender with a packet or two in flight (an echo, a ping-pong) gains nothing from a narrower
  // window, and at 10,000 connections a CNP to each would double the datagrams: the first CNP
  // waits for a quarter of a window of the peer's packets, each next one for a window.
  if (uint32_t(PsnDiff(epsn_, cnp_sent_at_)) < (cnp_sent_ ? window_limit_ : window_limit_ / 4)) return;
  Headers h;
  h.bth.opcode = Opcode::Cnp;
  h.bth.resv8a = kBecn;
  h.bth.dest_qp = params_.dest_qpn;
  if (!Transmit(h, nullptr, nullptr, 0, 0, 0, false)) return;
  counters_.Add(Counter::CnpsSent);
  cnp_sent_ = true;
  cnp_sent_at_ = epsn_;
}

void RcLink::Narrow() {
  mutex_.AssertHeld();
  if (window_settled_) SetWindow(std::max(window_ / 2, 2u));
}

void RcLink::SetWindow(uint32_t packets) {
  mutex_.AssertHeld();
  window_ = packets;
  ack_every_ = AckEvery(window_);
  window_changed_at_ = sent_end_psn_;
  window_settled_ = false;
}

bool RcLink::SendAck(uint8_t syndrome, uint32_t psn) {
  mutex_.AssertHeld();
  Headers h;
  h.bth.opcode = Opcode::Acknowledge;
  h.bth.dest_qp = params_.dest_qpn;
  h.bth.psn = psn & kPsnMask;
  h.aeth.syndrome = syndrome;
  h.aeth.msn = msn_ & kPsnMask;
  return Transmit(h, nullptr, nullptr, 0, 0, 0, false);
}

void RcLink::Pump(bool send_ack) {
  mutex_.AssertHeld();
  PumpQueued(send_ack);
  FlushTx();
}

void RcLink::PumpQueued(bool send_ack) {
  mutex_.AssertHeld();
  if (shut_ || stalled_ || failed_) return;
  // Read Responses first: an ACK covers every PSN before it, Reads included. Then the ACK, then
  // our requests: the application may have seen the message the ACK acknowledges and posted them
  // since, and a peer that failed on one of them before taking the ACK would flush that message's
  // Send, which we took (FlushTx keeps the ACK within their first GSO buffer).
  while (!responses_.empty()) {
    Response& response = responses_.front();
    if (!SendResponsePacket(response)) return;
    if (response.sent == response.packets) responses_.pop_front();
    if (shut_) return;
  }
  if (ack_due_ && send_ack) {
    if (!SendAck(MakeSyndrome(AethKind::Ack, kCreditInvalid), PsnAdd(epsn_, kPsnMask))) return;  // socket full
    ack_due_ = false;
  }
  SendRequests();
}

void RcLink::SendRequests() {
  mutex_.AssertHeld();
  while (!rnr_waiting_) {
    while (resend_from_ < flights_.size() && flights_[resend_from_].sent == flights_[resend_from_].packets)
      resend_from_++;
    if (resend_from_ < flights_.size()) {
      Flight& f = flights_[resend_from_];
      // A Read asks for its data a window at a time, the next once the last has arrived; other
      // requests keep within the window of unacknowledged packets.
      if (f.opcode == WrOpcode::Read ? f.sent != f.received
                                     : uint32_t(PsnDiff(PsnAdd(f.first_psn, f.sent), acked_psn_)) > window_)
        break;
      if (!SendRequestPacket(f)) return;
      continue;
    }
    if (next_position_ == qp_->send_tail()) break;
    if (HeldUntilEstablished()) break;  // posted before establishment: Established kicks us
    uint32_t oldest = flights_.empty() ? next_psn_ : flights_.front().first_psn;
    if (uint32_t(PsnDiff(next_psn_, oldest)) >= window_) break;
    SendWqe& wqe = qp_->send_at(next_position_);
    if (wqe.done) {  // refused at post time (bad local key): completes in its turn, QP fails
      qp_->FinishSend(next_position_++, wqe.status);
      break;
    }
    if ((wqe.flags & kFence) && reads_outstanding_) break;  // waits for earlier Reads
    if (wqe.opcode == WrOpcode::Bind || wqe.opcode == WrOpcode::Invalidate) {
      // Nothing goes on the wire; it completes in order after the requests before it.
      qp_->FinishSend(next_position_++, WcStatus::Success);
      continue;
    }
    if (wqe.opcode == WrOpcode::Read) {
      if (reads_outstanding_ >= params_.ord) break;  // beyond ORD a Read waits; it does not fail
      reads_outstanding_++;
    }
    counters_.Add(wqe.opcode == WrOpcode::Send ? Counter::TxSends
                  : wqe.opcode == WrOpcode::Write ? Counter::TxWrites : Counter::TxReads);
    Flight flight{next_position_++, wqe.opcode, next_psn_, PacketsFor(wqe.length, params_.mtu), 0, 0, 0};
    next_psn_ = PsnAdd(next_psn_, flight.packets);
    if (flights_.empty()) waiting_since_ = CoarseNow();
    if (!timing_ && flight.opcode != WrOpcode::Read)
      StartTiming(flight, flights_.empty() ? waiting_since_ : CoarseNow());
    flights_.push_back(flight);
  }
  if (!flights_.empty()) EnsureTimer(rnr_waiting_ ? rnr_until_ : RetransmitAt());
}

bool RcLink::SendRequestPacket(Flight& flight) {
  mutex_.AssertHeld();
  Headers h;
  h.bth.dest_qp = params_.dest_qpn;
  if (flight.position == kKeepalive) {  // a zero-length Write names no memory (IB C9-88)
    h.bth.opcode = Opcode::WriteOnly;
    h.bth.ack_req = true;
    h.bth.psn = flight.first_psn;
    if (!Transmit(h, nullptr, nullptr, 0, 0, 0, true)) return false;
    CountRequestPacket(h.bth.psn, PsnAdd(h.bth.psn, 1));
    flight.sent = 1;
    return true;
  }
  SendWqe& wqe = qp_->send_at(flight.position);
  if (flight.opcode == WrOpcode::Read) {
    // One Read Request per window of response packets (a responder answers a request at once,
    // in full: a window is what the receiving socket is sure to hold). Sent again, it asks only
    // for what has not arrived.
    // Asked again (lost responses): the rest of what was asked, whose PSNs the responder has
    // already counted; otherwise the next window.
    uint32_t end = flight.asked_to > flight.received ? flight.asked_to
                                                     : std::min(flight.received + window_, flight.packets);
    uint32_t packets = end - flight.received;
    uint64_t done = uint64_t(flight.received) * params_.mtu;
    uint64_t length = std::min<uint64_t>(wqe.length - done, uint64_t(packets) * params_.mtu);
    h.bth.opcode = Opcode::ReadRequest;
    h.bth.psn = PsnAdd(flight.first_psn, flight.received);
    h.bth.ack_req = true;
    h.reth = {wqe.remote_addr + done, wqe.rkey, uint32_t(length)};
    if (!Transmit(h, nullptr, nullptr, 0, 0, 0, true)) return false;
    CountRequestPacket(h.bth.psn, PsnAdd(flight.first_psn, end));
    flight.asked_to = end;
    flight.sent = end;
    return true;
  }
  uint32_t k = flight.sent;
  uint64_t offset = uint64_t(k) * params_.mtu;
  uint32_t length = uint32_t(std::min<uint64_t>(params_.mtu, wqe.length - offset));
  bool first = k == 0, last = k + 1 == flight.packets;
  bool send = flight.opcode == WrOpcode::Send;
  if (send && last && (wqe.flags & kInvalidate)) {  // the IETH rides on the message's last packet
    h.bth.opcode = first ? Opcode::SendOnlyInv : Opcode::SendLastInv;
    h.ieth = wqe.rkey;
  } else if (send)
    h.bth.opcode = first && last ? Opcode::SendOnly : first ? Opcode::SendFirst
                   : last ? Opcode::SendLast : Opcode::SendMiddle;
  else
    h.bth.opcode = first && last ? Opcode::WriteOnly : first ? Opcode::WriteFirst
                   : last ? Opcode::WriteLast : Opcode::WriteMiddle;
  if (!send && first) h.reth = {wqe.remote_addr, wqe.rkey, uint32_t(wqe.length)};
  h.bth.solicited = send && last && (wqe.flags & kSolicited);
  h.bth.ack_req = last || (k & (ack_every_ - 1)) == ack_every_ - 1;
  h.bth.pad_count = uint8_t((4 - length % 4) % 4);
  h.bth.psn = PsnAdd(flight.first_psn, k);
  bool is_inline = wqe.flags & kInline;
  if (!Transmit(h, is_inline ? wqe.inline_data : nullptr, wqe.sge, wqe.num_sge, offset, length, true))
    return false;
  CountRequestPacket(h.bth.psn, PsnAdd(h.bth.psn, 1));
  flight.sent++;
  return true;
}

bool RcLink::SendResponsePacket(Response& r) {
  mutex_.AssertHeld();
  uint32_t k = r.sent;
  uint64_t offset = uint64_t(k) * params_.mtu;
  uint32_t length = uint32_t(std::min<uint64_t>(params_.mtu, r.length - offset));
  bool first = k == 0, last = k + 1 == r.packets;
  Headers h;
  h.bth.opcode = first && last ? Opcode::ReadResponseOnly : first ? Opcode::ReadResponseFirst
                 : last ? Opcode::ReadResponseLast : Opcode::ReadResponseMiddle;
  h.bth.dest_qp = params_.dest_qpn;
  h.bth.psn = PsnAdd(r.psn, k);
  h.bth.pad_count = uint8_t((4 - length % 4) % 4);
  h.aeth.syndrome = MakeSyndrome(AethKind::Ack, kCreditInvalid);
  h.aeth.msn = msn_ & kPsnMask;
  Sge source{r.va + offset, length, 0};
  // The source is checked again as its bytes leave, with deregistration held off: memory
  // deregistered since the request was checked is never sent.
  base::ReaderLock placement(qp_->pd().placement_lock());
  if (length && qp_->pd().CheckRemoteLocked(r.rkey, qpn_, source.addr, length, kRemoteRead) != KeyCheck::Ok) {
    placement.unlock();
    responses_.clear();
    Nak(NakCode::RemoteAccessError, h.bth.psn, true);
    return false;
  }
  if (!Transmit(h, nullptr, &source, 1, 0, length, false)) return false;
  r.sent++;
  return true;
}

void RcLink::CountRequestPacket(uint32_t psn, uint32_t end_psn) {
  mutex_.AssertHeld();
  if (PsnDiff(psn, sent_end_psn_) < 0) counters_.Add(Counter::Retransmits);  // below the high-water mark
  if (PsnDiff(end_psn, sent_end_psn_) > 0) sent_end_psn_ = end_psn;
}

// ------------------------------------------------------------------------------- receive

void RcLink::OnPackets(std::span<const Packet> packets, bool congested) {
  bool first_packet = false;
  {
    base::MutexLock lock(mutex_);
    if (shut_ || failed_) return;  // (Shutdown dropped qp_)
    QpState state = qp_->state();
    if (state != QpState::Rtr && state != QpState::Rts && state != QpState::Sqd) return;
    for (const Packet& packet : packets) {
      // Failed (a fatal NAK sent, or the requester gave up): the QP is on its way to Error, where
      // inbound packets are dropped; nothing more is executed or answered.
      if (shut_ || failed_) break;
      Opcode op = packet.headers.bth.opcode;
      NDWV_LOG(Trace, "%s: recv %s psn %u len %zu (epsn %u)", counters_.Identity().c_str(), ToString(op),
               packet.headers.bth.psn, packet.payload.size(), epsn_);
      counters_.Add(Counter::RxPackets);
      if (op == Opcode::Cnp) {  // about our packets, not a message of the peer's
        counters_.Add(Counter::CnpsReceived);
        Narrow();
        continue;
      }
      if (op == Opcode::Acknowledge) OnAck(packet);
      else if (IsReadResponse(op)) OnReadResponse(packet);
      else OnRequest(packet);
      if (!shut_ && HeldUntilEstablished() && !first_packet_seen_) first_packet = first_packet_seen_ = true;
      if (congested && IsReadResponse(op)) Narrow();  // we asked for them: we slow down ourselves
      else if (congested && op != Opcode::Acknowledge && !failed_) {
        SendCnp();
        congested = false;  // one per run
      }
    }
    Pump(!t_polling);  // also sends what the receive path queued (NAKs)
    // An ACK left due (a poller's, or a full socket's) goes by ack_by_ at the latest. One sent
    // just now needs no timer: arming one per message cost a heap update and a firing each.
    if (ack_due_) EnsureTimer(ack_by_);
    if (params_.keepalive_ms) last_rx_ = CoarseNow();
    CheckSettled();
  }
  if (first_packet)
    if (auto observer = observer_.lock()) observer->OnFirstPacket();
  Report();
}

// ---- requester side

void RcLink::Progress() {
  mutex_.AssertHeld();
  if (!window_settled_) window_settled_ = PsnDiff(acked_psn_, window_changed_at_) >= 0;
  if (window_settled_ && window_ < window_limit_) SetWindow(window_ + 1);
  retries_left_ = params_.retry_count;
  rnr_left_ = params_.rnr_retry;
  waiting_since_ = CoarseNow();
  if (timing_ && PsnDiff(acked_psn_, timed_psn_) >= 0) {
    timing_ = false;
    g_ack_wait.Acknowledged(timed_since_, timed_resent_, waiting_since_, std::chrono::milliseconds(params_.ack_timeout_ms));
  }
}

bool RcLink::RetransmitDue(Clock::time_point now) const {
  mutex_.AssertHeld();
  return !rnr_waiting_ && !flights_.empty() && !failed_ && now >= RetransmitAt();
}

Clock::time_point RcLink::RetransmitAt() const {
  mutex_.AssertHeld();
  return waiting_since_ + g_ack_wait.For(std::chrono::milliseconds(params_.ack_timeout_ms));
}

void RcLink::StartTiming(const Flight& flight, Clock::time_point now) {
  mutex_.AssertHeld();
  timing_ = true;
  timed_psn_ = PsnAdd(flight.first_psn, flight.packets - 1);
  timed_since_ = now;
  timed_resent_ = {};
}

uint32_t RcLink::ResumePsn(const Flight& flight) const {
  mutex_.AssertHeld();
  if (flight.opcode == WrOpcode::Read) return PsnAdd(flight.first_psn, flight.received);
  // Packets up to acked_psn_ arrived.
  int32_t acked = PsnDiff(acked_psn_, flight.first_psn) + 1;
  return PsnAdd(flight.first_psn, uint32_t(std::clamp<int32_t>(acked, 0, int32_t(flight.packets))));
}

void RcLink::Retire() {
  mutex_.AssertHeld();
  while (!flights_.empty()) {
    Flight& f = flights_.front();
    uint32_t last = PsnAdd(f.first_psn, f.packets - 1);
    if (f.opcode == WrOpcode::Read) {
      if (f.received < f.packets) {
        // Acknowledged past what it asked for while responses are missing: they were lost; ask
        // again once.
        if (f.sent > f.received && PsnDiff(acked_psn_, PsnAdd(f.first_psn, f.sent - 1)) >= 0 &&
            rewound_for_ != ResumePsn(f)) {
          rewound_for_ = ResumePsn(f);
          Rewind(rewound_for_);
        }
        return;
      }
      reads_outstanding_--;
    } else if (PsnDiff(last, acked_psn_) > 0) {
      return;
    }
    uint64_t position = f.position;
    flights_.pop_front();
    if (resend_from_) resend_from_--;
    if (position != kKeepalive) qp_->FinishSend(position, WcStatus::Success);
  }
}

void RcLink::Rewind(uint32_t psn) {
  mutex_.AssertHeld();
  for (size_t i = 0; i < flights_.size(); ++i) {
    Flight& f = flights_[i];
    int32_t into = PsnDiff(psn, f.first_psn);
    if (into >= int32_t(f.packets)) continue;
    if (f.opcode == WrOpcode::Read) f.sent = f.received;
    else f.sent = uint32_t(std::max<int32_t>(into, 0));
    resend_from_ = std::min(resend_from_, i);
  }
}

void RcLink::FailFront(WcStatus status) {
  mutex_.AssertHeld();
  if (flights_.empty()) return;
  uint64_t position = flights_.front().position;
  NDWV_LOG(Info, "%s: request at psn %u failed (status %d)", counters_.Identity().c_str(), flights_.front().first_psn,
           int(status));
  if (status == WcStatus::TimeoutRetry) counters_.Add(Counter::RetryExceeded);
  if (status == WcStatus::RnrRetry) counters_.Add(Counter::RnrRetryExceeded);
  // The QP moves to Error, which shuts this link down.
  if (position == kKeepalive) qp_->DeferError();
  else qp_->FinishSend(position, status);
  failure_to_report_ = true;
  flights_.clear();
  resend_from_ = 0;
  failed_ = true;  // nothing more goes out
}

void RcLink::OnAck(const Packet& packet) {
  mutex_.AssertHeld();
  const Aeth& aeth = packet.headers.aeth;
  uint32_t psn = packet.headers.bth.psn;
  if (flights_.empty()) return;
  // The last PSN sent: a message's PSNs are all assigned when its first packet goes, and an
  // answer naming one not yet sent would complete the message unsent.
  uint32_t newest = PsnAdd(sent_end_psn_, kPsnMask);
  switch (aeth.kind()) {
    case AethKind::Ack:
      if (PsnDiff(psn, acked_psn_) <= 0 || PsnDiff(psn, newest) > 0) return;  // old or bogus
      acked_psn_ = psn;
      Progress();
      Retire();
      return;
    case AethKind::RnrNak:
    case AethKind::Nak: {
      // Everything before the NAKed PSN arrived.
      if (PsnDiff(psn, newest) > 0 || PsnDiff(psn, PsnAdd(acked_psn_, 1)) < 0) return;
      counters_.Add(aeth.kind() == AethKind::RnrNak ? Counter::NaksReceivedRnr
                    : NakCode(aeth.value()) == NakCode::PsnSequenceError ? Counter::NaksReceivedSequence
                    : NakCode(aeth.value()) == NakCode::RemoteAccessError ? Counter::NaksReceivedAccess
                    : NakCode(aeth.value()) == NakCode::RemoteOperationalError ? Counter::NaksReceivedRemoteOp
                                                                              : Counter::NaksReceivedInvalid);
      if (PsnDiff(PsnAdd(psn, kPsnMask), acked_psn_) > 0) {
        acked_psn_ = PsnAdd(psn, kPsnMask);
        Progress();
        Retire();
        if (flights_.empty()) return;
      }
      if (aeth.kind() == AethKind::RnrNak) {
        if (params_.rnr_retry != 7 && rnr_left_-- == 0) return FailFront(WcStatus::RnrRetry);
        rnr_waiting_ = true;
        rnr_until_ = Clock::now() + std::chrono::microseconds(RnrTimerMicros(aeth.value()));
        Rewind(psn);
        return;
      }
      if (NakCode(aeth.value()) == NakCode::PsnSequenceError) {
        if (rnr_waiting_) return;
        if (retries_left_-- == 0) return FailFront(WcStatus::TimeoutRetry);
        Rewind(psn);
        return;
      }
      // A fatal NAK names the request at fault.
      while (!flights_.empty() &&
             PsnDiff(psn, PsnAdd(flights_.front().first_psn, flights_.front().packets - 1)) > 0)
        flights_.pop_front();  // past an incomplete Read (Retire stops there): it fails with the rest
      return FailFront(StatusForNak(aeth.value()));
    }
    default:
      return;
  }
}

void RcLink::OnReadResponse(const Packet& packet) {
  mutex_.AssertHeld();
  uint32_t psn = packet.headers.bth.psn;
  // The response belongs to the oldest Read not yet complete; everything before it is
  // implicitly acknowledged by it.
  for (size_t i = 0; i < flights_.size(); ++i) {
    Flight& f = flights_[i];
    if (f.opcode != WrOpcode::Read || f.received == f.packets) continue;
    int32_t into = PsnDiff(psn, f.first_psn);
    if (into < 0 || into >= int32_t(f.packets)) return;  // not this Read's: stale or bogus
    if (uint32_t(into) < f.received) return;              // duplicate
    if (uint32_t(into) > f.received) {                    // earlier responses were lost
      if (rewound_for_ != ResumePsn(f)) {
        rewound_for_ = ResumePsn(f);
        if (retries_left_-- == 0) return FailFront(WcStatus::TimeoutRetry);
        Rewind(rewound_for_);
      }
      return;
    }
    SendWqe& wqe = qp_->send_at(f.position);
    uint64_t offset = uint64_t(f.received) * params_.mtu;
    uint64_t want = std::min<uint64_t>(params_.mtu, wqe.length - offset);
    // Placed by its PSN; the opcode need only be a response's (one sent before a request was
    // repeated may arrive after it, and carries the same bytes).
    if (packet.payload.size() != want) {
      NDWV_LOG(Info, "%s: %s psn %u carries %zu bytes for a Read expecting %llu", counters_.Identity().c_str(),
               ToString(packet.headers.bth.opcode), psn, packet.payload.size(), (unsigned long long)want);
      return FailFront(WcStatus::BadResponse);
    }
    if (want && !ScatterChecked(qp_->pd(), wqe.sge, wqe.num_sge, offset, packet.payload.data(), want))
      return FailFront(WcStatus::LocalProtection);
    counters_.Add(Counter::RxBytes, want);
    f.received++;
    if (PsnDiff(psn, acked_psn_) > 0) acked_psn_ = psn;
    Progress();
    Retire();
    return;
  }
}

// ---- responder side

void RcLink::Nak(NakCode code, uint32_t psn, bool fatal, WcStatus receive_status) {
  mutex_.AssertHeld();
  NDWV_LOG(Info, "%s: NAK %d for psn %u%s", counters_.Identity().c_str(), int(code), psn, fatal ? ", QP fails" : "");
  counters_.Add(code == NakCode::PsnSequenceError ? Counter::NaksSentSequence
                : code == NakCode::RemoteAccessError ? Counter::NaksSentAccess
                : code == NakCode::RemoteOperationalError ? Counter::NaksSentRemoteOp
                                                          : Counter::NaksSentInvalid);
  SendAck(MakeSyndrome(AethKind::Nak, uint8_t(code)), psn);
  if (!fatal) return;
  if (have_recv_) {
    qp_->CompleteReceive(recv_, 0, receive_status, false);
    have_recv_ = false;
  }
  qp_->DeferError();
  failure_to_report_ = true;
  failed_ = true;  // nothing more goes out
}

void RcLink::OnRequest(const Packet& packet) {
  mutex_.AssertHeld();
  const Bth& bth = packet.headers.bth;
  int32_t distance = PsnDiff(bth.psn, epsn_);
  if (distance > 0) {  // a gap: NAK once, drop until the expected PSN comes
    counters_.Add(Counter::RxOutOfSequence);
    if (!nak_sent_) {
      nak_sent_ = true;
      counters_.Add(Counter::NaksSentSequence);
      SendAck(MakeSyndrome(AethKind::Nak, uint8_t(NakCode::PsnSequenceError)), epsn_);
    }
    return;
  }
  if (distance < 0) {  // a duplicate: acknowledged again, never executed twice (a Read is answered again)
    counters_.Add(Counter::RxDuplicates);
    if (bth.opcode == Opcode::ReadRequest) {
      ExecuteRead(packet, true);
    } else if (bth.ack_req) {
      ack_due_ = true;
      ack_by_ = CoarseNow() + kAckDelay;
    }
    return;
  }
  nak_sent_ = false;
  bool done;
  if (IsSend(bth.opcode)) done = ExecuteSend(packet);
  else if (IsWrite(bth.opcode)) done = ExecuteWrite(packet);
  else if (bth.opcode == Opcode::ReadRequest) done = ExecuteRead(packet, false);
  else {
    Nak(NakCode::InvalidRequest, bth.psn, true);
    return;
  }
  if (!done) return;
  if (bth.opcode == Opcode::ReadRequest) return;  // its response is its acknowledgement
  epsn_ = PsnAdd(epsn_, 1);
  if (bth.ack_req) {
    ack_due_ = true;
    ack_by_ = CoarseNow() + kAckDelay;
  }
}

bool RcLink::ExecuteSend(const Packet& packet) {
  mutex_.AssertHeld();
  const Bth& bth = packet.headers.bth;
  OpcodeInfo info = InfoFor(bth.opcode);
  // A First while one is open, a Middle/Last without one, or any Send inside a Write.
  if (info.first != !have_recv_ || in_write_) {
    Nak(NakCode::InvalidRequest, bth.psn, true);
    return false;
  }
  if (info.first) {
    if (!qp_->TakeReceive(&recv_)) {
      SendAck(MakeSyndrome(AethKind::RnrNak, params_.rnr_timer), bth.psn);
      counters_.Add(Counter::NaksSentRnr);
      return false;
    }
    have_recv_ = true;
    recv_offset_ = 0;
  }
  size_t n = packet.payload.size();
  if ((!info.last && n != params_.mtu) || recv_offset_ + n > recv_.length) {
    Nak(NakCode::InvalidRequest, bth.psn, true);  // too long for the receive, or malformed
    return false;
  }
  if (n && !ScatterChecked(qp_->pd(), recv_.sge, recv_.num_sge, recv_offset_, packet.payload.data(), n)) {
    Nak(NakCode::RemoteOperationalError, bth.psn, true);
    return false;
  }
  recv_offset_ += uint32_t(n);
  counters_.Add(Counter::RxBytes, n);
  PlacedPeerMessage();
  if (info.last) {
    // A Send with Invalidate unbinds the window it names before its receive completes; a key
    // that names no window bound to this QP is an invalid request that ends the connection.
    bool invalidates = bth.opcode == Opcode::SendLastInv || bth.opcode == Opcode::SendOnlyInv;
    if (invalidates && !qp_->InvalidateRemote(packet.headers.ieth)) {
      Nak(NakCode::InvalidRequest, bth.psn, true, WcStatus::LocalOp);
      return false;
    }
    have_recv_ = false;
    msn_++;
    counters_.Add(Counter::RxSends);
    qp_->CompleteReceive(recv_, recv_offset_, WcStatus::Success, bth.solicited);
  }
  return true;
}

bool RcLink::ExecuteWrite(const Packet& packet) {
  mutex_.AssertHeld();
  const Headers& h = packet.headers;
  OpcodeInfo info = InfoFor(h.bth.opcode);
  // A First while one is open, a Middle/Last without one, any Write inside a Send.
  if (info.first == in_write_ || have_recv_ ||
      (h.bth.opcode == Opcode::WriteOnlyImm || h.bth.opcode == Opcode::WriteLastImm) ||
      (info.first && h.reth.length > kMaxTransferLength)) {
    Nak(NakCode::InvalidRequest, h.bth.psn, true);
    return false;
  }
  ProtectionDomain& pd = qp_->pd();
  if (info.first) {
    // The whole target is checked before a byte is placed (zero-length Writes name no memory).
    if (h.reth.length && pd.CheckRemote(h.reth.rkey, qpn_, h.reth.va, h.reth.length, kRemoteWrite) != KeyCheck::Ok) {
      Nak(NakCode::RemoteAccessError, h.bth.psn, true);
      return false;
    }
    in_write_ = true;
    write_va_ = h.reth.va;
    write_rkey_ = h.reth.rkey;
    write_length_ = h.reth.length;
    write_offset_ = 0;
  }
  size_t n = packet.payload.size();
  if ((!info.last && n != params_.mtu) || write_offset_ + n > write_length_ ||
      (info.last && write_offset_ + n != write_length_)) {
    Nak(NakCode::InvalidRequest, h.bth.psn, true);
    return false;
  }
  if (n) {
    base::ReaderLock placement(pd.placement_lock());
    uint64_t target = write_va_ + write_offset_;
    if (pd.CheckRemoteLocked(write_rkey_, qpn_, target, n, kRemoteWrite) != KeyCheck::Ok) {
      placement.unlock();
      Nak(NakCode::RemoteAccessError, h.bth.psn, true);
      return false;
    }
    // The last byte alone and last: a reader polling it (in-order placement) must see it once,
    // after the rest (a library memcpy may store a tail byte twice, or first).
    auto* dest = reinterpret_cast<uint8_t*>(target);
    memcpy(dest, packet.payload.data(), n - 1);
    std::atomic_ref<uint8_t>(dest[n - 1]).store(packet.payload[n - 1], std::memory_order_release);
    PlacedPeerMessage();  // not a zero-length Write (a keepalive)
  }
  write_offset_ += uint32_t(n);
  counters_.Add(Counter::RxBytes, n);
  if (info.last) {
    in_write_ = false;
    msn_++;
    counters_.Add(Counter::RxWrites);
  }
  return true;
}

bool RcLink::ExecuteRead(const Packet& packet, bool duplicate) {
  mutex_.AssertHeld();
  const Headers& h = packet.headers;
  // A Read inside a message, one larger than a work request may move (its length counts its
  // PSNs: 4 GiB in 256-byte packets would wrap them), and any Read, even one that claims to
  // repeat an earlier one, where the Accept granted none (IRD 0), are protocol errors.
  if ((!duplicate && (have_recv_ || in_write_)) || h.reth.length > kMaxTransferLength || params_.ird == 0) {
    Nak(NakCode::InvalidRequest, h.bth.psn, true);
    return false;
  }
  if (h.reth.length && qp_->pd().CheckRemote(h.reth.rkey, qpn_, h.reth.va, h.reth.length, kRemoteRead) != KeyCheck::Ok) {
    Nak(NakCode::RemoteAccessError, h.bth.psn, true);
    return false;
  }
  uint32_t packets = PacketsFor(h.reth.length, params_.mtu);
  if (duplicate) {
    // Answered again from where the requester asks; a response still queued for the same or
    // later PSNs is replaced by this one. No more are queued than new Reads may be (IRD): a
    // peer repeating old PSNs while it does not read its socket holds no more of our memory.
    while (!responses_.empty() && PsnDiff(responses_.back().psn, h.bth.psn) >= 0) responses_.pop_back();
    if (PsnDiff(PsnAdd(h.bth.psn, packets), epsn_) > 0) return false;  // claims PSNs never used
    if (responses_.size() >= params_.ird) return false;  // asked again later
  } else if (responses_.size() >= params_.ird) {
    Nak(NakCode::InvalidRequest, h.bth.psn, true);  // beyond the Reads we granted: a protocol error
    return false;
  }
  responses_.push_back({h.bth.psn, h.reth.va, h.reth.rkey, h.reth.length, packets, 0});
  if (!duplicate) {
    epsn_ = PsnAdd(epsn_, packets);
    msn_++;
    counters_.Add(Counter::RxReads);
    if (h.reth.length) PlacedPeerMessage();
  }
  return true;
}

// ---------------------------------------------------------------------------------- timer

void RcLink::EnsureTimer(Clock::time_point deadline) {
  mutex_.AssertHeld();
  if (timer_.pending() && timer_deadline_ <= deadline) return;  // fires in time; it re-checks then
  timer_deadline_ = deadline;
  auto delay = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  timer_.Arm(shared_from_this(), std::max(delay, std::chrono::milliseconds(0)));
}

void RcLink::OnTimer(Timer* timer) {
  RcLink* self = LinkTimer::OwnerOf(timer);  // alive: the firing holds it until TakeFiring
  // A retransmission is due: the acknowledgement may be in our socket already, unread (a busy
  // engine reads up to 1,024 ready sockets, then fires the timers due; at 10,000 connections an
  // echo on each made hundreds of retransmissions of packets that had arrived). It is read
  // first, so that an ACK waiting there is not taken for a loss: one read, and only then. The
  // timer is handled as of the same moment: what was not due before the read is not after it.
  const Clock::time_point now = Clock::now();
  bool due;
  {
    base::MutexLock lock(self->mutex_);
    due = !self->shut_ && self->RetransmitDue(now);
  }
  if (due) self->port_->DriveReceive();
  std::shared_ptr<RcLink> keep;
  {
    base::MutexLock lock(self->mutex_);
    keep = self->timer_.TakeFiring();
    if (!keep || self->shut_) return;
    self->HandleTimer(now);
  }
  keep->Report();
}

void RcLink::HandleTimer(Clock::time_point now) {
  mutex_.AssertHeld();
  if (ack_due_ && now >= ack_by_) Pump();
  if (rnr_waiting_ && now >= rnr_until_) {
    rnr_waiting_ = false;
    waiting_since_ = now;
    Pump();
  }
  // Also while the socket is full: what it does not take is no more acknowledged than what a
  // wire lost, and the retry budget bounds every request however it waits.
  if (RetransmitDue(now)) {
    if (retries_left_-- == 0) {
      NDWV_LOG(Info, "%s: no acknowledgement after %u retries", counters_.Identity().c_str(), unsigned(params_.retry_count));
      return FailFront(WcStatus::TimeoutRetry);
    }
    NDWV_LOG(Debug, "%s: ACK timeout, retransmitting from psn %u", counters_.Identity().c_str(), ResumePsn(flights_.front()));
    counters_.Add(Counter::AckTimeouts);
    waiting_since_ = now;
    if (timing_) timed_resent_ = now;  // the timed request goes again, if not acknowledged yet
    rewound_for_ = UINT32_MAX;
    Rewind(ResumePsn(flights_.front()));
    Pump();
  }
  if (shut_) return;
  if (params_.keepalive_ms && flights_.empty() && !failed_) {
    // Idle: has the peer been heard from lately? If not, ask it for an acknowledgement. Not
    // before the connection is established (the passive side waits for the RTU): the active QP
    // may not exist yet, and the CM's own timers watch the peer until then.
    auto due = probe_now_ ? now : KeepaliveDue(last_rx_, params_);
    if (now >= due && (HeldUntilEstablished() || qp_->state() != QpState::Rts)) {
      last_rx_ = now;
      probe_now_ = false;
      EnsureTimer(KeepaliveDue(now, params_));
    } else if (now >= due) {
      if (std::exchange(probe_now_, false)) counters_.Add(Counter::PeerProbes);
      flights_.push_back({kKeepalive, WrOpcode::Write, next_psn_, 1, 0, 0, 0});
      counters_.Add(Counter::KeepalivesSent);
      next_psn_ = PsnAdd(next_psn_, 1);
      waiting_since_ = now;
      if (!timing_) StartTiming(flights_.back(), now);
      Pump();
    } else {
      EnsureTimer(due);
    }
  }
  if (shut_) return;
  CheckSettled(now);
  if (settling_) EnsureTimer(SettleBy());
  if (ack_due_) EnsureTimer(ack_by_);
  if (!flights_.empty()) EnsureTimer(rnr_waiting_ ? rnr_until_ : RetransmitAt());
}

}  // namespace ndwv::dev::roce
