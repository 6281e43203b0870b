// The harness itself: a failing peer, a failing local side and a peer that never answers must
// each fail the test (and never hang it).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

IT_PEER(harness_fails) {
  parent.Send("hello " + args.Get("word"));
  IT_CHECK_EQ(1, 2);
}

IT_PEER(harness_echo) {
  std::string line = parent.Receive("a line to echo");
  parent.Send(line);
  parent.Expect("bye");
}

IT_PEER(harness_silent) {
  parent.Expect("never sent", 30000);
}

void PeerFailure() {
  RunWithPeer("harness_fails", {{"word", "world"}}, [](Channel& peer) {
    peer.Expect("hello world");
    peer.Expect("never sent");  // the peer fails instead: reported at once, not after 10 s
  });
}

void LocalFailure() {
  RunWithPeer("harness_silent", [](Channel&) { IT_CHECK_EQ(3, 4); });
}

void SilentPeer() {
  RunWithPeer("harness_silent", [](Channel& peer) { peer.Receive("anything", 300); });
}

TEST(IntegrationHarness, PeerFailureFailsTheTest) {
  EXPECT_NONFATAL_FAILURE(PeerFailure(), "2 is 2, expected 1");
}

TEST(IntegrationHarness, LocalFailureFailsTheTestAndEndsThePeer) {
  EXPECT_NONFATAL_FAILURE(LocalFailure(), "3");
}

TEST(IntegrationHarness, WaitsAreBounded) {
  // The wait gives up at its deadline (300 ms here) and fails the test instead of hanging.
  EXPECT_NONFATAL_FAILURE(SilentPeer(), "nothing from the other side");
}

TEST(IntegrationHarness, ChannelCarriesLinesBothWays) {
  RunWithPeer("harness_echo", [](Channel& peer) {
    peer.Send("ping 42");
    peer.Expect("ping 42");
    peer.Send("bye");
  });
}

}  // namespace
}  // namespace ndit
