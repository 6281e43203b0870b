// The iWARP receive state machine fed without a socket (tests/common/iwarp_stream_rig.h): every
// kind of FPDU, with and without CRCs, delivered whole, cut in two at every offset (inside the
// length field, the headers, the payload, the checked tail, the pad and the CRC), and one byte at a
// time. However the bytes come, the outcome is the same as when they come whole: the same bytes
// placed (and none outside what was granted: the guard zones are compared too), the same
// completions, the same bytes sent back. The whole delivery is checked against what the
// scenario should do, so the comparison cannot pass on a stream that does nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "../common/iwarp_stream_rig.h"
#include "qp_watch.h"
#include "wire/ddp.h"
#include "wire/mpa.h"

namespace ndwv::dev {
namespace {

using namespace std::chrono_literals;
using test_support::GuardedRegion;
using test_support::StreamRig;
namespace w = ndwv::wire;
using w::DdpHeader;
using w::RdmapOpcode;

std::vector<uint8_t> Fpdu(const DdpHeader& h, std::span<const uint8_t> payload, bool crc,
                          const w::ReadRequest* read = nullptr) {
  std::vector<uint8_t> ulpdu(h.length() + (read ? w::kReadRequestLen : 0) + payload.size());
  size_t n = w::EncodeDdpHeader(h, ulpdu);
  if (read) n += w::EncodeReadRequest(*read, std::span(ulpdu).subspan(n));
  std::copy(payload.begin(), payload.end(), ulpdu.begin() + n);
  std::vector<uint8_t> out(w::FpduLength(ulpdu.size()));
  w::EncodeFpdu(ulpdu, crc, out);
  return out;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed * 13 + i * 7 + (i >> 8));
  return v;
}

void Append(std::vector<uint8_t>& to, const std::vector<uint8_t>& bytes) { to.insert(to.end(), bytes.begin(), bytes.end()); }

// What a delivery did.
struct Outcome {
  std::vector<std::tuple<uint64_t, int, uint32_t, int>> completions;  // wr_id, status, length, opcode
  std::vector<uint8_t> writable, readable, locked, sink, recv;        // guard zones included
  std::vector<uint8_t> sent;                                          // what the stream sent back
  int errors = 0;
  bool operator==(const Outcome&) const = default;
};

struct Scenario {
  const char* name;
  // Before the bytes: what the QP posts, and the bytes that posting sends (to be read first).
  std::function<std::vector<uint8_t>(StreamRig&, bool crc)> prepare;
  // The bytes the peer sends.
  std::function<std::vector<uint8_t>(StreamRig&, bool crc)> bytes;
  size_t completions;  // that the bytes complete, before the QP is flushed
  std::function<std::vector<uint8_t>(bool crc)> reply;  // what the stream sends back
  // What the whole delivery must have done (checked on the reference run).
  std::function<void(StreamRig&, const Outcome&)> expect;
};

constexpr uint64_t kFirstRecv = 100;
bool Placed(GuardedRegion& r, size_t at, const std::vector<uint8_t>& data) {
  return std::equal(data.begin(), data.end(), r.region() + at) && r.UnchangedOutside(at, at + data.size());
}
std::tuple<uint64_t, int, uint32_t, int> Done(uint64_t wr_id, WcStatus status, uint32_t length, WrOpcode op) {
  return {wr_id, int(status), length, int(op)};
}
// The receives the flush completes, from the first `from`.
void ExpectFlushedFrom(const Outcome& o, size_t index, uint64_t from) {
  for (uint64_t id = from; id < kFirstRecv + StreamRig::kRecvs; ++id, ++index) {
    ASSERT_LT(index, o.completions.size());
    EXPECT_EQ(o.completions[index], Done(id, WcStatus::Flushed, 0, WrOpcode::Receive));
  }
}

std::vector<Scenario> Scenarios() {
  std::vector<Scenario> s;
  auto none = [](StreamRig&, bool) { return std::vector<uint8_t>(); };
  auto nothing = [](bool) { return std::vector<uint8_t>(); };

  s.push_back({"Send", none,
               [](StreamRig&, bool crc) {
                 return Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), Pattern(100, 1), crc);
               },
               1, nothing, [](StreamRig& rig, const Outcome& o) {
                 EXPECT_EQ(o.completions.at(0), Done(kFirstRecv, WcStatus::Success, 100, WrOpcode::Receive));
                 ExpectFlushedFrom(o, 1, kFirstRecv + 1);
                 EXPECT_TRUE(Placed(rig.recv, 0, Pattern(100, 1)));
               }});

  // A message in three segments, then a solicited one: the offsets carry on across segments.
  s.push_back({"SendInSegments", none,
               [](StreamRig&, bool crc) {
                 std::vector<uint8_t> out, m = Pattern(180, 2);
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, false), {m.data(), 50}, crc));
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 50, false), {m.data() + 50, 61}, crc));
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 111, true), {m.data() + 111, 69}, crc));
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::SendSolicited, 2, 0, true), Pattern(21, 3), crc));
                 return out;
               },
               2, nothing, [](StreamRig& rig, const Outcome& o) {
                 EXPECT_EQ(o.completions.at(0), Done(kFirstRecv, WcStatus::Success, 180, WrOpcode::Receive));
                 EXPECT_EQ(o.completions.at(1), Done(kFirstRecv + 1, WcStatus::Success, 21, WrOpcode::Receive));
                 ExpectFlushedFrom(o, 2, kFirstRecv + 2);
                 // The first receive's buffer holds 180 bytes, the second's (right after it) 21.
                 std::vector<uint8_t> both = Pattern(180, 2);
                 const auto first = rig.recv.original.begin() + GuardedRegion::kGuard;
                 both.insert(both.end(), first + 180, first + StreamRig::kRecvSize);
                 Append(both, Pattern(21, 3));
                 EXPECT_TRUE(Placed(rig.recv, 0, both));
               }});

  s.push_back({"Write", none,
               [](StreamRig& rig, bool crc) {
                 return Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, rig.writable.rkey, rig.writable.addr() + 16, true),
                             Pattern(200, 4), crc);
               },
               0, nothing, [](StreamRig& rig, const Outcome& o) {
                 ExpectFlushedFrom(o, 0, kFirstRecv);
                 EXPECT_TRUE(Placed(rig.writable, 16, Pattern(200, 4)));
               }});

  // Two segments, the second longer than the staging buffer and the checked tail: its bytes go
  // straight from the "socket" into the region, its last 64 only after its CRC.
  s.push_back({"WriteInSegments", none,
               [](StreamRig& rig, bool crc) {
                 std::vector<uint8_t> out, d = Pattern(6000, 5);
                 uint64_t at = rig.writable.addr() + 100;
                 Append(out, Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, rig.writable.rkey, at, false), {d.data(), 150}, crc));
                 Append(out, Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, rig.writable.rkey, at + 150, true),
                                  {d.data() + 150, d.size() - 150}, crc));
                 return out;
               },
               0, nothing, [](StreamRig& rig, const Outcome& o) {
                 ExpectFlushedFrom(o, 0, kFirstRecv);
                 EXPECT_TRUE(Placed(rig.writable, 100, Pattern(6000, 5)));
               }});

  // The peer reads 100 bytes of the readable region: ndwv answers with a Read Response.
  s.push_back({"ReadRequest", none,
               [](StreamRig& rig, bool crc) {
                 w::ReadRequest read{0x77, 0x40, 100, rig.readable.rkey, rig.readable.addr() + 8};
                 return Fpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true), {}, crc, &read);
               },
               0,
               [](bool crc) {
                 GuardedRegion source(StreamRig::kRegion, 2);  // the readable region's pattern
                 return Fpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, 0x77, 0x40, true),
                             {source.region() + 8, 100}, crc);
               },
               [](StreamRig& rig, const Outcome& o) {
                 ExpectFlushedFrom(o, 0, kFirstRecv);
                 EXPECT_EQ(o.readable, rig.readable.original);
               }});

  // ndwv reads 300 bytes into two SGEs; the response comes in two segments.
  s.push_back({"ReadResponse",
               [](StreamRig& rig, bool crc) {
                 rig.PostRead(7, 16, 300);
                 w::ReadRequest read{0xFF000000u, 0, 300, 0x1234, 0x10000};  // the sink: our tag for position 0
                 return Fpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true), {}, crc, &read);
               },
               [](StreamRig&, bool crc) {
                 std::vector<uint8_t> out, d = Pattern(300, 6);
                 Append(out, Fpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, 0xFF000000u, 0, false), {d.data(), 120}, crc));
                 Append(out, Fpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, 0xFF000000u, 120, true),
                                  {d.data() + 120, 180}, crc));
                 return out;
               },
               1, nothing, [](StreamRig& rig, const Outcome& o) {
                 EXPECT_EQ(o.completions.at(0), Done(7, WcStatus::Success, 300, WrOpcode::Read));
                 ExpectFlushedFrom(o, 1, kFirstRecv);
                 std::vector<uint8_t> d = Pattern(300, 6), placed(d.begin(), d.begin() + 100);
                 // The second SGE starts 7 bytes after the first one ends.
                 placed.insert(placed.end(), rig.sink.original.begin() + GuardedRegion::kGuard + 116,
                               rig.sink.original.begin() + GuardedRegion::kGuard + 123);
                 placed.insert(placed.end(), d.begin() + 100, d.end());
                 EXPECT_TRUE(Placed(rig.sink, 16, placed));
               }});

  // The peer's Terminate ends the connection; it is not answered.
  s.push_back({"Terminate", none,
               [](StreamRig&, bool crc) {
                 uint8_t term[w::kTerminateMaxLen];
                 size_t n = w::EncodeTerminate(term, w::kTermRdmapCatastrophic);
                 std::vector<uint8_t> out(w::FpduLength(n));
                 w::EncodeFpdu({term, n}, crc, out);
                 return out;
               },
               0, nothing, [](StreamRig& rig, const Outcome& o) {
                 ExpectFlushedFrom(o, 0, kFirstRecv);
                 EXPECT_EQ(o.errors, 1);
                 EXPECT_EQ(o.writable, rig.writable.original);
                 EXPECT_EQ(o.recv, rig.recv.original);
               }});

  // Several kinds back to back: each boundary between FPDUs is cut too.
  s.push_back({"Mixed", none,
               [](StreamRig& rig, bool crc) {
                 std::vector<uint8_t> out;
                 Append(out, Fpdu(DdpHeader::Tagged(RdmapOpcode::RdmaWrite, rig.writable.rkey, rig.writable.addr(), true),
                                  Pattern(70, 7), crc));
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 1, 0, true), Pattern(90, 8), crc));
                 w::ReadRequest read{0x99, 0, 33, rig.readable.rkey, rig.readable.addr()};
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::ReadRequest, 1, 0, true), {}, crc, &read));
                 Append(out, Fpdu(DdpHeader::Untagged(RdmapOpcode::Send, 2, 0, true), {}, crc));  // empty
                 return out;
               },
               2,
               [](bool crc) {
                 GuardedRegion source(StreamRig::kRegion, 2);
                 return Fpdu(DdpHeader::Tagged(RdmapOpcode::ReadResponse, 0x99, 0, true), {source.region(), 33}, crc);
               },
               [](StreamRig& rig, const Outcome& o) {
                 EXPECT_EQ(o.completions.at(0), Done(kFirstRecv, WcStatus::Success, 90, WrOpcode::Receive));
                 EXPECT_EQ(o.completions.at(1), Done(kFirstRecv + 1, WcStatus::Success, 0, WrOpcode::Receive));
                 ExpectFlushedFrom(o, 2, kFirstRecv + 2);
                 EXPECT_TRUE(Placed(rig.writable, 0, Pattern(70, 7)));
                 EXPECT_TRUE(Placed(rig.recv, 0, Pattern(90, 8)));
               }});
  return s;
}

