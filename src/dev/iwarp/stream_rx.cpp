// The receive side of an iWARP stream (Stream, stream.h): a resumable state machine over the
// socket's bytes (header, payload, trailer), each segment's checks, placement and completion by
// its opcode (kRxHandlers).
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <optional>

#include "base/log.h"
#include "base/object_pool.h"
#include "base/thread_loan.h"
#include "dev/device.h"
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
  if (rx_.by_poller) peer_message_by_poller_.store(true, std::memory_order_relaxed);
}

void Stream::QueueTerminate(TermCode code) {
  rx_mutex_.AssertHeld();
  NDWV_LOG(Info, "%s: sending Terminate (%s)", counters_.Identity().c_str(), Describe(code));
  std::span<const uint8_t> offending(rx_.raw_hdr, rx_.hdr_len ? 2 + rx_.hdr_len : 0);  // the segment at fault
  SendTerminate(code, offending);
}

void Stream::DriveReceive(bool poller) {
  rx_called_.store(true);  // before the runner: a busy one runs again
  const bool engine = !poller && Engine::Get().OnEngineThread();
  bool turn_ended = false;
  rx_runner_.Run(rx_mutex_, [&] {
    rx_mutex_.AssertHeld();
    rx_.by_poller = poller;
    rx_.turn_left = engine ? kEngineSegments : UINT32_MAX;
    if (!shut_) {
      StagingInUse staging(*this);
      ProcessRx();
      if (broken_.load()) Broken();  // the transmit side found the socket gone
    }
    turn_ended = rx_.turn_left == 0 && rx_.phase != RxPhase::Dead;
    return true;
  });
  if (turn_ended) Engine::Get().CallAgain(weak_from_this(), EPOLLIN);
}

Stream::StagingInUse::StagingInUse(Stream& stream) : stream_(stream) {
  stream.rx_.staging = base::ThreadLoan<RxStaging>::BorrowOr(stream.rx_.own_staging);
}

Stream::StagingInUse::~StagingInUse() {
  stream_.rx_mutex_.AssertHeld();
  RxState& rx = stream_.rx_;
  RxStaging* used = std::exchange(rx.staging, nullptr);
  if (!base::ThreadLoan<RxStaging>::IsLent(used)) return;  // the stream's own
  const size_t left = rx.staging_end - rx.staging_begin;
  if (left) {
    rx.own_staging = base::MakePoolUnique<RxStaging>();
    memcpy(rx.own_staging->bytes, used->bytes + rx.staging_begin, left);
  }
  rx.staging_begin = 0;
  rx.staging_end = left;
  base::ThreadLoan<RxStaging>::Return(used);
}

void Stream::ProcessRx() {
  rx_mutex_.AssertHeld();
  for (;;) {
    bool progress = false;
    switch (rx_.phase) {
      case RxPhase::Header: progress = StartSegment(); break;
      case RxPhase::Payload: progress = PlacePayload(); break;
      case RxPhase::Trailer:
        progress = FinishSegment();
        // A poller that owns the socket gets control back at the end of a message, with nothing
        // read ahead: asking the socket for the next message first would cost it a system call
        // that finds nothing before it sees the completion, or the placed Write, that it waits
        // for (a Read Request read meanwhile is answered with its next post or poll). The
        // engine, woken by edges, must read until the socket is empty.
        if (progress && rx_.by_poller && rx_.hdr.last && rx_.staging_begin == rx_.staging_end &&
            !handoff_.engine_reads())
          return;
        if (progress && --rx_.turn_left == 0) return;  // the engine's share of a turn (DriveReceive)
        break;
      case RxPhase::Dead: return;
    }
    if (!progress) return;
  }
}

ssize_t Stream::Receive(void* buffer, size_t length) {
  rx_mutex_.AssertHeld();
  if (source_) [[unlikely]] return source_->Read(buffer, length);
  if (rx_.socket_emptied && !rx_called_.load()) {  // nothing can have come since (rx_called_)
    errno = EAGAIN;
    return -1;
  }
  rx_called_.store(false);  // before the read: a call from now on may be for bytes it misses
  ssize_t n = recv(fd_, buffer, length, MSG_DONTWAIT);
  rx_.socket_emptied = n > 0 && size_t(n) < length && !rx_to_end_.load();
  return n;
}

