// Floods against an ND server (iWARP, docs/security.md): what unauthenticated peers make the
// server hold stays bounded, and legitimate connections keep working during and after.
//
// The flooders are raw TCP sockets in the test process speaking just enough MPA (a Request is 24
// fixed bytes); the server is an ND program in the peer process. Counts are asserted (descriptors,
// counters), never times: every wait is bounded.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0xF5);
void* const kClientQp = Ctx(0xFC);

// An MPA rev 2 Request as an ndwv client sends it: enhanced, CRC, peer to peer with a zero-length
// Write as RTR, IRD and ORD 4, no private data.
std::vector<uint8_t> MpaRequest() {
  std::vector<uint8_t> frame(24);
  memcpy(frame.data(), "MPA ID Req Frame", 16);
  frame[16] = 0x50;  // CRC, enhanced
  frame[17] = 2;     // revision
  frame[19] = 4;     // PD_Length: the IRD/ORD words
  frame[20] = 0x80, frame[21] = 4;  // P2P, IRD 4
  frame[22] = 0x80, frame[23] = 4;  // Write RTR, ORD 4
  return frame;
}

// The process's open descriptors (the count includes the directory's own); SIZE_MAX when even
// that one cannot be opened (the process is at its limit).
size_t OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return SIZE_MAX;
  size_t n = 0;
  while (readdir(dir)) n++;
  closedir(dir);
  return n;
}


// A raw TCP connection to 127.0.0.1:port that sends `bytes` (maybe none); -1 if the process is
// out of descriptors.
int RawConnect(uint16_t port, const std::vector<uint8_t>& bytes) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in to = Loopback(port);
  IT_CHECK_MSG(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0, strerror(errno));
  if (!bytes.empty()) IT_CHECK(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size()));
  return fd;
}

// Everything the server sends on `fd` until it ends the connection (bounded).
std::vector<uint8_t> ReadToEnd(int fd) {
  std::vector<uint8_t> out;
  Deadline deadline;
  uint8_t chunk[256];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    IT_CHECK_MSG(poll(&p, 1, deadline.LeftMs()) > 0, "the server kept the connection open");
    ssize_t n = recv(fd, chunk, sizeof chunk, 0);
    if (n <= 0) return out;
    out.insert(out.end(), chunk, chunk + n);
  }
}

// An endpoint with an 8-byte message buffer, a receive posted into it.
struct Talker {
  Talker(Adapter& adapter, void* qp_context) : mr(adapter, box.data(), box.size(), kSinkFlags), e(adapter, qp_context, {.separateCqs = true}) {
    IT_OK(e.qp->Receive(nullptr, &sge, 1));
  }
  // One message each way on the established connection: it still works. `first`: this side
  // sends first, the other answers.
  void Exchange(void* context, bool first) {
    auto send = [&] {
      IT_OK(e.qp->Send(context, &sge, 1, 0));
      ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, context, e.qpContext}, "a Send");
    };
    if (first) send();
    ExpectCompletion(e.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, nullptr, e.qpContext, 8}, "a Receive");
    IT_OK(e.qp->Receive(nullptr, &sge, 1));
    if (!first) send();
  }
  std::vector<uint8_t> box = std::vector<uint8_t>(8);
  Mr mr;
  ND2_SGE sge = {box.data(), 8, mr.token()};
  Endpoint e;
};

// ---- MPA Requests whose senders leave at once, more than the server has descriptors for --------

constexpr int kFlood = 400;     // connections
constexpr int kHeadroom = 64;   // descriptors the server has to spare

IT_PEER(flooded_server) {
  Adapter adapter;
  Talker a(adapter, kServerQp);
  Serve(parent, a.e);
  // Out of descriptors after kHeadroom more: the flood is more than that.
  rlimit limit{};
  IT_CHECK(getrlimit(RLIMIT_NOFILE, &limit) == 0);
  const size_t baseline = OpenDescriptors();
  rlimit low = limit;
  low.rlim_cur = baseline + kHeadroom;
  IT_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
  parent.Send("limited");
  a.Exchange(Ctx(0xA1), /*first=*/false);  // during the flood
  parent.Expect("flooded");
  // Every flooder left: what they held is given back, without any GetConnectionRequest, and each
  // is counted.
  Deadline deadline;
  unsigned spins = 0;
  auto counted = [] { return AdapterCounter("mpa_requests_abandoned") + AdapterCounter("accepts_refused"); };
  while ((OpenDescriptors() > baseline || counted() < uint64_t(kFlood)) && !deadline.Expired()) Pause(spins);
  IT_CHECK_MSG(OpenDescriptors() <= baseline, std::to_string(OpenDescriptors()) + " descriptors open, " +
                                                  std::to_string(baseline) + " before the flood");
  parent.SendValue("abandoned", AdapterCounter("mpa_requests_abandoned"));
  parent.SendValue("refused", AdapterCounter("accepts_refused"));
  // A new connection is served, and the first one still works.
  Talker b(adapter, kServerQp);
  b.e.connector = GetConnectionRequest(adapter, a.e.listener.get());
  IT_OK(Accept(b.e.connector.get(), b.e.qp.get(), 4, 4));
  parent.Send("accepted");
  b.Exchange(Ctx(0xB1), /*first=*/false);
  a.Exchange(Ctx(0xA2), /*first=*/false);
  ServerTeardown(parent, b.e);
  ServerTeardown(parent, a.e);
  setrlimit(RLIMIT_NOFILE, &limit);
}

