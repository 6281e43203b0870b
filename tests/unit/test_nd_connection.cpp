// ND connectors and listeners over fake WV endpoints: argument checks, what Connect and Accept
// hand WV, and the getters' size protocols.
#include <cstring>

#include "test_nd_fakes.h"

namespace ndwv::nd::testing {
namespace {

class NdConnectTest : public NdTest {
 protected:
  void SetUp() override {
    NdTest::SetUp();
    cq = MakeCq();
    qp = MakeQp(cq);
    wvQp = pd->lastQp;
    connector = MakeConnector();
    endpoint = wv->lastEndpoint;
  }
  void TearDown() override {
    if (connector != nullptr) {
      EXPECT_EQ(connector->Release(), 0u);
    }
    EXPECT_EQ(qp->Release(), 0u);
    EXPECT_EQ(cq->Release(), 0u);
    NdTest::TearDown();
  }
  HRESULT Connect(const sockaddr_in& to, const void* data, ULONG length, ULONG in = 4,
                  ULONG out = 4) {
    return connector->Connect(qp, Sa(to), sizeof(to), in, out, data, length, &ov);
  }
  // The connection as WV would report it after the peer's request or reply.
  void PeerSent(const char* data, UINT32 ird, UINT32 ord) {
    WV_CONNECT_ATTRIBUTES& c = endpoint->connection;
    c.LocalAddress.Sin = Ipv4("127.0.0.1", 5000);
    c.PeerAddress.Sin = Ipv4("127.0.0.1", 6000);
    c.Param.DataLength = std::strlen(data);
    std::memcpy(c.Param.Data, data, c.Param.DataLength);
    c.Param.ResponderResources = ird;
    c.Param.InitiatorDepth = ord;
    c.PeerParamReceived = TRUE;
  }

