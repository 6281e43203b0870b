// The connection endpoints' transition tables (dev/endpoint.h): each accepts the state changes
// its endpoint makes and refuses others; an illegal change is counted (release) or aborts
// (checked builds); and docs/teardown.md shows the tables as the code has them.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/checked.h"
#include "dev/counters.h"
#include "dev/iwarp/endpoint.h"
#include "dev/roce/endpoint.h"

namespace ndwv::dev {
namespace {

// The table as docs/teardown.md shows it: one line per state, the targets in the enum's order.
template <class Endpoint>
std::string Markdown() {
  using State = typename Endpoint::State;
  std::string out = "| from | may go to |\n|---|---|\n";
  for (size_t from = 0; from < Endpoint::kStates; ++from) {
    std::string targets;
    for (size_t to = 0; to < Endpoint::kStates; ++to) {
      if (!Endpoint::kTransitions.Allows(State(from), State(to))) continue;
      if (!targets.empty()) targets += ", ";
      targets += Endpoint::ToString(State(to));
    }
    out += std::string("| ") + Endpoint::ToString(State(from)) + " | " + targets + " |\n";
  }
  return out;
}

std::string ReadDoc(const char* name) {
  std::ifstream in(std::string(NDWV_DOCS_DIR) + "/" + name);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(EndpointStates, IwarpTableHasWhatTheCodeDoes) {
  using E = iwarp::Endpoint;
  using S = E::State;
  // Every change iwarp/endpoint.cpp makes, by the path that makes it.
  const std::pair<S, S> used[] = {
      {S::Idle, S::Bound},                          // Bind
      {S::Bound, S::Listening},                     // Listen
      {S::Idle, S::ActiveConnecting},               // Connect, not bound
      {S::Bound, S::ActiveConnecting},              // Connect
      {S::ActiveConnecting, S::ActiveMpaSent},      // TCP connected, MPA Request sent
      {S::ActiveConnecting, S::Bound},              // refused, timed out, canceled
      {S::ActiveMpaSent, S::ActiveReplied},         // MPA Reply
      {S::ActiveMpaSent, S::Bound},                 // rejected, reset, timed out, canceled
      {S::ActiveReplied, S::Connected},             // CompleteConnect
      {S::ActiveReplied, S::Closed},                // Reject after Connect
      {S::Idle, S::PassiveHandshake},               // accepted by a listener
      {S::PassiveHandshake, S::PassiveRequest},     // MPA Request read
      {S::PassiveHandshake, S::Closed},             // bad request, peer left, expired
      {S::Idle, S::PassiveRequest},                 // GetRequest target (Adopt)
      {S::PassiveRequest, S::Closed},               // Reject, expired, peer left, adopted child
      {S::PassiveRequest, S::PassiveAccepting},     // Accept
      {S::PassiveRequest, S::Disconnected},         // Accept could not send the Reply
      {S::PassiveAccepting, S::Connected},          // RTR
      {S::PassiveAccepting, S::Disconnected},       // peer closed, stream error, QP failed here, timeout
      {S::Connected, S::ActiveDisconnect},          // Disconnect
      {S::Connected, S::PassiveDisconnect},         // peer's FIN
      {S::Connected, S::Disconnected},              // stream error, QP failed here (OnClosedHere)
      {S::ActiveDisconnect, S::Disconnected},       // peer's FIN, error, timeout
      {S::PassiveDisconnect, S::Disconnected},      // Disconnect after the peer's
      {S::Disconnected, S::Disconnected},           // Disconnect after a failure
      {S::Listening, S::Closed},                    // Close
      {S::Connected, S::Closed},                    // Close while connected
      {S::Closed, S::Closed},                       // Close again (a listener closing its children)
  };
  for (auto [from, to] : used)
    EXPECT_TRUE(E::kTransitions.Allows(from, to)) << E::ToString(from) << " -> " << E::ToString(to);
  const std::pair<S, S> illegal[] = {
      {S::Closed, S::Connected}, {S::Closed, S::Idle},          {S::Disconnected, S::Connected},
      {S::Listening, S::Connected}, {S::Connected, S::Idle},    {S::Connected, S::Connected},
      {S::ActiveDisconnect, S::PassiveDisconnect}, {S::Idle, S::Connected},
      {S::PassiveRequest, S::Connected}, {S::ActiveMpaSent, S::Connected},
  };
  for (auto [from, to] : illegal)
    EXPECT_FALSE(E::kTransitions.Allows(from, to)) << E::ToString(from) << " -> " << E::ToString(to);
  for (size_t s = 0; s < E::kStates; ++s) EXPECT_TRUE(E::kTransitions.Allows(S(s), S::Closed)) << E::ToString(S(s));
}

TEST(EndpointStates, RoceTableHasWhatTheCodeDoes) {
  using E = roce::Endpoint;
  using S = E::State;
  // Every change roce/endpoint.cpp makes, by the path that makes it.
  const std::pair<S, S> used[] = {
      {S::Idle, S::Bound},                         // Bind
      {S::Bound, S::Listening},                    // Listen
      {S::Idle, S::Connecting},                    // Connect, not bound
      {S::Bound, S::Connecting},                   // Connect
      {S::Connecting, S::Replied},                 // REP
      {S::Connecting, S::Bound},                   // REJ, REQ timeout, unreachable, canceled
      {S::Replied, S::Connected},                  // CompleteConnect
      {S::Replied, S::Closed},                     // Reject after Connect
      {S::Idle, S::Requested},                     // a listener's request; GetRequest target
      {S::Requested, S::Closed},                   // Reject; adopted; expired
      {S::Requested, S::Accepting},                // Accept
      {S::Requested, S::Disconnected},             // Accept could not send the REP
      {S::Accepting, S::Connected},                // RTU, or the first packet
      {S::Accepting, S::Disconnected},             // REJ, REP timeout
      {S::Accepting, S::PeerDisconnected},         // a DREQ that overtook the RTU
      {S::Accepting, S::LinkFailed},               // the link failed
      {S::Accepting, S::Disconnecting},            // Disconnect
      {S::Connected, S::Disconnecting},            // Disconnect
      {S::Connected, S::PeerDisconnected},         // DREQ, REJ
      {S::Connected, S::LinkFailed},               // retries exhausted, peer gone
      {S::LinkFailed, S::Disconnecting},           // Disconnect still sends the DREQ
      {S::LinkFailed, S::PeerDisconnected},        // DREQ
      {S::Connected, S::PeerClosing},              // DREQ while requests we sent are unacknowledged
      {S::Accepting, S::PeerClosing},              // the same, the DREQ overtaking the RTU
      {S::PeerClosing, S::PeerDisconnected},       // settled, failed or timed out: the DREP
      {S::PeerClosing, S::Settling},               // Disconnect: the DREP once settled
      {S::Connected, S::Settling},                 // Disconnect while requests we sent are unacknowledged
      {S::Settling, S::Disconnecting},             // settled, failed or timed out: the DREQ (or DREP)
      {S::Settling, S::Disconnected},              // REJ
      {S::Disconnecting, S::Disconnected},         // DREP, DREQ timeout, crossing DREQ
      {S::PeerDisconnected, S::Disconnected},      // Disconnect after the peer's
      {S::Disconnected, S::Disconnected},          // Disconnect after a failure
      {S::Listening, S::Closed},                   // Close
      {S::Closed, S::Closed},                      // Close again
  };
  for (auto [from, to] : used)
    EXPECT_TRUE(E::kTransitions.Allows(from, to)) << E::ToString(from) << " -> " << E::ToString(to);
  const std::pair<S, S> illegal[] = {
      {S::Closed, S::Connected},  {S::Closed, S::Bound},          {S::Disconnected, S::Connected},
      {S::Listening, S::Requested}, {S::Connected, S::Connecting}, {S::Connected, S::Disconnected},
      {S::PeerDisconnected, S::Connected}, {S::Disconnecting, S::PeerDisconnected},
      {S::PeerClosing, S::Connected}, {S::LinkFailed, S::PeerClosing}, {S::LinkFailed, S::Settling},
      {S::Settling, S::Connected}, {S::Settling, S::PeerClosing},
      {S::Replied, S::Accepting}, {S::LinkFailed, S::Connected},
  };
  for (auto [from, to] : illegal)
    EXPECT_FALSE(E::kTransitions.Allows(from, to)) << E::ToString(from) << " -> " << E::ToString(to);
  for (size_t s = 0; s < E::kStates; ++s) EXPECT_TRUE(E::kTransitions.Allows(S(s), S::Closed)) << E::ToString(S(s));
}

void ReportOne() { ReportIllegalTransition(Transport::Roce, "roce cm qp 1 [test]", "Closed", "Connected"); }

TEST(EndpointStates, IllegalChangeIsCountedOrAborts) {
  if constexpr (base::kCheckedBuild) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(ReportOne(), "roce cm qp 1 \\[test\\]: illegal state change Closed -> Connected");
  } else {
    const uint64_t roce = AdapterCounters(Transport::Roce).Get(Counter::IllegalEndpointTransitions);
    const uint64_t iwarp = AdapterCounters(Transport::Iwarp).Get(Counter::IllegalEndpointTransitions);
    ReportOne();
    EXPECT_EQ(AdapterCounters(Transport::Roce).Get(Counter::IllegalEndpointTransitions), roce + 1);
    EXPECT_EQ(AdapterCounters(Transport::Iwarp).Get(Counter::IllegalEndpointTransitions), iwarp);
  }
}

TEST(EndpointStates, TeardownDocShowsTheTables) {
  const std::string doc = ReadDoc("teardown.md");
  ASSERT_FALSE(doc.empty());
  EXPECT_NE(doc.find("iWARP endpoint transitions:\n\n" + Markdown<iwarp::Endpoint>()), std::string::npos)
      << "docs/teardown.md should show, after \"iWARP endpoint transitions:\" and a blank line:\n"
      << Markdown<iwarp::Endpoint>();
  EXPECT_NE(doc.find("RoCE endpoint transitions:\n\n" + Markdown<roce::Endpoint>()), std::string::npos)
      << "docs/teardown.md should show, after \"RoCE endpoint transitions:\" and a blank line:\n"
      << Markdown<roce::Endpoint>();
}

}  // namespace
}  // namespace ndwv::dev