// Runs a scenario with its bytes cut at `cuts` (offsets, ascending): the outcome.
Outcome Deliver(const Scenario& scenario, bool crc, const std::vector<size_t>& cuts) {
  Outcome o;
  StreamRig rig(crc);
  if (!rig.stream) {
    ADD_FAILURE() << "no socketpair";
    return o;
  }
  std::vector<uint8_t> posted = scenario.prepare(rig, crc), sent;
  if (!posted.empty()) {
    EXPECT_TRUE(rig.ReadSent(sent, posted.size(), 5s)) << "the Read Request did not leave";
    EXPECT_EQ(sent, posted);
  }
  std::vector<uint8_t> bytes = scenario.bytes(rig, crc);
  size_t at = 0;
  for (size_t cut : cuts) {
    rig.Deliver({bytes.data() + at, cut - at});
    at = cut;
  }
  rig.Deliver({bytes.data() + at, bytes.size() - at});
  // Completions and replies may be finished by another thread (the engine): bounded waits.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  do rig.Drain();
  while (rig.completions.size() < scenario.completions && std::chrono::steady_clock::now() < deadline);
  std::vector<uint8_t> reply = scenario.reply(crc);
  if (!reply.empty()) rig.ReadSent(o.sent, reply.size(), 5s);
  rig.Finish();
  for (const Completion& c : rig.completions) o.completions.push_back(Done(c.wr_id, c.status, c.length, c.opcode));
  o.writable = rig.writable.bytes;
  o.readable = rig.readable.bytes;
  o.locked = rig.locked.bytes;
  o.sink = rig.sink.bytes;
  o.recv = rig.recv.bytes;
  o.errors = rig.observer->errors;
  // The reference's checks need the rig.
  if (cuts.empty()) {
    EXPECT_EQ(o.sent, reply) << "what the stream sent back";
    EXPECT_EQ(o.locked, rig.locked.original);
    scenario.expect(rig, o);
  }
  return o;
}

