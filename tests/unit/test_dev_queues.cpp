// The QP state machine, in-order completion and flush, and the CQ's Notify rules, without a wire.
#include <gtest/gtest.h>

#include <ndwv/wvstatus.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "dev/cq.h"
#include "dev/poller_handoff.h"
#include "dev/qp.h"
#include "dev/srq.h"
#include "wait.h"

namespace ndwv::dev {
namespace {

struct Recorder : AsyncOp {
  std::vector<int32_t> statuses;
  void Complete(int32_t status) override { statuses.push_back(status); }
};

TEST(QpStateMachine, LegalTransitionsFollowTheVerbsTable) {
  EXPECT_TRUE(IsLegalTransition(QpState::Reset, QpState::Init));
  EXPECT_TRUE(IsLegalTransition(QpState::Init, QpState::Rtr));
  EXPECT_TRUE(IsLegalTransition(QpState::Rtr, QpState::Rts));
  EXPECT_TRUE(IsLegalTransition(QpState::Rts, QpState::Sqd));
  EXPECT_TRUE(IsLegalTransition(QpState::Sqd, QpState::Rts));
  EXPECT_TRUE(IsLegalTransition(QpState::Sqe, QpState::Rts));
  for (QpState s : {QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe,
                    QpState::Error}) {
    EXPECT_TRUE(IsLegalTransition(s, QpState::Error)) << ToString(s);
    EXPECT_TRUE(IsLegalTransition(s, QpState::Reset)) << ToString(s);
  }
  EXPECT_FALSE(IsLegalTransition(QpState::Reset, QpState::Rts));
  EXPECT_FALSE(IsLegalTransition(QpState::Init, QpState::Rts));
  EXPECT_FALSE(IsLegalTransition(QpState::Rtr, QpState::Init));
  EXPECT_FALSE(IsLegalTransition(QpState::Error, QpState::Rts));
}

struct QpTest : ::testing::Test {
  std::shared_ptr<ProtectionDomain> pd = std::make_shared<ProtectionDomain>();
  std::shared_ptr<CompletionQueue> cq = std::make_shared<CompletionQueue>(64);
  std::shared_ptr<QueuePair> qp =
      std::make_shared<QueuePair>(pd, cq, cq, nullptr, reinterpret_cast<void*>(0x55), QpCaps{8, 8, 4, 4, 64});
  alignas(8) uint8_t buffer[256] = {};
  uint32_t lkey = 0, rkey = 0;
  void SetUp() override { ASSERT_EQ(pd->Register(buffer, sizeof buffer, kLocalWrite, &lkey, &rkey), WV_SUCCESS); }
  SendWqe Send(uint64_t id, uint32_t flags = kSignaled) {
    SendWqe w{};
    w.wr_id = id;
    w.opcode = WrOpcode::Send;
    w.flags = flags;
    w.num_sge = 1;
    w.sge[0] = {reinterpret_cast<uint64_t>(buffer), 16, lkey};
    w.length = 16;
    return w;
  }
  std::vector<Completion> Drain() {
    std::vector<Completion> out(64);
    out.resize(cq->Poll(out.data(), out.size()));
    return out;
  }
};

// A post referring to more than one work request may move (MaxTransferLength) is refused before
// it is queued, on every queue; exactly that much is taken.
TEST_F(QpTest, APostOfMoreThanAWorkRequestMayMoveIsRefused) {
  const uint32_t half = uint32_t(kMaxTransferLength / 2);
  Sge over[2] = {{reinterpret_cast<uint64_t>(buffer), half, lkey}, {reinterpret_cast<uint64_t>(buffer), half + 1, lkey}};
  Sge exactly[2] = {over[0], over[0]};
  EXPECT_EQ(qp->PostReceive(1, over, 2), WV_BUFFER_OVERFLOW);
  EXPECT_EQ(qp->PostReceive(2, exactly, 2), WV_SUCCESS);
  SharedReceiveQueue srq(pd, 4, 2, 0);
  EXPECT_EQ(srq.PostReceive(3, over, 2), WV_BUFFER_OVERFLOW);
  EXPECT_EQ(srq.PostReceive(4, exactly, 2), WV_SUCCESS);
  ASSERT_EQ(qp->Modify(QpState::Init), WV_SUCCESS);
  ASSERT_EQ(qp->Modify(QpState::Rtr), WV_SUCCESS);
  ASSERT_EQ(qp->Modify(QpState::Rts), WV_SUCCESS);
  for (WrOpcode opcode : {WrOpcode::Send, WrOpcode::Write, WrOpcode::Read}) {
    SendWqe w = Send(5);
    w.opcode = opcode;
    w.num_sge = 2;
    w.sge[0] = over[0];
    w.sge[1] = over[1];
    w.length = kMaxTransferLength + 1;
    EXPECT_EQ(qp->PostSend(w), WV_BUFFER_OVERFLOW) << "opcode " << int(opcode);
  }
  EXPECT_TRUE(Drain().empty()) << "a refused post completed";
}

TEST_F(QpTest, PostingFollowsTheState) {
  Sge sge{reinterpret_cast<uint64_t>(buffer), 8, lkey};
  EXPECT_EQ(qp->PostReceive(1, &sge, 1), WV_SUCCESS);  // receives may be posted before connecting
  EXPECT_EQ(qp->PostSend(Send(1)), WV_CONNECTION_INVALID);
  ASSERT_EQ(qp->Modify(QpState::Init), WV_SUCCESS);
  ASSERT_EQ(qp->Modify(QpState::Rtr), WV_SUCCESS);
  EXPECT_EQ(qp->PostSend(Send(1)), WV_CONNECTION_INVALID);
  EXPECT_EQ(qp->Modify(QpState::Init), WV_INVALID_DEVICE_STATE);
  ASSERT_EQ(qp->Modify(QpState::Rts), WV_SUCCESS);
  EXPECT_EQ(qp->PostSend(Send(1)), WV_SUCCESS);
  Sge many[5] = {sge, sge, sge, sge, sge};
  EXPECT_EQ(qp->PostReceive(2, many, 5), WV_DATA_OVERRUN);  // more SGEs than the QP has
}

TEST_F(QpTest, SendsCompleteInOrderAndUnsignaledSuccessIsSilent) {
  qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(qp->PostSend(Send(id, id == 2 ? 0u : uint32_t(kSignaled))), WV_SUCCESS);
  qp->FinishSend(2, WcStatus::Success);  // the third finishes first: nothing may complete yet
  EXPECT_TRUE(Drain().empty());
  qp->FinishSend(0, WcStatus::Success);
  qp->FinishSend(1, WcStatus::Success);
  auto done = Drain();
  ASSERT_EQ(done.size(), 2u);  // the unsignaled one is silent
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[1].wr_id, 3u);
  EXPECT_EQ(done[0].qp_context, reinterpret_cast<void*>(0x55));
}

TEST_F(QpTest, QueueFullIsRefusedAtPost) {
  qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(qp->PostSend(Send(i)), WV_SUCCESS);
  EXPECT_EQ(qp->PostSend(Send(9)), WV_NO_MORE_ENTRIES);
}

// Depths that are not a power of two: the limit is the depth asked for, round after round.
TEST_F(QpTest, AnOddDepthIsTheLimitAndEntriesWrapInOrder) {
  auto odd = std::make_shared<QueuePair>(pd, cq, cq, nullptr, nullptr, QpCaps{5, 3, 4, 4, 64});
  odd->Modify(QpState::Init);
  odd->Modify(QpState::Rtr);
  odd->Modify(QpState::Rts);
  Sge sge{reinterpret_cast<uint64_t>(buffer), 8, lkey};
  uint64_t next_send = 0, next_recv = 100;
  for (uint64_t round = 0; round < 4; ++round) {
    for (int i = 0; i < 5; ++i) ASSERT_EQ(odd->PostSend(Send(next_send + i)), WV_SUCCESS);
    EXPECT_EQ(odd->PostSend(Send(99)), WV_NO_MORE_ENTRIES);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(odd->PostReceive(next_recv + i, &sge, 1), WV_SUCCESS);
    EXPECT_EQ(odd->PostReceive(999, &sge, 1), WV_NO_MORE_ENTRIES);
    for (uint64_t position = 5 * round; position < 5 * round + 5; ++position)
      odd->FinishSend(position, WcStatus::Success);
    RecvWqe wqe;
    while (odd->TakeReceive(&wqe)) odd->CompleteReceive(wqe, 0, WcStatus::Success, false);
    auto done = Drain();
    ASSERT_EQ(done.size(), 8u);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(done[i].wr_id, next_send + i);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(done[5 + i].wr_id, next_recv + i);
    next_send += 5;
    next_recv += 3;
  }
}

TEST(Srq, AnOddDepthIsTheLimitAndAResizeKeepsTheOrder) {
  auto pd = std::make_shared<ProtectionDomain>();
  SharedReceiveQueue srq(pd, 3, 1, 0);
  Sge sge{0, 0, 0};
  RecvWqe wqe;
  uint64_t next = 0;
  for (int round = 0; round < 3; ++round) {  // wrap a few times
    for (int i = 0; i < 3; ++i) ASSERT_EQ(srq.PostReceive(next + i, &sge, 1), WV_SUCCESS);
    EXPECT_EQ(srq.PostReceive(99, &sge, 1), WV_NO_MORE_ENTRIES);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(srq.Take(&wqe));
      EXPECT_EQ(wqe.wr_id, next++);
    }
    EXPECT_FALSE(srq.Take(&wqe));
  }
  for (int i = 0; i < 2; ++i) ASSERT_EQ(srq.PostReceive(next + i, &sge, 1), WV_SUCCESS);
  ASSERT_TRUE(srq.Take(&wqe));  // one taken, one left, then grown to five
  EXPECT_EQ(srq.Modify(5, 0), WV_SUCCESS);
  uint32_t depth = 0, max_sge = 0, limit = 0;
  srq.Query(&depth, &max_sge, &limit);
  EXPECT_EQ(depth, 5u);
  for (int i = 2; i < 6; ++i) ASSERT_EQ(srq.PostReceive(next + i, &sge, 1), WV_SUCCESS);
  EXPECT_EQ(srq.PostReceive(99, &sge, 1), WV_NO_MORE_ENTRIES);
  for (int i = 1; i < 6; ++i) {
    ASSERT_TRUE(srq.Take(&wqe));
    EXPECT_EQ(wqe.wr_id, next + i);
  }
}

