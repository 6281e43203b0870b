// The IB CM state machine (design-facts §3.4-3.6) between two agents joined by a fake pipe that
// encodes every MAD (EncodeCm) and hands the bytes to the peer's OnMad, under a fake clock. The
// pipe can drop, duplicate and delay messages, so every race of §6 item 7 is played out exactly.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <ndwv/wvstatus.h>

#include "dev/roce/cm.h"
#include "wire/bytes.h"
#include "wire/ib_cm.h"
#include "../common/cm_ids.h"

namespace ndwv::dev::roce {
namespace {

using wire::ib::CmAttr;
using wire::ib::CmMessage;
using wire::ib::kMadLen;
using wire::ib::RejectedMessage;
using wire::ib::RejReason;
using Kinds = std::vector<CmEventKind>;
using K = CmEventKind;

sockaddr_storage Address(const char* ip, uint16_t port) {
  sockaddr_storage s{};
  auto& in = reinterpret_cast<sockaddr_in&>(s);
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  inet_pton(AF_INET, ip, &in.sin_addr);
  return s;
}

std::string Key(const sockaddr_storage& s) {
  const auto& in = reinterpret_cast<const sockaddr_in&>(s);
  return std::to_string(in.sin_addr.s_addr) + ":" + std::to_string(in.sin_port);
}

std::vector<uint8_t> Encode(const CmMessage& m) {
  std::vector<uint8_t> bytes(kMadLen);
  wire::ib::EncodeCm(m, std::span<uint8_t, kMadLen>(bytes.data(), kMadLen));
  return bytes;
}

CmMessage Decode(const std::vector<uint8_t>& bytes) {
  CmMessage m;
  EXPECT_EQ(wire::ib::DecodeCm(bytes, m), wire::ib::CmError::Ok);
  return m;
}

std::span<const uint8_t> Text(const char* s) {
  return {reinterpret_cast<const uint8_t*>(s), strlen(s)};
}
std::string TextOf(const uint8_t* data, size_t n) {
  return std::string(reinterpret_cast<const char*>(data), strnlen(reinterpret_cast<const char*>(data), n));
}

struct FakeClock {
  uint64_t now = 1000;
};

struct Datagram {
  sockaddr_storage from, to;
  CmAttr attr;
  std::vector<uint8_t> bytes;
  uint64_t deliver_at = 0;
  uint64_t seq = 0;
};

enum class Fate { Deliver, Drop, Duplicate, Delay };
struct Verdict {
  Fate fate = Fate::Deliver;
  uint64_t delay_ms = 0;
};

// Carries encoded MADs between agents. Every datagram sent is logged; `filter` decides its fate.
class FakePipe {
 public:
  explicit FakePipe(FakeClock& clock) : clock_(clock) {}
  void Attach(const sockaddr_storage& address, CmAgent* agent) { agents_[Key(address)] = agent; }
  void Reset() {
    in_flight_.clear();
    log.clear();
    filter = nullptr;
  }

  void Send(const sockaddr_storage& from, const sockaddr_storage& to, const CmMessage& m) {
    Datagram d{from, to, m.attr, Encode(m), clock_.now, seq_++};
    log.push_back(d);
    Verdict v = filter ? filter(d) : Verdict{};
    if (v.fate == Fate::Drop) return;
    if (v.fate == Fate::Delay) d.deliver_at += v.delay_ms;
    in_flight_.push_back(d);
    if (v.fate == Fate::Duplicate) in_flight_.push_back(d);
  }

  uint64_t NextDeliveryMs() const {
    uint64_t next = UINT64_MAX;
    for (const Datagram& d : in_flight_) next = std::min(next, d.deliver_at);
    return next;
  }

  // Delivers the earliest due datagram (ties in sending order); false if none is due.
  bool DeliverOne() {
    auto due = in_flight_.end();
    for (auto it = in_flight_.begin(); it != in_flight_.end(); ++it)
      if (it->deliver_at <= clock_.now &&
          (due == in_flight_.end() || it->deliver_at < due->deliver_at))
        due = it;
    if (due == in_flight_.end()) return false;
    Datagram d = std::move(*due);
    in_flight_.erase(due);
    auto agent = agents_.find(Key(d.to));
    if (agent != agents_.end()) agent->second->OnMad(d.from, d.bytes);
    return true;
  }

  // Datagrams of one kind sent from `from` (all senders if null).
  size_t Count(CmAttr attr, const sockaddr_storage* from = nullptr) const {
    return size_t(std::count_if(log.begin(), log.end(), [&](const Datagram& d) {
      return d.attr == attr && (!from || Key(d.from) == Key(*from));
    }));
  }
  std::vector<CmMessage> Sent(CmAttr attr) const {
    std::vector<CmMessage> out;
    for (const Datagram& d : log)
      if (d.attr == attr) out.push_back(Decode(d.bytes));
    return out;
  }

  std::function<Verdict(const Datagram&)> filter;
  std::vector<Datagram> log;

 private:
  FakeClock& clock_;
  std::map<std::string, CmAgent*> agents_;
  std::vector<Datagram> in_flight_;
  uint64_t seq_ = 0;
};

// One UDP port: its address, and its agent whose environment is the fake clock and pipe.
class Node final : public CmEnv {
 public:
  Node(FakeClock& clock, FakePipe& pipe, sockaddr_storage address, const CmConfig& config)
      : clock_(clock), pipe_(pipe), address(address), agent(*this, config) {
    pipe_.Attach(address, &agent);
  }
  uint64_t NowMs() override { return clock_.now; }
  void SendMad(const sockaddr_storage& to, const CmMessage& msg) override {
    pipe_.Send(address, to, msg);
  }
  bool Overloaded() override { return overloaded; }
  bool overloaded = false;

  std::vector<CmEvent> Events() {
    std::vector<CmEvent> out;
    CmEvent e;
    while (agent.PopEvent(&e)) out.push_back(e);
    return out;
  }
  Kinds EventKinds() {
    Kinds out;
    for (const CmEvent& e : Events()) out.push_back(e.kind);
    return out;
  }
  CmState State(uint32_t id) const { return agent.StateOf(id); }

 private:
  FakeClock& clock_;
  FakePipe& pipe_;

 public:
  const sockaddr_storage address;
  CmAgent agent;
};

constexpr uint64_t kService = wire::ib::TcpServiceId(4000);
constexpr uint64_t kGuidA = 0xA0A0A0A0A0A0A0A0ull, kGuidB = 0xB0B0B0B0B0B0B0B0ull;
constexpr uint32_t kQpnA = 0x111, kQpnB = 0x222;

CmConfig Config(uint64_t guid, uint32_t seed) {
  CmConfig c;
  c.response_timeout_ms = 100;  // time value 15: 135 ms
  c.max_retries = 3;
  c.timewait_ms = 500;
  c.ca_guid = guid;
  c.id_seed = seed;
  return c;
}

class RoceCm : public ::testing::Test {
 protected:
  RoceCm() { Start(Config(kGuidA, 0x11000000), Config(kGuidB, 0x22000000)); }

  // Replaces both nodes (before anything was sent).
  void Start(const CmConfig& ca, const CmConfig& cb) {
    a_.reset();
    b_.reset();
    a_ = std::make_unique<Node>(clock, pipe, Address("10.0.0.1", 5000), ca);
    b_ = std::make_unique<Node>(clock, pipe, Address("10.0.0.2", 6000), cb);
  }

  // Delivers and fires everything due up to `until`, advancing the clock from event to event.
  void RunUntil(uint64_t until) {
    for (;;) {
      for (bool progress = true; progress;) {
        progress = pipe.DeliverOne();
        for (Node* n : {a_.get(), b_.get()})
          if (n->agent.NextDeadlineMs() <= clock.now) {
            n->agent.OnTimer();
            progress = true;
          }
      }
      uint64_t next = std::min({pipe.NextDeliveryMs(), a_->agent.NextDeadlineMs(),
                                b_->agent.NextDeadlineMs()});
      if (next > until) break;
      clock.now = std::max(clock.now, next);
    }
    clock.now = std::max(clock.now, until);
  }
  void RunFor(uint64_t ms) { RunUntil(clock.now + ms); }
  void Run() { RunFor(0); }

  ConnectArgs Args(std::span<const uint8_t> data = {}) {
    ConnectArgs args;
    args.service_id = kService;
    args.local_qpn = kQpnA;
    args.starting_psn = 0x123456;
    args.ird = 4;
    args.ord = 8;
    args.path_mtu = 3;
    args.retry_count = 7;
    args.rnr_retry_count = 6;
    args.local_ack_timeout = 14;
    args.private_data = data;
    return args;
  }
  AcceptArgs Accepting(std::span<const uint8_t> data = {}) {
    AcceptArgs args;
    args.local_qpn = kQpnB;
    args.starting_psn = 0xABCDEF;
    args.ird = 8;
    args.ord = 2;
    args.rnr_retry_count = 5;
    args.private_data = data;
    return args;
  }

  // Connect and wait for the passive side's ReqReceived; returns (active id, passive id).
  std::pair<uint32_t, uint32_t> Request() {
    if (!listening_) {
      EXPECT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
      listening_ = true;
    }
    uint32_t active = a_->agent.Connect(b_->address, Args());
    EXPECT_NE(active, 0u);
    Run();
    auto events = b_->Events();
    EXPECT_EQ(events.size(), 1u);
    if (events.size() != 1) return {active, 0};
    EXPECT_EQ(events[0].kind, K::ReqReceived);
    return {active, events[0].id};
  }

  // The passive side accepts the request, the active side sends the RTU: both ESTABLISHED, their
  // events drained.
  void Complete(uint32_t active, uint32_t passive, const AcceptArgs& accepting) {
    EXPECT_EQ(b_->agent.Accept(passive, accepting), WV_SUCCESS);
    Run();
    EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
    EXPECT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
    Run();
    EXPECT_EQ(b_->EventKinds(), Kinds{K::Established});
    EXPECT_EQ(a_->State(active), CmState::Established);
    EXPECT_EQ(b_->State(passive), CmState::Established);
  }

  // Runs the whole handshake; both sides ESTABLISHED and their events drained.
  std::pair<uint32_t, uint32_t> Establish() {
    auto [active, passive] = Request();
    Complete(active, passive, Accepting());
    return {active, passive};
  }

