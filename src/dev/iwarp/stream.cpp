#include "dev/iwarp/stream.h"

#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>

#include "base/fork.h"
#include "base/log.h"
#include "base/settings.h"
#include "dev/address.h"
#include "wire/bytes.h"
#include "wire/crc.h"
#include "wire/mpa.h"

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;

namespace {

// How TCP ends a connection whose peer stopped answering (NDWV_IWARP_TIMEOUT_MS): ETIMEDOUT, or
// the soft error it met meanwhile (no route, or no neighbour, while the link is down).
bool NoAnswer(int error) { return error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH; }

// The STag a Read Request names as its sink: our own tag for the request's send queue position,
// so the response lands in the request's SGE list (which needs no remote rights) and MR keys
// (top byte never 0xFF) cannot be confused with it.
constexpr uint32_t kSinkStagTag = 0xFF000000u;
uint32_t SinkStag(uint64_t position) { return kSinkStagTag | uint32_t(position & 0xFFFFFF); }
// Probes (zero-length Reads confirming Writes) carry their own tag.
constexpr uint32_t kProbeStagTag = 0xFE000000u;
// Payload bytes at the end of each FPDU placed only after its CRC checked out. At least 1: the
// tail's placement is what stores the last byte alone and last (FinishSegment).
constexpr uint32_t kCheckedTail = 64;
static_assert(kCheckedTail >= 1);
uint32_t ProbeStag(uint32_t seq) { return kProbeStagTag | (seq & 0xFFFFFF); }

TermCode RemoteProtection(KeyCheck check) {
  switch (check) {
    case KeyCheck::InvalidKey: return MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::InvalidStag);
    case KeyCheck::OutOfBounds: return MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::BaseBounds);
    case KeyCheck::NoRights: return MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::AccessRights);
    case KeyCheck::WrongQp: return MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::StagNotAssociated);
    case KeyCheck::Ok: break;
  }
  return kTermRdmapCatastrophic;
}

// The RDMAP opcode of a Send with these send flags.
RdmapOpcode SendOpcode(uint32_t flags) {
  bool solicited = flags & kSolicited, invalidate = flags & kInvalidate;
  return invalidate ? (solicited ? RdmapOpcode::SendSolicitedInvalidate : RdmapOpcode::SendInvalidate)
                    : (solicited ? RdmapOpcode::SendSolicited : RdmapOpcode::Send);
}

// What the initiator's request completes with when the peer terminates the stream because of it.
WcStatus StatusForTerminate(TermCode code) {
  if (code.layer == TermLayer::Rdmap && code.type == uint8_t(RdmapErrorType::RemoteProtection))
    return WcStatus::RemoteAccess;
  if (code == MakeTerm(DdpTaggedCode::InvalidStag) || code == MakeTerm(DdpTaggedCode::BaseBounds) ||
      code == MakeTerm(DdpTaggedCode::StagNotAssociated))
    return WcStatus::RemoteAccess;
  if (code == MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer)) return WcStatus::RnrRetry;
  if (code == MakeTerm(DdpUntaggedCode::MessageTooLong)) return WcStatus::RemoteInvalidRequest;
  return WcStatus::RemoteOp;
}

}  // namespace

Stream::Stream(int fd, std::shared_ptr<QueuePair> qp, const StreamParams& params,
               std::weak_ptr<StreamObserver> observer, std::unique_ptr<base::TcpCapture> capture,
               const sockaddr_storage* local, const sockaddr_storage* peer)
    : fd_(fd), capture_(std::move(capture)), qp_(std::move(qp)), params_(params), observer_(std::move(observer)), qpn_(qp_->qpn()) {
  params_.max_ulpdu = std::min<uint32_t>(params_.max_ulpdu, kFpduMaxUlpdu);
  params_.ird = std::max<uint32_t>(params_.ird, 1);
  params_.ord = std::max<uint32_t>(params_.ord, 1);
  sockaddr_storage asked_local{}, asked_peer{};
  socklen_t length = sizeof asked_local;
  if (!local) getsockname(fd_, reinterpret_cast<sockaddr*>(&asked_local), &length);
  length = sizeof asked_peer;
  if (!peer) getpeername(fd_, reinterpret_cast<sockaddr*>(&asked_peer), &length);
  counters_.Register(Transport::Iwarp, qpn_, 0, local ? *local : asked_local, peer ? *peer : asked_peer);
  linger_timer_.fire = &Stream::OnLingerTimer;
  linger_timer_.owner = this;
}

Stream::~Stream() { Shutdown(); }

namespace {
constexpr uint32_t kWatched = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
}  // namespace

bool Stream::TakeWaitingTransmit() {
  // Loads first: an empty poll asks this every time, and mostly nothing waits.
  return deferred_bytes_.load(std::memory_order_relaxed) ||
         (response_owed_.load(std::memory_order_relaxed) && response_owed_.exchange(false));
}

void Stream::PollProgress() {
  // A stalled transmit (the socket had no room) too: send now.
  if (tx_stalled_.load(std::memory_order_relaxed) || TakeWaitingTransmit()) Kick();
  DriveReceive(true);
  // Loaded first: mostly no peer message was placed, and then no read-modify-write is needed.
  bool peer = peer_message_by_poller_.load(std::memory_order_relaxed) &&
              peer_message_by_poller_.exchange(false, std::memory_order_relaxed);
  handoff_.EmptyPoll(*this, peer, Lendable());
}

void Stream::PlacedPeerMessage() {
  if (rx_by_poller_) peer_message_by_poller_.store(true, std::memory_order_relaxed);
}

void Stream::Reaped(bool peer_message) { handoff_.Reaped(*this, peer_message); }

void Stream::StillPolled() { handoff_.Posted(); }

void Stream::OnNotifyArmed() {
  handoff_.NotifyArmed(*this);
  if (TakeWaitingTransmit()) Kick();
}

void Stream::ApplyWatchLocked() {
  handoff_.mutex().AssertHeld();
  // A stream that shut down keeps the interest its lingering set (Shutdown).
  if (!shut_) Engine::Get().Modify(fd_, handoff_.engine_reads() ? kWatched : 0);  // the poller drives both directions
}

void Stream::EngineReturned(bool by_timer) {
  if (shut_) return;
  if (TakeWaitingTransmit()) Kick();
  uint64_t before = counters_.Get(Counter::RxPackets);
  DriveReceive();  // what arrived while nobody watched
  // The pollers stopped while the peer's data came: the application waited without polling
  // (on memory) and paid up to a look's delay for it (PollerRule).
  if (by_timer && counters_.Get(Counter::RxPackets) != before)
    AdapterCounters(Transport::Iwarp).AddShared(Counter::LateEngineTakeovers);
}

void Stream::Start() {
  if (!qp_->Attach(shared_from_this())) {
    Abort();  // the QP failed (Flush) before its connection started: the connection ends
    return;
  }
  Engine::Get().Watch(fd_, kWatched, weak_from_this());
  DriveReceive();  // bytes may have arrived before the socket was watched
}