bool Stream::Fill(size_t need) {
  rx_mutex_.AssertHeld();
  size_t avail = rx_.staging_end - rx_.staging_begin;
  if (avail >= need) return true;
  if (rx_.staging_begin) {
    memmove(rx_.staging->bytes, rx_.staging->bytes + rx_.staging_begin, avail);
    rx_.staging_begin = 0;
    rx_.staging_end = avail;
  }
  while (rx_.staging_end < need) {
    ssize_t n = Receive(rx_.staging->bytes + rx_.staging_end, sizeof rx_.staging->bytes - rx_.staging_end);
    int error = n < 0 ? errno : 0;  // read once, before the capture hook can change it
    if (capture_) [[unlikely]] capture_->Received(rx_.staging->bytes + rx_.staging_end, n);
    if (n > 0) {
      rx_.staging_end += size_t(n);
      continue;
    }
    if (error == EINTR) continue;
    if (error == EAGAIN || error == EWOULDBLOCK) return false;
    // The end of the stream at a message boundary is the peer's graceful close, unless the
    // transmit side already found the socket failed: its send took the error (a reset, or
    // ETIMEDOUT), and a failed socket reads as ended.
    if (n == 0 && rx_.phase == RxPhase::Header && rx_.staging_end == 0 && !broken_.load()) {
      // The peer closed its half at a message boundary: a graceful disconnect.
      rx_.phase = RxPhase::Dead;
      rx_.peer_closed = true;
      NDWV_LOG(Debug, "%s: peer closed the stream", counters_.Identity().c_str());
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
  if (rx_.have_recv) {
    qp_->CompleteReceive(rx_.recv, uint32_t(rx_.recv_bytes), local_status, false);
    rx_.have_recv = false;
  }
  QueueTerminate(code);
  Broken();
}

bool Stream::StartSegment() {
  rx_mutex_.AssertHeld();
  if (!Fill(4)) return false;
  const uint8_t* p = rx_.staging->bytes + rx_.staging_begin;
  rx_.ulpdu_len = LoadBe16(p);
  rx_.hdr_len = SegmentHeaderLength(LoadBe16(p + 2));
  if (rx_.ulpdu_len < rx_.hdr_len) {
    rx_.hdr_len = 0;
    counters_.Add(Counter::DropsBadDdp);
    Fail(TermCodeFor(DdpError::Truncated), WcStatus::Flushed);
    return false;
  }
  if (!Fill(2 + rx_.hdr_len)) return false;
  p = rx_.staging->bytes + rx_.staging_begin;
  memcpy(rx_.raw_hdr, p, 2 + rx_.hdr_len);
  rx_.staging_begin += 2 + rx_.hdr_len;
  DdpError error = DecodeDdpHeader({rx_.raw_hdr + 2, rx_.hdr_len}, rx_.hdr);
  if (error != DdpError::Ok) {
    counters_.Add(Counter::DropsBadDdp);
    Fail(TermCodeFor(error), WcStatus::Flushed);
    return false;
  }
  counters_.Add(Counter::RxPackets);
  // An FPDU read whole (a small message: the usual case) is checked here in one pass, before any
  // of it is placed; a longer one as its bytes go by.
  rx_.crc_streaming = false;
  if (params_.crc) {
    const uint8_t* fpdu = rx_.staging->bytes + rx_.staging_begin - 2 - rx_.hdr_len;
    size_t covered = FpduLength(rx_.ulpdu_len) - kFpduCrcLen;  // length field, ULPDU, pad
    if (size_t(rx_.staging->bytes + rx_.staging_end - fpdu) >= covered + kFpduCrcLen) {
      if (LoadFpduCrc(fpdu + covered) != Crc32c(fpdu, covered)) {
        counters_.Add(Counter::DropsBadCrc);
        Fail(MakeTerm(LlpErrorCode::CrcError), WcStatus::Flushed);
        return false;
      }
    } else {
      rx_.crc_streaming = true;
      rx_.crc = FpduCrcBuilder();
      rx_.crc.Add({rx_.raw_hdr, 2 + rx_.hdr_len});
    }
  }
  rx_.payload_len = rx_.ulpdu_len - uint32_t(rx_.hdr_len);
  rx_.payload_done = 0;
  rx_.tail_len = std::min(rx_.payload_len, kCheckedTail);
  rx_.phase = RxPhase::Payload;

  if (params_.expect_rtr) {
    if (rx_.hdr.opcode != RdmapOpcode::RdmaWrite || rx_.payload_len || !rx_.hdr.last) {
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
  if (rx_.payload_len) {
    KeyCheck check = qp_->pd().CheckRemote(rx_.hdr.stag, qpn_, rx_.hdr.to, rx_.payload_len, kRemoteWrite);
    if (check != KeyCheck::Ok) {
      Fail(RemoteProtection(check), WcStatus::Flushed);
      return false;
    }
  }
  return true;
}

bool Stream::StartReadResponse() {
  rx_mutex_.AssertHeld();
  bool outstanding;
  {
    // Not held across Fail: its Terminate takes tx_mutex_, under which FillBatch takes this one.
    // The oldest Read stays ours to read: only this receive path retires it.
    base::MutexLock lock(reads_mutex_);
    outstanding = !reads_outstanding_.empty();
    if (outstanding) rx_.read = reads_outstanding_.front();
  }
  if (!outstanding) {
    Fail(MakeTerm(DdpTaggedCode::InvalidStag), WcStatus::Flushed);
    return false;
  }
  // Each Read, probes included, named a sink STag of its own: an answer replayed from an earlier
  // probe does not confirm what the outstanding one was sent for.
  if (rx_.hdr.stag != rx_.read.sink_stag) {
    Fail(MakeTerm(DdpTaggedCode::InvalidStag), WcStatus::Flushed);
    return false;
  }
  // A response fills the sink from its start, in order, to its end: a segment anywhere else, or
  // a last one that leaves bytes out, would complete a Read whose memory was never written.
  uint64_t length = rx_.read.probe ? 0 : qp_->send_at(rx_.read.position).length;
  if (rx_.hdr.to != rx_.response_bytes || rx_.payload_len > length - rx_.hdr.to ||
      (rx_.hdr.last && rx_.hdr.to + rx_.payload_len != length)) {
    Fail(MakeTerm(DdpTaggedCode::BaseBounds), WcStatus::Flushed);
    return false;
  }
  return true;
}

bool Stream::StartReadRequest() {
  rx_mutex_.AssertHeld();
  DecodeReadRequest({rx_.raw_hdr + 2 + kDdpUntaggedHeaderLen, kReadRequestLen}, rx_.read_req);
  if (rx_.hdr.msn != rx_.read_req_msn) {
    Fail(MakeTerm(DdpUntaggedCode::InvalidMsnRange), WcStatus::Flushed);
    return false;
  }
  // One whole segment: the Read Request queue's buffer holds exactly its header, so a segment
  // elsewhere in the message, one announcing more to follow, or one with bytes after the header
  // has no room.
  if (rx_.hdr.mo != 0 || !rx_.hdr.last || rx_.payload_len) {
    Fail(MakeTerm(rx_.hdr.mo != 0 ? DdpUntaggedCode::InvalidMo : DdpUntaggedCode::MessageTooLong),
         WcStatus::Flushed);
    return false;
  }
  return true;
}

bool Stream::StartTerminate() {
  rx_mutex_.AssertHeld();
  // The one message of the Terminate queue: MSN 1, MO 0, whole in one segment, no longer than
  // the headers RFC 5040 lets it name.
  if (rx_.hdr.msn != 1 || rx_.hdr.mo != 0 || !rx_.hdr.last ||
      rx_.payload_len > sizeof rx_.raw_hdr - 2 - rx_.hdr_len) {
    DropBadTerminate("its DDP header");
    return false;
  }
  return true;
}

bool Stream::StartSend() {
  rx_mutex_.AssertHeld();
  // A Send.
  if (!IsSend(rx_.hdr.opcode) || rx_.hdr.msn != rx_.recv_msn) {
    Fail(IsSend(rx_.hdr.opcode) ? MakeTerm(DdpUntaggedCode::InvalidMsnRange)
                                : MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::UnexpectedOpcode),
         WcStatus::Flushed);
    return false;
  }
  if (!rx_.have_recv) {
    if (rx_.hdr.mo != 0) {
      Fail(MakeTerm(DdpUntaggedCode::InvalidMo), WcStatus::Flushed);
      return false;
    }
    if (!qp_->TakeReceive(&rx_.recv)) {
      Fail(MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer), WcStatus::Flushed);
      return false;
    }
    rx_.have_recv = true;
    rx_.recv_bytes = 0;
    rx_.recv_opcode = rx_.hdr.opcode;
    rx_.recv_inv_stag = rx_.hdr.inv_stag;
  }
  // Every segment of a message carries its opcode: a Send that turns solicited, or into a Send
  // with Invalidate, on its last segment would have its completion decided by that one alone.
  if (rx_.hdr.opcode != rx_.recv_opcode) {
    Fail(MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::UnexpectedOpcode), WcStatus::Flushed);
    return false;
  }
  // So does a Send with Invalidate its key: which window it unbinds is not the last segment's say.
  if (CarriesInvalidateStag(rx_.hdr.opcode) && rx_.hdr.inv_stag != rx_.recv_inv_stag) {
    Fail(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::CannotInvalidate), WcStatus::Flushed);
    return false;
  }
  if (rx_.hdr.mo != rx_.recv_bytes) {
    Fail(MakeTerm(DdpUntaggedCode::InvalidMo), WcStatus::Flushed);
    return false;
  }
  if (rx_.payload_len > rx_.recv.length - rx_.recv_bytes) {
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
  return {reinterpret_cast<uint8_t*>(rx_.hdr.to) + offset, rx_.payload_len - offset};
}

std::pair<uint8_t*, uint64_t> Stream::ReadResponseTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  const SendWqe& read = qp_->send_at(rx_.read.position);
  return PieceAt(read.sge, read.num_sge, rx_.hdr.to + offset);
}