TEST_F(QpTest, ErrorFlushesEveryRequestOnceInOrderAndLaterPostsToo) {
  Sge sge{reinterpret_cast<uint64_t>(buffer), 8, lkey};
  qp->PostReceive(10, &sge, 1);
  qp->PostReceive(11, &sge, 1);
  qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);
  qp->PostSend(Send(1, 0));  // unsignaled: a flush still reports it
  qp->PostSend(Send(2));
  ASSERT_EQ(qp->Modify(QpState::Error), WV_SUCCESS);
  EXPECT_EQ(qp->Modify(QpState::Error), WV_SUCCESS);
  auto done = Drain();
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done[0].wr_id, 1u);
  EXPECT_EQ(done[1].wr_id, 2u);
  EXPECT_EQ(done[2].wr_id, 10u);
  EXPECT_EQ(done[3].wr_id, 11u);
  for (auto& c : done) EXPECT_EQ(c.status, WcStatus::Flushed);
  EXPECT_EQ(done[2].opcode, WrOpcode::Receive);
  EXPECT_EQ(done[0].opcode, WrOpcode::Send);
  EXPECT_EQ(qp->PostSend(Send(3)), WV_SUCCESS);
  EXPECT_EQ(qp->PostReceive(12, &sge, 1), WV_SUCCESS);
  done = Drain();
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].status, WcStatus::Flushed);
  EXPECT_EQ(done[1].status, WcStatus::Flushed);
}

