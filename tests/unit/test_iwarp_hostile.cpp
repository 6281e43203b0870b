// A hostile iWARP peer against the device: a raw TCP socket, written here with the wire codecs,
// that completes (or fails to complete) the MPA rev 2 exchange and then sends malformed or
// forbidden FPDUs to a passive ndwv QP.
//
// The requirement under test: a malformed or hostile byte stream ends only that connection, with
// a Terminate (RFC 5040/5041/5044 codes), flushes its QP (every posted request completes exactly
// once), and touches no memory that was not granted. So every test checks:
//   * what the raw peer receives: the Terminate with its layer/type/code (and the offending
//     headers it names), nothing else of interest (no Read Response), then the end of the stream;
//   * the ndwv QP: to Error, each posted receive (and send) completed exactly once, Flushed;
//   * memory: every buffer (regions, their guard bytes, the receive buffers) byte-for-byte
//     unchanged, except where the peer was allowed to write.
//
// Every wait is bounded (kBound); the tests assert statuses, counts and bytes, never timing.
// Only 127.0.0.1 is used.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <ndwv/wvstatus.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "base/settings.h"
#include "dev/counters.h"
#include "dev/cq.h"
#include "guarded_buffer.h"
#include "hostile_support.h"
#include "engine_hold.h"
#include "qp_watch.h"
#include "dev/device.h"
#include "dev/endpoint.h"
#include "dev/iwarp/stream.h"
#include "dev/memory.h"
#include "dev/qp.h"
#include "wire/bytes.h"
#include "wire/ddp.h"
#include "wire/mpa.h"

namespace ndwv::dev {
namespace {

using namespace std::chrono_literals;
namespace w = ndwv::wire;
using w::DdpHeader;
using w::RdmapOpcode;
using w::TermCode;

// ---- an asynchronous request's record ---------------------------------------------------------

class Op final : public AsyncOp {
 public:
  void Complete(int32_t status) override {
    std::lock_guard<std::mutex> lock(mutex_);
    statuses_.push_back(status);
    cv_.notify_all();
  }
  // The first status, waiting at most kBound; nullopt if the request did not complete.
  std::optional<int32_t> Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_until(lock, Deadline(), [&] { return !statuses_.empty(); })) return std::nullopt;
    return statuses_.front();
  }
  size_t count() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return statuses_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<int32_t> statuses_;
};

// ---- the raw peer -----------------------------------------------------------------------------

enum class End { Eof, Reset, Timeout };
const char* ToString(End e) { return e == End::Eof ? "EOF" : e == End::Reset ? "reset" : "timeout"; }

class RawPeer {
 public:
  RawPeer() = default;
  RawPeer(const RawPeer&) = delete;
  RawPeer& operator=(const RawPeer&) = delete;
  ~RawPeer() { Close(); }

  bool crc = true;  // what the MPA exchange negotiated

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd() const { return fd_; }

  // receive_buffer: SO_RCVBUF, 0 for the default (a small one makes a peer that reads nothing
  // fill the sender's socket soon).
  void Connect(uint16_t port, int receive_buffer = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd_, 0) << strerror(errno);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (receive_buffer) setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in to = Loopback(port);
    ASSERT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to), 0) << strerror(errno);
    ASSERT_EQ(fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK), 0);
  }

  uint16_t LocalPort() const {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.sin_port);
  }

  void Send(std::span<const uint8_t> bytes) {
    auto deadline = Deadline();
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n > 0) {
        done += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) << "send: " << strerror(errno);
      pollfd p{fd_, POLLOUT, 0};
      ASSERT_GT(poll(&p, 1, RemainingMs(deadline)), 0) << "send did not finish in time";
    }
  }

  void HalfClose() { shutdown(fd_, SHUT_WR); }

  // The peer as a server: takes the connection waiting on listen_fd.
  void Accept(int listen_fd) {
    pollfd p{listen_fd, POLLIN, 0};
    ASSERT_GT(poll(&p, 1, RemainingMs(Deadline())), 0) << "no connection came in time";
    fd_ = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    ASSERT_GE(fd_, 0) << strerror(errno);
  }

  // `bytes` and the FIN in one segment (held by TCP_CORK until the FIN is tacked on): the
  // receiver gets one edge for both.
  void SendWithFin(std::span<const uint8_t> bytes) {
    int one = 1;
    ASSERT_EQ(setsockopt(fd_, IPPROTO_TCP, TCP_CORK, &one, sizeof one), 0) << strerror(errno);
    ASSERT_NO_FATAL_FAILURE(Send(bytes));
    HalfClose();
  }

  // Exactly n bytes, or a test failure.
  void ReadExact(uint8_t* out, size_t n) {
    auto deadline = Deadline();
    size_t done = 0;
    while (done < n) {
      ssize_t got = recv(fd_, out + done, n - done, 0);
      if (got > 0) {
        done += size_t(got);
        continue;
      }
      ASSERT_NE(got, 0) << "the stream ended after " << done << " of " << n << " bytes";
      if (errno == EINTR) continue;
      ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << "recv: " << strerror(errno);
      pollfd p{fd_, POLLIN, 0};
      ASSERT_GT(poll(&p, 1, RemainingMs(deadline)), 0)
          << "only " << done << " of " << n << " bytes arrived in time";
    }
  }

  // Everything until the peer's end of stream (or a reset, or the bound).
  End ReadToEnd(std::vector<uint8_t>& out) {
    auto deadline = Deadline();
    uint8_t chunk[4096];
    for (;;) {
      ssize_t got = recv(fd_, chunk, sizeof chunk, 0);
      if (got > 0) {
        out.insert(out.end(), chunk, chunk + got);
        continue;
      }
      if (got == 0) return End::Eof;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return End::Reset;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, RemainingMs(deadline)) <= 0) return End::Timeout;
    }
  }

 private:
  int fd_ = -1;
};

// ---- frames the raw peer builds ---------------------------------------------------------------

std::vector<uint8_t> Encode(const w::MpaFrame& frame) {
  std::vector<uint8_t> out(w::MpaFrameLength(frame));
  EXPECT_EQ(w::EncodeMpaFrame(frame, out), out.size());
  return out;
}

// One MPA frame of `kind` from the peer, whole: its bytes in `bytes`, decoded into `frame` (whose
// private data points into them).
void ReadMpaFrame(RawPeer& peer, w::MpaKind kind, std::vector<uint8_t>& bytes, w::MpaFrame& frame) {
  bytes.assign(w::kMpaHeaderLen, 0);
  ASSERT_NO_FATAL_FAILURE(peer.ReadExact(bytes.data(), bytes.size()));
  size_t length = 0;
  ASSERT_EQ(w::DecodeMpaHeader(bytes, kind, length), w::MpaError::Ok);
  bytes.resize(length);
  ASSERT_NO_FATAL_FAILURE(peer.ReadExact(bytes.data() + w::kMpaHeaderLen, length - w::kMpaHeaderLen));
  ASSERT_EQ(w::DecodeMpaFrame(bytes, kind, frame), w::MpaError::Ok);
}

const uint8_t kRequestData[] = {'h', 'o', 's', 't', 'i', 'l', 'e'};

// A request ndwv serves: rev 2, enhanced, P2P with the zero-length Write RTR, CRC asked for.
w::MpaFrame GoodRequest() {
  w::MpaFrame f;
  f.reply = false;
  f.crc = true;
  f.revision = w::kMpaRevision2;
  f.enhanced = true;
  f.p2p = true;
  f.rtr_write = true;
  f.ird = 4;
  f.ord = 4;
  f.private_data = kRequestData;
  return f;
}

// One FPDU: the DDP/RDMAP header (plus a Read Request's 28 bytes), the payload, pad and CRC.
std::vector<uint8_t> Fpdu(const DdpHeader& h, std::span<const uint8_t> payload, bool crc,
                          const w::ReadRequest* read = nullptr) {
  std::vector<uint8_t> ulpdu(h.length() + (read ? w::kReadRequestLen : 0) + payload.size());
  size_t n = w::EncodeDdpHeader(h, ulpdu);
  EXPECT_EQ(n, h.length());
  if (read) n += w::EncodeReadRequest(*read, std::span(ulpdu).subspan(n));
  if (!payload.empty()) memcpy(ulpdu.data() + n, payload.data(), payload.size());
  std::vector<uint8_t> out(w::FpduLength(ulpdu.size()));
  EXPECT_EQ(w::EncodeFpdu(ulpdu, crc, out), out.size());
  return out;
}

std::vector<uint8_t> Concat(std::initializer_list<std::vector<uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(0xA0 ^ (seed * 29 + i * 13));
  return v;
}

// ---- what the raw peer receives ---------------------------------------------------------------

struct Segment {
  DdpHeader hdr;
  w::ReadRequest read;
  w::TerminateCtrl term;
  uint16_t term_segment_len = 0;
  std::vector<uint8_t> term_ddp, term_rdmap, payload;
};

struct Inbound {
  std::vector<Segment> segments;
  End end = End::Timeout;
  size_t leftover = 0;  // bytes after the last whole FPDU
  std::string error;    // a decoding problem, empty if none
  size_t Count(RdmapOpcode op) const {
    return size_t(std::count_if(segments.begin(), segments.end(),
                                [&](const Segment& s) { return s.hdr.opcode == op; }));
  }
};

bool Parse(std::span<const uint8_t> ulpdu, Segment& out, std::string& error) {
  w::DdpSegment seg;
  w::DdpError e = w::DecodeDdpSegment(ulpdu, seg);
  if (e != w::DdpError::Ok) {
    error = std::string("DDP segment: ") + w::ToString(e);
    return false;
  }
  out.hdr = seg.hdr;
  out.read = seg.read;
  out.term = seg.term.ctrl;
  out.term_segment_len = seg.term.ddp_segment_len;
  out.term_ddp.assign(seg.term.ddp_header.begin(), seg.term.ddp_header.end());
  out.term_rdmap.assign(seg.term.rdmap_header.begin(), seg.term.rdmap_header.end());
  out.payload.assign(seg.payload.begin(), seg.payload.end());
  return true;
}

// Reads until the stream ends and decodes every FPDU in it.
Inbound Collect(RawPeer& peer) {
  Inbound in;
  std::vector<uint8_t> bytes;
  in.end = peer.ReadToEnd(bytes);
  std::span<const uint8_t> rest(bytes);
  while (!rest.empty()) {
    w::FpduView view;
    w::FpduError e = w::DecodeFpdu(rest, peer.crc, view);
    if (e == w::FpduError::Truncated) break;
    if (e != w::FpduError::Ok) {
      in.error = std::string("FPDU: ") + w::ToString(e);
      break;
    }
    Segment s;
    if (!Parse(view.ulpdu, s, in.error)) break;
    in.segments.push_back(std::move(s));
    rest = rest.subspan(view.length);
  }
  in.leftover = rest.size();
  return in;
}

// Exactly one FPDU.
void ReadFpdu(RawPeer& peer, Segment& out) {
  uint8_t len[2];
  ASSERT_NO_FATAL_FAILURE(peer.ReadExact(len, 2));
  size_t ulpdu = w::LoadBe16(len);
  std::vector<uint8_t> fpdu(w::FpduLength(ulpdu));
  fpdu[0] = len[0], fpdu[1] = len[1];
  ASSERT_NO_FATAL_FAILURE(peer.ReadExact(fpdu.data() + 2, fpdu.size() - 2));
  w::FpduView view;
  ASSERT_EQ(w::DecodeFpdu(fpdu, peer.crc, view), w::FpduError::Ok);
  std::string error;
  ASSERT_TRUE(Parse(view.ulpdu, out, error)) << error;
}

std::string Name(TermCode c) {
  char buf[96];
  snprintf(buf, sizeof buf, "layer %u type %u code 0x%02x (%s)", unsigned(c.layer), unsigned(c.type),
           unsigned(c.code), w::Describe(c));
  return buf;
}

// The peer sent a Terminate with `code` as its last FPDU, nothing but `allowed_before` before it,
// never a Read Response, and then ended the stream. Returns the Terminate.
void ExpectTerminate(const Inbound& in, TermCode code, Segment& term, size_t allowed_before = 0) {
  ASSERT_TRUE(in.error.empty()) << in.error;
  EXPECT_EQ(in.leftover, 0u) << "a partial FPDU at the end";
  EXPECT_NE(in.end, End::Timeout) << "the stream did not end within the bound";
  EXPECT_EQ(in.Count(RdmapOpcode::ReadResponse), 0u) << "memory was sent back";
  ASSERT_FALSE(in.segments.empty()) << "no Terminate (stream ended by " << ToString(in.end) << ")";
  ASSERT_EQ(in.Count(RdmapOpcode::Terminate), 1u);
  EXPECT_EQ(in.segments.size(), allowed_before + 1) << "unexpected FPDUs before the Terminate";
  term = in.segments.back();
  ASSERT_EQ(term.hdr.opcode, RdmapOpcode::Terminate) << "the Terminate is the stream's last FPDU";
  EXPECT_EQ(term.hdr.qn, uint32_t(w::DdpQueue::Terminate));
  EXPECT_EQ(term.hdr.msn, 1u);
  EXPECT_EQ(term.hdr.mo, 0u);
  EXPECT_TRUE(term.hdr.last);
  EXPECT_EQ(term.term.code, code) << "got " << Name(term.term.code) << ", want " << Name(code);
}

