// NetworkDirect version 1 conformance, part 4 (nd1-spi.md §4, "#n"): connections. The
// handshake with private data and read limits, refusals and rejects, the retryable timeout of an
// unanswered Connect, an active side that gives up, listening, endpoint ownership, Disconnect and
// NotifyDisconnect under the teardown contract, and cancellation. Two processes each.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness_v1.h"

namespace ndit {
namespace {

// Short CM timeouts for the side that is meant to time out (iWARP: the MPA exchange and the wait
// for the peer's final handshake; RoCE: the CM's retransmissions).
const std::map<std::string, std::string> kImpatient = {{"env:NDWV_CM_TIMEOUT_MS", "500"},
                                                       {"env:NDWV_ROCE_CM_TIMEOUT_MS", "100"},
                                                       {"env:NDWV_ROCE_CM_RETRIES", "2"}};

std::vector<uint8_t> Pattern(size_t length, uint64_t seed) {
  std::vector<uint8_t> bytes(length);
  FillPattern(bytes.data(), length, seed);
  return bytes;
}

// The peer's private data as GetConnectionData gives it: the size first (ND_BUFFER_OVERFLOW for
// an empty buffer unless there is none), then the bytes. A transport that pads (RoCE) reports
// the padded size.
std::vector<uint8_t> ConnectionData(INDConnector* connector, SIZE_T* inbound, SIZE_T* outbound) {
  SIZE_T length = 0;
  HRESULT hr = connector->GetConnectionData(inbound, outbound, nullptr, &length);
  IT_CHECK_MSG(hr == ND_BUFFER_OVERFLOW || (hr == ND_SUCCESS && length == 0), StatusName(hr));
  std::vector<uint8_t> data(length);
  IT_OK(connector->GetConnectionData(nullptr, nullptr, data.data(), &length));
  IT_CHECK_EQ(data.size(), length);
  return data;
}

// The first `length` bytes are `expected`, and anything after them (a transport's padding) 0.
void CheckData(const std::vector<uint8_t>& data, const std::vector<uint8_t>& expected, const char* what) {
  IT_CHECK_MSG(data.size() >= expected.size(), what);
  IT_CHECK_MSG(std::memcmp(data.data(), expected.data(), expected.size()) == 0, what);
  for (size_t i = expected.size(); i < data.size(); ++i) IT_CHECK_MSG(data[i] == 0, what);
}

// ---- #31, #32: the handshake ---------------------------------------------------------------------

IT_PEER(v1_handshake_server) {
  V1Adapter adapter;
  const ND_ADAPTER_INFO& info = adapter.info();
  V1Side server(adapter, {.inboundReadLimit = 8, .outboundReadLimit = 8});
  parent.SendValue("port", adapter.Listen(server.listen));
  V1GetConnectionRequest(server);
  // The requester's limits from this side's point of view: its outbound reads come in here.
  SIZE_T inbound = 0, outbound = 0;
  std::vector<uint8_t> data = ConnectionData(server.connector.get(), &inbound, &outbound);
  IT_CHECK_EQ(SIZE_T(3), inbound);
  IT_CHECK_EQ(SIZE_T(2), outbound);
  CheckData(data, Pattern(info.MaxCallerData, 61), "the connect's private data, all MaxCallerData bytes");
  // A buffer too small gets what fits, ND_BUFFER_OVERFLOW and the size needed.
  uint8_t part[10] = {};
  SIZE_T length = sizeof part;
  IT_CHECK_HR(ND_BUFFER_OVERFLOW, server.connector->GetConnectionData(nullptr, nullptr, part, &length));
  IT_CHECK_EQ(data.size(), length);
  IT_CHECK(std::memcmp(part, data.data(), sizeof part) == 0);
  // Its endpoint with those limits, lowered by a cap of its own: 3 → 1.
  server.CreateEndpoint(std::min<SIZE_T>(inbound, 1), outbound);
  std::vector<uint8_t> reply = Pattern(info.MaxCalleeData, 62);
  IT_OK(V1Accept(server, reply.data(), reply.size()));
  parent.Send("accepted");
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Connection, HandshakeWithPrivateDataAndReadLimitsBothWays) {
  RunWithPeer("v1_handshake_server", [](Channel& peer) {
    V1Adapter adapter;
    const ND_ADAPTER_INFO& info = adapter.info();
    V1Side client(adapter, {.inboundReadLimit = 2, .outboundReadLimit = 3});
    client.CreateEndpoint();
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    std::vector<uint8_t> data = Pattern(info.MaxCallerData, 61);
    IT_OK(V1Connect(client, port, data.data(), data.size()));
    SIZE_T inbound = 0, outbound = 0;
    std::vector<uint8_t> reply = ConnectionData(client.connector.get(), &inbound, &outbound);
    // The acceptor's choice (inbound 1, outbound 2), from this side: 2 in, 1 out.
    IT_CHECK_EQ(SIZE_T(2), inbound);
    IT_CHECK_EQ(SIZE_T(1), outbound);
    CheckData(reply, Pattern(info.MaxCalleeData, 62), "the accept's private data");
    V1CompleteConnect(client);
    peer.Expect("accepted");
    // The addresses: both ends of the connection, and the size protocol.
    sockaddr_in local{}, remote{};
    SIZE_T size = 0;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, client.connector->GetPeerAddress(nullptr, &size));
    IT_CHECK_EQ(sizeof remote, size);
    IT_OK(client.connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&remote), &size));
    IT_CHECK_EQ(port, PortOf(remote));
    size = sizeof local;
    IT_OK(client.connector->GetLocalAddress(reinterpret_cast<sockaddr*>(&local), &size));
    IT_CHECK(local.sin_addr.s_addr == htonl(INADDR_LOOPBACK) && PortOf(local) != 0);
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, client.connector->GetLocalAddress(nullptr, nullptr));
    V1ClientTeardown(peer, client);
  });
}