  IND2CompletionQueue* cq = nullptr;
  IND2QueuePair* qp = nullptr;
  FakeQp* wvQp = nullptr;
  IND2Connector* connector = nullptr;
  FakeEndpoint* endpoint = nullptr;
  OVERLAPPED ov{};
  const sockaddr_in server = Ipv4("127.0.0.1", 7000);
};

TEST_F(NdConnectTest, EndpointCompletesToTheConnectorsFile) { EXPECT_EQ(wv->endpointFile, file); }

TEST_F(NdConnectTest, BindPassesAddressesOfThisAdapterOnly) {
  sockaddr_in elsewhere = Ipv4("192.0.2.1", 1);
  EXPECT_EQ(connector->Bind(Sa(elsewhere), sizeof(elsewhere)), ND_INVALID_ADDRESS);
  EXPECT_EQ(connector->Bind(nullptr, sizeof(elsewhere)), ND_INVALID_PARAMETER_1);
  EXPECT_EQ(connector->Bind(Sa(elsewhere), 4), ND_INVALID_PARAMETER_2);
  sockaddr_in6 six{};
  six.sin6_family = AF_INET6;
  EXPECT_EQ(connector->Bind(reinterpret_cast<sockaddr*>(&six), sizeof(sockaddr_in)),
            ND_INVALID_PARAMETER_2)
      << "short for its family";
  sockaddr unix_{};
  unix_.sa_family = AF_UNIX;
  EXPECT_EQ(connector->Bind(&unix_, sizeof(sockaddr_in)), ND_INVALID_ADDRESS);

  sockaddr_in mine = Ipv4("127.0.0.1", 4000);
  ASSERT_EQ(connector->Bind(Sa(mine), sizeof(mine)), ND_SUCCESS);
  EXPECT_EQ(endpoint->boundTo.Sin.sin_port, htons(4000));
  EXPECT_EQ(connector->Bind(Sa(mine), sizeof(mine)), STATUS_ADDRESS_ALREADY_ASSOCIATED);
}

TEST_F(NdConnectTest, WildcardBindMeansThisAdaptersAddress) {
  sockaddr_in any = Ipv4("0.0.0.0", 4001);
  ASSERT_EQ(connector->Bind(Sa(any), sizeof(any)), ND_SUCCESS);
  EXPECT_EQ(endpoint->boundTo.Sin.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_EQ(endpoint->boundTo.Sin.sin_port, htons(4001));
}

TEST_F(NdConnectTest, ConnectHandsWvTheQueuePairDataAndClampedLimits) {
  sockaddr_in mine = Ipv4("127.0.0.1", 4000);
  ASSERT_EQ(connector->Bind(Sa(mine), sizeof(mine)), ND_SUCCESS);
  const char hello[] = "hello";
  ASSERT_EQ(Connect(server, hello, sizeof(hello), 1000, 2), ND_PENDING);
  EXPECT_EQ(endpoint->connectedQp, wvQp);
  EXPECT_EQ(endpoint->connectedTo.Sin.sin_port, htons(7000));
  const WV_CONNECT_PARAM& sent = endpoint->sent;
  EXPECT_EQ(sent.DataLength, sizeof(hello));
  EXPECT_EQ(std::memcmp(sent.Data, hello, sizeof(hello)), 0);
  EXPECT_EQ(sent.ResponderResources, Info().MaxInboundReadLimit) << "inbound clamped to the cap";
  EXPECT_EQ(sent.InitiatorDepth, 2u);
  EXPECT_EQ(sent.RetryCount, 7);
  EXPECT_EQ(sent.RnrRetryCount, 7);
}

TEST_F(NdConnectTest, ConnectBindsAnUnboundConnector) {
  ASSERT_EQ(Connect(server, nullptr, 0), ND_PENDING);
  ASSERT_TRUE(endpoint->bound);
  EXPECT_EQ(endpoint->boundTo.Sin.sin_family, AF_INET);
  EXPECT_EQ(endpoint->boundTo.Sin.sin_port, 0) << "an ephemeral port";
}

TEST_F(NdConnectTest, ConnectArgumentErrorsLeaveTheConnectorUsable) {
  const ULONG max = Info().MaxCallerData;
  std::vector<char> data(max + 1, 'x');
  EXPECT_EQ(Connect(server, data.data(), max + 1), ND_INVALID_BUFFER_SIZE);
  EXPECT_EQ(Connect(server, nullptr, 4), ND_ACCESS_VIOLATION);
  sockaddr_in nowhere = Ipv4("0.0.0.0", 7000);
  EXPECT_EQ(Connect(nowhere, nullptr, 0), STATUS_BAD_NETWORK_NAME);
  Foreign* foreign = new Foreign;
  EXPECT_EQ(connector->Connect(foreign, Sa(server), sizeof(server), 0, 0, nullptr, 0, &ov),
            ND_INVALID_PARAMETER_1);
  EXPECT_EQ(connector->Connect(qp, nullptr, sizeof(server), 0, 0, nullptr, 0, &ov),
            ND_INVALID_PARAMETER_2);
  EXPECT_EQ(connector->Connect(qp, Sa(server), 3, 0, 0, nullptr, 0, &ov), ND_INVALID_PARAMETER_3);
  foreign->Release();
  EXPECT_EQ(endpoint->connectedQp, nullptr) << "nothing reached WV";
  ULONG size = 0;
  EXPECT_EQ(connector->GetPeerAddress(nullptr, &size), ND_CONNECTION_INVALID);

  EXPECT_EQ(Connect(server, data.data(), max), ND_PENDING);
  EXPECT_EQ(endpoint->sent.DataLength, max);
}

TEST_F(NdConnectTest, NothingButBindAndConnectBeforeAConnection) {
  ULONG size = 64, in = 0, out = 0;
  char buffer[64];
  EXPECT_EQ(connector->GetReadLimits(&in, &out), ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->GetPrivateData(buffer, &size), ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->GetLocalAddress(reinterpret_cast<sockaddr*>(buffer), &size),
            ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->CompleteConnect(&ov), ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->Accept(qp, 1, 1, nullptr, 0, &ov), ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->Reject(nullptr, 0), ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->NotifyDisconnect(&ov), ND_CONNECTION_INVALID);
  EXPECT_EQ(connector->Disconnect(&ov), ND_CONNECTION_INVALID);
}

TEST_F(NdConnectTest, AfterConnectTheGettersReportThePeer) {
  ASSERT_EQ(Connect(server, nullptr, 0, 8, 8), ND_PENDING);
  ULONG in = 0, out = 0, early = 0;
  EXPECT_EQ(connector->GetReadLimits(&in, &out), ND_CONNECTION_INVALID) << "nothing heard yet";
  EXPECT_EQ(connector->GetPrivateData(nullptr, &early), ND_CONNECTION_INVALID);
  PeerSent("reply-data", 3, 100);

  ASSERT_EQ(connector->GetReadLimits(&in, &out), ND_SUCCESS);
  EXPECT_EQ(in, Info().MaxInboundReadLimit) << "peer's outbound (100) clamped by our cap";
  EXPECT_EQ(out, 3u) << "peer's inbound";
  EXPECT_EQ(connector->GetReadLimits(nullptr, nullptr), ND_SUCCESS);

  // Private data: size probe, short buffer (first bytes copied), exact size.
  ULONG size = 0;
  EXPECT_EQ(connector->GetPrivateData(nullptr, &size), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, 10u);
  char data[16] = {};
  size = 5;
  EXPECT_EQ(connector->GetPrivateData(data, &size), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, 10u);
  EXPECT_EQ(std::string(data, 5), "reply");
  EXPECT_EQ(data[5], 0);
  size = sizeof(data);
  EXPECT_EQ(connector->GetPrivateData(data, &size), ND_SUCCESS);
  EXPECT_EQ(size, 10u);
  EXPECT_EQ(std::string(data, 10), "reply-data");
  EXPECT_EQ(connector->GetPrivateData(data, nullptr), ND_INVALID_PARAMETER_2);

  // Addresses: a short buffer is untouched.
  sockaddr_in address{};
  address.sin_port = 0xbeef;
  size = sizeof(address) - 1;
  EXPECT_EQ(connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&address), &size),
            ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, sizeof(sockaddr_in));
  EXPECT_EQ(address.sin_port, 0xbeef);
  size = 64;
  EXPECT_EQ(connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&address), &size), ND_SUCCESS);
  EXPECT_EQ(size, sizeof(sockaddr_in));
  EXPECT_EQ(address.sin_port, htons(6000));
  EXPECT_EQ(connector->GetLocalAddress(reinterpret_cast<sockaddr*>(&address), &size), ND_SUCCESS);
  EXPECT_EQ(address.sin_port, htons(5000));

  ASSERT_EQ(connector->CompleteConnect(&ov), ND_PENDING);
  EXPECT_TRUE(endpoint->accepted);
  EXPECT_EQ(endpoint->acceptedQp, nullptr) << "the active side's Accept carries no QP";
  EXPECT_EQ(connector->NotifyDisconnect(&ov), ND_PENDING);
  EXPECT_EQ(connector->Disconnect(&ov), ND_PENDING);
  EXPECT_EQ(connector->CancelOverlappedRequests(), ND_SUCCESS);
  EXPECT_EQ(endpoint->cancels, 1);
}