void Stream::OnIo(uint32_t events) {
  if (shut_.load(std::memory_order_relaxed)) [[unlikely]] {  // lingering after a Terminate, if at all
    Linger();
    return;
  }
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) DriveReceive();
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) Kick();
}

void Stream::NotifyObserver(void (StreamObserver::*event)()) {
  if (auto observer = observer_.lock()) (observer.get()->*event)();
}

void Stream::Broken() {
  rx_mutex_.AssertHeld();
  phase_ = RxPhase::Dead;
  if (!error_reported_.exchange(true)) {
    NDWV_LOG(Debug, "%s: iWARP stream lost%s", counters_.identity(),
             timed_out_ ? " (the peer stopped acknowledging)" : "");
    // A dead peer or link: the oldest request still waiting for the peer takes the timeout.
    if (qp_ && timed_out_) qp_->FailOldest(WcStatus::TimeoutRetry);
    else if (qp_) qp_->DeferError();
    if (auto observer = observer_.lock()) observer->OnStreamError(timed_out_);
  }
}

void Stream::Abort() {
  base::MutexLock rx(rx_mutex_);
  if (!shut_) Broken();
}

void Stream::Shutdown() {
  std::shared_ptr<Stream> self = weak_from_this().lock();  // none in the destructor: no lingering
  bool linger = false;
  {
    base::MutexLock rx(rx_mutex_);
    base::MutexLock tx(tx_mutex_);
    if (shut_) return;
    shut_ = true;
    phase_ = RxPhase::Dead;
    if (have_recv_) {  // a message was arriving into it: it is flushed with the rest
      qp_->CompleteReceive(recv_, 0, WcStatus::Flushed, false);
      have_recv_ = false;
      counters_.AddShared(Counter::FlushedRequests);
    }
    // After a Terminate the socket stays until the peer's TCP has it (CloseSocket); the QP is
    // kept for that while (the rest of a batch of Read Responses is checked against its PD).
    linger = terminated_ && self;
    if (linger) {
      lingering_ = true;
      linger_until_ = Clock::now() + std::chrono::milliseconds(base::Config().disconnect_timeout_ms);
      linger_self_ = self;
      // Lingering runs on the engine only (its timer and EPOLLOUT), so its steps never overlap;
      // armed under the lock, before the engine can see lingering_ and end it.
      Engine::Get().Modify(fd_, EPOLLOUT | EPOLLET);
      Engine::Get().Arm(&linger_timer_, std::chrono::milliseconds(0));
    } else {
      broken_ = true;
      qp_.reset();
    }
  }
  handoff_.Close();
  if (!linger) CloseSocket();
}

void Stream::CloseSocket() {
  Engine::Get().Unwatch(fd_);
  if (capture_) [[unlikely]] capture_->SentFin();  // close() sends it, if shutdown() did not
  ReleaseTcpPort(fd_);
  base::CloseDescriptor(fd_);
}

void Stream::OnLingerTimer(Timer* timer) { static_cast<Stream*>(timer->owner)->Linger(); }

void Stream::Linger() {
  constexpr auto kLingerPoll = std::chrono::milliseconds(10);
  std::shared_ptr<Stream> release;  // the stream may go with it: last
  {
    base::MutexLock tx(tx_mutex_);
    if (!lingering_) return;
    // What was begun goes out whole, then the Terminate, then the FIN; nothing else.
    bool done = false;
    for (;;) {
      if (!batch_.empty() && !FlushBatch()) {
        done = broken_;  // the socket failed; else it is full: EPOLLOUT or the timer comes back
        break;
      }
      if (send_closed_) {
        int unacknowledged = 0;
        done = ioctl(fd_, SIOCOUTQ, &unacknowledged) != 0 || unacknowledged == 0;
        break;
      }
      if (!FillBatch()) {
        shutdown(fd_, SHUT_WR);
        if (capture_) [[unlikely]] capture_->SentFin();
        send_closed_ = true;
      }
    }
    if (!done && Clock::now() < linger_until_) {
      Engine::Get().Arm(&linger_timer_, kLingerPoll);
      return;
    }
    lingering_ = false;
    Engine::Get().Disarm(&linger_timer_);  // on the engine, as its firing: none can be pending
    qp_.reset();
    release = std::move(linger_self_);
  }
  CloseSocket();
}

// ---------------------------------------------------------------------------------- transmit

void Stream::Kick() {
  bool broken = false;
  tx_runner_.Run(tx_mutex_, [&] {
    tx_mutex_.AssertHeld();
    if (!shut_) ProcessTx();
    broken = broken_.load() && !shut_;
    return !broken;
  });
  // The receive side reports it (Broken runs under its lock). Not by taking that lock in the
  // runner: the receive path itself kicks us (a Read slot freed), and would wait for itself.
  if (broken) DriveReceive();
}

void Stream::Posted(const SendWqe& request) {
  // A stream of large requests gains nothing from a system call each while those before them,
  // sent and not yet confirmed placed, fill the pipe: what is posted now arrives after all of
  // that anyway. It waits until a batch's worth is queued, or for the next empty poll, Notify, or
  // probe answer (which confirms its predecessors and kicks us): within a round trip, as a probe
  // is in flight or due whenever requests are unconfirmed. TCP takes 512 KiB in one call at
  // ~1.3 times the rate of 64 KiB calls on loopback (docs/iwarp.md, "Performance notes").
  const uint64_t length = request.length;
  bool carries_data = request.opcode == WrOpcode::Send || request.opcode == WrOpcode::Write;
  if (carries_data && length >= kCoalesceMin && length < kCoalesceBatch &&
      unconfirmed_bytes_.load(std::memory_order_relaxed) >= kCoalesceInFlight) {
    // Release: the request was published before; whoever takes the count (an exchange) sees it.
    if (deferred_bytes_.fetch_add(length, std::memory_order_acq_rel) + length < kCoalesceBatch) {
      counters_.AddShared(Counter::TxCoalesced);  // posters share no lock
      return;
    }
    deferred_bytes_.exchange(0, std::memory_order_acq_rel);  // a batch's worth: it all goes now
  }
  Kick();
}

void Stream::SendRtr() {
  {
    base::MutexLock lock(tx_mutex_);
    rtr_pending_ = true;
  }
  Kick();
}

void Stream::CloseSend() {
  // What the peer sent before our FIN is answered before it, as an RNIC answers every request it
  // received before the disconnect: a Read Request already in the socket (a probe confirming the
  // peer's last Send or Write, say) gets its Response, else that request would end flushed. So
  // the receive in progress ends first, then whatever is left in the socket is processed.
  { base::MutexLock wait(rx_mutex_); }
  DriveReceive();
  {
    base::MutexLock lock(tx_mutex_);
    close_send_ = true;
  }
  Kick();
}