class IwarpStreamSplit : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(IwarpStreamSplit, AnyCutGivesTheOutcomeOfTheWholeDelivery) {
  const Scenario scenario = Scenarios()[std::get<0>(GetParam())];
  const bool crc = std::get<1>(GetParam());
  const Outcome whole = Deliver(scenario, crc, {});
  if (::testing::Test::HasFailure()) return;

  size_t length;
  {
    StreamRig rig(crc);
    length = scenario.bytes(rig, crc).size();
  }
  // Every cut in two; for long payloads, every cut near the ends of each FPDU and a stride
  // between (the FPDUs' headers, tails and CRCs are all within 100 bytes of an end).
  for (size_t cut = 1; cut < length; ++cut) {
    if (length > 1000 && cut > 300 && cut < length - 200 && cut % 37) continue;
    Outcome o = Deliver(scenario, crc, {cut});
    ASSERT_TRUE(o == whole) << scenario.name << ": cut at byte " << cut << " of " << length;
  }
  // One byte at a time.
  std::vector<size_t> every(length - 1);
  for (size_t i = 0; i + 1 < length; ++i) every[i] = i + 1;
  EXPECT_TRUE(Deliver(scenario, crc, every) == whole) << scenario.name << ": one byte at a time";
}

INSTANTIATE_TEST_SUITE_P(Fpdus, IwarpStreamSplit,
                         ::testing::Combine(::testing::Range(0, int(Scenarios().size())), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return std::string(Scenarios()[std::get<0>(info.param)].name) +
                                  (std::get<1>(info.param) ? "WithCrc" : "WithoutCrc");
                         });