// Bind and Invalidate change the window when they are posted; a flush that catches them waiting
// for their turn reports that (an ND_CANCELED Invalidate of a window it unbound would make the
// owner and a racing peer both lose). One posted to an Error QP changes nothing.
TEST_F(QpTest, AFlushReportsTheWindowChangesThatTookEffectAtPost) {
  auto bound = pd->AllocateWindow(), unbound = pd->AllocateWindow();
  uint32_t key;
  ASSERT_EQ(pd->BindWindow(bound.get(), qp->qpn(), lkey, reinterpret_cast<uint64_t>(buffer), 64, kRemoteRead, &key),
            KeyCheck::Ok);
  auto window_request = [](uint64_t id, WrOpcode opcode, const std::shared_ptr<MemoryWindow>& mw) {
    SendWqe w{};
    w.wr_id = id;
    w.opcode = opcode;
    w.flags = kSignaled;
    w.window = mw;
    return w;
  };
  qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);
  ASSERT_EQ(qp->PostSend(Send(1)), WV_SUCCESS);
  ASSERT_EQ(qp->PostSend(window_request(2, WrOpcode::Bind, bound)), WV_SUCCESS);
  ASSERT_EQ(qp->PostSend(window_request(3, WrOpcode::Invalidate, bound)), WV_SUCCESS);
  ASSERT_EQ(qp->PostSend(window_request(4, WrOpcode::Invalidate, unbound)), WV_SUCCESS);
  ASSERT_EQ(qp->PostSend(Send(5)), WV_SUCCESS);
  ASSERT_EQ(qp->Modify(QpState::Error), WV_SUCCESS);
  auto done = Drain();
  ASSERT_EQ(done.size(), 5u);
  const WcStatus expected[] = {WcStatus::Flushed, WcStatus::Success, WcStatus::Success, WcStatus::LocalOp,
                               WcStatus::Flushed};
  for (size_t i = 0; i < done.size(); ++i) {
    EXPECT_EQ(done[i].wr_id, i + 1);
    EXPECT_EQ(done[i].status, expected[i]) << "request " << i + 1;
  }
  EXPECT_EQ(pd->CheckRemote(key, qp->qpn(), reinterpret_cast<uint64_t>(buffer), 1, kRemoteRead),
            KeyCheck::InvalidKey);

  ASSERT_EQ(pd->BindWindow(bound.get(), qp->qpn(), lkey, reinterpret_cast<uint64_t>(buffer), 64, kRemoteRead, &key),
            KeyCheck::Ok);
  ASSERT_EQ(qp->PostSend(window_request(6, WrOpcode::Invalidate, bound)), WV_SUCCESS);
  done = Drain();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::Flushed);
  EXPECT_EQ(pd->CheckRemote(key, qp->qpn(), reinterpret_cast<uint64_t>(buffer), 1, kRemoteRead), KeyCheck::Ok);
  EXPECT_TRUE(pd->InvalidateWindow(bound.get()));
  pd->FreeWindow(bound.get());
  pd->FreeWindow(unbound.get());
}