// ---- #33: refused, and rejected ---------------------------------------------------------------------

IT_PEER(v1_reject_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  parent.SendValue("port", adapter.Listen(server.listen));
  V1GetConnectionRequest(server);
  std::vector<uint8_t> why = Pattern(20, 63);
  IT_OK(server.connector->Reject(why.data(), why.size()));
  parent.Expect("done");
}

TEST(ConformanceV1Connection, RefusedAndRejectedConnects) {
  RunWithPeer("v1_reject_server", [](Channel& peer) {
    V1Adapter adapter;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    // A port nobody listens on.
    Ref<INDListen> probe;
    uint16_t nobody = adapter.Listen(probe);
    probe.Reset();
    V1Side lonely(adapter);
    lonely.CreateEndpoint();
    IT_CHECK_HR(ND_CONNECTION_REFUSED, V1Connect(lonely, nobody));
    // The peer's Reject: refused, with its private data.
    V1Side client(adapter);
    client.CreateEndpoint();
    IT_CHECK_HR(ND_CONNECTION_REFUSED, V1Connect(client, port));
    SIZE_T length = 64;
    uint8_t why[64] = {};
    HRESULT hr = client.connector->GetConnectionData(nullptr, nullptr, why, &length);
    IT_CHECK_MSG(hr == ND_SUCCESS, StatusName(hr));
    CheckData(std::vector<uint8_t>(why, why + length), Pattern(20, 63), "the reject's private data");
    peer.Send("done");
  });
}

// On RoCE the protocol is part of the service ID: a Connect for another protocol is refused.
// iWARP's wire has no place for it (the MPA exchange names no service): the listener takes it.
IT_PEER(v1_protocol_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  parent.SendValue("port", adapter.Listen(server.listen, kV1Protocol));
  if (!TransportIsRoce()) {
    V1GetConnectionRequest(server);
    IT_OK(server.connector->Reject(nullptr, 0));
  }
  parent.Expect("done");
}