// The offending DDP header the Terminate carries, decoded.
void ExpectNamesSegment(const Segment& term, const DdpHeader& sent, size_t sent_ulpdu_len) {
  ASSERT_TRUE(term.term.m && term.term.d) << "the offending segment is not attached";
  EXPECT_EQ(term.term_segment_len, sent_ulpdu_len);
  DdpHeader named;
  ASSERT_EQ(w::DecodeDdpHeader(term.term_ddp, named), w::DdpError::Ok);
  EXPECT_EQ(named.opcode, sent.opcode);
  if (sent.tagged()) {
    EXPECT_EQ(named.stag, sent.stag);
    EXPECT_EQ(named.to, sent.to);
  } else {
    EXPECT_EQ(named.msn, sent.msn);
    EXPECT_EQ(named.mo, sent.mo);
  }
}

// Whether ndwv confirms Sends with a zero-length Read (NDWV_IWARP_CONFIRM=all).
bool ConfirmsSends() {
  const base::Settings* settings = base::LoadSettings();
  return settings && settings->confirm == base::Settings::Confirm::All;
}

constexpr TermCode Protection(w::RdmapErrorCode c) { return w::MakeTerm(w::RdmapErrorType::RemoteProtection, c); }

// ---- the ndwv side ----------------------------------------------------------------------------

constexpr size_t kRegion = 512;
constexpr size_t kRecvSize = 128;
constexpr uint32_t kRecvs = 4;
constexpr uint64_t kFirstRecvId = 100;

struct Conn : QpWatch {
  explicit Conn(uintptr_t tag) : QpWatch(reinterpret_cast<void*>(tag)) {}
  ~Conn() {
    // The endpoint first: it completes what it holds of ours (canceled); then the flush.
    if (ep) ep->Close();
    if (qp) qp->Modify(QpState::Error);
  }

  void Setup(uint32_t send_depth) {
    qp = std::make_shared<QueuePair>(pd, cq, cq, nullptr, context, QpCaps{send_depth, 16, 4, 4, 64});
    for (Buffer* b : {&writable, &locked, &readable, &local})
      ASSERT_EQ(pd->Register(b->region(), kRegion, b == &writable   ? kRemoteWrite | kLocalWrite
                                                   : b == &readable ? kRemoteRead
                                                                    : kLocalWrite,
                             &b->key, &b->rkey),
                WV_SUCCESS);
    ASSERT_EQ(pd->Register(recv.region(), recv.length, kLocalWrite, &recv.key, &recv.rkey), WV_SUCCESS);
    ep = Device::All()[0]->CreateEndpoint();
    ASSERT_TRUE(ep);
  }

  void PostReceives(uint32_t count) {
    for (uint32_t i = 0; i < count; ++i) {
      Sge sge{recv.addr() + i * kRecvSize, uint32_t(kRecvSize), recv.key};
      ASSERT_EQ(qp->PostReceive(kFirstRecvId + i, &sge, 1), WV_SUCCESS);
    }
  }

  std::map<uint64_t, WcStatus> AllReceivesFlushed(uint32_t count = kRecvs, uint32_t first = 0) const {
    std::map<uint64_t, WcStatus> m;
    for (uint32_t i = first; i < count; ++i) m[kFirstRecvId + i] = WcStatus::Flushed;
    return m;
  }

  void ExpectMemoryUntouched() {
    EXPECT_TRUE(Unchanged(writable, "writable region"));
    EXPECT_TRUE(Unchanged(locked, "region without remote rights"));
    EXPECT_TRUE(Unchanged(readable, "readable region"));
    EXPECT_TRUE(Unchanged(recv, "receive buffers"));
    EXPECT_TRUE(Unchanged(local, "local buffer"));
  }

  std::shared_ptr<ProtectionDomain> pd = std::make_shared<ProtectionDomain>();
  std::shared_ptr<ConnectEndpoint> ep;
  Buffer writable{kRegion, 1}, locked{kRegion, 2}, readable{kRegion, 3}, recv{kRecvSize * kRecvs, 4},
      local{kRegion, 5};
  RawPeer peer;
  Op get_request, accept, notify;
};

class IwarpHostile : public ::testing::Test {
 protected:
  static constexpr int kBacklog = 4;
  static constexpr uint32_t kIrd = 4;  // the Read Requests ndwv answers at once

  void SetUp() override {
    ASSERT_FALSE(Device::All().empty()) << "no device (settings refused?)";
    listener = Device::All()[0]->CreateEndpoint();
    port = ListenOnLoopback(*listener, kBacklog);
    ASSERT_NE(port, 0);
  }

  void TearDown() override {
    if (listener) listener->Close();  // cancels GetRequests that point at our records
    conns.clear();
  }

  Conn& NewConn(uint32_t send_depth = 16) {
    conns.push_back(std::make_unique<Conn>(0xC0 + conns.size()));
    Conn& c = *conns.back();
    c.Setup(send_depth);
    return c;
  }

  // TCP connect, the MPA Request, and GetRequest completes into c's endpoint.
  void Request(Conn& c, const w::MpaFrame& request = GoodRequest(), int receive_buffer = 0) {
    ASSERT_EQ(listener->GetRequest(c.ep, &c.get_request), WV_PENDING);
    ASSERT_NO_FATAL_FAILURE(c.peer.Connect(port, receive_buffer));
    ASSERT_NO_FATAL_FAILURE(c.peer.Send(Encode(request)));
    std::optional<int32_t> status = c.get_request.Wait();
    ASSERT_TRUE(status.has_value()) << "GetRequest did not complete";
    ASSERT_EQ(*status, WV_SUCCESS);
  }

  // Accept with c's QP; the raw peer reads the MPA Reply.
  void AcceptAndReadReply(Conn& c, uint32_t ird = kIrd) {
    ConnectParams params;
    params.ird = ird;
    params.ord = 4;
    ASSERT_EQ(c.ep->Accept(c.qp, params, &c.accept), WV_PENDING);
    std::vector<uint8_t> bytes;
    w::MpaFrame reply;
    ASSERT_NO_FATAL_FAILURE(ReadMpaFrame(c.peer, w::MpaKind::Reply, bytes, reply));
    ASSERT_FALSE(reply.reject);
    ASSERT_TRUE(reply.enhanced && reply.p2p && reply.rtr_write) << "not the P2P / Write-RTR reply";
    EXPECT_TRUE(reply.crc) << "we asked for CRCs: either side asking means CRCs are used";
    c.peer.crc = reply.crc;
  }

  // ndwv Reads `length` bytes into c's local buffer at `offset` (wr_id 7); the raw peer reads the
  // Read Request.
  void PostRead(Conn& c, uint64_t offset, uint32_t length, Segment& request) {
    SendWqe read{};
    read.wr_id = 7;
    read.opcode = WrOpcode::Read;
    read.flags = kSignaled;
    read.num_sge = 1;
    read.sge[0] = {c.local.addr() + offset, length, c.local.key};
    read.length = length;
    read.remote_addr = 0x1000;
    read.rkey = 0x4242;
    ASSERT_EQ(c.qp->PostSend(read), WV_SUCCESS);
    ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, request));
    ASSERT_EQ(request.hdr.opcode, RdmapOpcode::ReadRequest);
    ASSERT_EQ(request.read.size, length);
  }

  // ndwv is asked to Write 64 bytes of c's local buffer to the raw peer (wr_id `wr_id`).
  void PostWrite(Conn& c, uint64_t wr_id) {
    SendWqe write{};
    write.wr_id = wr_id;
    write.opcode = WrOpcode::Write;
    write.flags = kSignaled;
    write.num_sge = 1;
    write.sge[0] = {c.local.addr(), 64, c.local.key};
    write.length = 64;
    write.remote_addr = 0x2000;
    write.rkey = 0x4343;
    ASSERT_EQ(c.qp->PostSend(write), WV_SUCCESS);
  }

  // ndwv Writes 64 bytes of c's local buffer to the raw peer (wr_id `wr_id`); the raw peer reads
  // the Write and the zero-length Read (the probe) that confirms it.
  void PostWriteAndReadProbe(Conn& c, uint64_t wr_id, Segment& probe) {
    ASSERT_NO_FATAL_FAILURE(PostWrite(c, wr_id));
    Segment placed;
    ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, placed));
    ASSERT_EQ(placed.hdr.opcode, RdmapOpcode::RdmaWrite);
    ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, probe));
    ASSERT_EQ(probe.hdr.opcode, RdmapOpcode::ReadRequest);
    ASSERT_EQ(probe.read.size, 0u);
  }

  void SendRtr(Conn& c) {
    c.peer.Send(Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, 0, 0, true), {}, c.peer.crc));
  }

  // The whole exchange: Request, Accept, Reply, RTR; Accept completes and the QP is in RTS. A
  // NotifyDisconnect is left armed.
  void Establish(Conn& c, uint32_t receives = kRecvs, int receive_buffer = 0, uint32_t ird = kIrd) {
    ASSERT_NO_FATAL_FAILURE(c.PostReceives(receives));
    ASSERT_NO_FATAL_FAILURE(Request(c, GoodRequest(), receive_buffer));
    ASSERT_NO_FATAL_FAILURE(AcceptAndReadReply(c, ird));
    ASSERT_NO_FATAL_FAILURE(SendRtr(c));
    std::optional<int32_t> status = c.accept.Wait();
    ASSERT_TRUE(status.has_value()) << "Accept did not complete after the RTR";
    ASSERT_EQ(*status, WV_SUCCESS);
    ASSERT_EQ(c.qp->state(), QpState::Rts);
    ASSERT_EQ(c.ep->NotifyDisconnect(&c.notify), WV_PENDING);
  }

  // After a hostile FPDU: the Terminate with `code`, the end of the stream, the QP flushed with
  // `completions`, and the endpoint's NotifyDisconnect told. Returns the Terminate.
  void ExpectTerminatedAndFlushed(Conn& c, TermCode code, const std::map<uint64_t, WcStatus>& completions,
                                  Segment& term) {
    Inbound in = Collect(c.peer);
    ASSERT_NO_FATAL_FAILURE(ExpectTerminate(in, code, term));
    EXPECT_EQ(in.end, End::Eof) << "the stream should close after the Terminate (FIN), not "
                                << ToString(in.end);
    ASSERT_NO_FATAL_FAILURE(c.WaitForError());
    c.ExpectCompletions(completions);
    EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS)) << "the endpoint was not told";
  }

  std::shared_ptr<ConnectEndpoint> listener;
  uint16_t port = 0;
  std::vector<std::unique_ptr<Conn>> conns;
};

// ==== 0. control: the raw peer's frames are right, so the failures below are the hostile bits ====

TEST_F(IwarpHostile, ControlWellFormedPeerIsServedAndItsFinFlushesTheRest) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));

  // Send -> the first receive; Write into the writable region; Read from the readable one.
  std::vector<uint8_t> message = Bytes(100, 1), data = Bytes(200, 2);
  const uint64_t write_at = c.writable.addr() + 16;
  w::ReadRequest read{0x1234, 0x40, 64, c.readable.rkey, c.readable.addr() + 8};
  c.peer.Send(Concat({Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, write_at, true), data, c.peer.crc),
                      Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, c.peer.crc),
                      Fpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true), {}, c.peer.crc, &read)}));
  ASSERT_TRUE(c.PollUntil([&] { return !c.completions.empty(); })) << "the Send did not complete";
  ASSERT_EQ(c.completions.size(), 1u);
  EXPECT_EQ(c.completions[0].wr_id, kFirstRecvId);
  EXPECT_EQ(c.completions[0].status, WcStatus::Success);
  EXPECT_EQ(c.completions[0].length, message.size());
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, message.size(), message));
  EXPECT_TRUE(Unchanged(c.writable, "writable region", 16, 16 + data.size(), data));
  EXPECT_EQ(memcmp(c.writable.region() + 16, data.data(), data.size()), 0) << "the Write was not placed";

  Segment response;
  ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, response));
  EXPECT_EQ(response.hdr.opcode, RdmapOpcode::ReadResponse);
  EXPECT_EQ(response.hdr.stag, read.sink_stag);
  EXPECT_EQ(response.hdr.to, read.sink_to);
  EXPECT_TRUE(response.hdr.last);
  ASSERT_EQ(response.payload.size(), 64u);
  EXPECT_EQ(memcmp(response.payload.data(), c.readable.region() + 8, 64), 0);
  EXPECT_EQ(c.qp->state(), QpState::Rts);

  // A FIN at a message boundary is a graceful disconnect: no Terminate, the rest is flushed.
  c.peer.HalfClose();
  Inbound in = Collect(c.peer);
  EXPECT_TRUE(in.error.empty()) << in.error;
  EXPECT_EQ(in.end, End::Eof);
  EXPECT_EQ(in.Count(RdmapOpcode::Terminate), 0u);
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  auto expected = c.AllReceivesFlushed(kRecvs, 1);
  expected[kFirstRecvId] = WcStatus::Success;
  c.ExpectCompletions(expected);
  EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS));
  EXPECT_TRUE(Unchanged(c.locked, "region without remote rights"));
  EXPECT_TRUE(Unchanged(c.readable, "readable region"));
}

