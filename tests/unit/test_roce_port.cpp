// roce::Port's flows: how many one port opens, and what happens past that.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include <ndwv/wvstatus.h>

#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "dev/address.h"
#include "dev/roce/port.h"

namespace ndwv::dev {
namespace {

sockaddr_storage Loopback(uint16_t port) {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(port);
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sockaddr_storage a{};
  memcpy(&a, &in, sizeof in);
  return a;
}

TEST(RocePort, APortOpensAtMostItsBoundOfFlowsAndTheRestUseItsOwnSocket) {
  int32_t status = 0;
  std::shared_ptr<roce::Port> port = roce::Port::Open(Loopback(0), false, &status);
  ASSERT_TRUE(port) << status;
  // Peer ports nobody uses: a flow is only connect()ed there, nothing is sent.
  auto peer = [](size_t i) { return Loopback(uint16_t(20000 + i)); };
  std::vector<std::shared_ptr<roce::Port>> flows;
  std::set<roce::Port*> distinct;
  for (size_t i = 0; i < roce::Port::kMaxFlows; ++i) {
    flows.push_back(roce::Port::OpenFlow(port, peer(i)));
    ASSERT_TRUE(flows.back()) << "flow " << i;
    distinct.insert(flows.back().get());
    EXPECT_EQ(PortOf(flows.back()->local()), PortOf(port->local()));
  }
  EXPECT_EQ(distinct.size(), roce::Port::kMaxFlows);
  // A peer that has a flow shares it; a new peer past the bound gets none.
  EXPECT_EQ(roce::Port::OpenFlow(port, peer(3)), flows[3]);
  EXPECT_FALSE(roce::Port::OpenFlow(port, peer(roce::Port::kMaxFlows)));
  // A flow released makes room for one more.
  flows[5].reset();
  std::shared_ptr<roce::Port> next = roce::Port::OpenFlow(port, peer(roce::Port::kMaxFlows));
  EXPECT_TRUE(next);
  EXPECT_FALSE(roce::Port::OpenFlow(port, peer(roce::Port::kMaxFlows + 1)));
}

}  // namespace
}  // namespace ndwv::dev