TEST(IntegrationFlood, MpaRequestsWhoseSendersLeaveHoldNothing) {
  if (TransportIsRoce()) GTEST_SKIP() << "iWARP's listener (the RoCE CM's bounds: docs/security.md)";
#ifdef __SANITIZE_ADDRESS__
  // The sanitizers' runtime needs descriptors of its own (test_connect.cpp, the descriptor test);
  // the server here keeps few to spare.
  GTEST_SKIP() << "the server's descriptors are counted tightly";
#endif
  RunWithPeer("flooded_server", [](Channel& peer) {
    Adapter adapter;
    Talker a(adapter, kClientQp);
    ConnectTo(peer, a.e);
    sockaddr_in listener{};
    ULONG length = sizeof listener;
    IT_OK(a.e.connector->GetPeerAddress(reinterpret_cast<sockaddr*>(&listener), &length));
    const uint16_t port = PortOf(listener);
    peer.Expect("limited");
    const std::vector<uint8_t> request = MpaRequest();
    for (int i = 0; i < kFlood; ++i) {
      int fd = RawConnect(port, request);
      IT_CHECK(fd >= 0);
      close(fd);
      if (i == kFlood / 2) a.Exchange(Ctx(0xC1), /*first=*/true);
    }
    peer.Send("flooded");
    uint64_t abandoned = peer.ReceiveValue("abandoned"), refused = peer.ReceiveValue("refused");
    // Each flooder's request was dropped when it left (a few may have met the server out of
    // descriptors for a moment, and been refused at once).
    IT_CHECK_MSG(abandoned + refused == uint64_t(kFlood),
                 std::to_string(abandoned) + " dropped, " + std::to_string(refused) + " refused");
    IT_CHECK_MSG(abandoned >= uint64_t(kFlood / 2), std::to_string(abandoned) + " dropped");
    Talker b(adapter, kClientQp);
    b.e.connector = adapter.CreateConnector();
    IT_OK(Connect(b.e.connector.get(), b.e.qp.get(), port, 4, 4));
    CompleteConnect(b.e.connector.get());
    peer.Expect("accepted");
    b.Exchange(Ctx(0xD1), /*first=*/true);
    a.Exchange(Ctx(0xC2), /*first=*/true);
    ClientTeardown(peer, b.e);
    ClientTeardown(peer, a.e);
  });
}

// ---- connections that never finish their MPA Request, and a request nobody takes ---------------

IT_PEER(slow_server) {
  Adapter adapter;
  Ref<IND2Listener> listener;
  uint16_t port = StartListening(adapter, listener);
  parent.SendValue("port", port);
  parent.Expect("done");
  parent.SendValue("timeouts", AdapterCounter("mpa_request_timeouts"));
  parent.SendValue("expired", AdapterCounter("mpa_requests_expired"));
  parent.SendValue("rejects", AdapterCounter("mpa_rejects_sent"));
  // The listener still serves a connection.
  Endpoint server(adapter, kServerQp);
  server.listener = std::move(listener);
  server.connector = GetConnectionRequest(adapter, server.listener.get());
  IT_OK(Accept(server.connector.get(), server.qp.get(), 4, 4));
  parent.Send("accepted");
  ServerTeardown(parent, server);
}

TEST(IntegrationFlood, HandshakesAndRequestsHaveATimeLimit) {
  if (TransportIsRoce()) GTEST_SKIP() << "iWARP's listener (the RoCE CM's bounds: docs/security.md)";
  // NDWV_CM_TIMEOUT_MS bounds both phases; short here, so that the test waits little.
  RunWithPeer("slow_server", {{"env:NDWV_CM_TIMEOUT_MS", "300"}}, [](Channel& peer) {
    uint16_t port = uint16_t(peer.ReceiveValue("port"));
    const std::vector<uint8_t> request = MpaRequest();
    // Nothing sent, and half a Request: closed unanswered.
    for (size_t sent : {size_t(0), request.size() / 2}) {
      int fd = RawConnect(port, {request.begin(), request.begin() + long(sent)});
      IT_CHECK(fd >= 0);
      IT_CHECK_MSG(ReadToEnd(fd).empty(), "an unfinished request was answered");
      close(fd);
    }
    // A whole Request that no GetConnectionRequest takes: rejected (an MPA Reply with R), then
    // closed.
    int fd = RawConnect(port, request);
    IT_CHECK(fd >= 0);
    std::vector<uint8_t> reply = ReadToEnd(fd);
    close(fd);
    IT_CHECK_MSG(reply.size() >= 20 && memcmp(reply.data(), "MPA ID Rep Frame", 16) == 0,
                 std::to_string(reply.size()) + " bytes instead of an MPA Reply");
    IT_CHECK_MSG(reply[16] & 0x20, "the Reply does not reject");
    peer.Send("done");
    IT_CHECK_EQ(uint64_t(2), peer.ReceiveValue("timeouts"));
    IT_CHECK_EQ(uint64_t(1), peer.ReceiveValue("expired"));
    IT_CHECK_EQ(uint64_t(1), peer.ReceiveValue("rejects"));
    // A legitimate connection is served as ever.
    Adapter adapter;
    Endpoint client(adapter, kClientQp);
    client.connector = adapter.CreateConnector();
    IT_OK(Connect(client.connector.get(), client.qp.get(), port, 4, 4));
    CompleteConnect(client.connector.get());
    peer.Expect("accepted");
    ClientTeardown(peer, client);
  });
}

}  // namespace
}  // namespace ndit