// Errors are found on several threads at once (the engine, a poller, the CM's work): the QP goes
// to Error, and the work that took it there lets go of it, however the calls interleave.
TEST_F(QpTest, ErrorsRaisedTogetherMoveToErrorAndReleaseTheQp) {
  using namespace std::chrono_literals;
  for (int round = 0; round < 3000; ++round) {
    ASSERT_EQ(qp->Modify(QpState::Reset), WV_SUCCESS);
    ASSERT_EQ(qp->Modify(QpState::Init), WV_SUCCESS);
    ASSERT_EQ(qp->Modify(QpState::Rtr), WV_SUCCESS);
    ASSERT_EQ(qp->Modify(QpState::Rts), WV_SUCCESS);
    std::atomic<int> ready{0};
    auto raise = [&] {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      qp->DeferError();
    };
    std::thread other(raise);
    raise();
    other.join();
    WaitUntil([&] { return qp->state() == QpState::Error && qp.use_count() == 1; }, 5s, 10us);
    ASSERT_EQ(qp->state(), QpState::Error) << "round " << round;
    ASSERT_EQ(qp.use_count(), 1) << "round " << round;
  }
}

TEST_F(QpTest, BadLocalKeyCompletesWithAProtectionError) {
  qp->Modify(QpState::Init);
  qp->Modify(QpState::Rtr);
  qp->Modify(QpState::Rts);
  SendWqe w = Send(7);
  w.sge[0].lkey ^= 0x100;
  ASSERT_EQ(qp->PostSend(w), WV_SUCCESS);  // refused at execution, not at post
  qp->FinishSend(0, qp->send_at(0).status);  // what the link does when the request's turn comes
  auto done = Drain();
  ASSERT_GE(done.size(), 1u);
  EXPECT_EQ(done[0].status, WcStatus::LocalProtection);
}