std::pair<uint8_t*, uint64_t> Stream::TerminateTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  return {rx_.raw_hdr + 2 + rx_.hdr_len + offset, rx_.payload_len - offset};
}

std::pair<uint8_t*, uint64_t> Stream::SendTarget(uint32_t offset) {
  rx_mutex_.AssertHeld();
  return PieceAt(rx_.recv.sge, rx_.recv.num_sge, rx_.recv_bytes + offset);
}

bool Stream::SgesGranted(const Sge* sge, uint32_t num_sge) const {
  for (uint32_t i = 0; i < num_sge; ++i)
    if (sge[i].length && qp_->pd().CheckLocalLocked(sge[i].lkey, sge[i].addr, sge[i].length, true) != KeyCheck::Ok)
      return false;
  return true;
}

bool Stream::LockTarget(std::shared_lock<base::SharedMutex>& placement) {
  rx_mutex_.AssertHeld();
  if (rx_.payload_len == 0) return true;  // zero length: no key (IB C9-88)
  return (this->*RxHandlersFor().lock_target)(placement);
}

// ---- each opcode's target checked again under the placement lock (handed back in `placement`)

bool Stream::LockWriteTarget(std::shared_lock<base::SharedMutex>& placement) {
  rx_mutex_.AssertHeld();
  // Re-checked under the lock: the region cannot be deregistered while bytes land in it.
  placement = std::shared_lock(qp_->pd().placement_lock());
  qp_->pd().placement_lock().AssertReaderHeld();  // handed back in `placement`
  if (qp_->pd().CheckRemoteLocked(rx_.hdr.stag, qpn_, rx_.hdr.to, rx_.payload_len, kRemoteWrite) == KeyCheck::Ok)
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
  const SendWqe& read = qp_->send_at(rx_.read.position);
  if (SgesGranted(read.sge, read.num_sge)) return true;
  placement.unlock();
  NDWV_LOG(Info, "%s: a Read's buffer was deregistered before its response arrived", counters_.Identity().c_str());
  qp_->FinishSend(rx_.read.position, WcStatus::LocalProtection);
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
  if (SgesGranted(rx_.recv.sge, rx_.recv.num_sge)) return true;
  placement.unlock();
  Fail(kTermRdmapCatastrophic, WcStatus::LocalProtection);
  return false;
}