  uint32_t Timeout() const { return TimeValueToMs(TimeValueFromMs(100)); }
  // How long an exchange waits for its answer in all (while answers come at once): 1 + retries
  // timeouts, within which each repeat waits twice as long as the one before.
  uint64_t GiveUp(uint64_t timeout, uint32_t retries = 3) const { return timeout * (1 + retries); }

  // Drops every datagram of a kind; or only its first `n`.
  void DropAll(CmAttr attr) {
    pipe.filter = [attr](const Datagram& d) {
      return d.attr == attr ? Verdict{Fate::Drop} : Verdict{};
    };
  }
  void DropFirst(CmAttr attr, int n = 1) {
    auto left = std::make_shared<int>(n);
    pipe.filter = [attr, left](const Datagram& d) {
      if (d.attr == attr && *left > 0) {
        --*left;
        return Verdict{Fate::Drop};
      }
      return Verdict{};
    };
  }

  // Hands b's agent a message as if a had sent it (a's address).
  void Inject(Node& to, const CmMessage& m, const sockaddr_storage& from) {
    to.agent.OnMad(from, Encode(m));
  }

  FakeClock clock;
  FakePipe pipe{clock};
  std::unique_ptr<Node> a_, b_;
  bool listening_ = false;
};

// ---------------------------------------------------------------------------- conversions

TEST(RoceCmTime, TimeValuesRoundTripInMilliseconds) {
  EXPECT_EQ(TimeValueToMs(20), 4295u);  // 4.096 us * 2^20, rounded up
  EXPECT_EQ(TimeValueFromMs(4295), 20);
  EXPECT_EQ(TimeValueFromMs(4296), 21);
  EXPECT_EQ(TimeValueToMs(24), 68720u);
  EXPECT_EQ(TimeValueFromMs(100), 15);  // 134.2 ms covers 100 ms; 14 (67.1 ms) does not
  EXPECT_EQ(TimeValueToMs(15), 135u);
  EXPECT_EQ(TimeValueToMs(0), 1u);      // never a zero timeout
  EXPECT_EQ(TimeValueFromMs(0), 0);
  EXPECT_EQ(TimeValueFromMs(UINT32_MAX), 31);
}

// ---------------------------------------------------------------------------- connection setup

TEST_F(RoceCm, HappyPathCarriesQpnPsnIrdOrdAndPrivateData) {
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  ConnectArgs args = Args(Text("hello"));
  uint32_t active = a_->agent.Connect(b_->address, args);
  ASSERT_NE(active, 0u);
  EXPECT_EQ(a_->State(active), CmState::ReqSent);
  EXPECT_EQ(a_->agent.TimeoutMsOf(active), Timeout());
  Run();

  auto req_events = b_->Events();
  ASSERT_EQ(req_events.size(), 1u);
  const CmEvent& req_event = req_events[0];
  EXPECT_EQ(req_event.kind, K::ReqReceived);
  ASSERT_TRUE(req_event.has_message);
  EXPECT_EQ(Key(req_event.peer), Key(a_->address));
  const wire::ib::CmReq& req = req_event.msg.req;
  EXPECT_EQ(req.service_id, kService);
  EXPECT_EQ(req.local_comm_id, active);
  EXPECT_EQ(req.local_ca_guid, kGuidA);
  EXPECT_EQ(req.local_qpn, kQpnA);
  EXPECT_EQ(req.starting_psn, 0x123456u);
  EXPECT_EQ(req.responder_resources, 4);
  EXPECT_EQ(req.initiator_depth, 8);
  EXPECT_EQ(req.local_cm_response_timeout, 15);
  EXPECT_EQ(req.remote_cm_response_timeout, 15);
  EXPECT_EQ(req.max_cm_retries, 3);
  EXPECT_EQ(TextOf(req.private_data, sizeof req.private_data), "hello");
  uint32_t passive = req_event.id;
  EXPECT_EQ(b_->State(passive), CmState::ReqRcvd);
  EXPECT_EQ(b_->agent.TimeoutMsOf(passive), Timeout());  // the REQ's local response timeout

  AcceptArgs accept = Accepting(Text("world"));
  ASSERT_EQ(b_->agent.Accept(passive, accept), WV_SUCCESS);
  EXPECT_EQ(b_->State(passive), CmState::RepSent);
  Run();
  auto rep_events = a_->Events();
  ASSERT_EQ(rep_events.size(), 1u);
  EXPECT_EQ(rep_events[0].kind, K::RepReceived);
  const wire::ib::CmRep& rep = rep_events[0].msg.rep;
  EXPECT_EQ(rep.local_comm_id, passive);
  EXPECT_EQ(rep.remote_comm_id, active);
  EXPECT_EQ(rep.local_ca_guid, kGuidB);
  EXPECT_EQ(TextOf(rep.private_data, sizeof rep.private_data), "world");
  EXPECT_EQ(a_->State(active), CmState::RepRcvd);

  // §3.9: each side advertised the PSN it expects; the IRD/ORD are crossed.
  QpAttributes qa = ActiveQpAttributes(args, rep);
  EXPECT_EQ(qa.dest_qpn, kQpnB);
  EXPECT_EQ(qa.rq_psn, 0x123456u);
  EXPECT_EQ(qa.sq_psn, 0xABCDEFu);
  EXPECT_EQ(qa.max_dest_rd_atomic, 4);  // own IRD
  EXPECT_EQ(qa.max_rd_atomic, 8);       // own ORD 8, peer's IRD 8
  EXPECT_EQ(qa.rnr_retry_count, 5);     // from the REP
  QpAttributes qb = PassiveQpAttributes(req, accept);
  EXPECT_EQ(qb.dest_qpn, kQpnA);
  EXPECT_EQ(qb.sq_psn, 0x123456u);
  EXPECT_EQ(qb.rq_psn, 0xABCDEFu);
  EXPECT_EQ(qb.max_dest_rd_atomic, 8);
  EXPECT_EQ(qb.max_rd_atomic, 2);
  EXPECT_EQ(qb.rnr_retry_count, 6);  // from the REQ
  EXPECT_EQ(qb.retry_count, 7);
  EXPECT_EQ(qb.path_mtu, 3);
  EXPECT_EQ(qb.local_ack_timeout, 14);

  ASSERT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
  Run();
  auto est = b_->Events();
  ASSERT_EQ(est.size(), 1u);
  EXPECT_EQ(est[0].kind, K::Established);
  EXPECT_EQ(TextOf(est[0].msg.rtu.private_data, sizeof est[0].msg.rtu.private_data), "");
  EXPECT_EQ(a_->State(active), CmState::Established);
  EXPECT_EQ(b_->State(passive), CmState::Established);
  EXPECT_TRUE(a_->Events().empty());

  // One of each, answers in the REQ's transaction, no timers left.
  EXPECT_EQ(pipe.log.size(), 3u);
  uint64_t tid = pipe.Sent(CmAttr::Req)[0].mad.transaction_id;
  EXPECT_EQ(pipe.Sent(CmAttr::Rep)[0].mad.transaction_id, tid);
  EXPECT_EQ(pipe.Sent(CmAttr::Rtu)[0].mad.transaction_id, tid);
  EXPECT_EQ(a_->agent.NextDeadlineMs(), UINT64_MAX);
  EXPECT_EQ(b_->agent.NextDeadlineMs(), UINT64_MAX);
  EXPECT_EQ(a_->agent.counters().Sent(CmAttr::Req), 1u);
  EXPECT_EQ(b_->agent.counters().Received(CmAttr::Req), 1u);
  EXPECT_EQ(b_->agent.counters().Received(CmAttr::Rtu), 1u);
  EXPECT_EQ(a_->agent.counters().retransmits + b_->agent.counters().retransmits, 0u);
}

// Communication IDs never repeat while their connections may be remembered, and one who saw
// some (its own connections') cannot tell the next: a forged DREQ must guess 32 bits.
TEST_F(RoceCm, CommIdsAreFreshAndUnpredictable) {
  uint32_t first = a_->agent.Connect(b_->address, Args());
  a_->agent.Destroy(first);
  std::vector<uint32_t> ids = {first};
  for (int i = 0; i < 1000; ++i) ids.push_back(a_->agent.Connect(b_->address, Args()));
  std::vector<uint32_t> sorted = ids;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "an ID recurred";
  EXPECT_NE(sorted.front(), 0u);
  // A sequence (any stride) repeats its step; these steps are as good as random: among 1000,
  // two equal ones have odds of ~1e-4.
  std::vector<uint32_t> steps;
  for (size_t i = 1; i < ids.size(); ++i) steps.push_back(ids[i] - ids[i - 1]);
  std::sort(steps.begin(), steps.end());
  EXPECT_GE(std::unique(steps.begin(), steps.end()) - steps.begin(), 998);
}

TEST_F(RoceCm, CallsCheckStateAndSizes) {
  uint8_t big[256] = {};
  EXPECT_EQ(a_->agent.Connect(b_->address, Args(std::span(big, 93))), 0u);
  EXPECT_NE(a_->agent.Connect(b_->address, Args(std::span(big, 92))), 0u);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::Rejected});  // (nobody listens yet)
  EXPECT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  EXPECT_EQ(b_->agent.Listen(kService), WV_ADDRESS_ALREADY_EXISTS);
  listening_ = true;
  EXPECT_EQ(a_->agent.Accept(12345, Accepting()), WV_NOT_FOUND);
  EXPECT_EQ(a_->State(12345), CmState::NoSuchId);
  auto [active, passive] = Request();
  EXPECT_EQ(a_->agent.Disconnect(active), WV_INVALID_DEVICE_STATE);
  EXPECT_EQ(a_->agent.SendRtu(active), WV_INVALID_DEVICE_STATE);
  EXPECT_EQ(a_->agent.Accept(active, Accepting()), WV_INVALID_DEVICE_STATE);
  EXPECT_EQ(b_->agent.Accept(passive, Accepting(std::span(big, 197))), WV_INVALID_PARAMETER);
  EXPECT_EQ(b_->agent.Reject(passive, std::span(big, 149)), WV_INVALID_PARAMETER);
  EXPECT_EQ(b_->agent.Established(passive), WV_INVALID_DEVICE_STATE);
  EXPECT_EQ(b_->State(passive), CmState::ReqRcvd);
}