TEST_F(NdConnectTest, ReleaseAfterConnectReturnsZero) {
  ASSERT_EQ(Connect(server, nullptr, 0), ND_PENDING);
  endpoint->AddRef();  // WV holding its endpoint, e.g. for the pending request
  EXPECT_EQ(connector->Release(), 0u);
  connector = nullptr;
  endpoint->Release();
}

TEST_F(NdConnectTest, RejectChecksItsPrivateData) {
  ASSERT_EQ(Connect(server, nullptr, 0), ND_PENDING);
  EXPECT_EQ(connector->Reject(nullptr, Info().MaxCalleeData + 1), ND_INVALID_BUFFER_SIZE);
  EXPECT_EQ(connector->Reject(nullptr, 3), ND_ACCESS_VIOLATION);
  EXPECT_EQ(connector->Reject("no", 2), ND_SUCCESS);
  EXPECT_EQ(endpoint->rejectedLength, 2u);
}

// ---- Listener and the passive side --------------------------------------------------------------

class NdListenTest : public NdConnectTest {
 protected:
  void SetUp() override {
    NdConnectTest::SetUp();
    listener = MakeListener();
    listening = wv->lastEndpoint;
  }
  void TearDown() override {
    EXPECT_EQ(listener->Release(), 0u);
    NdConnectTest::TearDown();
  }
  IND2Listener* listener = nullptr;
  FakeEndpoint* listening = nullptr;
};