// A Send with the FIN right behind it, in one segment: one edge (EPOLLIN with EPOLLRDHUP) for
// both. Nothing polls the CQ, so the engine reads alone; the read that brings the Send is short
// and would pass for an empty socket, but the FIN still has to be read: the receive completes,
// then the connection ends gracefully.
TEST_F(IwarpHostile, ControlSendAndFinInOneSegmentAreBothTakenByTheEngine) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> message = Bytes(100, 1);
  ASSERT_NO_FATAL_FAILURE(c.peer.SendWithFin(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, c.peer.crc)));
  ASSERT_TRUE(WaitUntil([&] { return c.qp->state() == QpState::Error; }, std::chrono::seconds(5)))
      << "the FIN behind the Send was not seen";
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  auto expected = c.AllReceivesFlushed(kRecvs, 1);
  expected[kFirstRecvId] = WcStatus::Success;
  c.ExpectCompletions(expected);
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, message.size(), message));
  EXPECT_EQ(memcmp(c.recv.region(), message.data(), message.size()), 0) << "the Send was not placed";
  EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS));
  Inbound in = Collect(c.peer);
  EXPECT_EQ(in.Count(RdmapOpcode::Terminate), 0u);
}

// A peer that answers ndwv's confirming Reads late. Large Writes posted while a mebibyte sent
// before them is unconfirmed wait to go to TCP with later ones (docs/iwarp.md): each must still
// arrive whole and in order, and complete only once the peer's answer confirms it.
TEST_F(IwarpHostile, ControlLargeWritesQueuedBehindAnUnconfirmedMebibyteArriveWholeAndInOrder) {
  const base::Settings* settings = base::LoadSettings();
  if (settings && settings->confirm == base::Settings::Confirm::None) GTEST_SKIP() << "Writes are not confirmed";
  // 30: the last few wait with less than a batch behind them, for a poll to send them.
  constexpr int kWrites = 30;
  constexpr uint32_t kSize = 64 << 10, kRkey = 0x4242;
  constexpr uint64_t kStride = 1 << 20;  // remote address of Write i: (i + 1) * kStride
  Conn& c = NewConn(kWrites);
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> source = Bytes(kSize, 40);
  uint32_t lkey, rkey;
  ASSERT_EQ(c.pd->Register(source.data(), source.size(), kLocalWrite, &lkey, &rkey), WV_SUCCESS);

  // The peer reads everything and answers nothing yet; the test thread polls meanwhile, which
  // sends what waits.
  std::vector<Segment> writes, probes;
  std::atomic<bool> read_all{false};
  std::thread reader([&] {
    int last_segments = 0;
    while (last_segments < kWrites || probes.empty()) {
      Segment s;
      ReadFpdu(c.peer, s);
      if (::testing::Test::HasFatalFailure()) break;
      if (s.hdr.opcode == RdmapOpcode::RdmaWrite) {
        last_segments += s.hdr.last;
        writes.push_back(std::move(s));
      } else {
        probes.push_back(std::move(s));
      }
    }
    read_all = true;
  });
  for (int i = 0; i < kWrites; ++i) {
    SendWqe write{};
    write.wr_id = 1000 + i;
    write.opcode = WrOpcode::Write;
    write.flags = kSignaled;
    write.num_sge = 1;
    write.sge[0] = {reinterpret_cast<uint64_t>(source.data()), kSize, lkey};
    write.length = kSize;
    write.remote_addr = (i + 1) * kStride;
    write.rkey = kRkey;
    ASSERT_EQ(c.qp->PostSend(write), WV_SUCCESS);
  }
  c.PollUntil([&] { return read_all.load(); });
  reader.join();
  ASSERT_TRUE(read_all) << "not every Write arrived";
  EXPECT_TRUE(c.completions.empty()) << "a Write completed before the peer confirmed it";
  uint64_t coalesced = c.qp->link()->counters().Get(Counter::TxCoalesced);
  EXPECT_GE(coalesced, 1u);
  EXPECT_LE(coalesced, uint64_t(kWrites - 16)) << "a Write waited before a mebibyte was unconfirmed";

  // Whole and in order: each Write's segments in turn, its bytes exactly the source's.
  int write = 0;
  uint64_t offset = 0;
  for (const Segment& s : writes) {
    ASSERT_EQ(s.hdr.stag, kRkey);
    ASSERT_EQ(s.hdr.to, (write + 1) * kStride + offset) << "Write " << write;
    ASSERT_LE(offset + s.payload.size(), kSize);
    ASSERT_EQ(memcmp(s.payload.data(), source.data() + offset, s.payload.size()), 0) << "Write " << write;
    offset += s.payload.size();
    ASSERT_EQ(s.hdr.last, offset == kSize) << "Write " << write;
    if (s.hdr.last) write++, offset = 0;
  }
  EXPECT_EQ(write, kWrites);

  // The answers: each confirms what was sent before its request, and frees the next probe.
  for (size_t answered = 0; c.completions.size() < size_t(kWrites); ++answered) {
    if (answered == probes.size()) {
      Segment next;
      ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, next));
      ASSERT_EQ(next.hdr.opcode, RdmapOpcode::ReadRequest);
      probes.push_back(std::move(next));
    }
    const Segment& probe = probes[answered];
    ASSERT_EQ(probe.hdr.opcode, RdmapOpcode::ReadRequest);
    ASSERT_EQ(probe.read.size, 0u);
    c.peer.Send(Fpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, probe.read.sink_stag, probe.read.sink_to, true),
                     {}, c.peer.crc));
    c.PollUntil([&] { return c.completions.size() == size_t(kWrites); }, 200ms);
  }
  for (int i = 0; i < kWrites; ++i) {
    EXPECT_EQ(c.completions[i].wr_id, uint64_t(1000 + i));
    EXPECT_EQ(c.completions[i].status, WcStatus::Success);
  }
  EXPECT_EQ(c.qp->state(), QpState::Rts);
}

// ==== 1. bad MPA exchange: only that TCP connection is closed; the listener serves the next ====

TEST_F(IwarpHostile, BadMpaRequestsAreDroppedAndTheListenerStillServesAGoodOne) {
  Conn& good = NewConn();
  // One GetRequest waits through everything: none of the bad connections may complete it.
  ASSERT_EQ(listener->GetRequest(good.ep, &good.get_request), WV_PENDING);

  // A request that is well formed but asks for what ndwv does not do (markers) is refused with
  // a Reply that has R set; it does not reach GetRequest.
  {
    w::MpaFrame markers = GoodRequest();
    markers.markers = true;
    RawPeer peer;
    ASSERT_NO_FATAL_FAILURE(peer.Connect(port));
    ASSERT_NO_FATAL_FAILURE(peer.Send(Encode(markers)));
    std::vector<uint8_t> answer;
    End end = peer.ReadToEnd(answer);
    EXPECT_NE(end, End::Timeout);
    w::MpaFrame reply;
    ASSERT_EQ(w::DecodeMpaFrame(answer, w::MpaKind::Reply, reply), w::MpaError::Ok)
        << answer.size() << " bytes, then " << ToString(end);
    EXPECT_TRUE(reply.reject);
    EXPECT_EQ(good.get_request.count(), 0u);
  }

  w::MpaFrame reply_key = GoodRequest();
  reply_key.reply = true;  // a Reply's key where a Request is due
  std::vector<uint8_t> wrong_key = Encode(GoodRequest());
  memcpy(wrong_key.data(), "MPA ID Req Frane", w::kMpaKeyLen);
  std::vector<uint8_t> garbage = Bytes(300, 9);
  std::vector<uint8_t> bad_revision = Encode(GoodRequest());
  bad_revision[17] = 7;
  std::vector<uint8_t> too_long = Encode(GoodRequest());
  w::StoreBe16(too_long.data() + 18, 600);  // PD_Length over 512
  std::vector<uint8_t> truncated = Encode(GoodRequest());
  truncated.resize(truncated.size() - 3);  // then FIN
  // The initiator may send nothing more until the Reply came: an RTR (or any FPDU) sent along
  // with the request makes it malformed.
  std::vector<uint8_t> overeager = Encode(GoodRequest());
  overeager.insert(overeager.end(), 14, 0);
  struct Bad {
    const char* what;
    std::vector<uint8_t> bytes;
    bool fin;
  };
  const Bad bad[] = {
      {"wrong MPA key", wrong_key, false},
      {"garbage", garbage, false},
      {"Reply key in a Request", Encode(reply_key), false},
      {"revision 7", bad_revision, false},
      {"PD_Length over 512", too_long, false},
      {"Request cut short, then FIN", truncated, true},
      {"bytes right after the Request", overeager, false},
  };
  // More dead connections than the listener's backlog: they must not count against it.
  static_assert(sizeof(bad) / sizeof(bad[0]) > size_t(kBacklog));
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    RawPeer peer;
    ASSERT_NO_FATAL_FAILURE(peer.Connect(port));
    ASSERT_NO_FATAL_FAILURE(peer.Send(b.bytes));
    if (b.fin) peer.HalfClose();
    std::vector<uint8_t> answer;
    End end = peer.ReadToEnd(answer);
    EXPECT_NE(end, End::Timeout) << "the connection was not closed";
    EXPECT_TRUE(answer.empty()) << "a malformed request is not answered";
    EXPECT_EQ(good.get_request.count(), 0u) << "GetRequest completed with a bad connection";
  }

  // The good connection gets the waiting GetRequest, and a full handshake completes on it.
  ASSERT_NO_FATAL_FAILURE(good.PostReceives(kRecvs));
  ASSERT_NO_FATAL_FAILURE(good.peer.Connect(port));
  ASSERT_NO_FATAL_FAILURE(good.peer.Send(Encode(GoodRequest())));
  std::optional<int32_t> status = good.get_request.Wait();
  if (!status) {
    std::vector<uint8_t> answer;
    End end = good.peer.ReadToEnd(answer);
    FAIL() << "the listener did not serve a good connection after the bad ones; the connection got "
           << answer.size() << " bytes, then " << ToString(end);
  }
  ASSERT_EQ(*status, WV_SUCCESS);
  ConnectionInfo info;
  ASSERT_EQ(good.ep->Query(&info), WV_SUCCESS);
  EXPECT_EQ(ntohs(reinterpret_cast<const sockaddr_in&>(info.peer).sin_port), good.peer.LocalPort())
      << "GetRequest holds another connection than the good one";
  ASSERT_EQ(info.peer_params.data_length, sizeof kRequestData);
  EXPECT_EQ(memcmp(info.peer_params.data, kRequestData, sizeof kRequestData), 0);
  ASSERT_NO_FATAL_FAILURE(AcceptAndReadReply(good));
  ASSERT_NO_FATAL_FAILURE(SendRtr(good));
  EXPECT_EQ(good.accept.Wait(), std::optional<int32_t>(WV_SUCCESS));
  EXPECT_EQ(good.qp->state(), QpState::Rts);
  std::vector<uint8_t> message = Bytes(40, 3);
  good.peer.Send(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, good.peer.crc));
  ASSERT_TRUE(good.PollUntil([&] { return !good.completions.empty(); }));
  EXPECT_EQ(good.completions[0].status, WcStatus::Success);
  EXPECT_EQ(good.completions[0].length, message.size());
}

// The active side. The passive peer answers the Request and leaves before CompleteConnect: its
// close comes while the CM still watches the socket, which the stream takes over at
// CompleteConnect (Engine::Watch's hand-over), and reports then.
TEST_F(IwarpHostile, APassivePeerThatLeavesAfterItsReplyIsSeenGoneAfterCompleteConnect) {
  const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(server, 0);
  sockaddr_in address = Loopback(0);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(server, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(server, 1), 0);
  ASSERT_EQ(getsockname(server, reinterpret_cast<sockaddr*>(&address), &length), 0);
  Conn& c = NewConn();
  ConnectParams params;
  params.ird = params.ord = 4;
  Op connect, complete;
  ASSERT_EQ(c.ep->Connect(c.qp, reinterpret_cast<sockaddr*>(&address), sizeof address, params, &connect), WV_PENDING);
  ASSERT_NO_FATAL_FAILURE(c.peer.Accept(server));
  close(server);
  std::vector<uint8_t> bytes;
  w::MpaFrame request;
  ASSERT_NO_FATAL_FAILURE(ReadMpaFrame(c.peer, w::MpaKind::Request, bytes, request));
  w::MpaFrame reply = GoodRequest();
  reply.reply = true;
  reply.private_data = {};
  ASSERT_NO_FATAL_FAILURE(c.peer.Send(Encode(reply)));
  ASSERT_EQ(connect.Wait(), std::optional<int32_t>(WV_SUCCESS));
  c.peer.Close();
  std::this_thread::sleep_for(50ms);  // the close reaches the endpoint, still the CM's
  ASSERT_EQ(c.ep->Accept(nullptr, params, &complete), WV_PENDING);
  EXPECT_EQ(complete.Wait(), std::optional<int32_t>(WV_SUCCESS));
  int32_t armed = c.ep->NotifyDisconnect(&c.notify);
  ASSERT_TRUE(armed == WV_PENDING || armed == WV_SUCCESS) << armed;
  if (armed == WV_PENDING) {
    EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS)) << "the peer's close was not reported";
  }
}

// ==== 2. CRC errors ===========================================================================

