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

using Time = std::chrono::steady_clock::time_point;
constexpr Time kNever{};
const Time kT0 = Time(std::chrono::seconds(1000));

// A lossy link: one request in ten is lost and sent again after the 200 ms timeout, and the ACK of
// the repeat comes 100 us after it. The losses say nothing of how long ACKs take: the wait stays
// at the floor (taken as round trips of 200 ms, they stretched it towards 8 x the floor).
TEST(RoceAckWait, AcknowledgementsOfRepeatsAfterLossesLeaveTheWaitAtTheFloor) {
  AckWait wait;
  const milliseconds floor(200);
  Time t = kT0;
  for (int i = 0; i < 40; ++i) {
    bool lost = i % 10 == 3;
    Time resent = lost ? t + floor : kNever;
    Time acked = (lost ? resent : t) + microseconds(100);
    wait.Acknowledged(t, resent, acked, floor);
    t = acked + milliseconds(1);
  }
  EXPECT_EQ(microseconds(floor), wait.For(floor));
}

// ACKs that come late for everything (busy engines: 400 ms against a 100 ms floor), so that each
// request is sent again before its first ACK: those ACKs come long after the repeat, and the wait
// still learns how late they are.
TEST(RoceAckWait, LateAcknowledgementsOfRepeatedRequestsStillStretchTheWait) {
  AckWait wait;
  const milliseconds floor(100);
  Time t = kT0;
  for (int i = 0; i < 20; ++i) {
    wait.Acknowledged(t, t + floor, t + milliseconds(400), floor);
    t += milliseconds(500);
  }
  EXPECT_GT(wait.For(floor), microseconds(milliseconds(400)));
}

// The boundary: within a quarter of the floor of the repeat is an answer to the repeat; later is
// a late answer to the first transmission.
TEST(RoceAckWait, AnAcknowledgementAQuarterOfTheFloorAfterTheRepeatIsALateOne) {
  const milliseconds floor(200);
  AckWait answered, late;
  answered.Acknowledged(kT0, kT0 + floor, kT0 + floor + milliseconds(49), floor);
  late.Acknowledged(kT0, kT0 + floor, kT0 + floor + milliseconds(50), floor);
  EXPECT_EQ(microseconds(floor), answered.For(floor));
  EXPECT_GT(late.For(floor), microseconds(milliseconds(250)));
}

}  // namespace
}  // namespace ndwv::dev::roce