TEST(CqNotify, BroadcastNoLostWakeupAndSolicitedRules) {
  CompletionQueue cq(4);
  Recorder a, b;
  ASSERT_EQ(cq.Notify(NotifyType::Solicited, &a), WV_PENDING);
  cq.Push({nullptr, 1, 0, WrOpcode::Receive, WcStatus::Success}, false);
  EXPECT_TRUE(a.statuses.empty());  // not solicited
  ASSERT_EQ(cq.Notify(NotifyType::Any, &b), WV_PENDING);  // unseen entry: fires at once, for both
  EXPECT_EQ(a.statuses, std::vector<int32_t>{WV_SUCCESS});
  EXPECT_EQ(b.statuses, std::vector<int32_t>{WV_SUCCESS});

  Recorder c;
  ASSERT_EQ(cq.Notify(NotifyType::Any, &c), WV_PENDING);
  EXPECT_TRUE(c.statuses.empty());  // the entry already fired a notification
  cq.Push({nullptr, 2, 0, WrOpcode::Send, WcStatus::Success}, false);
  EXPECT_EQ(c.statuses.size(), 1u);

  Completion out[4];
  EXPECT_EQ(cq.Poll(out, 4), 2u);
  Recorder d;
  cq.Notify(NotifyType::Solicited, &d);
  cq.Push({nullptr, 3, 0, WrOpcode::Send, WcStatus::Flushed}, false);  // errors wake solicited arms
  EXPECT_EQ(d.statuses.size(), 1u);

  Recorder e;
  cq.Notify(NotifyType::Any, &e);
  cq.CancelNotifies();
  EXPECT_EQ(e.statuses, std::vector<int32_t>{WV_CANCELLED});
}

TEST(CqNotify, OverrunBreaksTheCqAndTellsTheArmedRequests) {
  CompletionQueue cq(2);
  Completion out[2];
  cq.Push({nullptr, 1, 0, WrOpcode::Send, WcStatus::Success}, false);
  cq.Push({nullptr, 2, 0, WrOpcode::Send, WcStatus::Success}, false);
  EXPECT_EQ(cq.Poll(out, 1), 1u);  // not drained: the next Notify must not fire for old entries
  Recorder r;
  Recorder s;
  cq.Notify(NotifyType::Errors, &s);
  cq.Push({nullptr, 3, 0, WrOpcode::Send, WcStatus::Success}, false);
  cq.Push({nullptr, 4, 0, WrOpcode::Send, WcStatus::Success}, false);  // overrun
  EXPECT_TRUE(cq.broken());
  EXPECT_EQ(s.statuses, std::vector<int32_t>{WV_BUFFER_OVERFLOW});
  EXPECT_EQ(cq.Notify(NotifyType::Any, &r), WV_BUFFER_OVERFLOW);
}

TEST(CqNotify, AnOddDepthOverrunsAtTheDepthAskedFor) {
  CompletionQueue cq(3);
  EXPECT_EQ(cq.capacity(), 3u);
  Completion out[3];
  for (uint64_t round = 0; round < 3; ++round) {  // wrap a few times first
    for (uint64_t i = 0; i < 3; ++i) cq.Push({nullptr, round * 3 + i, 0, WrOpcode::Send, WcStatus::Success}, false);
    ASSERT_EQ(cq.Poll(out, 3), 3u);
    for (uint64_t i = 0; i < 3; ++i) EXPECT_EQ(out[i].wr_id, round * 3 + i);
  }
  for (uint64_t i = 0; i < 3; ++i) cq.Push({nullptr, i, 0, WrOpcode::Send, WcStatus::Success}, false);
  EXPECT_FALSE(cq.broken());
  cq.Push({nullptr, 3, 0, WrOpcode::Send, WcStatus::Success}, false);  // the fourth: overrun
  EXPECT_TRUE(cq.broken());
}