TEST(ConformanceV1Connection, AConnectForAnotherProtocol) {
  RunWithPeer("v1_protocol_server", [](Channel& peer) {
    V1Adapter adapter;
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    V1Side client(adapter);
    client.CreateEndpoint();
    // Refused either way: by the CM (RoCE), or by the listener's Reject (iWARP).
    IT_CHECK_HR(ND_CONNECTION_REFUSED, V1Connect(client, port, nullptr, 0, kV1Protocol + 1));
    sockaddr_in server = Loopback(port);
    OVERLAPPED ov{};
    IT_CHECK_HR(ND_INVALID_PARAMETER_4,
                client.connector->Connect(client.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                          sizeof server, 256, 0, nullptr, 0, &ov));
    IT_CHECK_HR(ND_INVALID_ADDRESS,
                client.connector->Connect(client.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                          sizeof server - 1, kV1Protocol, 0, nullptr, 0, &ov));
    sockaddr_in6 v6{};
    v6.sin6_family = AF_INET6;
    v6.sin6_addr = in6addr_loopback;
    IT_CHECK_HR(ND_INVALID_ADDRESS,  // not the adapter's family
                client.connector->Connect(client.endpoint.get(), reinterpret_cast<sockaddr*>(&v6),
                                          sizeof v6, kV1Protocol, 0, nullptr, 0, &ov));
    peer.Send("done");
  });
}

// ---- #34: an unanswered Connect times out, and may be issued again -------------------------------

IT_PEER(v1_retrying_client) {
  V1Adapter adapter;
  V1Side client(adapter);
  client.CreateEndpoint();
  uint16_t port = uint16_t(parent.ReceiveValue("port"));
  // Nothing answers: ND_TIMEOUT, a success status that says "try again" (not v2's ND_IO_TIMEOUT).
  HRESULT hr = V1Connect(client, port, nullptr, 0, IPPROTO_TCP);
  IT_CHECK_HR(ND_TIMEOUT, hr);
  IT_CHECK(SUCCEEDED(hr));
  parent.Send("timed out");
  parent.Expect("listening");
  // The same connector and endpoint, again: now it connects.
  IT_OK(V1Connect(client, port, nullptr, 0, IPPROTO_TCP));
  V1CompleteConnect(client);
  parent.Expect("accepted");
  V1ClientTeardown(parent, client);
}

