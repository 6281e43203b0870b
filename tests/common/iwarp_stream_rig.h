// An established iWARP Stream with no TCP connection under it: what it receives comes from a
// ByteSource that hands over exactly the bytes given so far (so the caller cuts the stream
// wherever it likes), and what it sends goes into a socketpair whose other end the caller reads.
// Its QP (in RTS) has receives posted and regions registered between guard zones. Shared by the
// split-delivery unit tests (tests/unit/test_iwarp_stream.cpp) and the stream fuzzer
// (tests/fuzz/fuzz_iwarp_stream.cpp); no test framework in here.
#pragma once
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "dev/cq.h"
#include "dev/iwarp/stream.h"
#include "dev/memory.h"
#include "dev/qp.h"

namespace ndwv::test_support {

// Hands the stream the bytes given so far, then EAGAIN; after End(), the end of the stream.
class ScriptedSource final : public dev::iwarp::ByteSource {
 public:
  void Give(std::span<const uint8_t> bytes) {
    std::lock_guard lock(mutex_);
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
  }
  void End() {
    std::lock_guard lock(mutex_);
    end_ = true;
  }
  ssize_t Read(void* out, size_t length) override {
    std::lock_guard lock(mutex_);
    if (at_ == bytes_.size()) {
      if (end_) return 0;
      errno = EAGAIN;
      return -1;
    }
    size_t n = std::min(length, bytes_.size() - at_);
    memcpy(out, bytes_.data() + at_, n);
    at_ += n;
    return ssize_t(n);
  }

 private:
  std::mutex mutex_;
  std::vector<uint8_t> bytes_;
  size_t at_ = 0;
  bool end_ = false;
};

// [guard][region][guard], filled with a pattern; only the region is registered.
struct GuardedRegion {
  static constexpr size_t kGuard = 64;
  GuardedRegion(size_t length, uint8_t seed) : length(length), bytes(2 * kGuard + length) {
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(seed * 41 + i * 11 + (i >> 6));
    original = bytes;
  }
  uint8_t* region() { return bytes.data() + kGuard; }
  uint64_t addr() { return reinterpret_cast<uint64_t>(region()); }
  // Nothing changed outside [from, to) of the region.
  bool UnchangedOutside(size_t from, size_t to) const {
    for (size_t i = 0; i < bytes.size(); ++i) {
      bool inside = i >= kGuard + from && i < kGuard + to;
      if (!inside && bytes[i] != original[i]) return false;
    }
    return true;
  }
  const size_t length;
  std::vector<uint8_t> bytes, original;
  uint32_t lkey = 0, rkey = 0;
};

class StreamRig {
 public:
  static constexpr size_t kRegion = 512;
  static constexpr size_t kWritable = 8192;  // room for a segment longer than the stream's staging
  static constexpr size_t kRecvSize = 256;
  static constexpr uint32_t kRecvs = 4;
  static constexpr uint32_t kIrd = 4, kOrd = 4;