void Stream::ProcessTx() {
  tx_mutex_.AssertHeld();
  // What waited is sent below: taking the count with an exchange makes the requests posted
  // before it visible here.
  if (deferred_bytes_.load(std::memory_order_relaxed)) deferred_bytes_.exchange(0, std::memory_order_acq_rel);
  for (;;) {
    if (!batch_.empty() && !FlushBatch()) return;
    if (send_closed_ || broken_) return;
    if (!FillBatch()) {
      if (close_send_) {
        ReleaseTcpPort(fd_);     // the FIN may leave a TIME_WAIT behind
        shutdown(fd_, SHUT_WR);  // FIN after the last queued byte
        if (capture_) [[unlikely]] capture_->SentFin();
        send_closed_ = true;
      }
      return;
    }
  }
}

bool Stream::SourcesGranted() const {
  tx_mutex_.AssertHeld();
  for (int i = 0; i < batch_.source_count; ++i) {
    const Source& s = batch_.sources[i];
    if (qp_->pd().CheckRemoteLocked(s.stag, qpn_, s.addr, s.length, kRemoteRead) != KeyCheck::Ok) return false;
  }
  return true;
}

bool Stream::FlushBatch() {
  tx_mutex_.AssertHeld();
  // Memory read for the peer is re-checked whenever bytes leave, with deregistration held off, so
  // a region deregistered (and freed) after the Read Request was checked is never sent.
  std::shared_lock<base::SharedMutex> sources;
  if (batch_.source_count) {
    sources = std::shared_lock(qp_->pd().placement_lock());
    qp_->pd().placement_lock().AssertReaderHeld();  // the analysis does not see std::shared_lock
    if (!SourcesGranted()) {
      broken_ = true;  // the Response cannot be completed: the connection ends
      return false;
    }
  }
  while (!batch_.empty()) {
    msghdr msg{};
    msg.msg_iov = batch_.iov + batch_.iov_done;
    msg.msg_iovlen = std::min(batch_.iov_count - batch_.iov_done, IOV_MAX);
    // What is small leaves from one buffer through send(), which the kernel takes faster than
    // sendmsg (no message header or iovec array to copy in: ~0.2 us a call on the test VM).
    // A small FPDU is built whole already; a few small ones are gathered here.
    const uint8_t* flat = msg.msg_iovlen == 1 ? static_cast<const uint8_t*>(msg.msg_iov[0].iov_base) : nullptr;
    size_t flat_len = msg.msg_iovlen == 1 ? msg.msg_iov[0].iov_len : 0;
    if (!flat && msg.msg_iovlen <= 8) {
      for (size_t i = 0; i < msg.msg_iovlen; ++i) flat_len += msg.msg_iov[i].iov_len;
      if (flat_len <= sizeof batch_.gathered) {
        for (size_t i = 0, at = 0; i < msg.msg_iovlen; at += msg.msg_iov[i++].iov_len)
          memcpy(batch_.gathered + at, msg.msg_iov[i].iov_base, msg.msg_iov[i].iov_len);
        flat = batch_.gathered;
      }
    }
    auto send_call = [&] {
      return flat ? send(fd_, flat, flat_len, MSG_NOSIGNAL | MSG_DONTWAIT)
                  : sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    };
    ssize_t n = capture_ ? capture_->SendAndRecord(send_call, [&](ssize_t sent) {
                             capture_->Sent(msg.msg_iov, msg.msg_iovlen, sent);
                           })
                         : send_call();
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) broken_ = true;
      if (NoAnswer(errno)) timed_out_ = true;
      tx_stalled_.store(true, std::memory_order_relaxed);
      return false;  // EPOLLOUT (edge), or a poller, kicks us again when there is room
    }
    while (n > 0) {
      iovec& v = batch_.iov[batch_.iov_done];
      size_t step = std::min<size_t>(v.iov_len, size_t(n));
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + step;
      v.iov_len -= step;
      n -= step;
      if (v.iov_len == 0) batch_.iov_done++;
    }
    while (batch_.iov_done < batch_.iov_count && batch_.iov[batch_.iov_done].iov_len == 0)
      batch_.iov_done++;
  }
  tx_stalled_.store(false, std::memory_order_relaxed);
  if (batch_.terminate) terminate_written_ = true;
  // Completing takes the send queue's lock, under which an Invalidate posted meanwhile takes the
  // PD exclusively: the placement lock (shared) must be gone first (docs/architecture.md, Locking).
  if (sources.owns_lock()) sources.unlock();
  // Sends and Writes complete once their last byte is in the stream (as on an RNIC).
  for (int i = 0; i < batch_.finished_count; ++i) qp_->FinishSend(batch_.finished[i], WcStatus::Success);
  batch_.finished_count = 0;
  return true;
}

bool Stream::AddFpdu(const DdpHeader& hdr, const ReadRequest* read, const uint8_t* inline_data,
                     const Sge* sge, uint32_t num_sge, uint64_t offset, uint32_t length) {
  tx_mutex_.AssertHeld();
  int pieces_needed = 2 + (inline_data ? 1 : int(num_sge));
  if (batch_.fpdus == kBatchFpdus || batch_.iov_count + pieces_needed > kBatchIov) return false;
  int slot = batch_.fpdus++;
  counters_.Add(Counter::TxPackets);
  counters_.Add(Counter::TxBytes, length);
  uint8_t* h = batch_.headers[slot];
  size_t hlen = EncodeDdpHeader(hdr, {h + 2, sizeof batch_.headers[slot] - 2});
  if (read) hlen += EncodeReadRequest(*read, {h + 2 + hlen, kReadRequestLen});
  size_t ulpdu = hlen + length;
  StoreBe16(h, uint16_t(ulpdu));
  // A small FPDU is copied whole into its slot: one iovec instead of three costs less than the copy.
  bool whole = FpduLength(ulpdu) <= kSmallFpdu;
  size_t built = 2 + hlen;  // bytes of the slot in use
  FpduCrcBuilder crc;
  auto add = [&](void* base, size_t len) NDWV_REQUIRES(tx_mutex_) {
    if (whole) {
      memcpy(h + built, base, len);
      built += len;
      return;
    }
    batch_.iov[batch_.iov_count++] = {base, len};
    if (params_.crc) crc.Add({static_cast<const uint8_t*>(base), len});
  };
  if (!whole) add(h, 2 + hlen);
  if (length) {
    if (inline_data) {
      add(const_cast<uint8_t*>(inline_data) + offset, length);
    } else {
      uint64_t left = length;
      while (left) {
        auto [base, len] = PieceAt(sge, num_sge, offset);
        len = std::min(len, left);
        add(base, len);
        offset += len;
        left -= len;
      }
    }
  }
  size_t pad = FpduPad(ulpdu);
  if (whole) {
    memset(h + built, 0, pad);
    StoreFpduCrc(h + built + pad, params_.crc ? Crc32c(h, built + pad) : 0);  // one pass, pad included
    batch_.iov[batch_.iov_count++] = {h, built + pad + kFpduCrcLen};
    return true;
  }
  uint8_t* t = batch_.trailers[slot];
  memset(t, 0, pad);
  StoreFpduCrc(t + pad, params_.crc ? crc.Finish() : 0);
  batch_.iov[batch_.iov_count++] = {t, pad + kFpduCrcLen};
  return true;
}