TEST(ConformanceV1Connection, AnUnansweredConnectTimesOutAndIsIssuedAgain) {
  RunWithPeer("v1_retrying_client", kImpatient, [](Channel& peer) {
    // A socket of the transport's kind on the port that never answers. RoCE: UDP takes the CM's
    // REQs and drops them. iWARP: a listener whose accept queue is full, so the kernel drops the
    // client's SYNs and its connection never gets as far as the MPA request (a request that
    // arrived waits for an Accept as long as it takes).
    int silent = socket(AF_INET, TransportIsRoce() ? SOCK_DGRAM : SOCK_STREAM, 0);
    IT_CHECK(silent >= 0);
    sockaddr_in address = Loopback(0);
    IT_CHECK(bind(silent, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    IT_CHECK(getsockname(silent, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    int filler = -1;
    if (!TransportIsRoce()) {
      IT_CHECK(listen(silent, 0) == 0);  // room for one pending connection: the filler's
      filler = socket(AF_INET, SOCK_STREAM, 0);
      IT_CHECK(connect(filler, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);
    }
    uint16_t port = PortOf(address);
    peer.SendValue("port", port);
    peer.Expect("timed out", 2 * kWaitMs);
    if (filler >= 0) close(filler);
    close(silent);
    V1Adapter adapter;
    V1Side server(adapter);
    USHORT given = 0;
    IT_OK(adapter->Listen(0, IPPROTO_TCP, htons(port), &given,
                          reinterpret_cast<INDListen**>(server.listen.Out())));
    IT_CHECK_EQ(htons(port), given);
    peer.Send("listening");
    V1GetConnectionRequest(server);
    server.CreateEndpoint();
    IT_OK(V1Accept(server));
    peer.Send("accepted");
    V1ServerTeardown(peer, server);
  });
}

// ---- #35: an active side that gives up --------------------------------------------------------------

IT_PEER(v1_abandoned_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  parent.SendValue("port", adapter.Listen(server.listen));
  V1GetConnectionRequest(server);
  server.CreateEndpoint();
  HRESULT hr = V1Accept(server);
  // Refused by the client's Reject, or (never completed) timed out: a failure either way. ND_TIMEOUT
  // is a success code, so it is named here.
  bool abandoned = hr == ND_CONNECTION_ABORTED || hr == ND_CONNECTION_REFUSED || hr == ND_TIMEOUT;
  IT_CHECK_MSG(abandoned, StatusName(hr));
  // Asked about the connection afterwards, the connector answers (it does not crash).
  sockaddr_in address{};
  SIZE_T length = sizeof address;
  hr = server.connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&address), &length);
  IT_CHECK_MSG(hr == ND_SUCCESS || hr == ND_CONNECTION_ABORTED || hr == ND_CONNECTION_INVALID,
               StatusName(hr));
  SIZE_T inbound = 0;
  hr = server.connector->GetConnectionData(&inbound, nullptr, nullptr, nullptr);
  IT_CHECK_MSG(hr == ND_SUCCESS || hr == ND_CONNECTION_ABORTED || hr == ND_CONNECTION_INVALID,
               StatusName(hr));
  parent.Send("accept ended");
  parent.Expect("done");
}

TEST(ConformanceV1Connection, TheActiveSideRejectsInsteadOfCompleting) {
  RunWithPeer("v1_abandoned_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Side client(adapter);
    client.CreateEndpoint();
    IT_OK(V1Connect(client, uint16_t(peer.ReceiveValue("port"))));
    IT_OK(client.connector->Reject(nullptr, 0));  // e.g. read limits it cannot take
    peer.Expect("accept ended");
    peer.Send("done");
  });
}

TEST(ConformanceV1Connection, TheActiveSideReleasesItsConnectorInsteadOfCompleting) {
  RunWithPeer("v1_abandoned_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Side client(adapter);
    client.CreateEndpoint();
    IT_OK(V1Connect(client, uint16_t(peer.ReceiveValue("port"))));
    client.endpoint.Reset();
    client.connector.Reset();
    peer.Expect("accept ended");
    peer.Send("done");
  });
}

// An active side that keeps its connector and never calls CompleteConnect: on iWARP the passive
// Accept ends after its time limit (6 x NDWV_CM_TIMEOUT_MS) with version 1's ND_TIMEOUT. On RoCE
// the active CM answers the passive side's repeated REP with an MRA, the IB CM's "give me time"
// (docs/roce.md): the Accept waits on, well past its own REP retries, and succeeds when the
// active side completes after all.
IT_PEER(v1_patient_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  parent.SendValue("port", adapter.Listen(server.listen));
  V1GetConnectionRequest(server);
  server.CreateEndpoint();
  Ov accept;
  HRESULT hr = server.connector->Accept(server.endpoint.get(), nullptr, 0,
                                        accept.Prepare(server.connector.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  if (!TransportIsRoce()) {
    IT_CHECK_HR(ND_TIMEOUT, accept.Finish(hr, "Accept of a connection never completed", 3 * kWaitMs));
    parent.Send("accept ended");
    parent.Expect("done");
    return;
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // REP retries: 3 x 100 ms (kImpatient)
  SIZE_T bytes;
  IT_CHECK_HR(ND_PENDING, server.connector->GetOverlappedResult(accept.get(), &bytes, FALSE));
  parent.Send("complete now");
  IT_OK(accept.Finish(hr, "Accept completed at last"));
  parent.Send("accepted");
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Connection, TheActiveSideNeverCompletes) {
  RunWithPeer("v1_patient_server", kImpatient, [](Channel& peer) {
    V1Adapter adapter;
    V1Side client(adapter);
    client.CreateEndpoint();
    IT_OK(V1Connect(client, uint16_t(peer.ReceiveValue("port"))));
    if (!TransportIsRoce()) {
      peer.Expect("accept ended", 3 * kWaitMs);
      peer.Send("done");
      return;
    }
    peer.Expect("complete now");
    V1CompleteConnect(client);
    peer.Expect("accepted");
    V1ClientTeardown(peer, client);
  });
}

// ---- #36: listening -------------------------------------------------------------------------------

IT_PEER(v1_listen_client) {
  V1Adapter adapter;
  uint16_t port = uint16_t(parent.ReceiveValue("port"));
  V1Side first(adapter), second(adapter);
  first.CreateEndpoint();
  second.CreateEndpoint();
  IT_OK(V1Connect(first, port));
  V1CompleteConnect(first);
  IT_OK(V1Connect(second, port));
  V1CompleteConnect(second);
  parent.Expect("accepted both");
  V1ClientTeardown(parent, first);
  V1ClientTeardown(parent, second);
}

TEST(ConformanceV1Connection, ListenPortsAndConnectionRequests) {
  RunWithPeer("v1_listen_client", [](Channel& peer) {
    V1Adapter adapter;
    Ref<INDListen> listen;
    auto** out = reinterpret_cast<INDListen**>(listen.Out());
    IT_CHECK_HR(ND_INVALID_PARAMETER_MIX, adapter->Listen(0, kV1Protocol, 0, nullptr, out));
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, adapter->Listen(0, 256, 0, nullptr, out));
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, adapter->Listen(0, -1, 0, nullptr, out));
    IT_CHECK_HR(ND_INVALID_PARAMETER_5, adapter->Listen(0, kV1Protocol, htons(1), nullptr, nullptr));
    uint16_t port = adapter.Listen(listen);  // port 0: one is given, in network order
    // The same port again, for the same protocol: refused.
    Ref<INDListen> again;
    USHORT given = 0;
    IT_CHECK_HR(ND_ADDRESS_ALREADY_EXISTS,
                adapter->Listen(0, kV1Protocol, htons(port), &given,
                                reinterpret_cast<INDListen**>(again.Out())));
    // Two requests outstanding at once; two connects complete one each.
    V1Side a(adapter), b(adapter);
    a.connector = adapter.CreateConnector();
    b.connector = adapter.CreateConnector();
    Ov requestA, requestB;
    HRESULT hrA = listen->GetConnectionRequest(a.connector.get(), requestA.Prepare(listen.get()));
    HRESULT hrB = listen->GetConnectionRequest(b.connector.get(), requestB.Prepare(listen.get()));
    IT_CHECK_HR(ND_PENDING, hrA);
    IT_CHECK_HR(ND_PENDING, hrB);
    peer.SendValue("port", port);
    IT_OK(requestA.Finish(hrA, "first GetConnectionRequest"));
    a.CreateEndpoint();
    IT_OK(V1Accept(a));
    IT_OK(requestB.Finish(hrB, "second GetConnectionRequest"));
    b.CreateEndpoint();
    IT_OK(V1Accept(b));
    peer.Send("accepted both");
    V1ServerTeardown(peer, a);
    V1ServerTeardown(peer, b);
    // Requests still waiting are canceled by CancelOverlappedRequests, and by the release.
    V1Side c(adapter), d(adapter);
    c.connector = adapter.CreateConnector();
    d.connector = adapter.CreateConnector();
    Ov requestC, requestD;
    HRESULT hrC = listen->GetConnectionRequest(c.connector.get(), requestC.Prepare(listen.get()));
    IT_OK(listen->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, requestC.Finish(hrC, "a canceled GetConnectionRequest"));
    HRESULT hrD = listen->GetConnectionRequest(d.connector.get(), requestD.Prepare(adapter.get()));
    IT_CHECK_EQ(0u, listen.Reset());
    IT_CHECK_HR(ND_CANCELED, requestD.Finish(hrD, "a GetConnectionRequest of a released listen"));
  });
}

// ---- #37: whose endpoint, and in which state ------------------------------------------------------

IT_PEER(v1_ownership_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  V1Serve(parent, server);
  // Established: Accept again is ND_CONNECTION_ACTIVE.
  Ov again;
  HRESULT hr = server.connector->Accept(server.endpoint.get(), nullptr, 0,
                                        again.Prepare(server.connector.get()));
  IT_CHECK_HR(ND_CONNECTION_ACTIVE, again.Finish(hr, "Accept of a connected endpoint"));
  parent.Send("accept checked");  // before the client's Disconnect, which would end the connection
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Connection, EndpointsBelongToTheirConnectorAndItsState) {
  RunWithPeer("v1_ownership_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Side client(adapter), other(adapter);
    other.CreateEndpoint();
    client.CreateEndpoint();
    // Another connector's endpoint (of this adapter) is not this connector's to use.
    sockaddr_in server = Loopback(1);
    OVERLAPPED ov{};
    IT_CHECK_HR(ND_INVALID_PARAMETER_1,
                client.connector->Connect(other.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                          sizeof server, kV1Protocol, 0, nullptr, 0, &ov));
    IT_CHECK_HR(ND_INVALID_PARAMETER_1, client.connector->Accept(other.endpoint.get(), nullptr, 0, &ov));
    // No Connect yet: nothing to complete, nothing to wait for or tear down.
    IT_CHECK_HR(ND_CONNECTION_INVALID, client.connector->CompleteConnect(&ov));
    IT_CHECK_HR(ND_CONNECTION_INVALID, client.connector->NotifyDisconnect(&ov));
    IT_CHECK_HR(ND_CONNECTION_INVALID, client.connector->Disconnect(&ov));
    SIZE_T length = sizeof server;
    IT_CHECK_HR(ND_CONNECTION_INVALID,
                client.connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&server), &length));
    V1ConnectTo(peer, client);
    // Connected: Connect again is ND_CONNECTION_ACTIVE.
    server = Loopback(uint16_t(1));
    Ov again;
    HRESULT hr = client.connector->Connect(client.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                           sizeof server, IPPROTO_TCP, 0, nullptr, 0,
                                           again.Prepare(client.connector.get()));
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, again.Finish(hr, "Connect of a connected endpoint"));
    peer.Expect("accept checked");
    V1ClientTeardown(peer, client);
  });
}