TEST_F(IwarpHostile, BadCrcOnASendTerminatesWithLlpCrcErrorAndFlushesEveryRequestOnce) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  ASSERT_TRUE(c.peer.crc) << "CRCs were not negotiated";

  // An outstanding ndwv Read (the peer never answers it) must be flushed too.
  Segment request;
  ASSERT_NO_FATAL_FAILURE(PostRead(c, 0, 32, request));

  std::vector<uint8_t> message = Bytes(100, 4);
  std::vector<uint8_t> fpdu = Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, true);
  fpdu.back() ^= 0x01;
  // In two writes, so that the receiver most likely sees the FPDU begin before it has all of it
  // and checks its CRC as the bytes go by (an FPDU read whole is checked at once: next test).
  const std::span<const uint8_t> bytes(fpdu);
  c.peer.Send(bytes.first(40));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  c.peer.Send(bytes.subspan(40));

  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::LlpErrorCode::CrcError),
                                                     [&] {
                                                       auto m = c.AllReceivesFlushed();
                                                       m[7] = WcStatus::Flushed;
                                                       return m;
                                                     }(),
                                                     term));
  EXPECT_FALSE(term.term.d) << "an LLP error attaches no header";
  // The first receive took the Send: its bytes before the checked tail may have landed there
  // (it is the receive's own buffer); the last 64 of the FPDU never do, nor anything else.
  const size_t unchecked = message.size() - 64;
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, unchecked, message));
  EXPECT_TRUE(Unchanged(c.writable, "writable region"));
  EXPECT_TRUE(Unchanged(c.local, "Read sink"));
}

TEST_F(IwarpHostile, BadCrcOnASendReadWholePlacesNothingOfIt) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  ASSERT_TRUE(c.peer.crc);
  std::vector<uint8_t> message = Bytes(100, 6);  // longer than the checked tail
  std::vector<uint8_t> fpdu = Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, true);
  fpdu[2 + w::kDdpUntaggedHeaderLen + 10] ^= 0x20;  // a payload byte
  c.peer.Send(fpdu);  // one write, one TCP segment: the receiver reads the FPDU whole
  Segment term;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, w::MakeTerm(w::LlpErrorCode::CrcError), c.AllReceivesFlushed(), term));
  c.ExpectMemoryUntouched();  // not even the bytes before the tail reached the receive buffer
}

TEST_F(IwarpHostile, BadCrcOnAWritePlacesNothingOfItsCheckedTailAndNothingOutsideIt) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  ASSERT_TRUE(c.peer.crc);
  std::vector<uint8_t> data = Bytes(48, 5);  // within the checked tail: nothing may land
  std::vector<uint8_t> fpdu =
      Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, c.writable.addr() + 100, true), data, true);
  fpdu[fpdu.size() - 2] ^= 0x80;
  c.peer.Send(fpdu);
  Segment term;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, w::MakeTerm(w::LlpErrorCode::CrcError), c.AllReceivesFlushed(), term));
  c.ExpectMemoryUntouched();
}

TEST_F(IwarpHostile, BadCrcOnTheRtrRefusesTheAccept) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(c.PostReceives(kRecvs));
  ASSERT_NO_FATAL_FAILURE(Request(c));
  ASSERT_NO_FATAL_FAILURE(AcceptAndReadReply(c));
  std::vector<uint8_t> rtr = Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, 0, 0, true), {}, true);
  rtr.back() ^= 0x10;
  c.peer.Send(rtr);
  Inbound in = Collect(c.peer);
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminate(in, w::MakeTerm(w::LlpErrorCode::CrcError), term));
  EXPECT_EQ(c.accept.Wait(), std::optional<int32_t>(WV_CONNECTION_REFUSED));
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(c.AllReceivesFlushed());
  c.ExpectMemoryUntouched();
}

// ==== 3. tagged access violations: Terminate with the RDMAP protection code, nothing placed ====

struct WriteCase {
  const char* name;
  enum Key { Unknown, NoRights, Writable } key;
  long offset;      // TO relative to the region's start
  size_t length;
  w::RdmapErrorCode code;
};

class IwarpHostileWrite : public IwarpHostile, public ::testing::WithParamInterface<WriteCase> {};

TEST_P(IwarpHostileWrite, IsTerminatedWithItsProtectionCodeAndPlacesNothing) {
  const WriteCase& p = GetParam();
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  uint32_t stag = p.key == WriteCase::Unknown    ? (c.writable.rkey ^ 0x00ABCD00u)
                  : p.key == WriteCase::NoRights ? c.locked.rkey
                                                 : c.writable.rkey;
  Buffer& target = p.key == WriteCase::NoRights ? c.locked : c.writable;
  DdpHeader h = DdpHeader::Tagged(RdmapOpcode::RdmaWrite, stag, target.addr() + uint64_t(p.offset), true);
  std::vector<uint8_t> data = Bytes(p.length, 6);
  c.peer.Send(Fpdu(h, data, c.peer.crc));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, Protection(p.code), c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + data.size());
  EXPECT_TRUE(term.term.r) << "RFC 5040: a protection error names the RDMAP header too";
  c.ExpectMemoryUntouched();
}

INSTANTIATE_TEST_SUITE_P(
    IwarpHostile, IwarpHostileWrite,
    ::testing::Values(
        WriteCase{"UnknownStag", WriteCase::Unknown, 0, 32, w::RdmapErrorCode::InvalidStag},
        WriteCase{"StagOfRegionWithoutRemoteRights", WriteCase::NoRights, 0, 32, w::RdmapErrorCode::AccessRights},
        WriteCase{"StartsBeforeTheRegion", WriteCase::Writable, -16, 32, w::RdmapErrorCode::BaseBounds},
        WriteCase{"EndsOneBytePastTheRegion", WriteCase::Writable, long(kRegion) - 31, 32,
                  w::RdmapErrorCode::BaseBounds},
        WriteCase{"EntirelyAfterTheRegion", WriteCase::Writable, long(kRegion), 16, w::RdmapErrorCode::BaseBounds},
        WriteCase{"LongerThanTheRegion", WriteCase::Writable, 0, kRegion + 1, w::RdmapErrorCode::BaseBounds},
        WriteCase{"LargePastTheEnd", WriteCase::Writable, long(kRegion) / 2, 3000, w::RdmapErrorCode::BaseBounds}),
    [](const ::testing::TestParamInfo<WriteCase>& info) { return std::string(info.param.name); });

TEST_F(IwarpHostile, WriteWhoseSecondSegmentLeavesTheRegionPlacesOnlyTheFirst) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  // Segment 1: the last 100 bytes of the region (allowed). Segment 2: the 100 bytes after it.
  std::vector<uint8_t> first = Bytes(100, 7), second = Bytes(100, 8);
  const uint64_t at = c.writable.addr() + kRegion - 100;
  DdpHeader h2 = DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, at + 100, true);
  c.peer.Send(Concat({Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, at, false), first, c.peer.crc),
                      Fpdu(h2, second, c.peer.crc)}));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, Protection(w::RdmapErrorCode::BaseBounds), c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h2, h2.length() + second.size());
  EXPECT_TRUE(Unchanged(c.writable, "writable region", kRegion - 100, kRegion, first));
  EXPECT_EQ(memcmp(c.writable.region() + kRegion - 100, first.data(), 100), 0) << "the allowed segment";
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers"));
}

TEST_F(IwarpHostile, UnsolicitedReadResponseIsTerminatedAndPlacesNothing) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  DdpHeader h = DdpHeader::Tagged(RdmapOpcode::ReadResponse, c.writable.rkey, c.writable.addr(), true);
  std::vector<uint8_t> data = Bytes(32, 9);
  c.peer.Send(Fpdu(h, data, c.peer.crc));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpTaggedCode::InvalidStag),
                                                     c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + data.size());
  c.ExpectMemoryUntouched();
}

// ==== 4. framing: truncated FPDUs and lengths shorter than their headers ======================

TEST_F(IwarpHostile, TruncatedWriteThenEofEndsTheConnectionAndPlacesNothing) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> fpdu = Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, c.writable.addr(), true),
                                   Bytes(60, 10), c.peer.crc);
  fpdu.resize(2 + 14 + 20);  // the length says 74 bytes of ULPDU; 34 come, then FIN
  c.peer.Send(fpdu);
  c.peer.HalfClose();
  Inbound in = Collect(c.peer);
  EXPECT_TRUE(in.error.empty()) << in.error;
  EXPECT_NE(in.end, End::Timeout) << "the connection did not end";
  EXPECT_EQ(in.Count(RdmapOpcode::ReadResponse), 0u);
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(c.AllReceivesFlushed());
  EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS));
  c.ExpectMemoryUntouched();
}

TEST_F(IwarpHostile, TruncatedSendThenEofFlushesTheReceiveItTookOnce) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> fpdu = Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), Bytes(50, 11), c.peer.crc);
  fpdu.resize(2 + 18 + 10);
  c.peer.Send(fpdu);
  c.peer.HalfClose();
  Inbound in = Collect(c.peer);
  EXPECT_TRUE(in.error.empty()) << in.error;
  EXPECT_NE(in.end, End::Timeout);
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(c.AllReceivesFlushed());
  EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS));
  c.ExpectMemoryUntouched();
}

// A long truncated Write: bytes before the FPDU's checked tail go straight to the (granted)
// target, so some may land; but only inside [TO, TO + what was sent), and only what was sent.
TEST_F(IwarpHostile, LongTruncatedWritePlacesAtMostWhatWasSentWithinItsRange) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> data = Bytes(400, 12);
  std::vector<uint8_t> fpdu =
      Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, c.writable.addr() + 50, true), data, c.peer.crc);
  const size_t sent = 200;
  fpdu.resize(2 + 14 + sent);
  c.peer.Send(fpdu);
  c.peer.HalfClose();
  Inbound in = Collect(c.peer);
  EXPECT_NE(in.end, End::Timeout);
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(c.AllReceivesFlushed());
  EXPECT_TRUE(Unchanged(c.writable, "writable region", 50, 50 + sent, data));
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers"));
  EXPECT_TRUE(Unchanged(c.locked, "region without remote rights"));
}

struct ShortCase {
  const char* name;
  uint16_t ctrl;        // the DDP/RDMAP control field
  uint16_t ulpdu_len;   // what the length field claims (and what is sent)
};

class IwarpHostileShort : public IwarpHostile, public ::testing::WithParamInterface<ShortCase> {};

TEST_P(IwarpHostileShort, LengthShorterThanItsHeadersIsADdpCatastrophicError) {
  const ShortCase& p = GetParam();
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  // A whole, correctly framed FPDU (length, pad, CRC) whose ULPDU is too short for its headers.
  std::vector<uint8_t> ulpdu = Bytes(p.ulpdu_len, 13);
  if (p.ulpdu_len >= 2) w::StoreBe16(ulpdu.data(), p.ctrl);
  std::vector<uint8_t> fpdu(w::FpduLength(ulpdu.size()));
  ASSERT_EQ(w::EncodeFpdu(ulpdu, c.peer.crc, fpdu), fpdu.size());
  c.peer.Send(fpdu);
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::kTermDdpCatastrophic, c.AllReceivesFlushed(), term));
  c.ExpectMemoryUntouched();
}

INSTANTIATE_TEST_SUITE_P(
    IwarpHostile, IwarpHostileShort,
    ::testing::Values(
        ShortCase{"TaggedWriteOf10", w::MakeDdpCtrl(RdmapOpcode::RdmaWrite, true), 10},
        ShortCase{"SendOf12", w::MakeDdpCtrl(RdmapOpcode::Send, true), 12},
        ShortCase{"ReadRequestOf30", w::MakeDdpCtrl(RdmapOpcode::ReadRequest, true), 30},
        ShortCase{"TerminateOf18", w::MakeDdpCtrl(RdmapOpcode::Terminate, true), 18},
        ShortCase{"Empty", 0, 0}),
    [](const ::testing::TestParamInfo<ShortCase>& info) { return std::string(info.param.name); });

// MPA (RFC 6581): the responder sends nothing before the initiator's RTR. The QP is in RTS from
// the Accept on; a Write posted then waits in the stream and goes once the RTR has come.
TEST_F(IwarpHostile, WhatIsPostedBeforeTheRtrIsSentOnlyAfterIt) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(c.PostReceives(kRecvs));
  ASSERT_NO_FATAL_FAILURE(Request(c));
  ASSERT_NO_FATAL_FAILURE(AcceptAndReadReply(c));
  EXPECT_EQ(c.qp->state(), QpState::Rts);
  ASSERT_NO_FATAL_FAILURE(PostWrite(c, 7));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // time enough to send it, were it allowed
  uint8_t byte;
  EXPECT_EQ(recv(c.peer.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT), -1) << "bytes before the RTR";
  EXPECT_EQ(c.accept.count(), 0u);
  ASSERT_NO_FATAL_FAILURE(SendRtr(c));
  Segment placed;
  ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, placed));
  EXPECT_EQ(placed.hdr.opcode, RdmapOpcode::RdmaWrite);
  EXPECT_EQ(placed.payload.size(), 64u);
  EXPECT_EQ(c.accept.Wait(), std::optional<int32_t>(WV_SUCCESS));
}

TEST_F(IwarpHostile, FirstFpduThatIsNotTheRtrIsRefusedAndItsWriteNotPlaced) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(c.PostReceives(kRecvs));
  ASSERT_NO_FATAL_FAILURE(Request(c));
  ASSERT_NO_FATAL_FAILURE(AcceptAndReadReply(c));
  // A real Write, with a valid key, in place of the zero-length RTR.
  c.peer.Send(Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, c.writable.rkey, c.writable.addr(), true),
                   Bytes(32, 14), c.peer.crc));
  Inbound in = Collect(c.peer);
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminate(in, w::MakeTerm(w::LlpErrorCode::NoMatchingRtr), term));
  EXPECT_EQ(c.accept.Wait(), std::optional<int32_t>(WV_CONNECTION_REFUSED));
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(c.AllReceivesFlushed());
  c.ExpectMemoryUntouched();
}