TEST_F(NdListenTest, ListenOnceAndOnlyThenReportTheAddress) {
  sockaddr_in address{};
  ULONG size = sizeof(address);
  EXPECT_EQ(listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&address), &size),
            ND_INVALID_DEVICE_STATE);
  sockaddr_in mine = Ipv4("127.0.0.1", 7000);
  ASSERT_EQ(listener->Bind(Sa(mine), sizeof(mine)), ND_SUCCESS);
  EXPECT_EQ(listener->Bind(Sa(mine), sizeof(mine)), STATUS_ADDRESS_ALREADY_ASSOCIATED);
  ASSERT_EQ(listener->Listen(0), ND_SUCCESS);
  EXPECT_EQ(listening->backlog, 0u) << "0, no limit: the device bounds it and lets the rest wait (ConnectEndpoint::Listen)";
  EXPECT_TRUE(FAILED(listener->Listen(8))) << "a second Listen fails";

  listening->connection.LocalAddress.Sin = mine;
  ASSERT_EQ(listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&address), &size), ND_SUCCESS);
  EXPECT_EQ(address.sin_port, htons(7000));
}

TEST_F(NdListenTest, GetConnectionRequestMakesTheConnectorPassive) {
  Foreign* foreign = new Foreign;
  EXPECT_EQ(listener->GetConnectionRequest(foreign, &ov), ND_INVALID_PARAMETER_1);
  EXPECT_EQ(listener->GetConnectionRequest(qp, &ov), ND_INVALID_PARAMETER_1);
  foreign->Release();

  ASSERT_EQ(listener->GetConnectionRequest(connector, &ov), ND_PENDING);
  EXPECT_EQ(listening->requestedFor, endpoint);
  EXPECT_EQ(listener->GetConnectionRequest(connector, &ov), ND_CONNECTION_ACTIVE)
      << "one request per connector";
  EXPECT_EQ(Connect(server, nullptr, 0), ND_CONNECTION_ACTIVE);
  ULONG size = 0;
  EXPECT_EQ(connector->GetPrivateData(nullptr, &size), ND_CONNECTION_INVALID) << "no request yet";

  // The request arrived: the peer offered IRD 2 and ORD 6.
  PeerSent("req", 2, 6);
  EXPECT_EQ(connector->GetPrivateData(nullptr, &size), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, 3u);
  sockaddr_in peer{};
  size = sizeof(peer);
  EXPECT_EQ(connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&peer), &size), ND_SUCCESS)
      << "before Accept, as ndmpic needs";

  std::vector<char> tooMuch(Info().MaxCalleeData + 1);
  EXPECT_EQ(connector->Accept(qp, 8, 8, tooMuch.data(), ULONG(tooMuch.size()), &ov),
            ND_INVALID_BUFFER_SIZE);
  ASSERT_EQ(connector->Accept(qp, 8, 8, "ok", 2, &ov), ND_PENDING) << "a second Accept may follow";
  EXPECT_EQ(endpoint->acceptedQp, wvQp);
  EXPECT_EQ(endpoint->sent.ResponderResources, 6u) << "no more than the peer's outbound reads";
  EXPECT_EQ(endpoint->sent.InitiatorDepth, 2u) << "no more than the peer's inbound reads";
  EXPECT_EQ(endpoint->sent.DataLength, 2u);
  EXPECT_EQ(connector->CompleteConnect(&ov), ND_CONNECTION_INVALID) << "passive side";
}

TEST_F(NdListenTest, CancelReachesTheListeningEndpoint) {
  EXPECT_EQ(listener->CancelOverlappedRequests(), ND_SUCCESS);
  EXPECT_EQ(listening->cancels, 1);
}

}  // namespace
}  // namespace ndwv::nd::testing
