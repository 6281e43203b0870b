// libFuzzer target: the RC transport's packet input (dev/roce/rc.h, RcLink::OnPackets) on an
// established link. Each input is a run of datagrams from the peer, given to a fresh link whose
// requests are in flight (a Send, an RDMA Write, an RDMA Read) and whose receives are posted, so
// that the peer's packets reach both the responder (requests into our memory) and the requester
// (ACKs, NAKs, Read Responses into our Read's buffer).
//
// Input: byte 0 is how many datagrams go to the link at once (1..8, as a receive buffer of the
// port would hand them over); then records of a 2-byte big-endian length and that many bytes,
// each decoded as the port does (DecodePacket, without the ICRC, which the port checks before).
//
// Besides ASan/UBSan: the peer writes nothing outside what it was granted. Every buffer sits
// between guard bytes; after the input only the writable region, the posted receives and the
// Read's destination may differ from their pattern, and only inside those ranges.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "base/settings.h"
#include "dev/address.h"
#include "dev/cq.h"
#include "dev/memory.h"
#include "dev/qp.h"
#include "dev/roce/port.h"
#include "dev/roce/rc.h"
#include "wire/bytes.h"
#include "wire/ib.h"

using namespace ndwv;
using namespace ndwv::dev;

#define CHECK(c) \
  do {           \
    if (!(c)) std::abort(); \
  } while (0)

namespace {

constexpr size_t kGuard = 64;

// [guard][region][guard], filled with a pattern; `allowed` ranges of the region may change.
struct Guarded {
  Guarded(size_t length, uint8_t seed) : length(length), bytes(2 * kGuard + length), pattern(bytes.size()) {
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = uint8_t(seed * 37 + i * 7 + (i >> 7));
  }
  uint8_t* region() { return bytes.data() + kGuard; }
  uint64_t addr() { return reinterpret_cast<uint64_t>(region()); }
  void Reset() { bytes = pattern; }
  // Every byte outside [from, to) of the region (guards included) is the pattern's. (memcmp: a
  // loop would be instrumented byte by byte and cost most of the run.)
  void CheckOutside(size_t from = 0, size_t to = 0) const {
    size_t begin = kGuard + from, end = kGuard + std::max(from, to);
    CHECK(memcmp(bytes.data(), pattern.data(), begin) == 0);
    CHECK(memcmp(bytes.data() + end, pattern.data() + end, bytes.size() - end) == 0);
  }
  const size_t length;
  std::vector<uint8_t> bytes, pattern;
  uint32_t lkey = 0, rkey = 0;
};

constexpr uint32_t kPeerQpn = 0x00ABCD;
constexpr size_t kRecvSize = 512;  // receives at 0 and 1024 of the receive region; gaps between

struct World {
  std::shared_ptr<ProtectionDomain> pd = std::make_shared<ProtectionDomain>();
  std::shared_ptr<CompletionQueue> cq = std::make_shared<CompletionQueue>(1024);
  std::shared_ptr<roce::Port> port;
  sockaddr_storage peer{};  // a socket nobody reads: what the link sends is dropped there
  Guarded writable{4096, 1}, readable{4096, 2}, locked{4096, 3}, recv{2048, 4}, source{4096, 5}, sink{4096, 6};

  World() {
    CHECK(base::LoadSettings());
    int32_t status = 0;
    sockaddr_storage local{};
    auto& in = reinterpret_cast<sockaddr_in&>(local);
    in.sin_family = AF_INET;
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    port = roce::Port::Open(local, false, &status);
    CHECK(port);
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    peer = local;
    CHECK(bind(fd, reinterpret_cast<sockaddr*>(&peer), sizeof(sockaddr_in)) == 0);
    socklen_t len = sizeof peer;
    getsockname(fd, reinterpret_cast<sockaddr*>(&peer), &len);  // kept open for the process
    CHECK(pd->Register(writable.region(), writable.length, kRemoteWrite | kLocalWrite, &writable.lkey,
                       &writable.rkey) == 0);
    CHECK(pd->Register(readable.region(), readable.length, kRemoteRead, &readable.lkey, &readable.rkey) == 0);
    CHECK(pd->Register(locked.region(), locked.length, kLocalWrite, &locked.lkey, &locked.rkey) == 0);
    CHECK(pd->Register(recv.region(), recv.length, kLocalWrite, &recv.lkey, &recv.rkey) == 0);
    CHECK(pd->Register(source.region(), source.length, 0, &source.lkey, &source.rkey) == 0);
    CHECK(pd->Register(sink.region(), sink.length, kLocalWrite, &sink.lkey, &sink.rkey) == 0);
  }