TEST(CqResize, KeepsEveryEntryAndRefusesBelowOccupancy) {
  CompletionQueue cq(4);
  for (uint64_t i = 0; i < 3; ++i) cq.Push({nullptr, i, 0, WrOpcode::Send, WcStatus::Success}, false);
  Completion out[8];
  EXPECT_EQ(cq.Poll(out, 1), 1u);
  cq.Push({nullptr, 3, 0, WrOpcode::Send, WcStatus::Success}, false);  // wraps
  EXPECT_EQ(cq.Resize(2), WV_BUFFER_OVERFLOW);
  EXPECT_EQ(cq.Resize(8), WV_SUCCESS);
  ASSERT_EQ(cq.Poll(out, 8), 3u);
  EXPECT_EQ(out[0].wr_id, 1u);
  EXPECT_EQ(out[2].wr_id, 3u);
}


// ---- pollers lend their thread to few sources only -------------------------------------------------

// A transport that counts what the CQ asks of it.
struct CountingSource : Link {
  explicit CountingSource(bool held_until_established = false) : Link(held_until_established) {}
  int progress = 0, reaped = 0, peer_messages = 0, still = 0, armed = 0, kicks = 0;
  void PollProgress() override { ++progress; }
  void Reaped(bool peer_message) override { ++reaped; peer_messages += peer_message; }
  void StillPolled() override { ++still; }
  void OnNotifyArmed() override { ++armed; }
  void Kick() override { ++kicks; }
  void Shutdown() override {}
};

TEST(CqSources, PollersVisitFewSourcesAndLeaveManyToTheEngine) {
  CompletionQueue cq(16);
  constexpr size_t kFew = CompletionQueue::kMaxLendingSources;
  std::vector<CountingSource> sources(kFew + 2);
  for (size_t i = 0; i < kFew; ++i) cq.AttachSource(&sources[i]);
  Completion out[4];
  EXPECT_EQ(cq.Poll(out, 4), 0u);
  for (size_t i = 0; i < kFew; ++i) {
    EXPECT_EQ(sources[i].progress, 1) << i;  // an empty poll lends its thread to each
    EXPECT_TRUE(sources[i].Lendable());
  }
  // One more: every source goes back to the engine (once), and polls visit none of them.
  cq.AttachSource(&sources[kFew]);
  cq.AttachSource(&sources[kFew + 1]);
  for (auto& s : sources) {
    EXPECT_EQ(s.armed, 1);
    EXPECT_FALSE(s.Lendable());
  }
  EXPECT_EQ(cq.Poll(out, 4), 0u);
  Recorder notify;
  EXPECT_EQ(cq.Notify(NotifyType::Any, &notify), WV_PENDING);
  for (size_t i = 0; i < sources.size(); ++i) {
    EXPECT_EQ(sources[i].progress, i < kFew ? 1 : 0) << i;
    EXPECT_EQ(sources[i].armed, 1) << i;  // Notify does not walk them either
  }
  // Back below the limit, pollers still keep away until every source has gone.
  for (size_t i = 1; i < sources.size(); ++i) cq.DetachSource(&sources[i]);
  EXPECT_EQ(cq.Poll(out, 4), 0u);
  EXPECT_EQ(sources[0].progress, 1);
  cq.DetachSource(&sources[0]);
  for (auto& s : sources) EXPECT_TRUE(s.Lendable());
  cq.AttachSource(&sources[0]);
  EXPECT_EQ(cq.Poll(out, 4), 0u);
  EXPECT_EQ(sources[0].progress, 2);
  cq.DetachSource(&sources[0]);
  cq.CancelNotifies();
}