size_t Stream::ReadsOutstanding() { return reads_queued_.load(std::memory_order_acquire); }

bool Stream::AddProbe(size_t reads) {
  tx_mutex_.AssertHeld();
  if (reads >= params_.ord) return false;  // sent when a Read slot frees up
  ReadRequest request{ProbeStag(probe_seq_), 0, 0, 0, 0};
  if (!AddFpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, read_msn_, 0, true), &request, nullptr,
               nullptr, 0, 0, 0))
    return false;
  read_msn_++;
  probe_seq_++;
  counters_.Add(Counter::TxConfirmReads);
  probe_due_ = false;
  base::MutexLock lock(reads_mutex_);
  reads_outstanding_.push_back({next_tx_, true});
  reads_queued_.fetch_add(1, std::memory_order_release);
  return true;
}

void Stream::ConfirmPlaced(uint64_t below) {
  for (;;) {
    uint64_t position;
    {
      base::MutexLock lock(reads_mutex_);
      if (unconfirmed_.empty() || unconfirmed_.front().position >= below) return;
      position = unconfirmed_.front().position;
      unconfirmed_.pop_front();
      unconfirmed_bytes_.fetch_sub(qp_->send_at(position).length, std::memory_order_relaxed);
    }
    qp_->FinishSend(position, WcStatus::Success);
  }
}

// The peer refused a message: the Send (by its MSN) or Write (by STag and offset) the Terminate
// names fails; the messages before it were placed.
void Stream::FailUnconfirmed(const TerminateMsg& term, WcStatus status) {
  DdpHeader offending;
  bool named = !term.ddp_header.empty() && DecodeDdpHeader(term.ddp_header, offending,
                                                           ReservedBits::Ignore) == DdpError::Ok;
  base::MutexLock lock(reads_mutex_);
  while (!unconfirmed_.empty()) {
    Unconfirmed entry = unconfirmed_.front();
    unconfirmed_.pop_front();
    const SendWqe& wqe = qp_->send_at(entry.position);
    unconfirmed_bytes_.fetch_sub(wqe.length, std::memory_order_relaxed);
    bool culprit = !named;
    if (named && offending.tagged() && wqe.opcode == WrOpcode::Write)
      culprit = offending.stag == wqe.rkey && offending.to >= wqe.remote_addr &&
                offending.to - wqe.remote_addr <= wqe.length;
    if (named && !offending.tagged() && wqe.opcode == WrOpcode::Send) culprit = offending.msn == entry.msn;
    qp_->FinishSend(entry.position, culprit ? status : WcStatus::Success);
    if (culprit) return;
  }
  qp_->FailOldest(status);
}

bool Stream::FillBatch() {
  tx_mutex_.AssertHeld();
  batch_.iov_count = batch_.iov_done = batch_.fpdus = batch_.finished_count = batch_.source_count = 0;
  batch_.terminate = false;
  if (terminate_len_) {
    // The Terminate is the last FPDU of the stream: send it alone, then close.
    uint8_t* h = batch_.headers[batch_.fpdus++];
    StoreBe16(h, uint16_t(terminate_len_));
    memcpy(h + 2, terminate_, terminate_len_);
    FpduCrcBuilder crc;
    crc.Add({h, terminate_len_ + 2});
    size_t pad = FpduPad(terminate_len_);
    uint8_t* t = batch_.trailers[0];
    memset(t, 0, pad);
    StoreFpduCrc(t + pad, params_.crc ? crc.Finish() : 0);
    batch_.iov[batch_.iov_count++] = {h, terminate_len_ + 2};
    batch_.iov[batch_.iov_count++] = {t, pad + kFpduCrcLen};
    terminate_len_ = 0;
    close_send_ = true;
    batch_.terminate = true;
    counters_.Add(Counter::TxPackets);
    return true;
  }
  if (terminated_) return false;  // the Terminate was the last FPDU
  if (close_send_ && qp_->state() == QpState::Error) return false;
  if (rtr_pending_) {
    AddFpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, 0, 0, true), nullptr, nullptr, nullptr, 0, 0, 0);
    rtr_pending_ = false;
  }
  for (;;) {
    // Read Responses owed to the peer go first, at message boundaries.
    ReadResponse* response = nullptr;
    if (responses_queued_.load(std::memory_order_acquire)) {
      base::MutexLock lock(responses_mutex_);
      response = &responses_.front();
    }
    if (response) {
      uint32_t chunk = std::min<uint32_t>(response->size - response->sent,
                                          params_.max_ulpdu - kDdpTaggedHeaderLen);
      bool last = response->sent + chunk == response->size;
      Sge source{response->source, response->size, 0};
      Source piece{response->source_stag, response->source + response->sent, chunk};
      {
        base::ReaderLock granted(qp_->pd().placement_lock());  // the CRC reads it
        if (chunk && qp_->pd().CheckRemoteLocked(piece.stag, qpn_, piece.addr, piece.length, kRemoteRead) !=
                         KeyCheck::Ok) {
          broken_ = true;  // deregistered since the request was checked: the connection ends
          break;
        }
        if (!AddFpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, response->sink_stag,
                                       response->sink_to + response->sent, last),
                     nullptr, nullptr, &source, 1, response->sent, chunk))
          break;
      }
      if (chunk) batch_.sources[batch_.source_count++] = piece;
      response->sent += chunk;
      if (last) {
        base::MutexLock lock(responses_mutex_);
        responses_.pop_front();
        responses_queued_.fetch_sub(1, std::memory_order_release);
      }
      continue;
    }
    if (next_tx_ == qp_->send_tail()) {
      // One probe in flight at a time: its answer confirms every message before it, and the
      // messages sent after it get the next probe when the answer comes (the Read Response
      // kicks us), so a stream of Writes costs a probe per round trip, not one per Write.
      if (probe_due_ && probe_seq_ == probes_answered_.load(std::memory_order_acquire))
        AddProbe(ReadsOutstanding());
      break;
    }
    // Posted before the RTR arrived (an answer to the first message while Accept completes): it
    // waits for the move to RTS, which kicks us.
    if (qp_->state() == QpState::Rtr) break;
    SendWqe& wqe = qp_->send_at(next_tx_);
    if (probe_due_ && wqe.opcode != WrOpcode::Write && wqe.opcode != WrOpcode::Send) {
      if (!AddProbe(ReadsOutstanding())) break;
      continue;
    }
    if (wqe.done) {  // refused at post time (bad local key): completes in its turn
      qp_->FinishSend(next_tx_++, wqe.status);
      break;
    }
    size_t reads = ReadsOutstanding();
    if ((wqe.flags & kFence) && reads) break;  // wait for earlier Reads
    if (wqe.opcode == WrOpcode::Bind || wqe.opcode == WrOpcode::Invalidate) {
      // Nothing goes on the wire; done when its turn comes, so it completes in order.
      qp_->FinishSend(next_tx_++, WcStatus::Success);
      continue;
    }
    if (wqe.opcode == WrOpcode::Read) {
      if (reads >= params_.ord) break;  // beyond the read limit a Read waits; it does not fail
      ReadRequest request{SinkStag(next_tx_), 0, uint32_t(wqe.length), wqe.rkey, wqe.remote_addr};
      if (!AddFpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, read_msn_, 0, true), &request,
                   nullptr, nullptr, 0, 0, 0))
        break;
      read_msn_++;
      counters_.Add(Counter::TxReads);
      base::MutexLock lock(reads_mutex_);
      reads_outstanding_.push_back({next_tx_++, false});
      reads_queued_.fetch_add(1, std::memory_order_release);
      continue;
    }
    bool is_send = wqe.opcode == WrOpcode::Send;
    size_t hlen = is_send ? kDdpUntaggedHeaderLen : kDdpTaggedHeaderLen;
    uint32_t chunk = uint32_t(std::min<uint64_t>(wqe.length - wqe.sent, params_.max_ulpdu - hlen));
    bool last = wqe.sent + chunk == wqe.length;
    DdpHeader hdr = is_send ? DdpHeader::Untagged(SendOpcode(wqe.flags), send_msn_, uint32_t(wqe.sent),
                                                  last, wqe.flags & kInvalidate ? wqe.rkey : 0)
                            : DdpHeader::Tagged(RdmapOpcode::RdmaWrite, wqe.rkey, wqe.remote_addr + wqe.sent, last);
    bool is_inline = wqe.flags & kInline;
    if (!AddFpdu(hdr, nullptr, is_inline ? wqe.inline_data : nullptr, wqe.sge, wqe.num_sge,
                 wqe.sent, chunk))
      break;
    wqe.sent += chunk;
    if (last) {
      counters_.Add(is_send ? Counter::TxSends : Counter::TxWrites);
      if (is_send ? params_.confirm_sends : params_.confirm_writes) {
        base::MutexLock lock(reads_mutex_);
        unconfirmed_.push_back({next_tx_++, is_send ? send_msn_ : 0});
        unconfirmed_bytes_.fetch_add(wqe.length, std::memory_order_relaxed);
        probe_due_ = true;
      } else {
        batch_.finished[batch_.finished_count++] = next_tx_++;
      }
      if (is_send) send_msn_++;
    }
  }
  return batch_.iov_count > 0;
}

