// A device QP under test and what its CQ delivered: drain it, wait (bounded) for a condition or
// for the QP to fail, and check that each request completed exactly once with its status.
// Shared by the hostile-peer tests of both transports.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include <ndwv/wvstatus.h>

#include "dev/cq.h"
#include "dev/qp.h"
#include "wait.h"

namespace ndwv::dev {

// A signaled Send of one SGE, the request most tests post.
inline SendWqe SignaledSend(uint64_t wr_id, const Sge& sge) {
  SendWqe send{};
  send.wr_id = wr_id;
  send.opcode = WrOpcode::Send;
  send.flags = kSignaled;
  send.num_sge = 1;
  send.sge[0] = sge;
  send.length = sge.length;
  return send;
}

struct QpWatch {
  explicit QpWatch(void* qp_context) : context(qp_context) {}

  // Everything the CQ holds now (an empty poll also lends the thread to receive progress).
  void Drain() {
    Completion batch[32];
    while (size_t n = cq->Poll(batch, 32)) completions.insert(completions.end(), batch, batch + n);
  }

  // Polls until `done` holds, at most `bound`.
  template <class Pred>
  bool PollUntil(Pred done, std::chrono::milliseconds bound = std::chrono::seconds(5)) {
    return WaitUntil([&] {
      Drain();
      return done();
    }, bound);
  }

  // Waits for the library to move the QP to Error, then for that move's flush to finish (a second
  // move to Error returns only after the first one's flush), and collects every completion.
  void WaitForError() {
    ASSERT_TRUE(PollUntil([&] { return qp->state() == QpState::Error; }))
        << "the QP is still " << ToString(qp->state());
    ASSERT_EQ(qp->Modify(QpState::Error), WV_SUCCESS);
    Drain();
  }

  // Each of the wr_ids completed exactly once with its status; nothing else completed.
  void ExpectCompletions(const std::map<uint64_t, WcStatus>& expected) {
    std::map<uint64_t, std::vector<WcStatus>> seen;
    for (const Completion& c : completions) {
      EXPECT_EQ(c.qp_context, context);
      seen[c.wr_id].push_back(c.status);
    }
    for (const auto& [id, statuses] : seen) {
      auto it = expected.find(id);
      if (it == expected.end()) {
        ADD_FAILURE() << "unexpected completion of wr_id " << id << " (status " << int(statuses[0]) << ")";
        continue;
      }
      EXPECT_EQ(statuses.size(), 1u) << "wr_id " << id << " completed " << statuses.size() << " times";
      EXPECT_EQ(int(statuses[0]), int(it->second)) << "wr_id " << id;
    }
    for (const auto& [id, status] : expected)
      EXPECT_TRUE(seen.count(id)) << "wr_id " << id << " never completed";
  }

  void* const context;
  std::shared_ptr<CompletionQueue> cq = std::make_shared<CompletionQueue>(256);
  std::shared_ptr<QueuePair> qp;
  std::vector<Completion> completions;
};

}  // namespace ndwv::dev