TEST_F(RoceCm, ReqForUnlistenedServiceIsRejectedInvalidServiceId) {
  uint32_t active = a_->agent.Connect(b_->address, Args());
  Run();
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 8);
  EXPECT_EQ(events[0].msg.rej.remote_comm_id, active);
  EXPECT_EQ(a_->State(active), CmState::Idle);
  EXPECT_EQ(b_->agent.size(), 0u);  // no CEP for a refused REQ
  EXPECT_EQ(b_->agent.counters().invalid_service_rejects_sent, 1u);
  EXPECT_EQ(a_->agent.NextDeadlineMs(), UINT64_MAX);

  // Listening ends: the same again.
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  b_->agent.StopListening(kService);
  a_->agent.Connect(b_->address, Args());
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::Rejected});
}

TEST_F(RoceCm, ConsumerRejectCarriesPrivateData) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Reject(passive, Text("busy")), WV_SUCCESS);
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  Run();
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 28);
  EXPECT_EQ(events[0].msg.rej.message_rejected, wire::ib::RejectedMessage::Req);
  EXPECT_EQ(TextOf(events[0].msg.rej.private_data, sizeof events[0].msg.rej.private_data), "busy");
  EXPECT_EQ(a_->State(active), CmState::Idle);
  EXPECT_TRUE(b_->Events().empty());
  a_->agent.Destroy(active);
  b_->agent.Destroy(passive);
  EXPECT_EQ(a_->agent.size() + b_->agent.size(), 0u);
}

TEST_F(RoceCm, ActiveRejectsTheRep) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  ASSERT_EQ(a_->agent.Reject(active, Text("no")), WV_SUCCESS);
  EXPECT_EQ(a_->State(active), CmState::Idle);
  Run();
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 28);
  EXPECT_EQ(events[0].msg.rej.message_rejected, wire::ib::RejectedMessage::Rep);
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  EXPECT_EQ(b_->agent.NextDeadlineMs(), UINT64_MAX);  // no REP retransmission
}

TEST_F(RoceCm, LostReqIsRetransmitted) {
  DropFirst(CmAttr::Req);
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  uint32_t active = a_->agent.Connect(b_->address, Args());
  Run();
  EXPECT_TRUE(b_->Events().empty());
  RunFor(Timeout() - 1);
  EXPECT_EQ(pipe.Count(CmAttr::Req), 1u);
  RunFor(1);
  EXPECT_EQ(pipe.Count(CmAttr::Req), 2u);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::ReqReceived});
  EXPECT_EQ(a_->agent.counters().retransmits, 1u);
  EXPECT_EQ(a_->State(active), CmState::ReqSent);
}

// Within the exchange's budget (1 + retries timeouts, the time a dead peer takes to be given up
// on), each repeat waits twice as long as the one before: under a load that delays every answer,
// repeats at a fixed interval would add to it.
TEST_F(RoceCm, RepeatsWaitTwiceAsLongEachTimeWithinTheBudget) {
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.max_retries = 15;
  Start(ca, Config(kGuidB, 0x22000000));
  DropAll(CmAttr::Req);
  const uint64_t start = clock.now;
  uint32_t active = a_->agent.Connect(b_->address, Args());
  RunUntil(start + GiveUp(Timeout(), 15) - 1);
  EXPECT_TRUE(a_->Events().empty());
  RunFor(1);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::ReqTimeout});
  EXPECT_EQ(a_->State(active), CmState::Idle);
  std::vector<uint64_t> gaps;
  uint64_t last = start;
  for (const Datagram& d : pipe.log)
    if (d.attr == CmAttr::Req) {
      gaps.push_back(d.deliver_at - last);  // a dropped datagram keeps its sending time
      last = d.deliver_at;
    }
  const uint64_t t = Timeout();
  EXPECT_EQ(gaps, (std::vector<uint64_t>{0, t, 2 * t, 4 * t, 8 * t}));  // the next at 23 t: past 16 t
}

// A connection that finds its peer's port closed has the others established with the same peer
// port probe it at once: the agent names them (none to another peer, none not established), once
// per quiet period, and for a bounded number of peers at a time.
TEST_F(RoceCm, ConnectionsToAPeerAreNamedForProbingOncePerQuietPeriod) {
  auto [first, first_passive] = Establish();
  ConnectArgs args = Args();
  args.local_qpn = kQpnA + 1;
  const uint32_t second = a_->agent.Connect(b_->address, args);
  Run();
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  AcceptArgs accepting = Accepting();
  accepting.local_qpn = kQpnB + 1;
  Complete(second, events[0].id, accepting);
  args.local_qpn = kQpnA + 2;
  const uint32_t connecting = a_->agent.Connect(b_->address, args);  // not established: not named
  ASSERT_NE(connecting, 0u);

  auto named = a_->agent.ConnectionsToProbe(b_->address);
  std::sort(named.begin(), named.end());
  EXPECT_EQ(named, (std::vector<uint32_t>{std::min(first, second), std::max(first, second)}));
  EXPECT_TRUE(a_->agent.ConnectionsToProbe(b_->address).empty()) << "their probes are running";
  EXPECT_TRUE(a_->agent.ConnectionsToProbe(Address("10.0.0.9", 6000)).empty());
  RunFor(2000);
  EXPECT_EQ(a_->agent.ConnectionsToProbe(b_->address).size(), 2u);
  RunFor(2000);
  for (int i = 0; i < 64; ++i) a_->agent.ConnectionsToProbe(Address(("10.0.1." + std::to_string(i)).c_str(), 7000));
  EXPECT_TRUE(a_->agent.ConnectionsToProbe(b_->address).empty()) << "64 peers are being probed already";
}

// A listener with no room for a request (a Listen(0) backlog full, or a process shedding new
// connections) keeps no CEP for it but answers with an MRA naming none (local ID 0) and asking
// for our response timeout: the sender waits that long, repeats the REQ as a new request, and the
// passive CEP it then gets is the one its REP comes from.
TEST_F(RoceCm, APostponedRequestIsRepeatedAfterTheMraAndGetsIn) {
  auto [active, first] = Request();
  ASSERT_EQ(b_->agent.PostponeRequest(first), WV_SUCCESS);
  EXPECT_EQ(b_->agent.size(), 0u);
  EXPECT_EQ(b_->agent.counters().Limited(CmLimit::BacklogWait), 1u);
  auto mras = pipe.Sent(CmAttr::Mra);
  ASSERT_EQ(mras.size(), 1u);
  EXPECT_EQ(mras[0].mra.local_comm_id, 0u);
  EXPECT_EQ(mras[0].mra.remote_comm_id, active);
  EXPECT_EQ(mras[0].mra.message_mraed, 0u);  // the REQ
  EXPECT_EQ(mras[0].mra.service_timeout, TimeValueFromMs(100));
  Run();
  EXPECT_EQ(a_->State(active), CmState::MraReqRcvd);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::MraReceived});
  EXPECT_EQ(a_->agent.DeadlineOf(active), clock.now + Timeout());  // the service time (lifetime 0)
  RunUntil(a_->agent.DeadlineOf(active));
  EXPECT_EQ(pipe.Count(CmAttr::Req), 2u);
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  ASSERT_EQ(events[0].kind, K::ReqReceived);
  Complete(active, events[0].id, Accepting());
  EXPECT_EQ(a_->agent.counters().Dropped(CmDrop::CommIdMismatch), 0u);
}

// A Connect whose every REQ is postponed (the listener's backlog stays full) gives up within its
// budget, stretched by the MRAs it honours (two) and no more; its timeout says the listener was
// there (peer_busy: ND_TIMEOUT, try again), where silence says it was not.
TEST_F(RoceCm, AConnectPostponedUntilItsBudgetEndsKnowsTheListenerWasThere) {
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  const uint32_t active = a_->agent.Connect(b_->address, Args());
  std::vector<CmEvent> events;
  auto turn = [&] {
    Run();
    for (const CmEvent& e : b_->Events()) {
      if (e.kind == K::ReqReceived) {
        EXPECT_EQ(b_->agent.PostponeRequest(e.id), WV_SUCCESS);
      }
    }
    Run();
    for (const CmEvent& e : a_->Events()) events.push_back(e);
  };
  for (int i = 0; i < 100 && a_->agent.NextDeadlineMs() != UINT64_MAX; ++i) {
    turn();
    if (a_->agent.NextDeadlineMs() != UINT64_MAX) RunUntil(a_->agent.NextDeadlineMs());
  }
  turn();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kind, K::MraReceived);
  EXPECT_EQ(events[1].kind, K::MraReceived);
  EXPECT_EQ(events[2].kind, K::ReqTimeout);
  EXPECT_TRUE(events[2].peer_busy);
  EXPECT_EQ(a_->State(active), CmState::Idle);
  EXPECT_EQ(b_->agent.size(), 0u);
  const size_t reqs = pipe.Count(CmAttr::Req);
  // The REQ and a repeat after each MRA honoured; the budget left then (two waits) ends before the
  // next repeat's backed-off wait.
  EXPECT_EQ(reqs, 3u);
  EXPECT_EQ(b_->agent.counters().Limited(CmLimit::BacklogWait), reqs);
  EXPECT_EQ(pipe.Count(CmAttr::Mra), reqs);  // one MRA per REQ: nothing amplified
  EXPECT_EQ(a_->agent.counters().Limited(CmLimit::MraCount), reqs - 2);

// Silence: the same budget ends "unresponsive".
  b_->overloaded = false;
  DropAll(CmAttr::Req);
  a_->agent.Connect(b_->address, Args());
  RunFor(100 * Timeout());
  events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::ReqTimeout);
  EXPECT_FALSE(events[0].peer_busy);
}