void Stream::QueueTerminate(TermCode code) {
  rx_mutex_.AssertHeld();
  NDWV_LOG(Info, "%s: sending Terminate (%s)", counters_.identity(), Describe(code));
  std::span<const uint8_t> offending(raw_hdr_, hdr_len_ ? 2 + hdr_len_ : 0);  // the segment at fault
  {
    base::MutexLock lock(tx_mutex_);
    if (terminated_) return;  // one Terminate per stream
    terminated_ = true;
    terminate_len_ = EncodeTerminate({terminate_, sizeof terminate_}, code, 1, offending,
                                     DefaultTermAttach(code));
    counters_.Add(code.layer == TermLayer::Rdmap ? Counter::TerminatesSentRdmap
                  : code.layer == TermLayer::Ddp ? Counter::TerminatesSentDdp : Counter::TerminatesSentLlp);
  }
  Kick();
}

// ----------------------------------------------------------------------------------- receive

void Stream::DriveReceive(bool poller) {
  rx_runner_.Run(rx_mutex_, [&] {
    rx_mutex_.AssertHeld();
    rx_by_poller_ = poller;
    if (!shut_) {
      ProcessRx();
      if (broken_.load()) Broken();  // the transmit side found the socket gone
    }
    return true;
  });
}

void Stream::ProcessRx() {
  rx_mutex_.AssertHeld();
  for (;;) {
    bool progress = false;
    switch (phase_) {
      case RxPhase::Header: progress = StartSegment(); break;
      case RxPhase::Payload: progress = PlacePayload(); break;
      case RxPhase::Trailer:
        progress = FinishSegment();
        // A poller that owns the socket gets control back at the end of a message, with nothing
        // read ahead: asking the socket for the next message first would cost it a system call
        // that finds nothing before it sees the completion, or the placed Write, that it waits
        // for (a Read Request read meanwhile is answered with its next post or poll). The
        // engine, woken by edges, must read until the socket is empty.
        if (progress && rx_by_poller_ && hdr_.last && staging_begin_ == staging_end_ &&
            !handoff_.engine_reads())
          return;
        break;
      case RxPhase::Dead: return;
    }
    if (!progress) return;
  }
}

ssize_t Stream::Receive(void* buffer, size_t length) {
  if (source_) [[unlikely]] return source_->Read(buffer, length);
  return recv(fd_, buffer, length, MSG_DONTWAIT);
}

bool Stream::Fill(size_t need) {
  rx_mutex_.AssertHeld();
  size_t avail = staging_end_ - staging_begin_;
  if (avail >= need) return true;
  if (staging_begin_) {
    memmove(staging_, staging_ + staging_begin_, avail);
    staging_begin_ = 0;
    staging_end_ = avail;
  }
  while (staging_end_ < need) {
    ssize_t n = Receive(staging_ + staging_end_, sizeof staging_ - staging_end_);
    int error = n < 0 ? errno : 0;  // read once, before the capture hook can change it
    if (capture_) [[unlikely]] capture_->Received(staging_ + staging_end_, n);
    if (n > 0) {
      staging_end_ += size_t(n);
      continue;
    }
    if (error == EINTR) continue;
    if (error == EAGAIN || error == EWOULDBLOCK) return false;
    if (n == 0 && phase_ == RxPhase::Header && staging_end_ == 0) {
      // The peer closed its half at a message boundary: a graceful disconnect.
      phase_ = RxPhase::Dead;
      peer_closed_ = true;
      NDWV_LOG(Debug, "%s: peer closed the stream", counters_.identity());
      NotifyObserver(&StreamObserver::OnPeerClosed);
      qp_->DeferError();  // the peer stopped: flush; the close that follows is our half
      return false;
    }
    if (NoAnswer(error)) timed_out_ = true;
    Broken();  // reset, timed out, or the stream ended inside an FPDU
    return false;
  }
  return true;
}

void Stream::Fail(TermCode code, WcStatus local_status) {
  rx_mutex_.AssertHeld();
  if (have_recv_) {
    qp_->CompleteReceive(recv_, uint32_t(recv_bytes_), local_status, false);
    have_recv_ = false;
  }
  QueueTerminate(code);
  Broken();
}