// ==== 5. untagged (Send) errors ===============================================================

TEST_F(IwarpHostile, SendWithAnUnexpectedMsnIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::Send, 2, 0, true);  // MSN 1 is due
  std::vector<uint8_t> message = Bytes(40, 15);
  c.peer.Send(Fpdu(h, message, c.peer.crc));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMsnRange),
                                                     c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + message.size());
  c.ExpectMemoryUntouched();
}

TEST_F(IwarpHostile, ReplayedMsnAfterAGoodSendIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> message = Bytes(40, 16), replay = Bytes(40, 17);
  c.peer.Send(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, c.peer.crc));
  ASSERT_TRUE(c.PollUntil([&] { return !c.completions.empty(); }));
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true);
  c.peer.Send(Fpdu(h, replay, c.peer.crc));
  Segment term;
  auto expected = c.AllReceivesFlushed(kRecvs, 1);
  expected[kFirstRecvId] = WcStatus::Success;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMsnRange), expected, term));
  ExpectNamesSegment(term, h, h.length() + replay.size());
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, message.size(), message));
}

TEST_F(IwarpHostile, SendWithNoReceivePostedIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c, /*receives=*/1));
  std::vector<uint8_t> message = Bytes(40, 18), extra = Bytes(40, 19);
  c.peer.Send(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, c.peer.crc));
  ASSERT_TRUE(c.PollUntil([&] { return !c.completions.empty(); }));
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::Send, 2, 0, true);
  c.peer.Send(Fpdu(h, extra, c.peer.crc));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMsnNoBuffer),
                                                     {{kFirstRecvId, WcStatus::Success}}, term));
  ExpectNamesSegment(term, h, h.length() + extra.size());
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, message.size(), message));
}

TEST_F(IwarpHostile, SendLongerThanTheReceiveIsTerminatedAndPlacesNothing) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true);
  std::vector<uint8_t> message = Bytes(kRecvSize + 1, 20);
  c.peer.Send(Fpdu(h, message, c.peer.crc));
  Segment term;
  auto expected = c.AllReceivesFlushed(kRecvs, 1);
  expected[kFirstRecvId] = WcStatus::LocalLength;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::MessageTooLong), expected, term));
  ExpectNamesSegment(term, h, h.length() + message.size());
  c.ExpectMemoryUntouched();
}

TEST_F(IwarpHostile, SendSegmentWithAGapInItsOffsetIsTerminatedInvalidMo) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> part = Bytes(32, 21);
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::Send, 1, 64, true);  // 32 bytes came, MO 64 follows
  c.peer.Send(Concat({Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, false), part, c.peer.crc),
                      Fpdu(h, part, c.peer.crc)}));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMo), c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + part.size());
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, part.size(), part));
}

// RFC 5041: an untagged segment whose MO is not where the message stands is "invalid MO"; for the
// first segment of a message that is MO != 0. (Not "no buffer": a receive is posted.)
TEST_F(IwarpHostile, FirstSendSegmentWithNonZeroMoIsTerminatedInvalidMo) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::Send, 1, 16, true);
  std::vector<uint8_t> message = Bytes(32, 22);
  c.peer.Send(Fpdu(h, message, c.peer.crc));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(
      ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMo), c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + message.size());
  c.ExpectMemoryUntouched();
}

// RFC 5040: every segment of one Send carries the message's opcode. A message begun as a plain
// Send and ended as a Send with Solicited Event (or with Invalidate, which would unbind a window
// on the word of its last segment alone) is a protocol error: Terminate, unexpected opcode, and
// the receive it took is flushed. (Before: the receive completed, solicited.)
TEST_F(IwarpHostile, SendWhoseOpcodeChangesWithinTheMessageIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> part = Bytes(32, 25);
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::SendSolicited, 1, 32, true);
  c.peer.Send(Concat({Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, false), part, c.peer.crc),
                      Fpdu(h, part, c.peer.crc)}));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(
      c, w::MakeTerm(w::RdmapErrorType::RemoteOperation, w::RdmapErrorCode::UnexpectedOpcode),
      c.AllReceivesFlushed(), term));
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, part.size(), part)) << "the second segment was placed";
}

// Likewise the key of a Send with Invalidate: every segment names the one window it unbinds. One
// whose key changes is refused before its bytes are placed. (Before: the last segment's key
// alone was used.)
TEST_F(IwarpHostile, SendWithInvalidateWhoseKeyChangesWithinTheMessageIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  std::vector<uint8_t> part = Bytes(32, 26);
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::SendInvalidate, 1, 32, true, 0x2222);
  c.peer.Send(Concat({Fpdu(DdpHeader::Untagged(RdmapOpcode::SendInvalidate, 1, 0, false, 0x1111), part, c.peer.crc),
                      Fpdu(h, part, c.peer.crc)}));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(
      c, w::MakeTerm(w::RdmapErrorType::RemoteProtection, w::RdmapErrorCode::CannotInvalidate),
      c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + part.size());
  EXPECT_TRUE(Unchanged(c.recv, "receive buffers", 0, part.size(), part)) << "the second segment was placed";
}

// A receive names its buffer by an L_Key, and the grant is the region the key names: a Send must
// not land outside it, whatever the SGE says. Either the post is refused, or the receive
// completes with an error when the data comes (and the connection ends); the bytes after the
// region stay as they were, and the receive never completes with success.
TEST_F(IwarpHostile, SendIsNotPlacedOutsideTheRegionOfTheReceivesKey) {
  Conn& c = NewConn();
  // The receive's SGE starts 64 bytes before the end of the receive region and is 128 long.
  Sge sge{c.recv.addr() + c.recv.length - 64, 128, c.recv.key};
  const int32_t posted = c.qp->PostReceive(kFirstRecvId, &sge, 1);
  ASSERT_NO_FATAL_FAILURE(Establish(c, /*receives=*/0));
  std::vector<uint8_t> message = Bytes(128, 23);
  c.peer.Send(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, c.peer.crc));
  EXPECT_TRUE(c.PollUntil([&] { return !c.completions.empty() || c.qp->state() == QpState::Error; }))
      << "neither a completion nor the end of the connection";
  EXPECT_TRUE(Unchanged(c.recv, "receive region and the guard after it", c.recv.length - 64, c.recv.length, message));
  for (const Completion& done : c.completions)
    EXPECT_NE(done.status, WcStatus::Success) << "a receive reaching outside its key's region completed";
  if (posted == WV_SUCCESS) {
    ASSERT_NO_FATAL_FAILURE(c.WaitForError());
    EXPECT_EQ(c.completions.size(), 1u);
  }
}

// The same for a region that was deregistered while the receive was posted.
TEST_F(IwarpHostile, SendIsNotPlacedIntoADeregisteredReceiveBuffer) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c, /*receives=*/1));
  ASSERT_EQ(c.pd->Deregister(c.recv.key), WV_SUCCESS);
  std::vector<uint8_t> message = Bytes(64, 24);
  c.peer.Send(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, c.peer.crc));
  EXPECT_TRUE(c.PollUntil([&] { return !c.completions.empty() || c.qp->state() == QpState::Error; }))
      << "neither a completion nor the end of the connection";
  EXPECT_TRUE(Unchanged(c.recv, "deregistered receive buffer"));
  for (const Completion& done : c.completions)
    EXPECT_NE(done.status, WcStatus::Success) << "a receive into deregistered memory completed";
}

// ==== 6. Read Requests the responder must refuse ==============================================

struct ReadCase {
  const char* name;
  enum Key { Unknown, WriteOnly, NoRights, Readable } key;
  long offset;
  uint32_t size;
  w::RdmapErrorCode code;
};

class IwarpHostileRead : public IwarpHostile, public ::testing::WithParamInterface<ReadCase> {};

TEST_P(IwarpHostileRead, IsTerminatedWithItsProtectionCodeAndNothingIsSentBack) {
  const ReadCase& p = GetParam();
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  Buffer& source = p.key == ReadCase::WriteOnly  ? c.writable
                   : p.key == ReadCase::NoRights ? c.locked
                                                 : c.readable;
  uint32_t stag = p.key == ReadCase::Unknown ? (c.readable.rkey ^ 0x00ABCD00u) : source.rkey;
  w::ReadRequest read{0x77, 0, p.size, stag, source.addr() + uint64_t(p.offset)};
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true);
  c.peer.Send(Fpdu(h, {}, c.peer.crc, &read));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, Protection(p.code), c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + w::kReadRequestLen);
  ASSERT_EQ(term.term_rdmap.size(), w::kReadRequestLen) << "the Read Request is not attached";
  w::ReadRequest named;
  ASSERT_TRUE(w::DecodeReadRequest(term.term_rdmap, named));
  EXPECT_EQ(named.src_stag, read.src_stag);
  EXPECT_EQ(named.src_to, read.src_to);
  EXPECT_EQ(named.size, read.size);
  c.ExpectMemoryUntouched();
}

INSTANTIATE_TEST_SUITE_P(
    IwarpHostile, IwarpHostileRead,
    ::testing::Values(
        ReadCase{"RegionWithRemoteWriteOnly", ReadCase::WriteOnly, 0, 64, w::RdmapErrorCode::AccessRights},
        ReadCase{"RegionWithoutRemoteRights", ReadCase::NoRights, 0, 64, w::RdmapErrorCode::AccessRights},
        ReadCase{"UnknownStag", ReadCase::Unknown, 0, 64, w::RdmapErrorCode::InvalidStag},
        ReadCase{"PastTheEndOfAReadableRegion", ReadCase::Readable, long(kRegion) - 32, 64,
                 w::RdmapErrorCode::BaseBounds},
        ReadCase{"BeforeAReadableRegion", ReadCase::Readable, -8, 64, w::RdmapErrorCode::BaseBounds}),
    [](const ::testing::TestParamInfo<ReadCase>& info) { return std::string(info.param.name); });

TEST_F(IwarpHostile, ReadRequestWithAnUnexpectedMsnIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  w::ReadRequest read{0x77, 0, 64, c.readable.rkey, c.readable.addr()};
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 5, 0, true);
  c.peer.Send(Fpdu(h, {}, c.peer.crc, &read));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMsnRange),
                                                     c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, h, h.length() + w::kReadRequestLen);
}

// A Read Request is one whole DDP segment (its queue's buffer holds exactly its 28 bytes): one
// with MO != 0 is "invalid MO"; one whose L bit says more follows, or with bytes after its
// header, is "message too long". None is answered. (Before: the first two were answered, and the
// second counted as a whole request; the third was "invalid MSN range".)
TEST_F(IwarpHostile, ReadRequestThatIsNotOneWholeSegmentIsTerminated) {
  struct Case {
    const char* name;
    uint32_t mo;
    bool last;
    size_t extra;
    w::DdpUntaggedCode code;
  };
  for (Case k : {Case{"MO 8", 8, true, 0, w::DdpUntaggedCode::InvalidMo},
                 Case{"L bit clear", 0, false, 0, w::DdpUntaggedCode::MessageTooLong},
                 Case{"4 bytes after it", 0, true, 4, w::DdpUntaggedCode::MessageTooLong}}) {
    SCOPED_TRACE(k.name);
    Conn& c = NewConn();
    ASSERT_NO_FATAL_FAILURE(Establish(c));
    w::ReadRequest read{0x77, 0, 64, c.readable.rkey, c.readable.addr()};
    DdpHeader h = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, k.mo, k.last);
    c.peer.Send(Fpdu(h, Bytes(k.extra, 27), c.peer.crc, &read));
    Segment term;
    ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(k.code), c.AllReceivesFlushed(), term));
    ExpectNamesSegment(term, h, h.length() + w::kReadRequestLen + k.extra);
    c.ExpectMemoryUntouched();
  }
}

// RFC 5040's "TO wrap": a Read whose source range or whose sink range runs past 2^64. The source
// is refused before any key is looked at; a wrapping sink would make the Read Response's tagged
// offsets wrap. Nothing is sent back. (Before: a wrapping source was "base or bounds", and a
// wrapping sink was answered.)
TEST_F(IwarpHostile, ReadRequestWhoseSourceOrSinkRangeWrapsIsTerminatedToWrap) {
  for (bool sink : {false, true}) {
    SCOPED_TRACE(sink ? "sink wraps" : "source wraps");
    Conn& c = NewConn();
    ASSERT_NO_FATAL_FAILURE(Establish(c));
    const uint64_t near_end = ~uint64_t(0) - 15;
    w::ReadRequest read{0x77, sink ? near_end : 0, 64, c.readable.rkey, sink ? c.readable.addr() : near_end};
    DdpHeader h = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true);
    c.peer.Send(Fpdu(h, {}, c.peer.crc, &read));
    Segment term;
    ASSERT_NO_FATAL_FAILURE(
        ExpectTerminatedAndFlushed(c, Protection(w::RdmapErrorCode::ToWrap), c.AllReceivesFlushed(), term));
    ExpectNamesSegment(term, h, h.length() + w::kReadRequestLen);
    c.ExpectMemoryUntouched();
  }
}

