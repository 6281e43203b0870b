// The stream's life (construction, start, shutdown, lingering after a Terminate) and the
// poller and engine hooks; transmit is in stream_tx.cpp, receive in stream_rx.cpp.
#include "dev/iwarp/stream.h"

#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "base/fork.h"
#include "base/log.h"
#include "base/settings.h"
#include "dev/address.h"

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;

Stream::Stream(int fd, std::shared_ptr<QueuePair> qp, const StreamParams& params,
               std::weak_ptr<StreamObserver> observer, std::unique_ptr<base::TcpCapture> capture,
               const sockaddr_storage* local, const sockaddr_storage* peer)
    : Link(params.expect_rtr), fd_(fd), capture_(std::move(capture)), qp_(std::move(qp)), params_(params),
      reads_granted_(params.ird != 0), observer_(std::move(observer)), qpn_(qp_->qpn()),
      port_released_(params.port_released) {
  params_.max_ulpdu = std::min<uint32_t>(params_.max_ulpdu, kFpduMaxUlpdu);
  params_.ird = std::max<uint32_t>(params_.ird, 1);
  params_.ord = std::max<uint32_t>(params_.ord, 1);
  sockaddr_storage asked_local{}, asked_peer{};
  socklen_t length = sizeof asked_local;
  if (!local) getsockname(fd_, reinterpret_cast<sockaddr*>(&asked_local), &length);
  length = sizeof asked_peer;
  if (!peer) getpeername(fd_, reinterpret_cast<sockaddr*>(&asked_peer), &length);
  counters_.Register(Transport::Iwarp, qpn_, 0, local ? *local : asked_local, peer ? *peer : asked_peer);
}

Stream::~Stream() { Shutdown(); }

uint32_t Stream::WatchedEvents() const {
  return EPOLLIN | EPOLLRDHUP | EPOLLET | (writable_watched_.load(std::memory_order_relaxed) ? uint32_t(EPOLLOUT) : 0u);
}

void Stream::WatchWritable() {
  base::MutexLock lock(handoff_.mutex());
  writable_watched_.store(true, std::memory_order_relaxed);
  // A socket that has room again by now is reported at once (epoll looks when the interest changes).
  ApplyWatchLocked();
}

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

void Stream::Reaped(bool peer_message) { handoff_.Reaped(*this, peer_message); }

void Stream::StillPolled() { handoff_.Posted(); }

void Stream::OnNotifyArmed() {
  handoff_.NotifyArmed(*this);
  if (TakeWaitingTransmit()) Kick();
}

void Stream::ApplyWatchLocked() {
  handoff_.mutex().AssertHeld();
  // A stream that shut down keeps the interest its lingering set (Shutdown).
  if (!shut_) Engine::Get().Modify(fd_, handoff_.engine_reads() ? WatchedEvents() : 0);  // the poller drives both directions
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
  // Bytes that arrived before the socket was watched raise an event at once (epoll looks when a
  // socket is added); a ByteSource raises none.
  Engine::Get().Watch(fd_, WatchedEvents(), weak_from_this());
  if (source_) DriveReceive();
}

std::string Stream::ReceiveState() {
  int unread = -1;  // a stream shut down closed its socket (or reads a ByteSource)
  if (!shut_.load(std::memory_order_relaxed) && !source_ && ioctl(fd_, SIOCINQ, &unread) != 0) unread = -1;
  const Engine::WatchState watch = Engine::Get().StateOf(fd_);
  char text[192];
  snprintf(text, sizeof text, "%llu FPDUs received, %d bytes unread in the socket, read by %s, %s",
           static_cast<unsigned long long>(counters_.Get(Counter::RxPackets)), unread,
           handoff_.engine_reads() ? "the engine" : "the CQ's pollers",
           !watch.watched ? "not watched" : watch.in_set ? "in the epoll set" : "out of the epoll set");
  return text;
}

void Stream::OnIo(uint32_t events) {
  if (shut_.load(std::memory_order_relaxed)) [[unlikely]] {  // lingering after a Terminate, if at all
    Linger();
    return;
  }
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) rx_to_end_.store(true);
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) DriveReceive();
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) Kick();
}

void Stream::NotifyObserver(void (StreamObserver::*event)()) {
  if (auto observer = observer_.lock()) (observer.get()->*event)();
}