bool Stream::StartSegment() {
  rx_mutex_.AssertHeld();
  if (!Fill(4)) return false;
  const uint8_t* p = staging_ + staging_begin_;
  ulpdu_len_ = LoadBe16(p);
  hdr_len_ = SegmentHeaderLength(LoadBe16(p + 2));
  if (ulpdu_len_ < hdr_len_) {
    hdr_len_ = 0;
    counters_.Add(Counter::DropsBadDdp);
    Fail(TermCodeFor(DdpError::Truncated), WcStatus::Flushed);
    return false;
  }
  if (!Fill(2 + hdr_len_)) return false;
  p = staging_ + staging_begin_;
  memcpy(raw_hdr_, p, 2 + hdr_len_);
  staging_begin_ += 2 + hdr_len_;
  DdpError error = DecodeDdpHeader({raw_hdr_ + 2, hdr_len_}, hdr_);
  if (error != DdpError::Ok) {
    counters_.Add(Counter::DropsBadDdp);
    Fail(TermCodeFor(error), WcStatus::Flushed);
    return false;
  }
  counters_.Add(Counter::RxPackets);
  // An FPDU read whole (a small message: the usual case) is checked here in one pass, before any
  // of it is placed; a longer one as its bytes go by.
  crc_streaming_ = false;
  if (params_.crc) {
    const uint8_t* fpdu = staging_ + staging_begin_ - 2 - hdr_len_;
    size_t covered = FpduLength(ulpdu_len_) - kFpduCrcLen;  // length field, ULPDU, pad
    if (size_t(staging_ + staging_end_ - fpdu) >= covered + kFpduCrcLen) {
      if (LoadFpduCrc(fpdu + covered) != Crc32c(fpdu, covered)) {
        counters_.Add(Counter::DropsBadCrc);
        Fail(MakeTerm(LlpErrorCode::CrcError), WcStatus::Flushed);
        return false;
      }
    } else {
      crc_streaming_ = true;
      crc_ = FpduCrcBuilder();
      crc_.Add({raw_hdr_, 2 + hdr_len_});
    }
  }
  payload_len_ = ulpdu_len_ - uint32_t(hdr_len_);
  payload_done_ = 0;
  tail_len_ = std::min(payload_len_, kCheckedTail);
  phase_ = RxPhase::Payload;

  if (params_.expect_rtr) {
    if (hdr_.opcode != RdmapOpcode::RdmaWrite || payload_len_ || !hdr_.last) {
      Fail(MakeTerm(LlpErrorCode::NoMatchingRtr), WcStatus::Flushed);
      return false;
    }
    return true;
  }
  return (this->*RxHandlersFor().start)();
}

// ---- each opcode's rules, at the start of its segment (after the header and CRC checks)

bool Stream::StartWrite() {
  rx_mutex_.AssertHeld();
  if (payload_len_) {
    KeyCheck check = qp_->pd().CheckRemote(hdr_.stag, qpn_, hdr_.to, payload_len_, kRemoteWrite);
    if (check != KeyCheck::Ok) {
      Fail(RemoteProtection(check), WcStatus::Flushed);
      return false;
    }
  }
  return true;
}

bool Stream::StartReadResponse() {
  rx_mutex_.AssertHeld();
  base::MutexLock lock(reads_mutex_);
  if (reads_outstanding_.empty()) {
    Fail(MakeTerm(DdpTaggedCode::InvalidStag), WcStatus::Flushed);
    return false;
  }
  rx_read_ = reads_outstanding_.front();
  bool expected = rx_read_.probe ? (hdr_.stag & 0xFF000000u) == kProbeStagTag
                                 : hdr_.stag == SinkStag(rx_read_.position);
  if (!expected) {
    Fail(MakeTerm(DdpTaggedCode::InvalidStag), WcStatus::Flushed);
    return false;
  }
  uint64_t length = rx_read_.probe ? 0 : qp_->send_at(rx_read_.position).length;
  if (hdr_.to > length || payload_len_ > length - hdr_.to) {
    Fail(MakeTerm(DdpTaggedCode::BaseBounds), WcStatus::Flushed);
    return false;
  }
  return true;
}

bool Stream::StartReadRequest() {
  rx_mutex_.AssertHeld();
  DecodeReadRequest({raw_hdr_ + 2 + kDdpUntaggedHeaderLen, kReadRequestLen}, read_req_);
  if (payload_len_ || hdr_.msn != read_req_msn_) {
    Fail(MakeTerm(DdpUntaggedCode::InvalidMsnRange), WcStatus::Flushed);
    return false;
  }
  return true;
}

bool Stream::StartTerminate() {
  rx_mutex_.AssertHeld();
  if (payload_len_ > sizeof raw_hdr_ - 2 - hdr_len_) {
    Fail(MakeTerm(DdpUntaggedCode::MessageTooLong), WcStatus::Flushed);
    return false;
  }
  return true;
}

bool Stream::StartSend() {
  rx_mutex_.AssertHeld();
  // A Send.
  if (!IsSend(hdr_.opcode) || hdr_.msn != recv_msn_) {
    Fail(IsSend(hdr_.opcode) ? MakeTerm(DdpUntaggedCode::InvalidMsnRange)
                             : MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::UnexpectedOpcode),
         WcStatus::Flushed);
    return false;
  }
  if (!have_recv_) {
    if (hdr_.mo != 0) {
      Fail(MakeTerm(DdpUntaggedCode::InvalidMo), WcStatus::Flushed);
      return false;
    }
    if (!qp_->TakeReceive(&recv_)) {
      Fail(MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer), WcStatus::Flushed);
      return false;
    }
    have_recv_ = true;
    recv_bytes_ = 0;
  }
  if (hdr_.mo != recv_bytes_) {
    Fail(MakeTerm(DdpUntaggedCode::InvalidMo), WcStatus::Flushed);
    return false;
  }
  if (payload_len_ > recv_.length - recv_bytes_) {
    Fail(MakeTerm(DdpUntaggedCode::MessageTooLong), WcStatus::LocalLength);
    return false;
  }
  return true;
}

std::pair<uint8_t*, uint64_t> Stream::Target(uint32_t offset) {
  rx_mutex_.AssertHeld();
  return (this->*RxHandlersFor().target)(offset);
}

// ---- where each opcode's next byte goes

std::pair<uint8_t*, uint64_t> Stream::WriteTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  return {reinterpret_cast<uint8_t*>(hdr_.to) + offset, payload_len_ - offset};
}

std::pair<uint8_t*, uint64_t> Stream::ReadResponseTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  const SendWqe& read = qp_->send_at(rx_read_.position);
  return PieceAt(read.sge, read.num_sge, hdr_.to + offset);
}

std::pair<uint8_t*, uint64_t> Stream::TerminateTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  return {raw_hdr_ + 2 + hdr_len_ + offset, payload_len_ - offset};
}

std::pair<uint8_t*, uint64_t> Stream::SendTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  return PieceAt(recv_.sge, recv_.num_sge, recv_bytes_ + offset);
}

bool Stream::SgesGranted(const Sge* sge, uint32_t num_sge) const {
  for (uint32_t i = 0; i < num_sge; ++i)
    if (sge[i].length && qp_->pd().CheckLocalLocked(sge[i].lkey, sge[i].addr, sge[i].length, true) != KeyCheck::Ok)
      return false;
  return true;
}