bool Stream::PlacePayload() {
  rx_mutex_.AssertHeld();
  // All but the tail go straight from the socket into the target. The tail waits in staging
  // until the CRC has been checked: a reader polling the last byte (in-order placement) must
  // neither see an unchecked FPDU complete nor change the buffer before its CRC is computed.
  uint32_t direct = rx_.payload_len - rx_.tail_len;
  while (rx_.payload_done < direct) {
    std::shared_lock<base::SharedMutex> placement;
    if (!LockTarget(placement)) return false;
    auto [dest, room] = Target(rx_.payload_done);
    size_t want = size_t(std::min<uint64_t>(room, direct - rx_.payload_done));
    size_t avail = rx_.staging_end - rx_.staging_begin;
    ssize_t n;
    if (avail) {
      n = ssize_t(std::min(avail, want));
      memcpy(dest, rx_.staging->bytes + rx_.staging_begin, size_t(n));
      rx_.staging_begin += size_t(n);
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
    if (rx_.crc_streaming) rx_.crc.Add({dest, size_t(n)});
    rx_.payload_done += uint32_t(n);
  }
  rx_.phase = RxPhase::Trailer;
  return true;
}

bool Stream::FinishSegment() {
  rx_mutex_.AssertHeld();
  size_t pad = FpduPad(rx_.ulpdu_len);
  if (!Fill(rx_.tail_len + pad + kFpduCrcLen)) return false;
  const uint8_t* tail = rx_.staging->bytes + rx_.staging_begin;
  if (rx_.crc_streaming) rx_.crc.Add({tail, rx_.tail_len + pad});  // tail and pad as received
  if (rx_.crc_streaming && LoadFpduCrc(tail + rx_.tail_len + pad) != rx_.crc.Finish()) {
    counters_.Add(Counter::DropsBadCrc);
    Fail(MakeTerm(LlpErrorCode::CrcError), WcStatus::Flushed);
    return false;
  }
  {
    std::shared_lock<base::SharedMutex> placement;
    if (!LockTarget(placement)) return false;
    for (uint32_t placed = 0; placed < rx_.tail_len;) {
      auto [dest, room] = Target(rx_.payload_done);
      uint32_t n = uint32_t(std::min<uint64_t>(room, rx_.tail_len - placed));
      // The segment's last byte is stored once, by itself, after all the others; memcpy promises
      // neither (glibc's AVX-512 memcpy copies 64..128 bytes as two overlapping 64-byte stores,
      // for 64 both over the whole tail). A reader polling the last byte may write it as soon as
      // it sees it (ndrpingpong's 'X' -> 'Y'); a second store would undo that write.
      bool last_piece = placed + n == rx_.tail_len;
      memcpy(dest, tail + placed, last_piece ? n - 1 : n);
      if (last_piece)
        std::atomic_ref<uint8_t>(dest[n - 1]).store(tail[placed + n - 1], std::memory_order_release);
      placed += n;
      rx_.payload_done += n;
    }
  }
  rx_.staging_begin += rx_.tail_len + pad + kFpduCrcLen;
  rx_.phase = RxPhase::Header;

  if (params_.expect_rtr) {
    params_.expect_rtr = false;
    Established();  // what was posted meanwhile goes now
    NotifyObserver(&StreamObserver::OnRtr);
    return true;
  }
  return (this->*RxHandlersFor().finish)();
}

// ---- each opcode's end of a segment (placed whole, CRC checked)

bool Stream::FinishWrite() {
  rx_mutex_.AssertHeld();
  counters_.Add(Counter::RxBytes, rx_.payload_len);
  if (rx_.hdr.last) {
    counters_.Add(Counter::RxWrites);
    if (rx_.payload_len) PlacedPeerMessage();  // not a zero-length Write (the RTR)
  }
  return true;
}

bool Stream::FinishReadResponse() {
  rx_mutex_.AssertHeld();
  counters_.Add(Counter::RxBytes, rx_.payload_len);
  rx_.response_bytes += rx_.payload_len;
  if (rx_.hdr.last) {
    rx_.response_bytes = 0;
    {
      base::MutexLock lock(reads_mutex_);
      reads_outstanding_.pop_front();
      reads_queued_.fetch_sub(1, std::memory_order_release);
    }
    if (rx_.read.probe) {
      ConfirmPlaced(rx_.read.position);
      probes_answered_.fetch_add(1, std::memory_order_release);
    }
    else qp_->FinishSend(rx_.read.position, WcStatus::Success);
    Kick();  // a Read slot is free
  }
  return true;
}

bool Stream::FinishReadRequest() {
  rx_mutex_.AssertHeld();
  rx_.read_req_msn++;
  if (rx_.read_req.size) PlacedPeerMessage();  // a zero-length one is a peer's probe
  counters_.Add((rx_.read_req.sink_stag & 0xFF000000u) == kProbeStagTag ? Counter::RxConfirmReads
                                                                         : Counter::RxReads);
  // Checked before any key is looked at: at most what one work request moves, and source and
  // sink ranges within the 64-bit offsets (a wrapping sink would wrap the Response's tagged
  // offsets). A zero-length Read names no memory: its keys are not checked (RFC 5040).
  if (rx_.read_req.size > kMaxTransferLength) {
    Fail(MakeTerm(RdmapErrorType::RemoteOperation, RdmapErrorCode::Unspecified), WcStatus::Flushed);
    return false;
  }
  const uint64_t last_byte = rx_.read_req.size ? rx_.read_req.size - 1 : 0;  // offset in the range
  if (rx_.read_req.src_to > UINT64_MAX - last_byte || rx_.read_req.sink_to > UINT64_MAX - last_byte) {
    Fail(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::ToWrap), WcStatus::Flushed);
    return false;
  }
  if (rx_.read_req.size && !reads_granted_) {  // where the Accept or Connect granted none
    counters_.Add(Counter::ReadsBeyondIrd);
    Fail(MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer), WcStatus::Flushed);
    return false;
  }
  if (rx_.read_req.size) {
    KeyCheck check = qp_->pd().CheckRemote(rx_.read_req.src_stag, qpn_, rx_.read_req.src_to,
                                           rx_.read_req.size, kRemoteRead);
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
        responses_.push_back({rx_.read_req.sink_stag, rx_.read_req.sink_to, rx_.read_req.src_stag,
                              rx_.read_req.src_to, rx_.read_req.size, 0});
        responses_queued_.fetch_add(1, std::memory_order_release);
      }
    }
    if (owed >= params_.ird) {
      counters_.Add(Counter::ReadsBeyondIrd);
      NDWV_LOG(Warn, "%s: Read Request beyond the IRD of %u (%zu answers not yet sent): Terminate",
               counters_.Identity().c_str(), params_.ird, owed);
      Fail(MakeTerm(DdpUntaggedCode::InvalidMsnNoBuffer), WcStatus::Flushed);
      return false;
    }
  }
  // A spinning poller owns this socket (the engine does not watch it): the Response goes out
  // with whatever the poller's application posts next, or at its next poll, in one sendmsg.
  if (rx_.by_poller && !handoff_.engine_reads()) response_owed_.store(true);
  else Kick();
  return true;
}

