// base::RingQueue: a first-in first-out queue of plain records in a ring that doubles when full,
// checked against std::deque through every growth and wrap.
#include <gtest/gtest.h>

#include <cstdint>
#include <deque>
#include <random>

#include "base/ring_queue.h"

namespace ndwv::base {
namespace {

struct Record {
  uint64_t id;
  uint32_t a, b;
};

::testing::AssertionResult Same(const RingQueue<Record>& q, const std::deque<Record>& model) {
  if (q.size() != model.size()) return ::testing::AssertionFailure() << "size " << q.size() << ", not " << model.size();
  if (q.empty() != model.empty()) return ::testing::AssertionFailure() << "empty()";
  for (size_t i = 0; i < model.size(); ++i)
    if (q[i].id != model[i].id || q[i].a != model[i].a || q[i].b != model[i].b)
      return ::testing::AssertionFailure() << "record " << i << " is " << q[i].id << ", not " << model[i].id;
  return ::testing::AssertionSuccess();
}

TEST(RingQueue, BehavesAsADequeAtItsEndsThroughGrowthAndWraps) {
  RingQueue<Record> q;
  std::deque<Record> model;
  EXPECT_TRUE(Same(q, model));
  std::mt19937 random(7);
  uint64_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    // Pushes outnumber pops early (the ring grows, wrapping each time), then pops catch up.
    const unsigned roll = random() % 10;
    const bool push = model.empty() || roll < (step < 10000 ? 6u : 4u);
    if (push) {
      Record r{next, uint32_t(next * 3), uint32_t(~next)};
      ++next;
      q.push_back(r);
      model.push_back(r);
    } else if (roll == 9) {
      q.pop_back();
      model.pop_back();
    } else {
      q.pop_front();
      model.pop_front();
    }
    ASSERT_TRUE(Same(q, model)) << "after step " << step;
    if (!model.empty()) {
      ASSERT_EQ(q.front().id, model.front().id);
      ASSERT_EQ(q.back().id, model.back().id);
    }
  }
  q.front().a = 77;  // a reference into the ring
  EXPECT_EQ(q[0].a, 77u);
  q.clear();
  EXPECT_TRUE(q.empty());
  q.push_back({1, 2, 3});
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(q.front().id, 1u);
}

}  // namespace
}  // namespace ndwv::base