bool Stream::LockTarget(std::shared_lock<base::SharedMutex>& placement) {
  rx_mutex_.AssertHeld();
  if (payload_len_ == 0) return true;  // zero length: no key (IB C9-88)
  return (this->*RxHandlersFor().lock_target)(placement);
}

// ---- each opcode's target checked again under the placement lock (handed back in `placement`)

bool Stream::LockWriteTarget(std::shared_lock<base::SharedMutex>& placement) {
  rx_mutex_.AssertHeld();
  // Re-checked under the lock: the region cannot be deregistered while bytes land in it.
  placement = std::shared_lock(qp_->pd().placement_lock());
  qp_->pd().placement_lock().AssertReaderHeld();  // handed back in `placement`
  if (qp_->pd().CheckRemoteLocked(hdr_.stag, qpn_, hdr_.to, payload_len_, kRemoteWrite) == KeyCheck::Ok)
    return true;
  placement.unlock();
  Fail(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::InvalidStag), WcStatus::Flushed);
  return false;
}

bool Stream::LockReadResponseTarget(std::shared_lock<base::SharedMutex>& placement) {
  rx_mutex_.AssertHeld();
  // The Read's sink buffers were checked when it was posted; the application may have
  // deregistered them since. Checked again under the lock, as a receive's are: the response
  // never lands in memory no longer granted. The Read completes with a local protection
  // error, and the sink STag we named is refused to the peer as an RNIC refuses an STag
  // invalidated under it (DDP tagged buffer error, invalid STag).
  placement = std::shared_lock(qp_->pd().placement_lock());
  qp_->pd().placement_lock().AssertReaderHeld();
  const SendWqe& read = qp_->send_at(rx_read_.position);
  if (SgesGranted(read.sge, read.num_sge)) return true;
  placement.unlock();
  NDWV_LOG(Info, "%s: a Read's buffer was deregistered before its response arrived", counters_.identity());
  qp_->FinishSend(rx_read_.position, WcStatus::LocalProtection);
  Fail(MakeTerm(DdpTaggedCode::InvalidStag), WcStatus::Flushed);
  return false;
}

bool Stream::LockTerminateTarget(std::shared_lock<base::SharedMutex>&) {
  return true;  // our own staging
}

bool Stream::LockSendTarget(std::shared_lock<base::SharedMutex>& placement) {
  rx_mutex_.AssertHeld();
  // A receive's buffers are granted by their L_Keys: checked under the lock, like a Write's
  // target, so a bad SGE or a region deregistered since the post is never written.
  placement = std::shared_lock(qp_->pd().placement_lock());
  qp_->pd().placement_lock().AssertReaderHeld();
  if (SgesGranted(recv_.sge, recv_.num_sge)) return true;
  placement.unlock();
  Fail(kTermRdmapCatastrophic, WcStatus::LocalProtection);
  return false;
}

bool Stream::PlacePayload() {
  rx_mutex_.AssertHeld();
  // All but the tail go straight from the socket into the target. The tail waits in staging
  // until the CRC has been checked: a reader polling the last byte (in-order placement) must
  // neither see an unchecked FPDU complete nor change the buffer before its CRC is computed.
  uint32_t direct = payload_len_ - tail_len_;
  while (payload_done_ < direct) {
    std::shared_lock<base::SharedMutex> placement;
    if (!LockTarget(placement)) return false;
    auto [dest, room] = Target(payload_done_);
    size_t want = size_t(std::min<uint64_t>(room, direct - payload_done_));
    size_t avail = staging_end_ - staging_begin_;
    ssize_t n;
    if (avail) {
      n = ssize_t(std::min(avail, want));
      memcpy(dest, staging_ + staging_begin_, size_t(n));
      staging_begin_ += size_t(n);
    } else {
      n = Receive(dest, want);
      int error = n < 0 ? errno : 0;
      if (capture_) [[unlikely]] capture_->Received(dest, n);
      if (error == EINTR) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) return false;
      if (n <= 0) {
        if (NoAnswer(error)) timed_out_ = true;
        Broken();
        return false;
      }
    }
    if (crc_streaming_) crc_.Add({dest, size_t(n)});
    payload_done_ += uint32_t(n);
  }
  phase_ = RxPhase::Trailer;
  return true;
}

bool Stream::FinishSegment() {
  rx_mutex_.AssertHeld();
  size_t pad = FpduPad(ulpdu_len_);
  if (!Fill(tail_len_ + pad + kFpduCrcLen)) return false;
  const uint8_t* tail = staging_ + staging_begin_;
  if (crc_streaming_) crc_.Add({tail, tail_len_ + pad});  // tail and pad as received
  if (crc_streaming_ && LoadFpduCrc(tail + tail_len_ + pad) != crc_.Finish()) {
    counters_.Add(Counter::DropsBadCrc);
    Fail(MakeTerm(LlpErrorCode::CrcError), WcStatus::Flushed);
    return false;
  }
  {
    std::shared_lock<base::SharedMutex> placement;
    if (!LockTarget(placement)) return false;
    for (uint32_t placed = 0; placed < tail_len_;) {
      auto [dest, room] = Target(payload_done_);
      uint32_t n = uint32_t(std::min<uint64_t>(room, tail_len_ - placed));
      // The segment's last byte is stored once, by itself, after all the others; memcpy promises
      // neither (glibc's AVX-512 memcpy copies 64..128 bytes as two overlapping 64-byte stores,
      // for 64 both over the whole tail). A reader polling the last byte may write it as soon as
      // it sees it (ndrpingpong's 'X' -> 'Y'); a second store would undo that write.
      bool last_piece = placed + n == tail_len_;
      memcpy(dest, tail + placed, last_piece ? n - 1 : n);
      if (last_piece)
        std::atomic_ref<uint8_t>(dest[n - 1]).store(tail[placed + n - 1], std::memory_order_release);
      placed += n;
      payload_done_ += n;
    }
  }
  staging_begin_ += tail_len_ + pad + kFpduCrcLen;
  phase_ = RxPhase::Header;

  if (params_.expect_rtr) {
    params_.expect_rtr = false;
    NotifyObserver(&StreamObserver::OnRtr);
    return true;
  }
  return (this->*RxHandlersFor().finish)();
}

// ---- each opcode's end of a segment (placed whole, CRC checked)

bool Stream::FinishWrite() {
  rx_mutex_.AssertHeld();
  counters_.Add(Counter::RxBytes, payload_len_);
  if (hdr_.last) {
    counters_.Add(Counter::RxWrites);
    if (payload_len_) PlacedPeerMessage();  // not a zero-length Write (the RTR)
  }
  return true;
}