// A Read longer than the device's advertised transfer length (1 GiB, MaxTransferLength) is
// refused whatever region it names, before its key is looked at. (Before: only the region's
// bounds were checked, so a region larger than 1 GiB could be read in one request.)
TEST_F(IwarpHostile, ReadRequestLongerThanTheAdvertisedTransferLengthIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  const uint64_t limit = Device::All()[0]->attributes().max_transfer_length;
  ASSERT_LT(limit, uint64_t(UINT32_MAX));
  w::ReadRequest read{0x77, 0, uint32_t(limit + 1), c.readable.rkey, c.readable.addr()};
  DdpHeader h = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true);
  c.peer.Send(Fpdu(h, {}, c.peer.crc, &read));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(
      c, w::MakeTerm(w::RdmapErrorType::RemoteOperation, w::RdmapErrorCode::Unspecified), c.AllReceivesFlushed(),
      term));
  ExpectNamesSegment(term, h, h.length() + w::kReadRequestLen);
  c.ExpectMemoryUntouched();
}

// An Accept that granted no inbound Reads (IRD 0): a Read Request for data is refused as beyond
// it, before its key is looked at (the stream still answers a zero-length Read, the probe by
// which an ndwv peer confirms its Sends and Writes).
TEST_F(IwarpHostile, ReadRequestForDataWhereTheAcceptGrantedNoReadsIsTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c, kRecvs, 0, /*ird=*/0));
  auto stream = std::dynamic_pointer_cast<iwarp::Stream>(c.qp->link());
  ASSERT_TRUE(stream);
  w::ReadRequest probe{0x77, 0, 0, 0, 0};
  DdpHeader first = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true);
  c.peer.Send(Fpdu(first, {}, c.peer.crc, &probe));
  Segment answer;
  ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, answer));
  EXPECT_EQ(answer.hdr.opcode, RdmapOpcode::ReadResponse) << "the zero-length Read was not answered";
  w::ReadRequest read{0x78, 0, 64, c.readable.rkey, c.readable.addr()};
  DdpHeader second = DdpHeader::Untagged(RdmapOpcode::ReadRequest, 2, 0, true);
  c.peer.Send(Fpdu(second, {}, c.peer.crc, &read));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpUntaggedCode::InvalidMsnNoBuffer),
                                                     c.AllReceivesFlushed(), term));
  ExpectNamesSegment(term, second, second.length() + w::kReadRequestLen);
  EXPECT_EQ(stream->counters().Get(Counter::ReadsBeyondIrd), 1u);
  c.ExpectMemoryUntouched();
}

// The peer's Terminate, as raw ULPDU bytes, to be altered before it is framed.
std::vector<uint8_t> TerminateUlpdu(TermCode code) {
  std::vector<uint8_t> term(w::kTerminateMaxLen);
  term.resize(w::EncodeTerminate(term, code));
  EXPECT_EQ(term.size(), w::kTerminateHeaderLen);
  return term;
}

std::vector<uint8_t> Frame(std::span<const uint8_t> ulpdu, bool crc) {
  std::vector<uint8_t> fpdu(w::FpduLength(ulpdu.size()));
  EXPECT_EQ(w::EncodeFpdu(ulpdu, crc, fpdu), fpdu.size());
  return fpdu;
}

// The raw peer sends the Terminate `term` (its ULPDU): the stream ends unanswered (no Terminate
// answers one), and the QP is flushed with `completions`.
void SendTerminateExpectUnanswered(Conn& c, std::span<const uint8_t> term,
                                   const std::map<uint64_t, WcStatus>& completions) {
  c.peer.Send(Frame(term, c.peer.crc));
  Inbound in = Collect(c.peer);
  EXPECT_TRUE(in.error.empty()) << in.error;
  EXPECT_NE(in.end, End::Timeout);
  EXPECT_EQ(in.Count(RdmapOpcode::Terminate), 0u) << "a Terminate was answered with a Terminate";
  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(completions);
}

// A Terminate's own DDP header is checked like any untagged message's: the only message on its
// queue has MSN 1, MO 0 and the L bit. One that breaks this still ends the connection, unanswered
// (a Terminate is never answered with one), and is counted as a bad DDP segment, not as a
// Terminate received. (Before: its MSN, MO and L were not looked at, nor was it counted.)
TEST_F(IwarpHostile, TerminateWithBadHeaderFieldsEndsTheConnectionCountedAndUnanswered) {
  enum Field { Msn, Mo, NotLast };
  for (Field field : {Msn, Mo, NotLast}) {
    SCOPED_TRACE(field == Msn ? "MSN 2" : field == Mo ? "MO 4" : "L bit clear");
    Conn& c = NewConn();
    ASSERT_NO_FATAL_FAILURE(Establish(c));
    auto stream = std::dynamic_pointer_cast<iwarp::Stream>(c.qp->link());
    ASSERT_TRUE(stream);
    std::vector<uint8_t> term = TerminateUlpdu(w::kTermRdmapCatastrophic);
    if (field == Msn) w::StoreBe32(term.data() + 10, 2);
    if (field == Mo) w::StoreBe32(term.data() + 14, 4);
    if (field == NotLast) w::StoreBe16(term.data(), uint16_t(w::LoadBe16(term.data()) & ~w::kDdpLast));
    ASSERT_NO_FATAL_FAILURE(SendTerminateExpectUnanswered(c, term, c.AllReceivesFlushed()));
    EXPECT_EQ(stream->counters().Get(Counter::DropsBadDdp), 1u);
    EXPECT_EQ(stream->counters().Get(Counter::TerminatesReceivedRdmap), 0u);
    c.ExpectMemoryUntouched();
  }
}

// A Terminate whose M and D flags promise the offending segment's headers but which carries none
// does not decode: nothing is read past it, it names no request of ours (the Write it might have
// blamed is flushed, not failed with the Terminate's code), and it is counted as a bad DDP
// segment. (Before: the decode error was ignored, and the oldest unconfirmed Write took the
// blame: ND_ACCESS_VIOLATION on the word of a malformed message.)
TEST_F(IwarpHostile, TerminateThatDoesNotDecodeBlamesNoRequestAndIsCounted) {
  const base::Settings* settings = base::LoadSettings();
  if (settings && settings->confirm == base::Settings::Confirm::None) GTEST_SKIP() << "Writes are not confirmed";
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  auto stream = std::dynamic_pointer_cast<iwarp::Stream>(c.qp->link());
  ASSERT_TRUE(stream);
  Segment probe;
  ASSERT_NO_FATAL_FAILURE(PostWriteAndReadProbe(c, 9, probe));
  std::vector<uint8_t> term = TerminateUlpdu(Protection(w::RdmapErrorCode::InvalidStag));
  uint8_t* ctrl = term.data() + w::kDdpUntaggedHeaderLen;
  w::StoreBe32(ctrl, w::LoadBe32(ctrl) | w::kTermFlagM | w::kTermFlagD);
  auto expected = c.AllReceivesFlushed();
  expected[9] = WcStatus::Flushed;
  ASSERT_NO_FATAL_FAILURE(SendTerminateExpectUnanswered(c, term, expected));
  EXPECT_EQ(stream->counters().Get(Counter::DropsBadDdp), 1u);
  EXPECT_EQ(stream->counters().Get(Counter::TerminatesReceivedRdmap), 0u);
}

// A Terminate holds its control word and the headers its flags announce, nothing more: one with
// bytes after them is malformed (counted, unanswered, blames no request). (Before: up to 48 such
// bytes were taken with it.)
TEST_F(IwarpHostile, TerminateWithBytesItsFlagsDoNotAnnounceIsCountedAsMalformed) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  auto stream = std::dynamic_pointer_cast<iwarp::Stream>(c.qp->link());
  ASSERT_TRUE(stream);
  std::vector<uint8_t> term = TerminateUlpdu(w::kTermRdmapCatastrophic);
  term.resize(term.size() + 8, 0xAB);
  ASSERT_NO_FATAL_FAILURE(SendTerminateExpectUnanswered(c, term, c.AllReceivesFlushed()));
  EXPECT_EQ(stream->counters().Get(Counter::DropsBadDdp), 1u);
  EXPECT_EQ(stream->counters().Get(Counter::TerminatesReceivedRdmap), 0u);
  c.ExpectMemoryUntouched();
}

// A Terminate from the peer ends the connection; it is not answered with one.
TEST_F(IwarpHostile, PeersTerminateFlushesTheQpAndIsNotAnswered) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  ASSERT_NO_FATAL_FAILURE(
      SendTerminateExpectUnanswered(c, TerminateUlpdu(w::kTermRdmapCatastrophic), c.AllReceivesFlushed()));
  EXPECT_EQ(c.notify.Wait(), std::optional<int32_t>(WV_SUCCESS));
  c.ExpectMemoryUntouched();
}

// ==== 7. two connections: the hostile one ends alone ==========================================

TEST_F(IwarpHostile, HostileBytesOnOneConnectionLeaveTheOtherWorking) {
  Conn& bad = NewConn();
  Conn& good = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(bad));
  ASSERT_NO_FATAL_FAILURE(Establish(good));

  // The hostile peer writes to the good connection's region with a key its own connection
  // grants: keys are per PD, and the good region's address is outside the one this key names.
  DdpHeader h = DdpHeader::Tagged(RdmapOpcode::RdmaWrite, bad.writable.rkey, good.writable.addr(), true);
  bad.peer.Send(Fpdu(h, Bytes(64, 25), bad.peer.crc));
  Segment term;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(bad, Protection(w::RdmapErrorCode::BaseBounds),
                                                     bad.AllReceivesFlushed(), term));
  bad.ExpectMemoryUntouched();
  good.ExpectMemoryUntouched();

  // The good connection: nothing happened to it ...
  good.Drain();
  EXPECT_TRUE(good.completions.empty());
  EXPECT_EQ(good.qp->state(), QpState::Rts);
  EXPECT_EQ(good.notify.count(), 0u) << "the good connection was told of a disconnect";

  // ... and it still receives (Write, Send, Read) ...
  std::vector<uint8_t> data = Bytes(80, 26), message = Bytes(60, 27);
  w::ReadRequest read{0x99, 0x10, 48, good.readable.rkey, good.readable.addr() + 100};
  good.peer.Send(Concat({Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, good.writable.rkey, good.writable.addr() + 200, true),
                              data, good.peer.crc),
                         Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, good.peer.crc),
                         Fpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true), {}, good.peer.crc, &read)}));
  ASSERT_TRUE(good.PollUntil([&] { return !good.completions.empty(); }));
  EXPECT_EQ(good.completions[0].wr_id, kFirstRecvId);
  EXPECT_EQ(good.completions[0].status, WcStatus::Success);
  EXPECT_EQ(good.completions[0].length, message.size());
  EXPECT_TRUE(Unchanged(good.recv, "good receive buffers", 0, message.size(), message));
  EXPECT_EQ(memcmp(good.recv.region(), message.data(), message.size()), 0);
  EXPECT_EQ(memcmp(good.writable.region() + 200, data.data(), data.size()), 0);
  EXPECT_TRUE(Unchanged(good.writable, "good writable region", 200, 200 + data.size(), data));
  Segment response;
  ASSERT_NO_FATAL_FAILURE(ReadFpdu(good.peer, response));
  EXPECT_EQ(response.hdr.opcode, RdmapOpcode::ReadResponse);
  EXPECT_EQ(response.hdr.stag, read.sink_stag);
  ASSERT_EQ(response.payload.size(), 48u);
  EXPECT_EQ(memcmp(response.payload.data(), good.readable.region() + 100, 48), 0);

  // ... and sends.
  ASSERT_EQ(good.qp->PostSend(SignaledSend(55, {good.local.addr(), 100, good.local.key})), WV_SUCCESS);
  Segment got;
  ASSERT_NO_FATAL_FAILURE(ReadFpdu(good.peer, got));
  EXPECT_EQ(got.hdr.opcode, RdmapOpcode::Send);
  EXPECT_EQ(got.hdr.msn, 1u);
  ASSERT_EQ(got.payload.size(), 100u);
  EXPECT_EQ(memcmp(got.payload.data(), good.local.region(), 100), 0);
  if (ConfirmsSends()) {
    // ndwv confirms the Send with a zero-length Read; the raw peer answers it as RDMAP requires.
    Segment probe;
    ASSERT_NO_FATAL_FAILURE(ReadFpdu(good.peer, probe));
    ASSERT_EQ(probe.hdr.opcode, RdmapOpcode::ReadRequest);
    EXPECT_EQ(probe.read.size, 0u);
    good.peer.Send(Fpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, probe.read.sink_stag, probe.read.sink_to, true),
                        {}, good.peer.crc));
  }
  ASSERT_TRUE(good.PollUntil([&] { return good.completions.size() >= 2; }));
  EXPECT_EQ(good.completions[1].wr_id, 55u);
  EXPECT_EQ(good.completions[1].status, WcStatus::Success);
  EXPECT_EQ(good.qp->state(), QpState::Rts);
  EXPECT_EQ(good.notify.count(), 0u);
  EXPECT_EQ(bad.notify.count(), 1u);
}


// ==== 8. what a peer may make ndwv place or hold (issue 18) ====================================

// The process's resident memory in KiB and its open descriptors, for the flood tests' bounds.
long ResidentKiB() {
  FILE* f = fopen("/proc/self/status", "re");
  long kib = -1;
  char line[256];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}