// The transports' rule for who reads a socket (engine or pollers) rests on what each poll tells.
TEST(CqSources, EmptyPollsLendTheThreadAndReapingPollsSayWhatTheyReaped) {
  CompletionQueue cq(16);
  CountingSource source;
  cq.AttachSource(&source);
  Completion out[4];
  EXPECT_EQ(cq.Poll(out, 4), 0u);
  EXPECT_EQ(cq.Poll(out, 4), 0u);
  EXPECT_EQ(source.progress, 2);
  EXPECT_EQ(source.reaped, 0);
  cq.Push({nullptr, 7, 0, WrOpcode::Write, WcStatus::Success}, false);
  EXPECT_EQ(cq.Poll(out, 4), 1u);
  EXPECT_EQ(source.progress, 2);
  EXPECT_EQ(source.reaped, 1);
  EXPECT_EQ(source.peer_messages, 0);  // the application's own request
  cq.Push({nullptr, 8, 0, WrOpcode::Send, WcStatus::Success}, false);
  cq.Push({nullptr, 9, 8, WrOpcode::Receive, WcStatus::Success}, false);
  EXPECT_EQ(cq.Poll(out, 4), 2u);
  EXPECT_EQ(source.reaped, 2);
  EXPECT_EQ(source.peer_messages, 1);  // a received message is the peer's
  cq.DetachSource(&source);
}

// A wait (empty polls) that ends in a reaping poll, with neither a peer's message placed during it
// nor a received message reaped at its end, was a wait for the application's own request: the
// engine must watch the socket again. Otherwise it was a wait for the peer: the pollers keep it.
TEST(PollerRule, AWaitEndsWithTheEvidenceOfWhatItWasFor) {
  PollerRule rule;
  EXPECT_FALSE(rule.Reaped(false));  // no wait: nothing to conclude
  rule.EmptyPoll(false);
  rule.EmptyPoll(false);
  EXPECT_TRUE(rule.Reaped(false));   // waited for its own request
  EXPECT_FALSE(rule.Reaped(false));
  rule.EmptyPoll(false);
  rule.EmptyPoll(true);
  rule.EmptyPoll(false);
  EXPECT_FALSE(rule.Reaped(false));  // the peer's message came while it polled
  rule.EmptyPoll(false);
  EXPECT_FALSE(rule.Reaped(true));   // it reaped a received message
  rule.EmptyPoll(false);
  EXPECT_TRUE(rule.Reaped(false));   // the evidence is per wait
  rule.EmptyPoll(false);
  rule.Notified();
  EXPECT_FALSE(rule.Reaped(false));
}

// A peer's message placed by a poller hands the socket to the pollers, unless the application
// waits by events (a Notify armed since the pollers last ended a wait themselves): it may wait for
// the peer on memory next, and nobody would read the socket.
TEST(PollerRule, PollersTakeTheSocketOnlyFromAnApplicationThatPollsItsWaits) {
  PollerRule rule;
  EXPECT_FALSE(rule.EmptyPoll(false));
  EXPECT_TRUE(rule.EmptyPoll(true));
  rule.Notified();
  EXPECT_FALSE(rule.EmptyPoll(true));
  EXPECT_FALSE(rule.Reaped(true));   // a wait the pollers ended themselves...
  EXPECT_TRUE(rule.EmptyPoll(true));  // ...gives them the socket again
}

// A wait for the application's own request gives the engine the socket, for the application may
// wait for the peer on memory next; if it polls again instead, and polls for its receives (it
// has ended a wait by reaping one), it waits by polling after all, and the pollers take the
// socket back at once, without waiting to place a peer's message themselves (which the engine,
// watching, would mostly read first).
TEST(PollerRule, PollingAgainAfterAWaitForItsOwnRequestTakesTheSocketBack) {
  PollerRule rule;
  rule.EmptyPoll(false);
  EXPECT_TRUE(rule.Reaped(false));      // waited for its own request: the engine watches
  EXPECT_FALSE(rule.EmptyPoll(false));  // never polled for a receive: it waits on memory
  EXPECT_FALSE(rule.Reaped(true));      // ...until a wait ends with a received message
  rule.EmptyPoll(false);
  EXPECT_TRUE(rule.Reaped(false));
  EXPECT_TRUE(rule.EmptyPoll(false));   // polls again: the pollers take the socket
  EXPECT_FALSE(rule.EmptyPoll(false));  // once; from then on only by the evidence
  EXPECT_FALSE(rule.Reaped(true));      // a wait for the peer keeps it with the pollers
  rule.EmptyPoll(false);
  EXPECT_FALSE(rule.EmptyPoll(false));
  EXPECT_TRUE(rule.Reaped(false));
  rule.Notified();                      // waits by events now: the pollers keep away
  EXPECT_FALSE(rule.EmptyPoll(false));
}

