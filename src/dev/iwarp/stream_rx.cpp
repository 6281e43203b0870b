// The receive side of an iWARP stream (Stream, stream.h): a resumable state machine over the
// socket's bytes (header, payload, trailer), each segment's checks, placement and completion by
// its opcode (kRxHandlers).
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "base/log.h"
#include "dev/iwarp/stream.h"
#include "dev/iwarp/stream_internal.h"
#include "wire/bytes.h"
#include "wire/crc.h"
#include "wire/mpa.h"

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;
using namespace stream_internal;

namespace {

// Payload bytes at the end of each FPDU placed only after its CRC checked out. At least 1: the
// tail's placement is what stores the last byte alone and last (FinishSegment).
constexpr uint32_t kCheckedTail = 64;
static_assert(kCheckedTail >= 1);

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

void Stream::PlacedPeerMessage() {
  if (rx_by_poller_) peer_message_by_poller_.store(true, std::memory_order_relaxed);
}

void Stream::QueueTerminate(TermCode code) {
  rx_mutex_.AssertHeld();
  NDWV_LOG(Info, "%s: sending Terminate (%s)", counters_.identity(), Describe(code));
  std::span<const uint8_t> offending(raw_hdr_, hdr_len_ ? 2 + hdr_len_ : 0);  // the segment at fault
  SendTerminate(code, offending);
}

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
