// The transmit side of an iWARP stream (Stream, stream.h): requests and Read Responses into
// batches of FPDUs, out through send/sendmsg; what the peer has confirmed placed.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "base/log.h"
#include "base/object_pool.h"
#include "base/thread_loan.h"
#include "dev/address.h"
#include "dev/iwarp/stream.h"
#include "dev/iwarp/stream_internal.h"
#include "wire/bytes.h"
#include "wire/crc.h"
#include "wire/mpa.h"

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;
using namespace stream_internal;

namespace {

// The RDMAP opcode of a Send with these send flags.
RdmapOpcode SendOpcode(uint32_t flags) {
  bool solicited = flags & kSolicited, invalidate = flags & kInvalidate;
  return invalidate ? (solicited ? RdmapOpcode::SendSolicitedInvalidate : RdmapOpcode::SendInvalidate)
                    : (solicited ? RdmapOpcode::SendSolicited : RdmapOpcode::Send);
}

}  // namespace

// ---- the batch a transmit step uses (stream.h, BatchInUse)

Stream::BatchInUse::BatchInUse(Stream& stream) : stream_(stream) {
  stream.tx_.batch = base::ThreadLoan<TxBatch>::BorrowOr(stream.tx_.own_batch);
}

Stream::BatchInUse::~BatchInUse() {
  stream_.tx_mutex_.AssertHeld();
  TxState& tx = stream_.tx_;
  TxBatch* used = std::exchange(tx.batch, nullptr);
  if (!base::ThreadLoan<TxBatch>::IsLent(used)) return;  // the stream's own
  if (!used->empty()) {
    // The socket did not take it all: the rest moves to the stream, the iovecs into the batch's
    // own bytes (headers, trailers, gathered pieces) with it.
    tx.own_batch = base::MakePoolUnique<TxBatch>(*used);
    TxBatch* own = tx.own_batch.get();
    const auto* from = reinterpret_cast<const uint8_t*>(used);
    for (int i = own->iov_done; i < own->iov_count; ++i) {
      auto* base = static_cast<uint8_t*>(own->iov[i].iov_base);
      if (base >= from && base < from + sizeof(TxBatch))
        own->iov[i].iov_base = reinterpret_cast<uint8_t*>(own) + (base - from);
    }
    used->Clear();
  }
  base::ThreadLoan<TxBatch>::Return(used);
}

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
  else if (tx_stalled_.load(std::memory_order_relaxed) && !writable_watched_.load(std::memory_order_relaxed))
    WatchWritable();
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
    tx_.rtr_pending = true;
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
    tx_.close_send = true;
  }
  Kick();
}

void Stream::ProcessTx() {
  tx_mutex_.AssertHeld();
  BatchInUse batch(*this);
  // What waited is sent below: taking the count with an exchange makes the requests posted
  // before it visible here.
  if (deferred_bytes_.load(std::memory_order_relaxed)) deferred_bytes_.exchange(0, std::memory_order_acq_rel);
  for (;;) {
    if (!tx_.batch->empty() && !FlushBatch()) return;
    if (tx_.send_closed || broken_) return;
    if (!FillBatch()) {
      if (tx_.close_send) {
        ReleasePort();           // the FIN may leave a TIME_WAIT behind
        shutdown(fd_, SHUT_WR);  // FIN after the last queued byte
        if (capture_) [[unlikely]] capture_->SentFin();
        tx_.send_closed = true;
      }
      return;
    }
  }
}

bool Stream::SourcesGranted() const {
  tx_mutex_.AssertHeld();
  for (int i = 0; i < tx_.batch->source_count; ++i) {
    const Source& s = tx_.batch->sources[i];
    if (qp_->pd().CheckRemoteLocked(s.stag, qpn_, s.addr, s.length, kRemoteRead) != KeyCheck::Ok) return false;
  }
  return true;
}