size_t OpenDescriptors() {
  size_t n = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (readdir(dir)) n++;
    closedir(dir);
  }
  return n;
}

// A Read's sink buffer deregistered while the Read is outstanding: its response lands nowhere.
// The Read completes with a local protection error, as an HCA's does; the peer is told that the
// STag of its Read Response is invalid (DDP tagged buffer error), and the connection ends. The
// buffer and its guard zones are unchanged. Both paths are taken: a short response (all of it in
// the FPDU's checked tail) and a long one sent in two pieces (placed as its bytes arrive). The
// same Reads with the buffer left registered are placed, and complete with success.
TEST_F(IwarpHostile, ReadResponseIsNotPlacedIntoASinkDeregisteredMeanwhile) {
  for (uint32_t length : {32u, 400u}) {
    for (bool deregister : {false, true}) {
      SCOPED_TRACE(std::to_string(length) + " bytes, " + (deregister ? "deregistered" : "registered"));
      Conn& c = NewConn();
      ASSERT_NO_FATAL_FAILURE(Establish(c));
      Segment request;
      ASSERT_NO_FATAL_FAILURE(PostRead(c, 8, length, request));
      if (deregister) {
        ASSERT_EQ(c.pd->Deregister(c.local.key), WV_SUCCESS);
      }

      std::vector<uint8_t> data = Bytes(length, 41);
      DdpHeader h = DdpHeader::Tagged(RdmapOpcode::ReadResponse, request.read.sink_stag, request.read.sink_to, true);
      std::vector<uint8_t> fpdu = Fpdu(h, data, c.peer.crc);
      const std::span<const uint8_t> bytes(fpdu);
      c.peer.Send(bytes.first(40));
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      c.peer.Send(bytes.subspan(40));
      if (!deregister) {
        ASSERT_TRUE(c.PollUntil([&] { return !c.completions.empty(); })) << "the Read did not complete";
        EXPECT_EQ(c.completions[0].wr_id, 7u);
        EXPECT_EQ(c.completions[0].status, WcStatus::Success);
        EXPECT_EQ(memcmp(c.local.region() + 8, data.data(), length), 0) << "the response was not placed";
        EXPECT_TRUE(Unchanged(c.local, "Read sink", 8, 8 + length, data));
        continue;
      }
      Segment term;
      auto expected = c.AllReceivesFlushed();
      expected[7] = WcStatus::LocalProtection;
      ASSERT_NO_FATAL_FAILURE(
          ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpTaggedCode::InvalidStag), expected, term));
      ExpectNamesSegment(term, h, h.length() + length);
      EXPECT_TRUE(Unchanged(c.local, "deregistered Read sink"));
    }
  }
}

// A Read Response must fill its sink from the start, in order, to the end. One that ends early
// (the last segment short of the Read's length) or skips bytes (a first segment past offset 0)
// would complete a Read with memory never written: it is terminated (tagged base or bounds
// violation) and the Read does not succeed. (Before: both completed the Read with Success.)
TEST_F(IwarpHostile, ReadResponseThatEndsEarlyOrSkipsBytesIsTerminated) {
  constexpr uint32_t kLength = 400;
  for (uint64_t skip : {uint64_t(0), uint64_t(200)}) {
    SCOPED_TRACE(skip ? "skips the first 200 bytes" : "ends after 200 of 400 bytes");
    Conn& c = NewConn();
    ASSERT_NO_FATAL_FAILURE(Establish(c));
    Segment request;
    ASSERT_NO_FATAL_FAILURE(PostRead(c, 8, kLength, request));
    std::vector<uint8_t> data = Bytes(200, 43);
    DdpHeader h = DdpHeader::Tagged(RdmapOpcode::ReadResponse, request.read.sink_stag,
                                    request.read.sink_to + skip, true);
    c.peer.Send(Fpdu(h, data, c.peer.crc));
    Segment term;
    auto expected = c.AllReceivesFlushed();
    expected[7] = WcStatus::Flushed;
    ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpTaggedCode::BaseBounds), expected, term));
    ExpectNamesSegment(term, h, h.length() + data.size());
    EXPECT_TRUE(Unchanged(c.local, "Read sink")) << "a refused response placed bytes";
  }
}

// Small Sends are built whole in the transmit batch, which a stream borrows from its thread and
// keeps for itself only when the socket does not take it all. A peer that reads nothing fills
// the socket mid-batch; another connection then sends from the same thread (its FPDUs built in
// the same borrowed batch); when the first peer reads, every one of its messages arrives intact
// and in order: what was left moved with its bytes, not pointing into the batch lent since.
TEST_F(IwarpHostile, ControlSmallSendsLeftInAFullSocketArriveIntactAfterTheThreadSendsForAnother) {
  constexpr uint32_t kChunk = 16, kMostChunks = 8192, kSize = 64;
  Conn& full = NewConn(4 * kChunk);
  ASSERT_NO_FATAL_FAILURE(Establish(full, kRecvs, /*receive_buffer=*/4096));
  Conn& other = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(other));
  auto post = [](Conn& c, uint32_t i, uint8_t seed, bool signaled) {
    SendWqe send{};
    send.wr_id = i;
    send.opcode = WrOpcode::Send;
    send.flags = kInline | (signaled ? uint32_t(kSignaled) : 0u);
    send.length = kSize;
    std::vector<uint8_t> bytes = Bytes(kSize, uint8_t(seed + i));  // copied by the post
    send.num_sge = 1;
    send.sge[0] = {reinterpret_cast<uintptr_t>(bytes.data()), kSize, 0};
    ASSERT_EQ(c.qp->PostSend(send), WV_SUCCESS) << "send " << i;
  };
  // Chunks of Sends, the last of each signaled, until one does not complete (a Send completes
  // once TCP has all of it): the socket is full.
  uint32_t sent = 0, chunks = 0;
  for (; chunks < kMostChunks && full.completions.size() == chunks; ++chunks) {
    for (uint32_t k = 0; k < kChunk; ++k, ++sent) ASSERT_NO_FATAL_FAILURE(post(full, sent, 1, k == kChunk - 1));
    full.Drain();
  }
  ASSERT_LT(full.completions.size(), chunks) << "the socket never filled: nothing to check";

  for (uint32_t i = 0; i < kChunk; ++i) ASSERT_NO_FATAL_FAILURE(post(other, i, 100, false));
  for (uint32_t i = 0; i < kChunk; ++i) {
    Segment got;
    ASSERT_NO_FATAL_FAILURE(ReadFpdu(other.peer, got));
    ASSERT_EQ(got.payload, Bytes(kSize, uint8_t(100 + i)));
  }

  for (uint32_t i = 0; i < sent; ++i) {
    Segment got;
    ASSERT_NO_FATAL_FAILURE(ReadFpdu(full.peer, got)) << "message " << i;
    ASSERT_EQ(got.hdr.opcode, RdmapOpcode::Send) << "message " << i;
    ASSERT_EQ(got.hdr.msn, i + 1) << "message " << i;
    ASSERT_EQ(got.payload, Bytes(kSize, uint8_t(1 + i))) << "message " << i;
  }
  ASSERT_TRUE(full.PollUntil([&] { return full.completions.size() == chunks; }));
  for (const Completion& c : full.completions) EXPECT_EQ(c.status, WcStatus::Success);
}

// A stream reads ahead into staging its thread lends it for the read, and keeps what it has not
// taken (a segment that arrived in part) in staging of its own. A peer sends a Send but for its
// last bytes, which the engine reads; another connection then receives on the same
// engine thread (its segment read into the same lent staging); when the rest of the first Send
// arrives, it completes byte-exact: the bytes read first moved with the stream, not left in the
// staging lent since. Nothing polls either CQ until the end, so the engine reads both sockets.
TEST_F(IwarpHostile, ControlSegmentReadInPartArrivesIntactAfterTheThreadReceivesForAnother) {
  Conn& split = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(split));
  Conn& other = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(other));
  auto split_stream = std::dynamic_pointer_cast<iwarp::Stream>(split.qp->link());
  auto other_stream = std::dynamic_pointer_cast<iwarp::Stream>(other.qp->link());
  ASSERT_TRUE(split_stream && other_stream);
  auto segments = [](const std::shared_ptr<iwarp::Stream>& s) { return s->counters().Get(Counter::RxPackets); };
  const uint64_t split_before = segments(split_stream), other_before = segments(other_stream);
  const std::vector<uint8_t> message = Bytes(kRecvSize, 7), other_message = Bytes(kRecvSize, 9);
  std::vector<uint8_t> fpdu = Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), message, split.peer.crc);
  // All but the last 20 bytes: the payload's last 64 wait in staging for the CRC, so most of them
  // are read and not yet taken.
  const size_t first_part = fpdu.size() - 20;
  split.peer.Send({fpdu.begin(), fpdu.begin() + first_part});
  ASSERT_TRUE(WaitUntil([&] { return segments(split_stream) > split_before; }, kBound)) << "the header was not read";
  other.peer.Send(Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), other_message, other.peer.crc));
  ASSERT_TRUE(WaitUntil([&] { return segments(other_stream) > other_before; }, kBound)) << "the other Send was not read";
  split.peer.Send({fpdu.begin() + first_part, fpdu.end()});

  for (Conn* c : {&split, &other}) {
    ASSERT_TRUE(c->PollUntil([&] { return !c->completions.empty(); })) << "a Send did not complete";
    ASSERT_EQ(c->completions.size(), 1u);
    EXPECT_EQ(c->completions[0].status, WcStatus::Success);
    EXPECT_EQ(c->completions[0].length, kRecvSize);
  }
  EXPECT_TRUE(Unchanged(split.recv, "receive buffers", 0, kRecvSize, message));
  EXPECT_TRUE(Unchanged(other.recv, "receive buffers", 0, kRecvSize, other_message));
}

// A peer that keeps its socket full (here with zero-length Writes, which cost it nothing and
// ndwv nothing but the reading) must not hold the engine's loop: the engine takes at most
// kEngineSegments of a stream per turn, then fires the timers due and serves the other
// sockets, and takes the rest, read ahead or still in the socket, in the next turns.
TEST_F(IwarpHostile, AStreamKeptFullIsReadInTurnsWithTheTimersBetween) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  auto stream = std::dynamic_pointer_cast<iwarp::Stream>(c.qp->link());
  ASSERT_TRUE(stream);
  const uint64_t before = stream->counters().Get(Counter::RxPackets);
  constexpr size_t kQueued = 300;
  static_assert(kQueued > 2 * iwarp::Stream::kEngineSegments, "more than two turns' segments");
  auto hold = std::make_shared<EngineHold>();
  ASSERT_TRUE(hold->Engage()) << "the engine never ran the handler";
  std::vector<uint8_t> writes;
  for (size_t i = 0; i < kQueued; ++i) {
    std::vector<uint8_t> fpdu = Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, 0, 0, true), {}, c.peer.crc);
    writes.insert(writes.end(), fpdu.begin(), fpdu.end());
  }
  c.peer.Send(writes);

  TurnRecorder turns(3, [&] { return stream->counters().Get(Counter::RxPackets) - before; });
  turns.Start();
  hold->Release();
  const std::vector<uint64_t> seen = turns.Wait(kBound);
  ASSERT_EQ(seen.size(), 3u) << "the timer did not fire three times";
  EXPECT_EQ(seen[0], 0u);  // the held turn ended: nothing read yet
  EXPECT_EQ(seen[1], iwarp::Stream::kEngineSegments);
  EXPECT_EQ(seen[2], 2 * iwarp::Stream::kEngineSegments);
  // The rest follows, and the connection is whole.
  ASSERT_TRUE(WaitUntil([&] { return stream->counters().Get(Counter::RxPackets) - before == kQueued; }, kBound))
      << stream->counters().Get(Counter::RxPackets) - before << " of " << kQueued << " segments read";
  EXPECT_EQ(c.qp->state(), QpState::Rts);
  PostWrite(c, 9);
  Segment write;
  ASSERT_NO_FATAL_FAILURE(ReadFpdu(c.peer, write));
  EXPECT_EQ(write.hdr.opcode, RdmapOpcode::RdmaWrite);
}