  explicit StreamRig(bool crc) {
    using namespace dev;
    Register(writable, kRemoteWrite | kLocalWrite);
    Register(readable, kRemoteRead);
    Register(locked, kLocalWrite);
    Register(sink, kLocalWrite);
    Register(recv, kLocalWrite);
    qp = std::make_shared<QueuePair>(pd, cq, cq, nullptr, this, QpCaps{16, 16, 4, 4, 64});
    for (QpState s : {QpState::Init, QpState::Rtr, QpState::Rts}) qp->Modify(s);
    for (uint32_t i = 0; i < kRecvs; ++i) {
      Sge sge{recv.addr() + i * kRecvSize, uint32_t(kRecvSize), recv.lkey};
      qp->PostReceive(100 + i, &sge, 1);
    }
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, ends) != 0) return;
    peer_fd = ends[1];
    iwarp::StreamParams params;
    params.crc = crc;
    params.ird = kIrd;
    params.ord = kOrd;
    params.confirm_writes = params.confirm_sends = false;
    observer = std::make_shared<Observer>();
    stream = std::make_shared<iwarp::Stream>(ends[0], qp, params, observer);
    stream->ReadFrom(&source);
    stream->Start();
  }
  ~StreamRig() {
    Finish();
    // Deregistered before their memory goes: a stream still finishing a batch of Read
    // Responses (lingering after a Terminate) checks its sources, and stops.
    for (GuardedRegion* r : {&writable, &readable, &locked, &sink, &recv}) pd->Deregister(r->lkey);
    if (peer_fd >= 0) close(peer_fd);
  }
  StreamRig(const StreamRig&) = delete;
  StreamRig& operator=(const StreamRig&) = delete;

  // The bytes reach the stream, which takes what it can of them now.
  void Deliver(std::span<const uint8_t> bytes) {
    source.Give(bytes);
    stream->OnIo(EPOLLIN);
  }
  void DeliverEnd() {
    source.End();
    stream->OnIo(EPOLLIN);
  }

  // What the CQ holds now.
  void Drain() {
    dev::Completion batch[32];
    while (size_t n = cq->Poll(batch, 32)) completions.insert(completions.end(), batch, batch + n);
  }

  // Reads what the stream sent until `out` has `want` bytes or `bound` passes; whether it has.
  bool ReadSent(std::vector<uint8_t>& out, size_t want, std::chrono::milliseconds bound) {
    auto deadline = std::chrono::steady_clock::now() + bound;
    uint8_t chunk[4096];
    while (out.size() < want) {
      ssize_t n = ::recv(peer_fd, chunk, std::min(sizeof chunk, want - out.size()), 0);
      if (n > 0) {
        out.insert(out.end(), chunk, chunk + n);
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) return false;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{peer_fd, POLLIN, 0};
      poll(&p, 1, int(left.count()));
    }
    return true;
  }
  // Whatever the stream sent that is waiting now (the caller's end never fills up).
  void DiscardSent() {
    uint8_t chunk[4096];
    while (::recv(peer_fd, chunk, sizeof chunk, 0) > 0) {
    }
  }

  // Ends the connection as Disconnect's QP phase does: the QP to Error, everything flushed.
  void Finish() {
    if (!qp) return;
    qp->Modify(dev::QpState::Error);
    Drain();
  }

  // Posts a Read of `length` bytes into the sink region at `offset`, in two SGEs when it can.
  bool PostRead(uint64_t wr_id, uint32_t offset, uint32_t length) {
    dev::SendWqe read{};
    read.wr_id = wr_id;
    read.opcode = dev::WrOpcode::Read;
    read.flags = dev::kSignaled;
    uint32_t first = length / 3;
    read.num_sge = first ? 2 : 1;
    if (first) {
      read.sge[0] = {sink.addr() + offset, first, sink.lkey};
      read.sge[1] = {sink.addr() + offset + first + 7, length - first, sink.lkey};  // a gap between
    } else {
      read.sge[0] = {sink.addr() + offset, length, sink.lkey};
    }
    read.length = length;
    read.remote_addr = 0x10000;
    read.rkey = 0x1234;
    return qp->PostSend(read) == 0;
  }

  struct Observer final : dev::iwarp::StreamObserver {
    void OnRtr() override {}
    void OnPeerClosed() override { peer_closed = true; }
    void OnStreamError(bool) override { errors++; }
    void OnClosedHere() override { closed_here++; }
    bool peer_closed = false;
    int errors = 0, closed_here = 0;
  };

  std::shared_ptr<dev::ProtectionDomain> pd = std::make_shared<dev::ProtectionDomain>();
  std::shared_ptr<dev::CompletionQueue> cq = std::make_shared<dev::CompletionQueue>(256);
  std::shared_ptr<dev::QueuePair> qp;
  GuardedRegion writable{kWritable, 1}, readable{kRegion, 2}, locked{kRegion, 3}, sink{kRegion, 4},
      recv{kRecvSize * kRecvs, 5};
  ScriptedSource source;
  std::shared_ptr<Observer> observer;
  std::shared_ptr<dev::iwarp::Stream> stream;
  int peer_fd = -1;
  std::vector<dev::Completion> completions;

 private:
  void Register(GuardedRegion& r, uint32_t access) { pd->Register(r.region(), r.length, access, &r.lkey, &r.rkey); }
};

}  // namespace ndwv::test_support