bool Stream::FlushBatch() {
  tx_mutex_.AssertHeld();
  // Memory read for the peer is re-checked whenever bytes leave, with deregistration held off, so
  // a region deregistered (and freed) after the Read Request was checked is never sent.
  std::shared_lock<base::SharedMutex> sources;
  if (tx_.batch->source_count) {
    sources = std::shared_lock(qp_->pd().placement_lock());
    qp_->pd().placement_lock().AssertReaderHeld();  // the analysis does not see std::shared_lock
    if (!SourcesGranted()) {
      broken_ = true;  // the Response cannot be completed: the connection ends
      return false;
    }
  }
  while (!tx_.batch->empty()) {
    msghdr msg{};
    msg.msg_iov = tx_.batch->iov + tx_.batch->iov_done;
    msg.msg_iovlen = std::min(tx_.batch->iov_count - tx_.batch->iov_done, IOV_MAX);
    // What is small leaves from one buffer through send(), which the kernel takes faster than
    // sendmsg (no message header or iovec array to copy in: ~0.2 us a call on the test VM).
    // A small FPDU is built whole already; a few small ones are gathered here.
    const uint8_t* flat = msg.msg_iovlen == 1 ? static_cast<const uint8_t*>(msg.msg_iov[0].iov_base) : nullptr;
    size_t flat_len = msg.msg_iovlen == 1 ? msg.msg_iov[0].iov_len : 0;
    if (!flat && msg.msg_iovlen <= 8) {
      for (size_t i = 0; i < msg.msg_iovlen; ++i) flat_len += msg.msg_iov[i].iov_len;
      if (flat_len <= sizeof tx_.batch->gathered) {
        for (size_t i = 0, at = 0; i < msg.msg_iovlen; at += msg.msg_iov[i++].iov_len)
          memcpy(tx_.batch->gathered + at, msg.msg_iov[i].iov_base, msg.msg_iov[i].iov_len);
        flat = tx_.batch->gathered;
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
      iovec& v = tx_.batch->iov[tx_.batch->iov_done];
      size_t step = std::min<size_t>(v.iov_len, size_t(n));
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + step;
      v.iov_len -= step;
      n -= step;
      if (v.iov_len == 0) tx_.batch->iov_done++;
    }
    while (tx_.batch->iov_done < tx_.batch->iov_count && tx_.batch->iov[tx_.batch->iov_done].iov_len == 0)
      tx_.batch->iov_done++;
  }
  tx_stalled_.store(false, std::memory_order_relaxed);
  if (tx_.batch->terminate) tx_.terminate_written = true;
  // Completing takes the send queue's lock, under which an Invalidate posted meanwhile takes the
  // PD exclusively: the placement lock (shared) must be gone first (docs/architecture.md, Locking).
  if (sources.owns_lock()) sources.unlock();
  // Sends and Writes complete once their last byte is in the stream (as on an RNIC).
  for (int i = 0; i < tx_.batch->finished_count; ++i) qp_->FinishSend(tx_.batch->finished[i], WcStatus::Success);
  tx_.batch->finished_count = 0;
  return true;
}

bool Stream::AddFpdu(const DdpHeader& hdr, const ReadRequest* read, const uint8_t* inline_data,
                     const Sge* sge, uint32_t num_sge, uint64_t offset, uint32_t length) {
  tx_mutex_.AssertHeld();
  int pieces_needed = 2 + (inline_data ? 1 : int(num_sge));
  if (tx_.batch->fpdus == kBatchFpdus || tx_.batch->iov_count + pieces_needed > kBatchIov) return false;
  int slot = tx_.batch->fpdus++;
  counters_.Add(Counter::TxPackets);
  counters_.Add(Counter::TxBytes, length);
  uint8_t* h = tx_.batch->headers[slot];
  size_t hlen = EncodeDdpHeader(hdr, {h + 2, sizeof tx_.batch->headers[slot] - 2});
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
    tx_.batch->iov[tx_.batch->iov_count++] = {base, len};
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
    tx_.batch->iov[tx_.batch->iov_count++] = {h, built + pad + kFpduCrcLen};
    return true;
  }
  uint8_t* t = tx_.batch->trailers[slot];
  memset(t, 0, pad);
  StoreFpduCrc(t + pad, params_.crc ? crc.Finish() : 0);
  tx_.batch->iov[tx_.batch->iov_count++] = {t, pad + kFpduCrcLen};
  return true;
}

size_t Stream::ReadsOutstanding() { return reads_queued_.load(std::memory_order_acquire); }