// Zero-length Read Requests count against the IRD like any other. A peer that sends them and
// reads nothing, so that the answers cannot leave, makes ndwv hold at most IRD answers; the next
// request is refused with a Terminate ("no buffer" on the Read Request queue) that follows the
// answers that fitted, and the connection ends. Neither memory nor descriptors grow with the
// flood. (Before: zero-length requests were not counted, and the answers piled up unbounded.)
TEST_F(IwarpHostile, ZeroLengthReadFloodIsHeldToTheIrdAndTerminated) {
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c, kRecvs, /*receive_buffer=*/4096));
  auto stream = std::dynamic_pointer_cast<iwarp::Stream>(c.qp->link());
  ASSERT_TRUE(stream);
  const long rss_before = ResidentKiB();
  const size_t descriptors_before = OpenDescriptors();

  // Requests go out in chunks (MSNs from 1) until ndwv refuses one; more than a million would
  // have made the unbounded queue of old grow by tens of MB.
  constexpr uint32_t kChunk = 1000, kMost = 1'200'000;
  auto sink_stag = [](uint32_t msn) { return 0x00100000u + msn; };
  uint32_t built = 0, max_queued = 0;
  std::vector<uint8_t> pending;
  size_t pending_at = 0;
  const auto deadline = Clock::now() + 4 * kBound;
  while (stream->counters().Get(Counter::ReadsBeyondIrd) == 0 && Clock::now() < deadline) {
    max_queued = std::max(max_queued, stream->ResponsesQueued());
    if (pending_at == pending.size()) {
      if (built == kMost) break;
      pending.clear();
      pending_at = 0;
      for (uint32_t i = 0; i < kChunk; ++i, ++built) {
        w::ReadRequest read{sink_stag(built + 1), 0, 0, 0, 0};
        std::vector<uint8_t> f =
            Fpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, built + 1, 0, true), {}, c.peer.crc, &read);
        pending.insert(pending.end(), f.begin(), f.end());
      }
    }
    ssize_t n = send(c.peer.fd(), pending.data() + pending_at, pending.size() - pending_at, MSG_NOSIGNAL);
    if (n > 0) {
      pending_at += size_t(n);
    } else {
      ASSERT_TRUE(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) << strerror(errno);
      pollfd p{c.peer.fd(), POLLOUT, 0};
      poll(&p, 1, 20);  // ndwv is not reading now; it is looked at again
    }
  }
  max_queued = std::max(max_queued, stream->ResponsesQueued());
  const long rss_after = ResidentKiB();
  EXPECT_LE(max_queued, kIrd) << "answers queued beyond the IRD";
  ASSERT_EQ(stream->counters().Get(Counter::ReadsBeyondIrd), 1u)
      << built << " requests built, none refused; " << stream->ResponsesQueued() << " answers queued";
#ifndef __SANITIZE_ADDRESS__  // ASan keeps freed memory (the test's own) in quarantine
  EXPECT_LT(rss_after - rss_before, 8 * 1024) << "KiB of resident memory grew with the flood";
#else
  (void)rss_after, (void)rss_before;
#endif

  // The peer reads now: the answers that fitted, in order, then the Terminate naming the request
  // that found the IRD's answers all waiting.
  Inbound in = Collect(c.peer);
  ASSERT_TRUE(in.error.empty()) << in.error;
  EXPECT_NE(in.end, End::Timeout);
  ASSERT_GE(in.segments.size(), 1u);
  const size_t answers = in.segments.size() - 1;
  for (size_t i = 0; i < answers; ++i) {
    ASSERT_EQ(in.segments[i].hdr.opcode, RdmapOpcode::ReadResponse) << "FPDU " << i;
    ASSERT_EQ(in.segments[i].hdr.stag, sink_stag(uint32_t(i + 1))) << "answers in request order";
    ASSERT_TRUE(in.segments[i].payload.empty());
  }
  const Segment& term = in.segments.back();
  ASSERT_EQ(term.hdr.opcode, RdmapOpcode::Terminate);
  EXPECT_EQ(term.term.code, w::MakeTerm(w::DdpUntaggedCode::InvalidMsnNoBuffer)) << Name(term.term.code);
  DdpHeader named;
  ASSERT_TRUE(term.term.d);
  ASSERT_EQ(w::DecodeDdpHeader(term.term_ddp, named), w::DdpError::Ok);
  EXPECT_EQ(named.opcode, RdmapOpcode::ReadRequest);
  EXPECT_EQ(named.msn, answers + kIrd + 1) << "the refused request is not the one after IRD waiting answers";

  ASSERT_NO_FATAL_FAILURE(c.WaitForError());
  c.ExpectCompletions(c.AllReceivesFlushed());
  stream.reset();
  EXPECT_TRUE(WaitUntil([&] { return OpenDescriptors() <= descriptors_before - 1; }, kBound))
      << "the connection's socket was not closed: " << OpenDescriptors() << " descriptors, "
      << descriptors_before << " before";
}

// Each confirming Read (probe) carries its own sink STag, and its answer must name exactly that
// one: a peer that replays the answer to an earlier probe for the probe now outstanding cannot
// make ndwv confirm the Write it was sent for. DDP tagged "invalid STag"; the Write does not
// succeed. (Before: any probe's STag answered the oldest probe, and the Write completed.)
TEST_F(IwarpHostile, ReplayedProbeAnswerDoesNotConfirmTheNextWrite) {
  const base::Settings* settings = base::LoadSettings();
  if (settings && settings->confirm == base::Settings::Confirm::None) GTEST_SKIP() << "Writes are not confirmed";
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(c));
  Segment first;
  ASSERT_NO_FATAL_FAILURE(PostWriteAndReadProbe(c, 10, first));
  DdpHeader answer = DdpHeader::Tagged(RdmapOpcode::ReadResponse, first.read.sink_stag, first.read.sink_to, true);
  c.peer.Send(Fpdu(answer, {}, c.peer.crc));
  ASSERT_TRUE(c.PollUntil([&] { return !c.completions.empty(); })) << "the first Write was not confirmed";
  EXPECT_EQ(c.completions[0].status, WcStatus::Success);

  Segment second;
  ASSERT_NO_FATAL_FAILURE(PostWriteAndReadProbe(c, 11, second));
  ASSERT_NE(second.read.sink_stag, first.read.sink_stag) << "two probes with one STag";
  c.peer.Send(Fpdu(answer, {}, c.peer.crc));  // the first answer again
  Segment term;
  auto expected = c.AllReceivesFlushed();
  expected[10] = WcStatus::Success;
  expected[11] = WcStatus::Flushed;
  ASSERT_NO_FATAL_FAILURE(ExpectTerminatedAndFlushed(c, w::MakeTerm(w::DdpTaggedCode::InvalidStag), expected, term));
  ExpectNamesSegment(term, answer, answer.length());
}

// A connection whose MPA Request waits for GetRequest holds a backlog slot and a socket. If its
// peer leaves meanwhile, both are given back at once: the request is dropped (and counted), and
// the slot serves the next connection. Before, it stayed queued with its socket until a GetRequest
// took it: a flood of such connections exhausted the process's descriptors for good.
TEST_F(IwarpHostile, QueuedRequestWhosePeerLeavesIsDroppedAtOnce) {
  const size_t descriptors_before = OpenDescriptors();
  const uint64_t abandoned_before = AdapterCounters(Transport::Iwarp).Get(Counter::MpaRequestsAbandoned);
  const uint64_t full_before = AdapterCounters(Transport::Iwarp).Get(Counter::ListenBacklogFull);
  const uint64_t received_before = AdapterCounters(Transport::Iwarp).Get(Counter::MpaRequestsReceived);
  auto abandoned = [&] { return AdapterCounters(Transport::Iwarp).Get(Counter::MpaRequestsAbandoned) - abandoned_before; };
  auto received = [&] { return AdapterCounters(Transport::Iwarp).Get(Counter::MpaRequestsReceived) - received_before; };

  // Twice the backlog, in two rounds: each round fills it and leaves.
  for (int round = 0; round < 2; ++round) {
    std::vector<std::unique_ptr<RawPeer>> peers;
    for (int i = 0; i < kBacklog; ++i) {
      peers.push_back(std::make_unique<RawPeer>());
      ASSERT_NO_FATAL_FAILURE(peers.back()->Connect(port));
      ASSERT_NO_FATAL_FAILURE(peers.back()->Send(Encode(GoodRequest())));
    }
    // The backlog is full of live requests: one more connection is refused at once, unanswered.
    // (Known by the requests read, not by descriptors: an earlier test's stream may still be
    // lingering after its Terminate, and close meanwhile.)
    ASSERT_TRUE(WaitUntil([&] { return received() == uint64_t(kBacklog * (round + 1)); }, kBound));
    RawPeer extra;
    ASSERT_NO_FATAL_FAILURE(extra.Connect(port));
    std::vector<uint8_t> answer;
    EXPECT_NE(extra.ReadToEnd(answer), End::Timeout) << "a connection beyond the backlog was kept";
    EXPECT_TRUE(answer.empty());
    EXPECT_EQ(AdapterCounters(Transport::Iwarp).Get(Counter::ListenBacklogFull) - full_before, uint64_t(round + 1));
    for (auto& p : peers) p->Close();
    EXPECT_TRUE(WaitUntil([&] { return abandoned() == uint64_t(kBacklog * (round + 1)); }, kBound))
        << abandoned() << " dropped";
  }
  EXPECT_TRUE(WaitUntil([&] { return OpenDescriptors() <= descriptors_before; }, kBound))
      << OpenDescriptors() << " descriptors open, " << descriptors_before << " before";

  // The slots serve a good connection: GetRequest gets it, not one of those that left.
  Conn& good = NewConn();
  ASSERT_NO_FATAL_FAILURE(Establish(good));
  ConnectionInfo info;
  ASSERT_EQ(good.ep->Query(&info), WV_SUCCESS);
  EXPECT_EQ(ntohs(reinterpret_cast<const sockaddr_in&>(info.peer).sin_port), good.peer.LocalPort());
}

// A request waiting for GetRequest is watched only for its peer leaving. Bytes its peer sends
// meanwhile belong to the stream and stay in the socket, unread; a watch that still asked for
// them (level-triggered) would wake the engine over and over while nothing happens. The request
// is served afterwards all the same.
TEST_F(IwarpHostile, BytesThePeerOfAQueuedRequestSendsDoNotKeepTheEngineBusy) {
  const uint64_t received_before = AdapterCounters(Transport::Iwarp).Get(Counter::MpaRequestsReceived);
  Conn& c = NewConn();
  ASSERT_NO_FATAL_FAILURE(c.peer.Connect(port));
  ASSERT_NO_FATAL_FAILURE(c.peer.Send(Encode(GoodRequest())));
  ASSERT_TRUE(WaitUntil([&] {
    return AdapterCounters(Transport::Iwarp).Get(Counter::MpaRequestsReceived) != received_before;
  }, kBound)) << "the listener never read the request";
  ASSERT_NO_FATAL_FAILURE(c.peer.Send(Bytes(64, 7)));  // early: no MPA Reply came yet
  std::this_thread::sleep_for(50ms);  // the watch is narrowed right after the request is read
  const uint64_t before = Engine::Get().EventsHandled();
  std::this_thread::sleep_for(200ms);
  // A busy loop handles tens of thousands of events in that time; a quiet engine, none.
  EXPECT_LT(Engine::Get().EventsHandled() - before, 20u);
  ASSERT_EQ(listener->GetRequest(c.ep, &c.get_request), WV_PENDING);
  EXPECT_EQ(c.get_request.Wait(), std::optional<int32_t>(WV_SUCCESS));
}

// ND's Listen(0) asks for no limit. The listener holds the host's backlog (somaxconn) of
// connections and requests, and a connection beyond it is not refused: accepting stops, the
// kernel's queue holds it (TCP makes its connect wait), and it is taken as soon as a request
// leaves. (Refused, Microsoft's ndconn, whose client connects without bound, counted a failed
// Connect and never finished.) An explicit backlog refuses beyond it, as above.
TEST_F(IwarpHostile, AListenerAskedForNoLimitLetsConnectionsBeyondItsBacklogWait) {
  const int n = HostBacklog();
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  const rlim_t need = rlim_t(2 * n) + OpenDescriptors() + 256;  // both ends of every connection
  rlimit raised = saved;
  raised.rlim_cur = std::max(saved.rlim_cur, std::min(need, saved.rlim_max));
  if (raised.rlim_cur < need || setrlimit(RLIMIT_NOFILE, &raised) != 0)
    GTEST_SKIP() << "needs " << need << " descriptors";
  struct Restore {
    rlimit limit;
    ~Restore() { setrlimit(RLIMIT_NOFILE, &limit); }
  } restore{saved};

  auto open = Device::All()[0]->CreateEndpoint();
  const uint16_t open_port = ListenOnLoopback(*open, 0);
  ASSERT_NE(open_port, 0);
  auto count = [](Counter c) { return AdapterCounters(Transport::Iwarp).Get(c); };
  const uint64_t received_before = count(Counter::MpaRequestsReceived);
  const uint64_t full_before = count(Counter::ListenBacklogFull);
  const uint64_t waits_before = count(Counter::ListenBacklogWaits);
  auto received = [&] { return count(Counter::MpaRequestsReceived) - received_before; };

  std::vector<std::unique_ptr<RawPeer>> peers;
  for (int i = 0; i <= n; ++i) {  // the backlog, and one more
    peers.push_back(std::make_unique<RawPeer>());
    ASSERT_NO_FATAL_FAILURE(peers.back()->Connect(open_port));
    ASSERT_NO_FATAL_FAILURE(peers.back()->Send(Encode(GoodRequest())));
  }
  ASSERT_TRUE(WaitUntil([&] { return count(Counter::ListenBacklogWaits) > waits_before; }, kBound))
      << "the listener did not stop accepting at " << received() << " requests";
  EXPECT_EQ(received(), uint64_t(n));
  EXPECT_EQ(count(Counter::ListenBacklogFull), full_before) << "a connection was refused";

  // A request taken: the connection that waited is accepted and its request read.
  Conn& c = NewConn();
  ASSERT_EQ(open->GetRequest(c.ep, &c.get_request), WV_PENDING);
  ASSERT_EQ(c.get_request.Wait(), std::optional<int32_t>(WV_SUCCESS));
  EXPECT_TRUE(WaitUntil([&] { return received() == uint64_t(n) + 1; }, kBound)) << received() << " requests read";
  EXPECT_EQ(count(Counter::ListenBacklogFull), full_before);
  open->Close();
  peers.clear();
}

}  // namespace
}  // namespace ndwv::dev