// ---- #39, #40: Disconnect and NotifyDisconnect ----------------------------------------------------

IT_PEER(v1_teardown_server) {
  V1Adapter adapter;
  std::vector<uint8_t> buffer(2 * 64);
  V1Mr mr(adapter, buffer.data(), buffer.size());
  V1Side server(adapter);
  ND_RESULT receives[2];
  V1Serve(parent, server, [&](V1Side& s) {
    for (int i = 0; i < 2; ++i) {
      ND_SGE sge = V1Sge(buffer.data() + i * 64, 64, mr.handle());
      IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
    }
  });
  Ov notify;
  HRESULT hr = server.connector->NotifyDisconnect(notify.Prepare(server.connector.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  parent.Send("notify armed");
  // #40 (ndwv flushes when the peer disconnects, as ndfltr does): the peer's Disconnect alone
  // completes NotifyDisconnect and flushes this endpoint's receives, before this side reacts.
  IT_OK(notify.Finish(hr, "NotifyDisconnect when the peer disconnected"));
  V1ExpectResult(server.cq.get(), &receives[0], ND_CANCELED, 0, "a receive after the peer left");
  V1ExpectResult(server.cq.get(), &receives[1], ND_CANCELED, 0, "the other receive");
  IT_OK(V1Disconnect(server.connector.get()));  // after the peer's: succeeds too
  parent.Send("server done");
}

TEST(ConformanceV1Connection, DisconnectFlushesAndNotifiesThePeer) {
  RunWithPeer("v1_teardown_server", [](Channel& peer) {
    V1Adapter adapter;
    std::vector<uint8_t> buffer(2 * 64);
    V1Mr mr(adapter, buffer.data(), buffer.size());
    V1Side client(adapter);
    ND_RESULT receives[2];
    V1ConnectTo(peer, client, [&](V1Side& s) {
      for (int i = 0; i < 2; ++i) {
        ND_SGE sge = V1Sge(buffer.data() + i * 64, 64, mr.handle());
        IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
      }
    });
    peer.Expect("notify armed");
    // #39: the local NotifyDisconnect is pending when the local Disconnect comes: version 1
    // cancels it. The Disconnect flushes every outstanding request and succeeds.
    Ov notify;
    HRESULT hrNotify = client.connector->NotifyDisconnect(notify.Prepare(client.connector.get()));
    IT_CHECK_HR(ND_PENDING, hrNotify);
    IT_OK(V1Disconnect(client.connector.get()));
    IT_CHECK_HR(ND_CANCELED, notify.Finish(hrNotify, "the local NotifyDisconnect"));
    V1ExpectResult(client.cq.get(), &receives[0], ND_CANCELED, 0, "flushed receive");
    V1ExpectResult(client.cq.get(), &receives[1], ND_CANCELED, 0, "flushed receive");
    V1ExpectNoResult(client.cq.get(), "each once");
    OVERLAPPED ov{};
    IT_CHECK_HR(ND_CONNECTION_INVALID, client.connector->Disconnect(&ov));  // once
    peer.Expect("server done");
  });
}

// ---- #41: cancellation and release ----------------------------------------------------------------

IT_PEER(v1_cancel_client) {
  V1Adapter adapter;
  uint16_t port = uint16_t(parent.ReceiveValue("port"));
  // A Connect the listener never answers (it takes no request): CancelOverlappedRequests ends it.
  V1Side client(adapter);
  client.CreateEndpoint();
  sockaddr_in server = Loopback(port);
  Ov connect;
  HRESULT hr = client.connector->Connect(client.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                         sizeof server, kV1Protocol, 0, nullptr, 0,
                                         connect.Prepare(client.connector.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  IT_OK(client.connector->CancelOverlappedRequests());
  IT_CHECK_HR(ND_CANCELED, connect.Finish(hr, "a canceled Connect"));
  // A connector released with a Connect pending completes it too (the adapter reports it).
  V1Side released(adapter);
  released.CreateEndpoint();
  hr = released.connector->Connect(released.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                   sizeof server, kV1Protocol, 0, nullptr, 0,
                                   connect.Prepare(adapter.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  released.endpoint.Reset();  // the endpoint holds its connector: both go
  IT_CHECK_EQ(0u, released.connector.Reset());
  IT_CHECK_HR(ND_CANCELED, connect.Finish(hr, "the Connect of a released connector"));
  // A CQ released with a Notify armed completes it (the adapter tells its final status).
  Ref<INDCompletionQueue> cq = adapter.CreateCq(4);
  Ov notify;
  hr = cq->Notify(ND_CQ_NOTIFY_ANY, notify.Prepare(adapter.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  IT_CHECK_EQ(0u, cq.Reset());
  IT_CHECK_HR(ND_CANCELED, notify.Finish(hr, "the Notify of a released CQ"));
  parent.Send("done");
}

TEST(ConformanceV1Connection, CancelAndReleaseCompleteWhatIsPending) {
  RunWithPeer("v1_cancel_client", [](Channel& peer) {
    V1Adapter adapter;
    Ref<INDListen> listen;
    peer.SendValue("port", adapter.Listen(listen));
    peer.Expect("done");
  });
}

}  // namespace
}  // namespace ndit