bool Stream::AddProbe(size_t reads) {
  tx_mutex_.AssertHeld();
  if (reads >= params_.ord) return false;  // sent when a Read slot frees up
  ReadRequest request{ProbeStag(tx_.probe_seq), 0, 0, 0, 0};
  if (!AddFpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, tx_.read_msn, 0, true), &request, nullptr,
               nullptr, 0, 0, 0))
    return false;
  tx_.read_msn++;
  tx_.probe_seq++;
  counters_.Add(Counter::TxConfirmReads);
  tx_.probe_due = false;
  base::MutexLock lock(reads_mutex_);
  reads_outstanding_.push_back({tx_.next, true, request.sink_stag});
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
  tx_.batch->Clear();
  if (tx_.terminate_len) {
    // The Terminate is the last FPDU of the stream: send it alone, then close.
    uint8_t* h = tx_.batch->headers[tx_.batch->fpdus++];
    StoreBe16(h, uint16_t(tx_.terminate_len));
    memcpy(h + 2, tx_.terminate, tx_.terminate_len);
    FpduCrcBuilder crc;
    crc.Add({h, tx_.terminate_len + 2});
    size_t pad = FpduPad(tx_.terminate_len);
    uint8_t* t = tx_.batch->trailers[0];
    memset(t, 0, pad);
    StoreFpduCrc(t + pad, params_.crc ? crc.Finish() : 0);
    tx_.batch->iov[tx_.batch->iov_count++] = {h, tx_.terminate_len + 2};
    tx_.batch->iov[tx_.batch->iov_count++] = {t, pad + kFpduCrcLen};
    tx_.terminate_len = 0;
    tx_.close_send = true;
    tx_.batch->terminate = true;
    counters_.Add(Counter::TxPackets);
    return true;
  }
  if (tx_.terminated) return false;  // the Terminate was the last FPDU
  if (tx_.close_send && qp_->state() == QpState::Error) return false;
  if (tx_.rtr_pending) {
    AddFpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, 0, 0, true), nullptr, nullptr, nullptr, 0, 0, 0);
    tx_.rtr_pending = false;
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
      if (chunk) tx_.batch->sources[tx_.batch->source_count++] = piece;
      response->sent += chunk;
      if (last) {
        base::MutexLock lock(responses_mutex_);
        responses_.pop_front();
        responses_queued_.fetch_sub(1, std::memory_order_release);
      }
      continue;
    }
    if (tx_.next == qp_->send_tail()) {
      // One probe in flight at a time: its answer confirms every message before it, and the
      // messages sent after it get the next probe when the answer comes (the Read Response
      // kicks us), so a stream of Writes costs a probe per round trip, not one per Write.
      if (tx_.probe_due && tx_.probe_seq == probes_answered_.load(std::memory_order_acquire))
        AddProbe(ReadsOutstanding());
      break;
    }
    // Posted before the RTR arrived (an answer to the first message while Accept completes): it
    // waits for the RTR (MPA: the responder sends nothing before it), which kicks us.
    if (HeldUntilEstablished()) break;
    SendWqe& wqe = qp_->send_at(tx_.next);
    if (tx_.probe_due && wqe.opcode != WrOpcode::Write && wqe.opcode != WrOpcode::Send) {
      if (!AddProbe(ReadsOutstanding())) break;
      continue;
    }
    if (wqe.done) {  // refused at post time (bad local key): completes in its turn
      qp_->FinishSend(tx_.next++, wqe.status);
      break;
    }
    size_t reads = ReadsOutstanding();
    if ((wqe.flags & kFence) && reads) break;  // wait for earlier Reads
    if (wqe.opcode == WrOpcode::Bind || wqe.opcode == WrOpcode::Invalidate) {
      // Nothing goes on the wire; done when its turn comes, so it completes in order.
      qp_->FinishSend(tx_.next++, WcStatus::Success);
      continue;
    }
    if (wqe.opcode == WrOpcode::Read) {
      if (reads >= params_.ord) break;  // beyond the read limit a Read waits; it does not fail
      ReadRequest request{SinkStag(tx_.next), 0, uint32_t(wqe.length), wqe.rkey, wqe.remote_addr};
      if (!AddFpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, tx_.read_msn, 0, true), &request,
                   nullptr, nullptr, 0, 0, 0))
        break;
      tx_.read_msn++;
      counters_.Add(Counter::TxReads);
      base::MutexLock lock(reads_mutex_);
      reads_outstanding_.push_back({tx_.next++, false, request.sink_stag});
      reads_queued_.fetch_add(1, std::memory_order_release);
      continue;
    }
    bool is_send = wqe.opcode == WrOpcode::Send;
    size_t hlen = is_send ? kDdpUntaggedHeaderLen : kDdpTaggedHeaderLen;
    uint32_t chunk = uint32_t(std::min<uint64_t>(wqe.length - wqe.sent, params_.max_ulpdu - hlen));
    bool last = wqe.sent + chunk == wqe.length;
    DdpHeader hdr = is_send ? DdpHeader::Untagged(SendOpcode(wqe.flags), tx_.send_msn, uint32_t(wqe.sent),
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
        unconfirmed_.push_back({tx_.next++, is_send ? tx_.send_msn : 0});
        unconfirmed_bytes_.fetch_add(wqe.length, std::memory_order_relaxed);
        tx_.probe_due = true;
      } else {
        tx_.batch->finished[tx_.batch->finished_count++] = tx_.next++;
      }
      if (is_send) tx_.send_msn++;
    }
  }
  return tx_.batch->iov_count > 0;
}

void Stream::SendTerminate(TermCode code, std::span<const uint8_t> offending) {
  {
    base::MutexLock lock(tx_mutex_);
    if (tx_.terminated) return;  // one Terminate per stream
    tx_.terminated = true;
    tx_.terminate_len = EncodeTerminate({tx_.terminate, sizeof tx_.terminate}, code, 1, offending,
                                        DefaultTermAttach(code));
    counters_.Add(code.layer == TermLayer::Rdmap ? Counter::TerminatesSentRdmap
                  : code.layer == TermLayer::Ddp ? Counter::TerminatesSentDdp : Counter::TerminatesSentLlp);
  }
  Kick();
}

}  // namespace ndwv::dev::iwarp