bool Stream::FinishReadResponse() {
  rx_mutex_.AssertHeld();
  counters_.Add(Counter::RxBytes, payload_len_);
  if (hdr_.last) {
    {
      base::MutexLock lock(reads_mutex_);
      reads_outstanding_.pop_front();
      reads_queued_.fetch_sub(1, std::memory_order_release);
    }
    if (rx_read_.probe) {
      ConfirmPlaced(rx_read_.position);
      probes_answered_.fetch_add(1, std::memory_order_release);
    }
    else qp_->FinishSend(rx_read_.position, WcStatus::Success);
    Kick();  // a Read slot is free
  }
  return true;
}

bool Stream::FinishReadRequest() {
  rx_mutex_.AssertHeld();
  read_req_msn_++;
  if (read_req_.size) PlacedPeerMessage();  // a zero-length one is a peer's probe
  counters_.Add((read_req_.sink_stag & 0xFF000000u) == kProbeStagTag ? Counter::RxConfirmReads
                                                                     : Counter::RxReads);
  if (read_req_.size) {
    KeyCheck check = qp_->pd().CheckRemote(read_req_.src_stag, qpn_, read_req_.src_to,
                                           read_req_.size, kRemoteRead);
    if (check != KeyCheck::Ok) {
      Fail(RemoteProtection(check), WcStatus::Flushed);
      return false;
    }
  }
  {
    // Every Read Request takes one of the IRD slots until its response is handed to TCP,
    // zero-length ones too (an ndwv peer's probes count against its ORD). One beyond is
    // refused: a peer that sends Read Requests and reads nothing meets this bound, not
    // our memory's. The Terminate is queued after responses_mutex_ is released: it takes
    // tx_mutex_, which the transmit path holds while it takes responses_mutex_.
    size_t owed;
    {
      base::MutexLock lock(responses_mutex_);
      owed = responses_.size();
      if (owed < params_.ird) {
        responses_.push_back({read_req_.sink_stag, read_req_.sink_to, read_req_.src_stag,
                              read_req_.src_to, read_req_.size, 0});
        responses_queued_.fetch_add(1, std::memory_order_release);
      }
    }
    if (owed >= params_.ird) {
      counters_.Add(Counter::ReadsBeyondIrd);
      NDWV_LOG(Warn, "%s: Read Request beyond the IRD of %u (%zu answers not yet sent): Terminate",
               counters_.identity(), params_.ird, owed);
      Fail(MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer), WcStatus::Flushed);
      return false;
    }
  }
  // A spinning poller owns this socket (the engine does not watch it): the Response goes out
  // with whatever the poller's application posts next, or at its next poll, in one sendmsg.
  if (rx_by_poller_ && !handoff_.engine_reads()) response_owed_.store(true);
  else Kick();
  return true;
}

bool Stream::FinishTerminate() {
  rx_mutex_.AssertHeld();
  TerminateMsg term;
  DecodeTerminatePayload({raw_hdr_ + 2 + kDdpUntaggedHeaderLen, hdr_len_ - kDdpUntaggedHeaderLen + payload_len_},
                         term);
  NDWV_LOG(Info, "%s: peer sent Terminate (%s)", counters_.identity(), Describe(term.ctrl.code));
  counters_.Add(term.ctrl.code.layer == TermLayer::Rdmap ? Counter::TerminatesReceivedRdmap
                : term.ctrl.code.layer == TermLayer::Ddp ? Counter::TerminatesReceivedDdp
                                                         : Counter::TerminatesReceivedLlp);
  WcStatus status = StatusForTerminate(term.ctrl.code);
  uint8_t named = term.ddp_header.empty() ? 0xFF : LoadBe16(term.ddp_header.data()) & kRdmapOpcodeMask;
  if (named == uint8_t(RdmapOpcode::ReadResponse)) {
    // Our answer to the peer's Read was refused (its sink buffer went away): no request of
    // ours is at fault; the connection ends and they are flushed.
    Broken();
    return false;
  }
  bool read_refused = named == uint8_t(RdmapOpcode::ReadRequest);
  std::optional<uint64_t> read;
  {
    base::MutexLock lock(reads_mutex_);
    for (const OutstandingRead& r : reads_outstanding_)
      if (!r.probe) {
        read = r.position;
        break;
      }
  }
  if (read_refused && read) qp_->FinishSend(*read, status);
  else FailUnconfirmed(term, status);
  Broken();
  return false;
}

bool Stream::FinishSend() {
  rx_mutex_.AssertHeld();
  // A Send segment.
  recv_bytes_ += payload_len_;
  counters_.Add(Counter::RxBytes, payload_len_);
  if (hdr_.last) {
    // A Send with Invalidate unbinds the window it names before its receive completes; a key
    // that names no window bound to this stream ends the stream (RFC 5040 §7.2).
    if (CarriesInvalidateStag(hdr_.opcode) && !qp_->InvalidateRemote(hdr_.inv_stag)) {
      Fail(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::CannotInvalidate),
           WcStatus::LocalOp);
      return false;
    }
    counters_.Add(Counter::RxSends);
    PlacedPeerMessage();
    have_recv_ = false;
    recv_msn_++;
    qp_->CompleteReceive(recv_, uint32_t(recv_bytes_), WcStatus::Success, IsSolicited(hdr_.opcode));
  }
  return true;
}

// ---- the table

// One row per RDMAP opcode, in wire::kRdmapOpcodes' order, no null entry; hdr_.opcode is always one of them
// (DecodeDdpHeader refuses any other before it sets one, and only a decoded segment gets past
// StartSegment). A Read Request carries no payload (StartReadRequest refuses any), so its
// target and its lock are never asked for: its row names the Send's.
const Stream::RxHandlers Stream::kRxHandlers[] = {
    // RDMA Write
    {&Stream::StartWrite, &Stream::WriteTarget, &Stream::LockWriteTarget, &Stream::FinishWrite},
    // RDMA Read Request
    {&Stream::StartReadRequest, &Stream::SendTarget, &Stream::LockSendTarget,
     &Stream::FinishReadRequest},
    // RDMA Read Response
    {&Stream::StartReadResponse, &Stream::ReadResponseTarget, &Stream::LockReadResponseTarget,
     &Stream::FinishReadResponse},
    // Send, Send with Invalidate, Send with Solicited Event, Send with SE and Invalidate
    {&Stream::StartSend, &Stream::SendTarget, &Stream::LockSendTarget, &Stream::FinishSend},
    {&Stream::StartSend, &Stream::SendTarget, &Stream::LockSendTarget, &Stream::FinishSend},
    {&Stream::StartSend, &Stream::SendTarget, &Stream::LockSendTarget, &Stream::FinishSend},
    {&Stream::StartSend, &Stream::SendTarget, &Stream::LockSendTarget, &Stream::FinishSend},
    // Terminate
    {&Stream::StartTerminate, &Stream::TerminateTarget, &Stream::LockTerminateTarget,
     &Stream::FinishTerminate},
};
const Stream::RxHandlers& Stream::RxHandlersFor() const {
  static_assert(std::size(kRxHandlers) == kRdmapOpcodeCount);
  rx_mutex_.AssertHeld();
  return kRxHandlers[uint8_t(hdr_.opcode)];
}

}  // namespace ndwv::dev::iwarp