  SendWqe Request(uint64_t id, WrOpcode opcode, uint64_t length) {
    SendWqe w{};
    w.wr_id = id;
    w.opcode = opcode;
    w.flags = kSignaled;
    w.num_sge = 1;
    w.length = length;
    if (opcode == WrOpcode::Read) {
      w.sge[0] = {sink.addr() + 256, uint32_t(length), sink.lkey};
    } else {
      w.sge[0] = {source.addr(), uint32_t(length), source.lkey};
    }
    w.remote_addr = 0x10000;
    w.rkey = 0x1234;
    return w;
  }
};

}  // namespace

// No leak checking: a link's last references are dropped on the device's threads after the input
// is done, which libFuzzer's per-input leak check takes for a leak (and scans the heap for, at
// a tenth of the speed).
extern "C" int __lsan_is_turned_off() { return 1; }

namespace {

World& TheWorld() {
  static World* world = new World;  // lives as long as the process (the engine's threads use it)
  return *world;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = TheWorld();
  for (Guarded* g : {&w.writable, &w.readable, &w.locked, &w.recv, &w.source, &w.sink}) g->Reset();

  // A fresh established link: PSNs from 0 both ways, an MTU of 1024.
  auto qp = std::make_shared<QueuePair>(w.pd, w.cq, w.cq, nullptr, nullptr, QpCaps{16, 16, 4, 4, 64});
  CHECK(qp->Modify(QpState::Init) == 0 && qp->Modify(QpState::Rtr) == 0);
  roce::RcParams params;
  params.peer = w.peer;
  params.dest_qpn = kPeerQpn;
  params.mtu = 1024;
  params.ird = params.ord = 2;
  params.ack_timeout_ms = 60000;  // no retransmission by the timer within an input
  params.rnr_retry = 7;
  auto link = std::make_shared<roce::RcLink>(w.port, qp, params, std::weak_ptr<roce::RcObserver>());
  CHECK(link->Start());
  CHECK(qp->Modify(QpState::Rts) == 0);
  for (uint32_t i = 0; i < 2; ++i) {
    Sge sge{w.recv.addr() + i * 2 * kRecvSize, uint32_t(kRecvSize), w.recv.lkey};
    CHECK(qp->PostReceive(100 + i, &sge, 1) == 0);
  }
  CHECK(qp->PostSend(w.Request(1, WrOpcode::Send, 300)) == 0);   // PSN 0
  CHECK(qp->PostSend(w.Request(2, WrOpcode::Write, 600)) == 0);  // PSN 1
  CHECK(qp->PostSend(w.Request(3, WrOpcode::Read, 2048)) == 0);  // PSNs 2, 3

  size_t run = size ? 1 + data[0] % 8 : 1;
  const bool congested = size && (data[0] & 0x80);  // read from a congested socket (CNPs out)
  std::vector<wire::ib::Packet> packets;
  for (size_t at = 1; at + 2 <= size;) {
    size_t length = std::min<size_t>(wire::LoadBe16(data + at), size - at - 2);
    std::span<const uint8_t> datagram(data + at + 2, length);
    at += 2 + length;
    wire::ib::Packet packet;
    if (wire::ib::DecodePacket(datagram, nullptr, packet) != wire::ib::PacketError::Ok) continue;
    packet.headers.bth.dest_qp = qp->qpn();  // what the port routed here
    packets.push_back(packet);
    if (packets.size() == run) {
      link->OnPackets(packets, congested);
      packets.clear();
    }
  }
  if (!packets.empty()) link->OnPackets(packets, congested);

  // Nothing is placed once the QP is in Error: the memory is checked after it.
  qp->Modify(QpState::Error);
  Completion done[64];
  while (w.cq->Poll(done, 64)) {
  }
  w.writable.CheckOutside(0, w.writable.length);  // the peer may write all of it, nothing around it
  w.readable.CheckOutside();
  w.locked.CheckOutside();
  w.source.CheckOutside();
  w.sink.CheckOutside(256, 256 + 2048);  // the Read's destination
  // The receives, not the gaps between them (receives at 0 and 2 * kRecvSize).
  for (size_t i = 0; i < 2; ++i) {
    size_t gap = kGuard + (2 * i + 1) * kRecvSize;
    CHECK(memcmp(w.recv.bytes.data() + gap, w.recv.pattern.data() + gap, kRecvSize) == 0);
  }
  CHECK(memcmp(w.recv.bytes.data(), w.recv.pattern.data(), kGuard) == 0);
  CHECK(memcmp(w.recv.bytes.data() + kGuard + w.recv.length, w.recv.pattern.data() + kGuard + w.recv.length, kGuard) == 0);
  return 0;
}