// While the pollers go on, the idle timer looks less and less often; when it finds them stopped
// the engine takes over. The first look after each departure is soon again.
TEST(PollerRule, IdleLooksBackOffWhileThePollersGoOn) {
  PollerRule rule;
  EXPECT_EQ(rule.FirstLook(), kFirstIdleLook);
  for (int i = 0; i < 8; ++i) rule.Posted();
  EXPECT_TRUE(rule.StillActive());
  EXPECT_EQ(rule.NextLook(), 2 * kFirstIdleLook);
  rule.EmptyPoll(false);
  EXPECT_FALSE(rule.StillActive());  // one poll since the last look is not a poller that spins
  for (int i = 0; i < 10; ++i) rule.NextLook();
  EXPECT_EQ(rule.NextLook(), kPollIdle);
  EXPECT_EQ(rule.FirstLook(), kFirstIdleLook);
}

TEST(CqSources, ASourceOfTwoCqsIsLentOnlyWhileNeitherHasTooMany) {
  CompletionQueue small(16), big(16);
  constexpr size_t kFew = CompletionQueue::kMaxLendingSources;
  std::vector<CountingSource> crowd(kFew);
  CountingSource both;
  small.AttachSource(&both);
  EXPECT_TRUE(both.Lendable());
  for (auto& s : crowd) big.AttachSource(&s);
  big.AttachSource(&both);  // the big CQ's fifth
  EXPECT_FALSE(both.Lendable());
  Completion out[1];
  EXPECT_EQ(small.Poll(out, 1), 0u);
  EXPECT_EQ(both.progress, 1);  // the small CQ's pollers still drive it, the engine watches too
  big.DetachSource(&both);
  EXPECT_TRUE(both.Lendable());
  for (auto& s : crowd) big.DetachSource(&s);
  small.DetachSource(&both);
}

// The passive side: a send posted before Accept completed (the QP in RTS since the Accept, its
// link holding until established) is taken; establishment lifts the hold and kicks the link.
// In RTR a send is refused, link or not.
TEST_F(QpTest, ASendPostedBeforeEstablishmentIsTakenAndEstablishmentKicksTheLink) {
  ASSERT_EQ(qp->Modify(QpState::Init), WV_SUCCESS);
  ASSERT_EQ(qp->Modify(QpState::Rtr), WV_SUCCESS);
  EXPECT_EQ(qp->PostSend(Send(1)), WV_CONNECTION_INVALID);  // no connection yet
  auto link = std::make_shared<CountingSource>(true);
  ASSERT_TRUE(qp->Attach(link));
  EXPECT_EQ(qp->PostSend(Send(1)), WV_CONNECTION_INVALID);  // still RTR
  ASSERT_EQ(qp->Modify(QpState::Rts), WV_SUCCESS);
  EXPECT_TRUE(link->HeldUntilEstablished());
  EXPECT_EQ(qp->PostSend(Send(2)), WV_SUCCESS);
  int kicks = link->kicks;
  link->Established();
  EXPECT_FALSE(link->HeldUntilEstablished());
  EXPECT_EQ(link->kicks, kicks + 1);
  ASSERT_EQ(qp->Modify(QpState::Error), WV_SUCCESS);
  std::vector<Completion> flushed = Drain();
  ASSERT_EQ(flushed.size(), 1u);
  EXPECT_EQ(flushed[0].wr_id, 2u);
  EXPECT_EQ(flushed[0].status, WcStatus::Flushed);
}

// A link attached after the QP failed would stay a progress source of its CQs after the flush
// detached the links it knew: the attach is refused.
TEST_F(QpTest, ALinkIsNotAttachedToAFailedQp) {
  ASSERT_EQ(qp->Modify(QpState::Error), WV_SUCCESS);
  auto link = std::make_shared<CountingSource>();
  EXPECT_FALSE(qp->Attach(link));
  Completion out[1];
  EXPECT_EQ(cq->Poll(out, 1), 0u);
  EXPECT_EQ(link->progress, 0);  // not a source of the CQ
}

}  // namespace
}  // namespace ndwv::dev
