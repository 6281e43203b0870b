// base::LazyDeque: a deque that allocates on its first element, and otherwise behaves as one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/lazy_deque.h"

namespace ndwv::base {
namespace {

TEST(LazyDeque, EmptyBeforeAndAfterUseAndFirstInFirstOut) {
  LazyDeque<std::string> q;
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.size(), 0u);
  int visited = 0;
  for (const std::string& s : q) visited += int(s.size()) + 1;  // nothing allocated: an empty range
  EXPECT_EQ(visited, 0);

  q.push_back("a");
  q.emplace_back("b");
  std::string c = "c";
  q.push_back(c);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q.front(), "a");
  EXPECT_EQ(q.back(), "c");
  EXPECT_EQ(q[1], "b");
  std::vector<std::string> seen(q.begin(), q.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"a", "b", "c"}));
  q.pop_front();
  q.pop_back();
  ASSERT_EQ(q.size(), 1u);
  EXPECT_EQ(q.front(), "b");
  q.clear();
  EXPECT_TRUE(q.empty());
  q.push_back("d");
  EXPECT_EQ(q.front(), "d");

  const LazyDeque<int> never;
  EXPECT_TRUE(never.begin() == never.end());
}

}  // namespace
}  // namespace ndwv::base
