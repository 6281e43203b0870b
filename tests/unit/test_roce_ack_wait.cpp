// The RoCE requester's ACK wait (dev/roce/ack_wait.h): the configured timeout is the floor, the
// wait follows measured round trips above it, and never exceeds kMaxStretch times the floor.
#include "dev/roce/ack_wait.h"

#include <gtest/gtest.h>

namespace ndwv::dev::roce {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(RoceAckWait, WithoutSamplesTheConfiguredTimeoutIsTheWait) {
  AckWait wait;
  EXPECT_EQ(microseconds(milliseconds(200)), wait.For(milliseconds(200)));
}

TEST(RoceAckWait, FastAcknowledgementsLeaveTheFloor) {
  AckWait wait;
  for (int i = 0; i < 100; ++i) wait.Sample(microseconds(50));
  EXPECT_EQ(microseconds(milliseconds(100)), wait.For(milliseconds(100)));
}

TEST(RoceAckWait, LateAcknowledgementsStretchTheWaitBeyondThem) {
  AckWait wait;
  // Acknowledgements taking 300 ms (engines busy with thousands of connections) against a
  // 100 ms timeout: the wait grows past them, so they are no longer taken for losses.
  for (int i = 0; i < 20; ++i) wait.Sample(milliseconds(300));
  EXPECT_GT(wait.For(milliseconds(100)), microseconds(milliseconds(300)));
}

TEST(RoceAckWait, OneLateAcknowledgementAlreadyStretchesTheWait) {
  AckWait wait;
  wait.Sample(microseconds(100));
  wait.Sample(milliseconds(250));
  EXPECT_GT(wait.For(milliseconds(100)), microseconds(milliseconds(250)));
}

TEST(RoceAckWait, TheStretchIsBounded) {
  AckWait wait;
  for (int i = 0; i < 20; ++i) wait.Sample(std::chrono::seconds(100));
  EXPECT_EQ(microseconds(milliseconds(100) * AckWait::kMaxStretch), wait.For(milliseconds(100)));
}

TEST(RoceAckWait, TheWaitComesBackDownWhenAcknowledgementsAreFastAgain) {
  AckWait wait;
  for (int i = 0; i < 20; ++i) wait.Sample(milliseconds(500));
  ASSERT_GT(wait.For(milliseconds(100)), microseconds(milliseconds(500)));
  for (int i = 0; i < 200; ++i) wait.Sample(microseconds(100));
  EXPECT_EQ(microseconds(milliseconds(100)), wait.For(milliseconds(100)));
}

TEST(RoceAckWait, ANegativeSampleCountsAsZero) {
  AckWait wait;
  wait.Sample(microseconds(-5000));  // clocks read on two threads
  EXPECT_EQ(microseconds(milliseconds(10)), wait.For(milliseconds(10)));
}

}  // namespace
}  // namespace ndwv::dev::roce