// A socket that failed reads as ended once a send has taken its error (a reset, or TCP's
// ETIMEDOUT): that end is the stream broken, not the peer's graceful close. Here the send fails
// first (the peer stopped reading: EPIPE, and no event for the receive side), and the receive
// side then finds the end.
TEST(IwarpStreamEnd, AnEndReadAfterASendFailedIsABrokenStreamNotAGracefulClose) {
  StreamRig rig(false);
  ASSERT_TRUE(rig.stream) << "no socketpair";
  rig.source.End();
  ASSERT_EQ(shutdown(rig.peer_fd, SHUT_RD), 0);
  ASSERT_EQ(rig.qp->PostSend(SignaledSend(7, {rig.locked.addr(), 64, rig.locked.lkey})), 0);
  rig.Finish();
  EXPECT_EQ(rig.observer->errors, 1);
  EXPECT_EQ(rig.observer->closed_here, 0);  // reported once, as the error
  EXPECT_FALSE(rig.observer->peer_closed);
  ASSERT_FALSE(rig.completions.empty());
  EXPECT_EQ(rig.completions.front().wr_id, 7u);
  EXPECT_NE(rig.completions.front().status, dev::WcStatus::Success);
}

// The QP going to Error with the connection up (a local error) closes the socket, and the
// connection manager hears of it once: it will not read the peer's close, so a Disconnect must
// not wait for that.
TEST(IwarpStreamEnd, AQpMovedToErrorClosesTheStreamAndTellsTheConnectionOnce) {
  StreamRig rig(false);
  ASSERT_TRUE(rig.stream) << "no socketpair";
  rig.Finish();
  EXPECT_EQ(rig.observer->closed_here, 1);
  EXPECT_EQ(rig.observer->errors, 0);
  EXPECT_FALSE(rig.observer->peer_closed);
  rig.stream->Shutdown();
  rig.stream->Abort();
  EXPECT_EQ(rig.observer->closed_here, 1);
  EXPECT_EQ(rig.observer->errors, 0);
  uint8_t byte;
  EXPECT_EQ(::recv(rig.peer_fd, &byte, 1, 0), 0) << "the peer reads the end of the stream";
}

}  // namespace
}  // namespace ndwv::dev