// The wait stretches to what answers are measured to take (ack_wait.h's rule), 8 timeouts at
// most, and comes back to the timeout once they are quick again.
TEST_F(RoceCm, SlowAnswersStretchTheWaitAndQuickOnesBringItBack) {
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  auto connect = [&] {
    uint32_t id = a_->agent.Connect(b_->address, Args());
    uint64_t wait = a_->agent.DeadlineOf(id) - clock.now;
    RunFor(0);
    for (const CmEvent& e : b_->Events()) {
      if (e.kind == K::ReqReceived) {
        EXPECT_EQ(b_->agent.Accept(e.id, Accepting()), WV_SUCCESS);
      }
    }
    RunFor(10 * Timeout());
    EXPECT_TRUE(a_->State(id) == CmState::RepRcvd || a_->State(id) == CmState::MraRepSent);
    a_->Events();
    return wait;
  };
  EXPECT_EQ(connect(), Timeout());
  // REPs come 2.5 timeouts late: the REQ was sent again meanwhile, and the REP that answers it
  // came long after that repeat, so it is the first one's answer (a sample).
  pipe.filter = [this](const Datagram& d) {
    return d.attr == CmAttr::Rep ? Verdict{Fate::Delay, Timeout() * 5 / 2} : Verdict{};
  };
  for (int i = 0; i < 3; ++i) connect();
  const uint64_t stretched = connect();
  EXPECT_GT(stretched, 4 * Timeout());
  EXPECT_LE(stretched, 8 * Timeout());
  pipe.filter = nullptr;
  uint64_t wait = stretched;
  for (int i = 0; i < 60 && wait > Timeout(); ++i) wait = connect();
  EXPECT_EQ(wait, Timeout());
}

// While the process drops datagrams (CmEnv::Overloaded) a new REQ is dropped unanswered and
// counted, and its repeat gets in once the overload is over; the connections the agent has go on.
TEST_F(RoceCm, AnOverloadedAgentDropsNewRequestsAndServesTheConnectionsItHas) {
  auto [established, passive] = Establish();
  b_->overloaded = true;
  const uint64_t start = clock.now;
  ConnectArgs another = Args();
  another.local_qpn = kQpnA + 1;  // (kQpnA's connection is in time-wait at the end)
  uint32_t active = a_->agent.Connect(b_->address, another);
  RunFor(Timeout() - 1);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(b_->agent.counters().Limited(CmLimit::Overloaded), 1u);
  EXPECT_EQ(b_->agent.counters().Sent(CmAttr::Rej) + b_->agent.counters().Sent(CmAttr::Mra), 0u)
      << "a shed REQ is not answered";
  EXPECT_EQ(b_->agent.size(), 1u) << "nothing held for it";
  // The established connection still disconnects.
  ASSERT_EQ(a_->agent.Disconnect(established), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);  // answers with the DREP
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DrepReceived});
  b_->overloaded = false;
  RunUntil(start + Timeout());
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::ReqReceived);
  EXPECT_EQ(a_->State(active), CmState::ReqSent);
}

TEST_F(RoceCm, ReqRetriesExhaustedAfterOnePlusMaxRetriesAndRejTimeout) {
  DropAll(CmAttr::Req);
  uint64_t start = clock.now;
  uint32_t active = a_->agent.Connect(b_->address, Args());
  RunUntil(start + GiveUp(Timeout()) - 1);
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_EQ(pipe.Count(CmAttr::Req), 3u);  // at 0, 1 and 3 timeouts: the budget ends at 4
  RunFor(1);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::ReqTimeout});
  EXPECT_EQ(pipe.Count(CmAttr::Req), 3u);
  EXPECT_EQ(a_->State(active), CmState::Idle);
  EXPECT_EQ(a_->agent.counters().req_timeouts, 1u);
  EXPECT_EQ(a_->agent.NextDeadlineMs(), UINT64_MAX);
  auto rejs = pipe.Sent(CmAttr::Rej);
  ASSERT_EQ(rejs.size(), 1u);  // WinOFED tells the peer
  EXPECT_EQ(rejs[0].rej.reason, 4);
  EXPECT_EQ(rejs[0].rej.local_comm_id, active);
  EXPECT_EQ(rejs[0].rej.reject_info_length, 8);
  EXPECT_EQ(wire::LoadBe64(rejs[0].rej.reject_info), kGuidA);
}

TEST_F(RoceCm, RepForAConnectThatGaveUpIsAnsweredWithARejThatEndsThePassiveCep) {
  // The active side's REQ times out while the passive consumer is slow, its MRAs lost, and the
  // REJ(timeout) that says so is lost too. The consumer then accepts: the REP finds the active
  // CEP idle and draws a REJ (invalid communication ID), which ends the passive CEP at once,
  // not after all its REP retries (its Accept: ND_CONNECTION_ABORTED, the peer gave up).
  pipe.filter = [](const Datagram& d) {
    bool lost = d.attr == CmAttr::Mra || (d.attr == CmAttr::Rej && Decode(d.bytes).rej.reason == 4);
    return lost ? Verdict{Fate::Drop} : Verdict{};
  };
  const uint64_t start = clock.now;
  auto [active, passive] = Request();
  RunUntil(start + GiveUp(Timeout()));
  EXPECT_EQ(a_->EventKinds(), Kinds{K::ReqTimeout});
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  std::vector<CmMessage> answers;
  for (const CmMessage& m : pipe.Sent(CmAttr::Rej))
    if (m.rej.reason == uint16_t(RejReason::InvalidCommId)) answers.push_back(m);
  ASSERT_EQ(answers.size(), 1u);
  EXPECT_EQ(answers[0].rej.local_comm_id, active);
  EXPECT_EQ(answers[0].rej.remote_comm_id, passive);
  EXPECT_EQ(answers[0].rej.message_rejected, RejectedMessage::Rep);
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, uint16_t(RejReason::InvalidCommId));
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  EXPECT_EQ(pipe.Count(CmAttr::Rep), 1u) << "the REP was sent again";
  EXPECT_TRUE(a_->Events().empty());
}

TEST_F(RoceCm, ReqTimeoutRejectFindsThePassiveCepByGuid) {
  // The passive consumer never answers and its MRAs are lost: the active side gives up, and its
  // REJ(timeout), which cannot name the passive ID, still ends the passive CEP.
  DropAll(CmAttr::Mra);
  auto [active, passive] = Request();
  RunFor(GiveUp(Timeout()));
  EXPECT_EQ(a_->EventKinds(), Kinds{K::ReqTimeout});
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 4);
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  // One per duplicate REQ, as many as max_mra_waits; the third repeat goes unanswered.
  EXPECT_EQ(b_->agent.counters().Sent(CmAttr::Mra), 2u);
  EXPECT_EQ(b_->agent.counters().duplicate_answers, 1u);
}

TEST_F(RoceCm, DuplicateReqIsAnsweredWithMraAndTheActiveSideWaits) {
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.max_retries = 1;
  Start(ca, Config(kGuidB, 0x22000000));
  uint64_t start = clock.now;
  auto [active, passive] = Request();  // the passive consumer takes its time
  RunFor(Timeout());                   // the REQ comes again: MRA
  EXPECT_EQ(pipe.Count(CmAttr::Req), 2u);
  EXPECT_EQ(pipe.Count(CmAttr::Mra), 1u);
  EXPECT_EQ(b_->State(passive), CmState::MraReqSent);
  EXPECT_EQ(a_->State(active), CmState::MraReqRcvd);
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::MraReceived);
  EXPECT_EQ(events[0].msg.mra.service_timeout, 24);
  EXPECT_TRUE(b_->Events().empty());  // no second ReqReceived

  // Without the MRA the REQ would have timed out at start + 2 timeouts.
  RunUntil(start + 2 * Timeout() + 1000);
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_EQ(a_->State(active), CmState::MraReqRcvd);
  EXPECT_EQ(a_->agent.NextDeadlineMs(), start + Timeout() + TimeValueToMs(24));

  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  EXPECT_EQ(a_->agent.counters().req_timeouts, 0u);
}

TEST_F(RoceCm, LostRepIsRetransmitted) {
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.packet_lifetime_ms = 100;  // the REQ timer runs longer than the REP timer
  Start(ca, Config(kGuidB, 0x22000000));
  auto [active, passive] = Request();
  DropFirst(CmAttr::Rep);
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_TRUE(a_->Events().empty());
  RunFor(Timeout());
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  EXPECT_EQ(pipe.Count(CmAttr::Rep), 2u);
  EXPECT_EQ(b_->agent.counters().retransmits, 1u);
  EXPECT_EQ(pipe.Count(CmAttr::Req), 1u);
}

TEST_F(RoceCm, RepRetriesExhausted) {
  // The active side's REQ timer runs longer (2 packet lifetimes more), so the passive side's REP
  // timer expires first.
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.packet_lifetime_ms = 100;
  Start(ca, Config(kGuidB, 0x22000000));
  DropAll(CmAttr::Rep);
  uint64_t start = clock.now;
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  EXPECT_EQ(a_->agent.TimeoutMsOf(active), Timeout() + 200);
  RunUntil(start + GiveUp(Timeout()) - 1);
  EXPECT_TRUE(b_->Events().empty());
  RunFor(1);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::RepTimeout});
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  EXPECT_EQ(b_->agent.counters().rep_timeouts, 1u);
  // At 0, 1 and 3 timeouts by the timer, plus one for the active side's REQ retransmission
  // meanwhile (after 335 ms; the REP gives up after 4 * 135).
  EXPECT_EQ(b_->agent.counters().retransmits, 2u);
  EXPECT_EQ(b_->agent.counters().duplicate_answers, 1u);
  EXPECT_EQ(pipe.Count(CmAttr::Rep), 4u);
  // The REJ(timeout) ends the active attempt too.
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 4);
  EXPECT_EQ(a_->State(active), CmState::Idle);
}

TEST_F(RoceCm, DuplicateReqResendsALostRepAndIsIgnoredOnceEstablished) {
  auto [active, passive] = Request();
  RunFor(Timeout() / 2);  // the consumer accepts late: the REP timer runs past the REQ timer
  DropFirst(CmAttr::Rep);
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_TRUE(a_->Events().empty());
  RunFor(Timeout() / 2 + 1);  // the REQ's retransmission reaches REP_SENT
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  EXPECT_EQ(pipe.Count(CmAttr::Rep), 2u);
  EXPECT_EQ(b_->agent.counters().duplicate_answers, 1u);
  EXPECT_EQ(b_->agent.counters().retransmits, 0u);

  ASSERT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::Established});
  size_t sent = pipe.log.size();
  a_->agent.OnMad(a_->address, {});  // (a truncated nothing, for good measure)
  b_->agent.OnMad(a_->address, pipe.log[0].bytes);  // the first REQ, very late
  EXPECT_EQ(pipe.log.size(), sent);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(b_->agent.counters().Dropped(CmDrop::Duplicate), 1u);
  EXPECT_EQ(b_->State(passive), CmState::Established);
}