void Stream::DropBadTerminate(const char* what) {
  rx_mutex_.AssertHeld();
  // A Terminate is never answered with one; nor can it be trusted to name a request of ours:
  // they are flushed.
  NDWV_LOG(Info, "%s: peer sent a malformed Terminate (%s): the stream ends", counters_.Identity().c_str(), what);
  counters_.Add(Counter::DropsBadDdp);
  Broken();
}

bool Stream::FinishTerminate() {
  rx_mutex_.AssertHeld();
  TerminateMsg term;
  const size_t length = rx_.hdr_len - kDdpUntaggedHeaderLen + rx_.payload_len;
  if (DecodeTerminatePayload({rx_.raw_hdr + 2 + kDdpUntaggedHeaderLen, length}, term) != DdpError::Ok) {
    DropBadTerminate("the headers its flags announce are missing");
    return false;
  }
  if (term.length() != length) {
    DropBadTerminate("it carries bytes its flags do not announce");
    return false;
  }
  NDWV_LOG(Info, "%s: peer sent Terminate (%s)", counters_.Identity().c_str(), Describe(term.ctrl.code));
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
  rx_.recv_bytes += rx_.payload_len;
  counters_.Add(Counter::RxBytes, rx_.payload_len);
  if (rx_.hdr.last) {
    // A Send with Invalidate unbinds the window it names before its receive completes; a key
    // that names no window bound to this stream ends the stream (RFC 5040 §7.2).
    if (CarriesInvalidateStag(rx_.hdr.opcode) && !qp_->InvalidateRemote(rx_.hdr.inv_stag)) {
      Fail(MakeTerm(RdmapErrorType::RemoteProtection, RdmapErrorCode::CannotInvalidate),
           WcStatus::LocalOp);
      return false;
    }
    counters_.Add(Counter::RxSends);
    PlacedPeerMessage();
    rx_.have_recv = false;
    rx_.recv_msn++;
    qp_->CompleteReceive(rx_.recv, uint32_t(rx_.recv_bytes), WcStatus::Success, IsSolicited(rx_.hdr.opcode));
  }
  return true;
}

// ---- the table

// One row per RDMAP opcode, in wire::kRdmapOpcodes' order, no null entry; rx_.hdr.opcode is
// always one of them (DecodeDdpHeader refuses any other before it sets one, and only a decoded
// segment gets past StartSegment). A Read Request carries no payload (StartReadRequest refuses
// any), so its target and its lock are never asked for: its row names the Send's.
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
  return kRxHandlers[uint8_t(rx_.hdr.opcode)];
}

}  // namespace ndwv::dev::iwarp