void Stream::Broken() {
  rx_mutex_.AssertHeld();
  rx_.phase = RxPhase::Dead;
  if (!error_reported_.exchange(true)) {
    NDWV_LOG(Debug, "%s: iWARP stream lost%s", counters_.Identity().c_str(),
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
  bool report = false;
  {
    base::MutexLock rx(rx_mutex_);
    base::MutexLock tx(tx_mutex_);
    if (shut_) return;
    shut_ = true;
    // The QP went to Error with the connection up (a local error: a Send from unregistered
    // memory, a receive that lost the race with an Invalidate): closing the socket ends the
    // connection, and the connection manager must hear it, for nothing reads the peer's close
    // any more: a Disconnect would wait for it until its timeout.
    report = !error_reported_.exchange(true);
    rx_.phase = RxPhase::Dead;
    if (rx_.have_recv) {  // a message was arriving into it: it is flushed with the rest
      qp_->CompleteReceive(rx_.recv, 0, WcStatus::Flushed, false);
      rx_.have_recv = false;
      counters_.AddShared(Counter::FlushedRequests);
    }
    // After a Terminate the socket stays until the peer's TCP has it (CloseSocket); the QP is
    // kept for that while (the rest of a batch of Read Responses is checked against its PD).
    linger = tx_.terminated && self;
    if (linger) {
      tx_.lingering = true;
      tx_.linger_until = Clock::now() + std::chrono::milliseconds(base::Config().disconnect_timeout_ms);
      tx_.linger_self = self;
      // Each step of lingering (its timer, EPOLLOUT) takes tx_mutex_; armed under it, before the
      // engine can see tx_.lingering and end it.
      Engine::Get().Modify(fd_, EPOLLOUT | EPOLLET);
      linger_timer_.Arm(self, std::chrono::milliseconds(0));
    } else {
      broken_ = true;
      qp_.reset();
    }
  }
  handoff_.Close();
  if (!linger) CloseSocket();
  if (report) NotifyObserver(&StreamObserver::OnClosedHere);
}

void Stream::CloseSocket() {
  if (capture_) [[unlikely]] capture_->SentFin();  // close() sends it, if shutdown() did not
  ReleasePort();
  Engine::Get().CloseWatched(fd_);
}

void Stream::ReleasePort() {
  if (!port_released_.exchange(true, std::memory_order_relaxed)) ReleaseTcpPort(fd_);
}

void Stream::OnLingerTimer(Timer* timer) {
  Stream* self = OwnedTimer<Stream>::OwnerOf(timer);  // alive: the timer keeps it until taken
  std::shared_ptr<Stream> keep;
  {
    base::MutexLock tx(self->tx_mutex_);
    keep = self->linger_timer_.TakeFiring();
  }
  if (keep) keep->Linger();
}

void Stream::Linger() {
  constexpr auto kLingerPoll = std::chrono::milliseconds(10);
  std::shared_ptr<Stream> release;  // the stream may go with it: last
  {
    base::MutexLock tx(tx_mutex_);
    if (!tx_.lingering) return;
    BatchInUse batch(*this);
    // What was begun goes out whole, then the Terminate, then the FIN; nothing else.
    bool done = false;
    for (;;) {
      if (!tx_.batch->empty() && !FlushBatch()) {
        done = broken_;  // the socket failed; else it is full: EPOLLOUT or the timer comes back
        break;
      }
      if (tx_.send_closed) {
        int unacknowledged = 0;
        done = ioctl(fd_, SIOCOUTQ, &unacknowledged) != 0 || unacknowledged == 0;
        break;
      }
      if (!FillBatch()) {
        shutdown(fd_, SHUT_WR);
        if (capture_) [[unlikely]] capture_->SentFin();
        tx_.send_closed = true;
      }
    }
    if (!done && Clock::now() < tx_.linger_until) {
      linger_timer_.Arm(tx_.linger_self, kLingerPoll);
      return;
    }
    tx_.lingering = false;
    linger_timer_.Disarm();  // one due still fires, finds lingering over, and lets the stream go
    qp_.reset();
    release = std::move(tx_.linger_self);
  }
  CloseSocket();
}

}  // namespace ndwv::dev::iwarp