TEST_F(RoceCm, DuplicateRepWhileTheActiveConsumerWaitsGetsMra) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  RunFor(Timeout());  // the REP comes again while no RTU was sent
  EXPECT_EQ(a_->State(active), CmState::MraRepSent);
  EXPECT_EQ(b_->State(passive), CmState::MraRepRcvd);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::MraReceived});
  RunFor(4 * Timeout());  // no REP timeout now
  EXPECT_TRUE(b_->Events().empty());
  ASSERT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::Established});
}

TEST_F(RoceCm, LostRtuReplacedByFirstPacketAndLateRtuIgnored) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  pipe.filter = [](const Datagram& d) {  // hold the RTU back
    return d.attr == CmAttr::Rtu ? Verdict{Fate::Delay, 50} : Verdict{};
  };
  ASSERT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
  Run();
  EXPECT_TRUE(b_->Events().empty());
  ASSERT_EQ(b_->agent.Established(passive), WV_SUCCESS);  // first packet on the QP
  EXPECT_EQ(b_->EventKinds(), Kinds{K::Established});
  EXPECT_EQ(b_->agent.NextDeadlineMs(), UINT64_MAX);  // REP timer stopped
  RunFor(50);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(b_->agent.counters().Dropped(CmDrop::Duplicate), 1u);
  EXPECT_EQ(b_->agent.Established(passive), WV_SUCCESS);
  EXPECT_TRUE(b_->Events().empty());
}

TEST_F(RoceCm, LostRtuIsResentWhenTheRepComesAgain) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  a_->Events();
  DropFirst(CmAttr::Rtu);
  ASSERT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
  RunFor(Timeout());
  EXPECT_EQ(b_->EventKinds(), Kinds{K::Established});
  EXPECT_EQ(pipe.Count(CmAttr::Rtu), 2u);
  EXPECT_EQ(a_->agent.counters().duplicate_answers, 1u);
}

TEST_F(RoceCm, DreqBeforeRtuEstablishesFirst) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  a_->Events();
  DropAll(CmAttr::Rtu);
  ASSERT_EQ(a_->agent.SendRtu(active), WV_SUCCESS);
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), (Kinds{K::Established, K::DreqReceived}));
  EXPECT_EQ(b_->State(passive), CmState::DreqRcvd);
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DrepReceived});
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
}

// ---------------------------------------------------------------------------- teardown

TEST_F(RoceCm, ActiveDisconnectThenTimewait) {
  auto [active, passive] = Establish();
  ASSERT_EQ(a_->agent.Disconnect(active, Text("bye")), WV_SUCCESS);
  EXPECT_EQ(a_->State(active), CmState::DreqSent);
  Run();
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::DreqReceived);
  EXPECT_EQ(TextOf(events[0].msg.dreq.private_data, sizeof events[0].msg.dreq.private_data), "bye");
  EXPECT_EQ(b_->State(passive), CmState::DreqRcvd);
  EXPECT_TRUE(a_->Events().empty());

  ASSERT_EQ(b_->agent.Disconnect(passive, Text("ok")), WV_SUCCESS);
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  uint64_t timewait_start = clock.now;
  Run();
  auto drep = a_->Events();
  ASSERT_EQ(drep.size(), 1u);
  EXPECT_EQ(drep[0].kind, K::DrepReceived);
  EXPECT_EQ(TextOf(drep[0].msg.drep.private_data, sizeof drep[0].msg.drep.private_data), "ok");
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  EXPECT_EQ(pipe.Sent(CmAttr::Drep)[0].mad.transaction_id,
            pipe.Sent(CmAttr::Dreq)[0].mad.transaction_id);

  RunUntil(timewait_start + 499);
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_TRUE(b_->Events().empty());
  RunFor(1);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::TimewaitExit});
  EXPECT_EQ(b_->EventKinds(), Kinds{K::TimewaitExit});
  EXPECT_EQ(a_->State(active), CmState::Idle);
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  a_->agent.Destroy(active);
  b_->agent.Destroy(passive);
  EXPECT_EQ(a_->agent.size() + b_->agent.size(), 0u);
  EXPECT_EQ(pipe.log.size(), 5u);  // REQ REP RTU DREQ DREP
}

TEST_F(RoceCm, PassiveDisconnect) {
  auto [active, passive] = Establish();
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DreqReceived});
  EXPECT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);  // answers with the DREP
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DrepReceived});
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  EXPECT_EQ(a_->agent.Disconnect(active), WV_INVALID_DEVICE_STATE);
  RunFor(500);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::TimewaitExit});
  EXPECT_EQ(b_->EventKinds(), Kinds{K::TimewaitExit});
}

TEST_F(RoceCm, CrossingDreqsAreBothAnswered) {
  auto [active, passive] = Establish();
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DreqReceived});  // one disconnect event each
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  EXPECT_EQ(pipe.Count(CmAttr::Drep, &a_->address), 1u);
  EXPECT_EQ(pipe.Count(CmAttr::Drep, &b_->address), 1u);
  RunFor(500);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::TimewaitExit});
  EXPECT_EQ(b_->EventKinds(), Kinds{K::TimewaitExit});
  EXPECT_EQ(pipe.Count(CmAttr::Dreq), 2u);  // no retransmissions
}

TEST_F(RoceCm, DreqToADeadPeerTimesOut) {
  auto [active, passive] = Establish();
  DropAll(CmAttr::Dreq);
  uint64_t start = clock.now;
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  RunUntil(start + GiveUp(Timeout()) - 1);
  EXPECT_TRUE(a_->Events().empty());
  RunFor(1);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DreqTimeout});
  EXPECT_EQ(pipe.Count(CmAttr::Dreq), 3u);
  EXPECT_EQ(a_->agent.counters().dreq_timeouts, 1u);
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  EXPECT_EQ(b_->State(passive), CmState::Established);
  RunFor(500);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::TimewaitExit});
}

TEST_F(RoceCm, DreqForNoConnectionIsAnsweredFromItsIds) {
  CmMessage m;
  m.attr = CmAttr::Dreq;
  m.mad.transaction_id = 0x77;
  m.dreq.local_comm_id = 0x01020304;
  m.dreq.remote_comm_id = 0x0A0B0C0D;
  m.dreq.remote_qpn = 9;
  Inject(*b_, m, a_->address);
  EXPECT_EQ(b_->agent.counters().dreqs_without_connection, 1u);
  auto dreps = pipe.Sent(CmAttr::Drep);
  ASSERT_EQ(dreps.size(), 1u);
  EXPECT_EQ(dreps[0].drep.local_comm_id, 0x0A0B0C0Du);
  EXPECT_EQ(dreps[0].drep.remote_comm_id, 0x01020304u);
  EXPECT_EQ(dreps[0].mad.transaction_id, 0x77u);
  EXPECT_EQ(Key(pipe.log.back().to), Key(a_->address));
  EXPECT_EQ(b_->agent.size(), 0u);
}

TEST_F(RoceCm, DreqMustNameBothIdsAndOurQpn) {
  auto [active, passive] = Establish();
  CmMessage m;
  m.attr = CmAttr::Dreq;
  m.dreq.local_comm_id = active;
  m.dreq.remote_comm_id = passive;
  m.dreq.remote_qpn = kQpnB + 1;  // another QP
  Inject(*b_, m, a_->address);
  EXPECT_EQ(b_->agent.counters().Dropped(CmDrop::QpnMismatch), 1u);
  EXPECT_EQ(pipe.Count(CmAttr::Drep), 0u);

  m.dreq.remote_qpn = kQpnB;
  m.dreq.local_comm_id = active + 1;  // another connection of the peer: not this one
  Inject(*b_, m, a_->address);
  EXPECT_EQ(b_->agent.counters().dreqs_without_connection, 1u);
  EXPECT_EQ(pipe.Count(CmAttr::Drep), 1u);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(b_->State(passive), CmState::Established);

  m.dreq.local_comm_id = active;  // the real one
  Inject(*b_, m, a_->address);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
}

TEST_F(RoceCm, DuplicateDreqInTimewaitResendsDrep) {
  auto [active, passive] = Establish();
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
  DropFirst(CmAttr::Drep);
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  EXPECT_TRUE(a_->Events().empty());
  RunFor(Timeout());  // the DREQ again, answered from TIMEWAIT
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DrepReceived});
  EXPECT_EQ(pipe.Count(CmAttr::Drep), 2u);
  EXPECT_EQ(b_->agent.counters().duplicate_answers, 1u);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
}

// The DREP was lost and the peer's DREQ retries reach us after our time-wait is over (the CEP
// is idle, its consumer still holds it): each is still answered, or the peer's Disconnect would
// end in a DREQ timeout although we disconnected at once.
TEST_F(RoceCm, DreqAfterTimewaitIsStillAnswered) {
  auto [active, passive] = Establish();
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  ASSERT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  RunFor(600);  // past the passive side's time-wait (500 ms)
  EXPECT_EQ(b_->EventKinds(), Kinds{K::TimewaitExit});
  ASSERT_EQ(b_->State(passive), CmState::Idle);
  size_t dreps = pipe.Count(CmAttr::Drep);
  CmMessage m;  // a DREQ retry that was late
  m.attr = CmAttr::Dreq;
  m.dreq.local_comm_id = active;
  m.dreq.remote_comm_id = passive;
  m.dreq.remote_qpn = kQpnB;
  Inject(*b_, m, a_->address);
  Run();
  EXPECT_EQ(pipe.Count(CmAttr::Drep), dreps + 1);
  EXPECT_TRUE(b_->Events().empty());
}

TEST_F(RoceCm, RejWhileEstablishedOrDisconnectingEndsInTimewait) {
  auto [active, passive] = Establish();
  CmMessage m;
  m.attr = CmAttr::Rej;
  m.rej.local_comm_id = passive;
  m.rej.remote_comm_id = active;
  m.rej.message_rejected = wire::ib::RejectedMessage::Other;
  m.rej.reason = 28;
  Inject(*a_, m, b_->address);
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 28);
  EXPECT_EQ(a_->State(active), CmState::Timewait);

  // In DREQ_SENT the REJ ends the disconnect: no DREQ timeout follows.
  DropAll(CmAttr::Dreq);
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  m.rej.local_comm_id = active;
  m.rej.remote_comm_id = passive;
  Inject(*b_, m, a_->address);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::Rejected});
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  RunFor(10 * Timeout());
  EXPECT_EQ(b_->EventKinds(), Kinds{K::TimewaitExit});
  EXPECT_EQ(pipe.Count(CmAttr::Dreq), 1u);
}

TEST_F(RoceCm, ReqFromAQpInTimewaitIsRejectedStale) {
  auto [active, passive] = Establish();
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  a_->Events();
  b_->Events();

  // The original REQ, duplicated very late: its CEP is in TIMEWAIT.
  b_->agent.OnMad(a_->address, pipe.log[0].bytes);
  EXPECT_EQ(b_->agent.counters().stale_rejects_sent, 1u);
  Run();
  EXPECT_EQ(a_->agent.counters().Dropped(CmDrop::WrongState), 1u);  // a is in TIMEWAIT too

  // A new connection from the same QP before time-wait is over (pitfall 15).
  uint32_t retry = a_->agent.Connect(b_->address, Args());
  EXPECT_NE(retry, active);
  Run();
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 10);
  EXPECT_EQ(a_->State(retry), CmState::Timewait);
  EXPECT_EQ(b_->agent.counters().stale_rejects_sent, 2u);
  EXPECT_TRUE(b_->Events().empty());

  RunFor(500);  // time-wait over: the QP may connect again
  a_->Events();
  b_->Events();
  a_->agent.Connect(b_->address, Args());
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::ReqReceived});
}

TEST_F(RoceCm, ReqFromAQpStillConnectedIsRejectedAndTheOldConnectionClosed) {
  auto [active, passive] = Establish();
  // The peer lost its connection state and reuses the QP for a new one.
  CmMessage req = pipe.Sent(CmAttr::Req)[0];
  req.req.local_comm_id = 0x5555;
  Inject(*b_, req, a_->address);
  EXPECT_EQ(b_->agent.counters().stale_rejects_sent, 1u);
  EXPECT_EQ(b_->State(passive), CmState::DreqSent);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::DreqReceived});  // the old connection ends
}

TEST_F(RoceCm, MalformedAndStaleMadsAreCountedAndDropped) {
  CmMessage rtu;
  rtu.attr = CmAttr::Rtu;
  rtu.rtu.local_comm_id = 1;
  rtu.rtu.remote_comm_id = 0x4242;
  std::vector<uint8_t> good = Encode(rtu);
  auto& agent = a_->agent;

  agent.OnMad(b_->address, std::span(good.data(), 100));
  EXPECT_EQ(agent.counters().Dropped(CmDrop::Truncated), 1u);
  auto wrong_class = good;
  wrong_class[1] = 0x04;  // subnet administration
  agent.OnMad(b_->address, wrong_class);
  EXPECT_EQ(agent.counters().Dropped(CmDrop::NotCm), 1u);
  auto wrong_version = good;
  wrong_version[2] = 1;
  agent.OnMad(b_->address, wrong_version);
  EXPECT_EQ(agent.counters().Dropped(CmDrop::BadVersion), 1u);
  auto lap = good;
  wire::StoreBe16(&lap[16], 0x0019);
  agent.OnMad(b_->address, lap);
  EXPECT_EQ(agent.counters().Dropped(CmDrop::UnknownAttribute), 1u);

  agent.OnMad(b_->address, good);  // RTU for no CEP
  CmMessage rep;
  rep.attr = CmAttr::Rep;
  rep.rep.remote_comm_id = 0x4242;
  Inject(*a_, rep, b_->address);
  CmMessage drep;
  drep.attr = CmAttr::Drep;
  drep.drep.remote_comm_id = 0x4242;
  Inject(*a_, drep, b_->address);
  CmMessage rej;
  rej.attr = CmAttr::Rej;
  rej.rej.remote_comm_id = 0x4242;
  rej.rej.reason = 28;
  Inject(*a_, rej, b_->address);
  CmMessage mra;
  mra.attr = CmAttr::Mra;
  mra.mra.remote_comm_id = 0x4242;
  Inject(*a_, mra, b_->address);
  EXPECT_EQ(agent.counters().Dropped(CmDrop::UnknownCommId), 5u);
  EXPECT_EQ(agent.counters().Received(CmAttr::Rtu), 1u);
  EXPECT_TRUE(a_->Events().empty());
  // None is answered but the REP, whose sender may be waiting for our RTU: a REJ from its IDs.
  ASSERT_EQ(pipe.log.size(), 1u);
  auto rejs = pipe.Sent(CmAttr::Rej);
  ASSERT_EQ(rejs.size(), 1u);
  EXPECT_EQ(rejs[0].rej.local_comm_id, 0x4242u);
  EXPECT_EQ(rejs[0].rej.remote_comm_id, 0u);
  EXPECT_EQ(rejs[0].rej.reason, uint16_t(RejReason::InvalidCommId));
  EXPECT_STREQ(ToString(CmDrop::UnknownCommId), "unknown comm ID");
}

TEST_F(RoceCm, RepNamingAnotherPeerIdIsDropped) {
  auto [active, passive] = Establish();
  CmMessage rtu;
  rtu.attr = CmAttr::Rtu;
  rtu.rtu.local_comm_id = active + 1;  // not the peer's ID for this CEP
  rtu.rtu.remote_comm_id = passive;
  Inject(*b_, rtu, a_->address);
  EXPECT_EQ(b_->agent.counters().Dropped(CmDrop::CommIdMismatch), 1u);
}

// ---------------------------------------------------------------------------- hostile peers
// docs/security.md, "RoCE": what a peer's messages may make the agent hold, and for how long.

// The REQ a peer would send (a's address unless said otherwise), before any clamp.
CmMessage PeerReq(uint32_t comm_id, uint32_t qpn = kQpnA) {
  CmMessage m;
  m.attr = CmAttr::Req;
  m.mad.transaction_id = 0x7000 + comm_id;
  m.req.local_comm_id = comm_id;
  m.req.service_id = kService;
  m.req.local_ca_guid = kGuidA;
  m.req.local_qpn = qpn;
  m.req.responder_resources = 4;
  m.req.initiator_depth = 4;
  m.req.remote_cm_response_timeout = 15;
  m.req.local_cm_response_timeout = 15;
  m.req.path_mtu = 3;
  m.req.retry_count = 7;
  m.req.rnr_retry_count = 6;
  m.req.max_cm_retries = 3;
  return m;
}

TEST_F(RoceCm, RequestNobodyAnswersExpiresAfterItsOwnBudgetWithRejTimeout) {
  // The application never accepts nor rejects, and a's retransmissions are lost (so no MRA
  // extends the request): b gives up after the REQ's own budget, 1 + retries transmissions of
  // the response timeout it asked of b, its 7 retries clamped to b's 3.
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.max_retries = 7;
  Start(ca, Config(kGuidB, 0x22000000));
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  pipe.filter = [n = 0](const Datagram& d) mutable {
    return d.attr == CmAttr::Req && n++ > 0 ? Verdict{Fate::Drop} : Verdict{};
  };
  uint64_t start = clock.now;
  uint32_t active = a_->agent.Connect(b_->address, Args());
  Run();
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  uint32_t passive = events[0].id;
  EXPECT_EQ(b_->agent.DeadlineOf(passive), start + 4 * Timeout());
  RunUntil(start + 4 * Timeout() - 1);
  EXPECT_EQ(b_->State(passive), CmState::ReqRcvd);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(pipe.Count(CmAttr::Rej), 0u);
  RunFor(1);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::RequestExpired});
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  EXPECT_EQ(b_->agent.counters().Limited(CmLimit::RequestExpired), 1u);
  auto rejs = pipe.Sent(CmAttr::Rej);
  ASSERT_GE(rejs.size(), 1u);
  EXPECT_EQ(rejs[0].rej.reason, 4);  // timeout
  EXPECT_EQ(rejs[0].rej.remote_comm_id, active);
  EXPECT_EQ(rejs[0].rej.local_comm_id, passive);
  EXPECT_EQ(b_->agent.NextDeadlineMs(), UINT64_MAX);
  EXPECT_EQ(b_->agent.Accept(passive, Accepting()), WV_INVALID_DEVICE_STATE);
  b_->agent.Destroy(passive);
  EXPECT_EQ(b_->agent.size(), 0u);
}

TEST_F(RoceCm, RequestLifetimeGrowsByTheMrasWeSendAndNoMore) {
  // A slow application is covered by the MRAs b sends in answer to a's repeats (each promises
  // an answer within its service timeout), at most max_mra_waits of them.
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.max_retries = 15;
  ca.max_mra_waits = 100;  // a peer that honours every MRA and repeats its REQ often
  CmConfig cb = Config(kGuidB, 0x22000000);
  cb.mra_timeout_ms = 1000;  // advertised as time value 18: 1074 ms
  Start(ca, cb);
  uint64_t start = clock.now;
  auto [active, passive] = Request();
  RunFor(Timeout());  // the first repeat: MRA
  EXPECT_EQ(pipe.Count(CmAttr::Mra), 1u);
  // The MRA's service timeout, and one response timeout for the repeat that follows it.
  EXPECT_EQ(b_->agent.DeadlineOf(passive), clock.now + TimeValueToMs(18) + Timeout());
  RunUntil(start + 30000);
  EXPECT_EQ(pipe.Count(CmAttr::Mra), 2u);  // max_mra_waits, then repeats go unanswered
  EXPECT_GT(b_->agent.counters().Dropped(CmDrop::Duplicate), 0u);
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::RequestExpired);
  EXPECT_EQ(b_->State(passive), CmState::Idle);
  EXPECT_EQ(a_->EventKinds(), (Kinds{K::MraReceived, K::MraReceived, K::Rejected}));
}

TEST_F(RoceCm, BacklogFullRefusesTheRequestAtOnceAndHoldsNothing) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.RefuseRequest(passive), WV_SUCCESS);
  EXPECT_EQ(b_->State(passive), CmState::NoSuchId);
  EXPECT_EQ(b_->agent.size(), 0u);
  EXPECT_EQ(b_->agent.NextDeadlineMs(), UINT64_MAX);
  EXPECT_EQ(b_->agent.counters().Limited(CmLimit::BacklogFull), 1u);
  auto rejs = pipe.Sent(CmAttr::Rej);
  ASSERT_EQ(rejs.size(), 1u);
  EXPECT_EQ(rejs[0].rej.reason, uint16_t(RejReason::NoResources));
  EXPECT_EQ(rejs[0].rej.remote_comm_id, active);
  EXPECT_EQ(rejs[0].rej.message_rejected, RejectedMessage::Req);
  Run();
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);  // the Connect: ND_CONNECTION_REFUSED
  EXPECT_EQ(a_->State(active), CmState::Idle);
  RunFor(10 * Timeout());
  EXPECT_EQ(pipe.Count(CmAttr::Req), 1u) << "the REQ was sent again";
  EXPECT_TRUE(b_->Events().empty());

  auto [again, request] = Request();
  EXPECT_EQ(b_->agent.RefuseRequest(request + 1), WV_NOT_FOUND);
  ASSERT_EQ(b_->agent.Accept(request, Accepting()), WV_SUCCESS);
  EXPECT_EQ(b_->agent.RefuseRequest(request), WV_INVALID_DEVICE_STATE);
}

TEST_F(RoceCm, ReqWithAPathMtuCodeOutsideOneToFiveIsRejectedInvalidMtu) {
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  uint32_t comm_id = 0x100;
  for (uint8_t code : {0, 6, 7, 15}) {
    SCOPED_TRACE(int(code));
    CmMessage req = PeerReq(++comm_id);
    req.req.path_mtu = code;
    pipe.Reset();
    Inject(*b_, req, a_->address);
    EXPECT_EQ(b_->agent.size(), 0u);  // no CEP
    EXPECT_TRUE(b_->Events().empty());
    auto rejs = pipe.Sent(CmAttr::Rej);
    ASSERT_EQ(rejs.size(), 1u);
    EXPECT_EQ(rejs[0].rej.reason, 26);
    EXPECT_EQ(rejs[0].rej.remote_comm_id, comm_id);
    EXPECT_EQ(rejs[0].mad.transaction_id, req.mad.transaction_id);
  }
  CmMessage uc = PeerReq(++comm_id);
  uc.req.transport_service_type = 1;  // UC: not served
  pipe.Reset();
  Inject(*b_, uc, a_->address);
  EXPECT_EQ(b_->agent.size(), 0u);
  ASSERT_EQ(pipe.Sent(CmAttr::Rej).size(), 1u);
  EXPECT_EQ(pipe.Sent(CmAttr::Rej)[0].rej.reason, 9);
  EXPECT_EQ(b_->agent.counters().Limited(CmLimit::InvalidReq), 5u);
  for (uint8_t code = 1; code <= 5; ++code) {  // every IB MTU is taken
    CmMessage req = PeerReq(++comm_id, kQpnA + code);
    req.req.path_mtu = code;
    Inject(*b_, req, a_->address);
  }
  EXPECT_EQ(b_->agent.size(), 5u);
  EXPECT_EQ(b_->Events().size(), 5u);
}

TEST_F(RoceCm, PeerTimeoutsRetriesReadLimitsAndRnrRetriesAreClampedToOurs) {
  CmConfig cb = Config(kGuidB, 0x22000000);
  cb.max_rnr_retry = 6;
  cb.max_read_limit = 128;
  Start(Config(kGuidA, 0x11000000), cb);
  ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
  CmMessage req = PeerReq(0x77);
  req.req.local_cm_response_timeout = 31;   // "answer my REP ... within 2.4 hours"
  req.req.remote_cm_response_timeout = 31;
  req.req.max_cm_retries = 15;
  req.req.responder_resources = 255;
  req.req.initiator_depth = 200;
  req.req.rnr_retry_count = 7;  // forever
  uint64_t start = clock.now;
  Inject(*b_, req, a_->address);
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  uint32_t passive = events[0].id;
  // What the consumer sees is within the device's limits.
  EXPECT_EQ(events[0].msg.req.responder_resources, 128);
  EXPECT_EQ(events[0].msg.req.initiator_depth, 128);
  EXPECT_EQ(events[0].msg.req.rnr_retry_count, 6);
  // The request lives (1 + our 3 retries) of our timeouts, not 16 of 2.4 hours.
  EXPECT_EQ(b_->agent.DeadlineOf(passive), start + 4 * Timeout());
  EXPECT_EQ(b_->agent.TimeoutMsOf(passive), Timeout());
  const CmCounters& c = b_->agent.counters();
  EXPECT_EQ(c.Limited(CmLimit::ResponseTimeout), 1u);
  EXPECT_EQ(c.Limited(CmLimit::Retries), 1u);
  EXPECT_EQ(c.Limited(CmLimit::ReadLimits), 1u);
  EXPECT_EQ(c.Limited(CmLimit::RnrRetry), 1u);

  // Accepted, and the peer never answers the REP (nor sends data): the QP in RTR is given up
  // after our bound, 4 transmissions of our timeout, each wait twice the one before. (The REPs are lost: a's agent, which never
  // sent this REQ, would answer one with a REJ.)
  DropAll(CmAttr::Rep);
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  uint64_t accepted = clock.now;
  RunUntil(accepted + GiveUp(Timeout()) - 1);
  EXPECT_TRUE(b_->Events().empty());
  RunFor(1);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::RepTimeout});
  EXPECT_EQ(pipe.Count(CmAttr::Rep), 3u);

  // The same limits apply to a REP (here a forged one: b never sees a's REQ).
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.max_rnr_retry = 3;
  Start(ca, cb);
  uint32_t active = a_->agent.Connect(b_->address, Args());
  pipe.Reset();
  CmMessage rep;
  rep.attr = CmAttr::Rep;
  rep.rep.local_comm_id = 0x9999;
  rep.rep.remote_comm_id = active;
  rep.rep.local_qpn = kQpnB;
  rep.rep.responder_resources = 250;
  rep.rep.rnr_retry_count = 7;
  Inject(*a_, rep, b_->address);
  auto reps = a_->Events();
  ASSERT_EQ(reps.size(), 1u);
  EXPECT_EQ(reps[0].kind, K::RepReceived);
  EXPECT_EQ(reps[0].msg.rep.responder_resources, 128);
  EXPECT_EQ(reps[0].msg.rep.rnr_retry_count, 3);
  EXPECT_EQ(a_->agent.counters().Limited(CmLimit::ReadLimits), 1u);
  EXPECT_EQ(a_->agent.counters().Limited(CmLimit::RnrRetry), 1u);
}

TEST_F(RoceCm, MraWaitsAreClampedAndCountedPerExchange) {
  CmConfig ca = Config(kGuidA, 0x11000000);
  ca.mra_timeout_ms = 4295;  // time value 20
  Start(ca, Config(kGuidB, 0x22000000));
  uint32_t active = a_->agent.Connect(b_->address, Args());
  pipe.Reset();  // b never hears of it
  CmMessage mra;
  mra.attr = CmAttr::Mra;
  mra.mra.local_comm_id = 0x4444;
  mra.mra.remote_comm_id = active;
  mra.mra.message_mraed = 0;  // REQ
  mra.mra.service_timeout = 31;  // 2.4 hours
  Inject(*a_, mra, b_->address);
  EXPECT_EQ(a_->agent.DeadlineOf(active), clock.now + 4295);
  EXPECT_EQ(a_->agent.counters().Limited(CmLimit::MraTimeout), 1u);
  RunFor(100);
  mra.mra.service_timeout = 10;  // 4 ms: honoured as asked
  Inject(*a_, mra, b_->address);
  EXPECT_EQ(a_->agent.DeadlineOf(active), clock.now + TimeValueToMs(10));
  uint64_t deadline = a_->agent.DeadlineOf(active);
  Inject(*a_, mra, b_->address);  // a third: ignored
  EXPECT_EQ(a_->agent.DeadlineOf(active), deadline);
  EXPECT_EQ(a_->agent.counters().Limited(CmLimit::MraCount), 1u);
  EXPECT_EQ(a_->EventKinds(), (Kinds{K::MraReceived, K::MraReceived}));
  // The retransmissions go on as without MRAs, a timeout for each transmission left (3), each
  // repeat after twice the wait: 2 more, then ReqTimeout.
  RunFor(GiveUp(Timeout()));
  EXPECT_EQ(a_->EventKinds(), Kinds{K::ReqTimeout});
  EXPECT_EQ(pipe.Count(CmAttr::Req), 2u);  // the first was sent before the Reset
}

TEST_F(RoceCm, MessagesForAConnectionFromAnotherAddressAreDroppedAndCounted) {
  auto [active, passive] = Establish();
  const sockaddr_storage third = Address("10.0.0.3", 5000);  // a's IP, another port is as bad
  const sockaddr_storage other_port = Address("10.0.0.1", 5001);
  pipe.Reset();
  uint64_t dropped = 0;
  struct Forged {
    CmAttr attr;
    Node* to;
  };
  const Forged forged[] = {{CmAttr::Dreq, b_.get()}, {CmAttr::Rej, b_.get()}, {CmAttr::Rtu, b_.get()},
                           {CmAttr::Drep, a_.get()}, {CmAttr::Rep, a_.get()}};
  for (const sockaddr_storage* from : {&third, &other_port}) {
    // Each names the connection's IDs exactly (as a's or b's peer would).
    for (const Forged& f : forged) {
      CmMessage m;
      m.attr = f.attr;
      if (f.to == b_.get()) ndwv::testing::SetCommIds(m, active, passive);
      else ndwv::testing::SetCommIds(m, passive, active);
      if (f.attr == CmAttr::Dreq) m.dreq.remote_qpn = kQpnB;
      if (f.attr == CmAttr::Rej) m.rej.reason = 28;
      Inject(*f.to, m, *from);
      dropped++;
    }
    // A REQ that claims a's QP, which is connected: the stale rule is for a's own port.
    Inject(*b_, PeerReq(0x5555), *from);
    dropped++;
  }
  EXPECT_EQ(a_->agent.counters().Dropped(CmDrop::WrongSource) + b_->agent.counters().Dropped(CmDrop::WrongSource),
            dropped);
  EXPECT_EQ(b_->agent.counters().stale_rejects_sent, 0u);
  EXPECT_TRUE(pipe.log.empty()) << "nothing is answered";
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(a_->State(active), CmState::Established);
  EXPECT_EQ(b_->State(passive), CmState::Established);

  // From the peer itself, the same DREQ closes the connection.
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
}

TEST_F(RoceCm, RepeatedReqFromAnotherAddressIsAnotherRequest) {
  auto [active, passive] = Request();
  // The same CA GUID and communication ID from elsewhere: not a repeat of a's REQ (no MRA to a),
  // a request of its own.
  CmMessage req = pipe.Sent(CmAttr::Req)[0];
  req.req.local_qpn = kQpnA + 1;
  Inject(*b_, req, Address("10.0.0.3", 5000));
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::ReqReceived);
  EXPECT_NE(events[0].id, passive);
  EXPECT_EQ(Key(events[0].peer), Key(Address("10.0.0.3", 5000)));
  EXPECT_EQ(pipe.Count(CmAttr::Mra), 0u);
  EXPECT_EQ(b_->State(passive), CmState::ReqRcvd);
}

// ---------------------------------------------------------------------------- Destroy (§3.4)

TEST_F(RoceCm, DestroyInReqSentSendsRejTimeout) {
  auto [active, passive] = Request();
  a_->agent.Destroy(active);
  EXPECT_EQ(a_->agent.size(), 0u);
  Run();
  auto events = b_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, K::Rejected);
  EXPECT_EQ(events[0].reject_reason, 4);
  EXPECT_EQ(a_->agent.NextDeadlineMs(), UINT64_MAX);
}

TEST_F(RoceCm, DestroyInReqRcvdRejectsAsConsumer) {
  auto [active, passive] = Request();
  b_->agent.Destroy(passive);
  EXPECT_EQ(b_->agent.size(), 0u);
  Run();
  auto events = a_->Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reject_reason, 28);
}

TEST_F(RoceCm, DestroyInRepRcvdRejectsTheRep) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  a_->agent.Destroy(active);  // RepReceived was still queued: gone with the CEP
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_EQ(a_->agent.size(), 0u);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::Rejected});
  EXPECT_EQ(b_->State(passive), CmState::Idle);
}

TEST_F(RoceCm, DestroyInRepSentRejectsAndKeepsATimewaitRecord) {
  auto [active, passive] = Request();
  ASSERT_EQ(b_->agent.Accept(passive, Accepting()), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::RepReceived});
  b_->agent.Destroy(passive);
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  Run();
  EXPECT_EQ(a_->EventKinds(), Kinds{K::Rejected});
  EXPECT_EQ(a_->State(active), CmState::Timewait);  // it had readied its QP
  RunFor(500);
  EXPECT_TRUE(b_->Events().empty());  // no events for a destroyed CEP
  EXPECT_EQ(b_->agent.size(), 0u);
  EXPECT_EQ(a_->EventKinds(), Kinds{K::TimewaitExit});
}

TEST_F(RoceCm, DestroyWhenEstablishedSendsDreqAndWaits) {
  auto [active, passive] = Establish();
  a_->agent.Destroy(active);
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  EXPECT_EQ(a_->agent.counters().Dropped(CmDrop::Duplicate), 1u);  // the DREP, in TIMEWAIT
  RunFor(10 * Timeout());
  EXPECT_EQ(pipe.Count(CmAttr::Dreq), 1u);  // sent once
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_EQ(a_->agent.size(), 0u);
  EXPECT_EQ(b_->EventKinds(), Kinds{K::TimewaitExit});
}

TEST_F(RoceCm, DestroyInDreqSentAndDreqRcvd) {
  auto [active, passive] = Establish();
  DropAll(CmAttr::Drep);
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  EXPECT_EQ(b_->EventKinds(), Kinds{K::DreqReceived});
  a_->agent.Destroy(active);  // DREQ_SENT: straight to TIMEWAIT
  EXPECT_EQ(a_->State(active), CmState::Timewait);
  b_->agent.Destroy(passive);  // DREQ_RCVD: DREP, then TIMEWAIT
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  EXPECT_EQ(pipe.Count(CmAttr::Drep), 1u);
  RunFor(500);
  EXPECT_EQ(pipe.Count(CmAttr::Dreq), 1u);
  EXPECT_TRUE(a_->Events().empty());
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(a_->agent.size() + b_->agent.size(), 0u);
  EXPECT_EQ(a_->agent.NextDeadlineMs(), UINT64_MAX);
}

TEST_F(RoceCm, DestroyInTimewaitKeepsTheRecordUntilItsTimer) {
  auto [active, passive] = Establish();
  ASSERT_EQ(a_->agent.Disconnect(active), WV_SUCCESS);
  Run();
  ASSERT_EQ(b_->agent.Disconnect(passive), WV_SUCCESS);
  Run();
  a_->Events();
  b_->agent.Destroy(passive);
  EXPECT_EQ(b_->State(passive), CmState::Timewait);
  b_->agent.OnMad(a_->address, pipe.log[0].bytes);  // the old REQ: still stale
  EXPECT_EQ(b_->agent.counters().stale_rejects_sent, 1u);
  RunFor(500);
  EXPECT_EQ(b_->agent.size(), 0u);
  EXPECT_TRUE(b_->Events().empty());
  EXPECT_EQ(a_->EventKinds(), Kinds{K::TimewaitExit});
}

// ---------------------------------------------------------------------------- a lossy network

// Many connections over a pipe that drops, duplicates and reorders; consumers that accept,
// complete, disconnect and destroy as real ones do. Whatever the losses: every connection has
// exactly one outcome before any disconnect event, at most one disconnect event per side, and
// every CEP is gone in the end.
TEST_F(RoceCm, LossyNetworkKeepsTheEventContract) {
  uint64_t total_disconnects = 0, total_retransmits = 0;
  for (uint32_t seed = 1; seed <= 40; seed++) {
    SCOPED_TRACE(seed);
    pipe.Reset();
    Start(Config(kGuidA, seed << 24), Config(kGuidB, seed << 16));
    listening_ = false;
    ASSERT_EQ(b_->agent.Listen(kService), WV_SUCCESS);
    std::mt19937 random(seed);
    pipe.filter = [&random](const Datagram&) {
      uint32_t roll = random() % 100;
      if (roll < 15) return Verdict{Fate::Drop};
      if (roll < 25) return Verdict{Fate::Duplicate};
      if (roll < 40) return Verdict{Fate::Delay, random() % 300};
      return Verdict{};
    };

    struct Tally {
      int outcome = 0, disconnect = 0, other = 0;
      bool destroyed = false;
    };
    std::map<uint32_t, Tally> actives, passives;
    for (int i = 0; i < 8; i++) {
      ConnectArgs args = Args();
      args.local_qpn = kQpnA + i;
      actives[a_->agent.Connect(b_->address, args)];
    }
    auto is_disconnect = [](K k) {
      return k == K::DreqReceived || k == K::DrepReceived || k == K::DreqTimeout;
    };
    for (int step = 0; step < 2000; step++) {
      RunFor(25);
      for (const CmEvent& e : a_->Events()) {
        Tally& t = actives[e.id];
        ASSERT_FALSE(t.destroyed);
        if (e.kind == K::RepReceived || e.kind == K::ReqTimeout ||
            (e.kind == K::Rejected && t.outcome == 0)) {
          EXPECT_EQ(t.outcome++, 0) << ToString(e.kind);
          if (e.kind == K::RepReceived) {
            // (A REJ may already have ended it: then these fail, and its event follows.)
            a_->agent.SendRtu(e.id);
            if (e.id % 2) a_->agent.Disconnect(e.id);
          } else {
            a_->agent.Destroy(e.id);
            t.destroyed = true;
          }
        } else if (is_disconnect(e.kind) || e.kind == K::Rejected) {
          EXPECT_EQ(t.outcome, 1) << ToString(e.kind);
          EXPECT_EQ(t.disconnect++, 0) << ToString(e.kind);
          if (a_->State(e.id) == CmState::DreqRcvd) a_->agent.Disconnect(e.id);
        } else if (e.kind == K::TimewaitExit) {
          a_->agent.Destroy(e.id);
          t.destroyed = true;
        }
      }
      for (const CmEvent& e : b_->Events()) {
        Tally& t = passives[e.id];
        ASSERT_FALSE(t.destroyed);
        switch (e.kind) {
          case K::ReqReceived:
            b_->agent.Accept(e.id, Accepting());
            break;
          case K::Established:
            EXPECT_EQ(t.outcome++, 0);
            if (e.id % 3 == 0) b_->agent.Disconnect(e.id);
            break;
          case K::RepTimeout:
          case K::Rejected:
            if (t.outcome == 0) {
              t.outcome++;
              if (b_->State(e.id) == CmState::Idle) {
                b_->agent.Destroy(e.id);
                t.destroyed = true;
              }
              break;
            }
            EXPECT_EQ(t.disconnect++, 0);
            break;
          case K::DreqReceived:
          case K::DrepReceived:
          case K::DreqTimeout:
            EXPECT_EQ(t.outcome, 1);
            EXPECT_EQ(t.disconnect++, 0) << ToString(e.kind);
            if (b_->State(e.id) == CmState::DreqRcvd) b_->agent.Disconnect(e.id);
            break;
          case K::TimewaitExit:
            b_->agent.Destroy(e.id);
            t.destroyed = true;
            break;
          default:
            break;
        }
      }
      // Connections nobody closes: the active consumer goes away after a while.
      if (step == 1500)
        for (auto& [id, t] : actives)
          if (!t.destroyed) {
            a_->agent.Destroy(id);
            t.destroyed = true;
          }
      if (step == 1700)
        for (auto& [id, t] : passives)
          if (!t.destroyed) {
            b_->agent.Destroy(id);
            t.destroyed = true;
          }
    }
    EXPECT_EQ(a_->agent.size(), 0u);
    EXPECT_EQ(b_->agent.size(), 0u);
    for (auto& [id, t] : passives) total_disconnects += t.disconnect;
    total_retransmits += a_->agent.counters().retransmits + b_->agent.counters().retransmits;
    pipe.Reset();
  }
  // The losses did bite, and connections did get through them.
  EXPECT_GT(total_disconnects, 100u);
  EXPECT_GT(total_retransmits, 100u);
}

}  // namespace
}  // namespace ndwv::dev::roce
