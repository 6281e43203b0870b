// Wire checks (DESIGN.md "Tests"): the packets of a whole connection, written by the device itself
// to a pcap file (NDWV_CAPTURE), decode cleanly in tshark, Wireshark's command-line decoder.
//
// The peer is the server and captures (NDWV_CAPTURE set in its environment; it sees every packet
// of the connection, as sender or receiver); this process is the client. The scenario: connect,
// a Send each way, an RDMA Write, an RDMA Read, disconnect. Then tshark must decode every frame
// with no malformed packet and no expert warning or error, and name what the scenario did:
//   iWARP: the MPA Request and Reply (iwarp_mpa), and DDP/RDMAP Send, RDMA Write, Read Request
//          and Read Response in the FPDUs (iwarp_ddp_rdmap), over TCP segments reassembled by
//          Wireshark (an FPDU received in several recv calls spans several segments);
//   RoCE:  InfiniBand over UDP in every frame (decoded with -d udp.port==P,infiniband for every
//          port of the capture: ndwv's ports are not 4791), the CM's REQ, REP, RTU, DREQ, DREP,
//          and the RC opcodes of Send, RDMA Write, Read Request, Read Response and ACK.
// Each test runs on the transport this process uses (NDWV_TRANSPORTS, as the suite's "roce."
// pass sets it) and is skipped on the other; both skip when tshark is not installed.
//
// Set NDWV_KEEP_PCAP=1 to keep the capture (its path is printed).
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "../common/tshark.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "harness.h"

namespace ndit {
namespace {

void* const kClientQp = Ctx(0xC1);
void* const kServerQp = Ctx(0x5E);
constexpr size_t kSendBytes = 100;
constexpr size_t kWriteBytes = 10000;  // several RoCE packets; one FPDU read in pieces (iWARP)
constexpr size_t kReadBytes = 10000;
constexpr uint64_t kSendSeed = 71, kWriteSeed = 72, kReadSeed = 73;

using ndwv::test_support::HaveTshark;
using ndwv::test_support::Rows;

std::vector<std::string> Split(const std::string& text, char by) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, by))
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// tshark prints numbers in decimal or hex ("0x0a"); both compare by value.
long Number(const std::string& text) { return std::strtol(text.c_str(), nullptr, 0); }

std::string TempPcap(const char* tag) {
  std::string dir = ::testing::TempDir();
  if (dir.empty() || dir.back() != '/') dir += '/';
  return dir + "ndwv_capture_" + tag + "_" + std::to_string(getpid()) + ".pcap";
}

// ---- the scenario ---------------------------------------------------------------------------------

// The server: receives a Send, sends its memory's description, and lets the client Write to and
// Read from that memory.
IT_PEER(wire_capture_server) {
  Adapter adapter;
  std::vector<uint8_t> region(kWriteBytes + kReadBytes, 0);
  FillPattern(region.data() + kWriteBytes, kReadBytes, kReadSeed);
  Mr regionMr(adapter, region.data(), region.size(), kTargetFlags);
  std::vector<uint8_t> inbox(2 * 128, 0);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);

  Endpoint server(adapter, kServerQp, {.depth = 8, .separateCqs = true});  // SendRemoteBuffer
  for (int i = 0; i < 2; ++i) {
    ND2_SGE sge = {inbox.data() + 128 * i, 128, inboxMr.token()};
    IT_OK(server.qp->Receive(Ctx(0x100 + i), &sge, 1));
  }
  Serve(parent, server, 2, 2);
  ExpectCompletion(server.receiveCq,
                   {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), kServerQp, int64_t(kSendBytes)},
                   "the client's Send");
  CheckPattern(inbox.data(), kSendBytes, kSendSeed, "the client's Send");
  SendRemoteBuffer(server,
                   {reinterpret_cast<uint64_t>(region.data()), region.size(),
                    regionMr.remoteToken(), 0},
                   Ctx(0x200));
  // The client's Send after its Write and Read: the Write is in place.
  ExpectCompletion(server.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x101), kServerQp, 4},
                   "the client's last Send");
  IT_CHECK(std::memcmp(inbox.data() + 128, "DONE", 4) == 0);
  CheckPattern(region.data(), kWriteBytes, kWriteSeed, "the client's Write");
  ServerTeardown(parent, server);
}

// The client (this process): connect, Send, Write, Read, Send, disconnect.
void RunClient(Channel& peer) {
  Adapter adapter;
  std::vector<uint8_t> source(kSendBytes + kWriteBytes), sink(kReadBytes, 0), inbox(128, 0);
  FillPattern(source.data(), kSendBytes, kSendSeed);
  FillPattern(source.data() + kSendBytes, kWriteBytes, kWriteSeed);
  Mr sourceMr(adapter, source.data(), source.size(), kSourceFlags);
  Mr sinkMr(adapter, sink.data(), sink.size(), kReadSinkFlags);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);

  Endpoint client(adapter, kClientQp, {.depth = 8, .inlineSize = 16, .separateCqs = true});
  ND2_SGE inboxSge = {inbox.data(), ULONG(inbox.size()), inboxMr.token()};
  IT_OK(client.qp->Receive(Ctx(0x100), &inboxSge, 1));
  ConnectTo(peer, client, 2, 2);

  ND2_SGE sendSge = {source.data(), ULONG(kSendBytes), sourceMr.token()};
  IT_OK(client.qp->Send(Ctx(0x200), &sendSge, 1, 0));
  ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kClientQp},
                   "the Send");
  RemoteBuffer target = ReceiveRemoteBuffer(client, inbox.data(), Ctx(0x100));

  ND2_SGE writeSge = {source.data() + kSendBytes, ULONG(kWriteBytes), sourceMr.token()};
  IT_OK(client.qp->Write(Ctx(0x300), &writeSge, 1, target.address, target.token, 0));
  ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x300), kClientQp},
                   "the Write");
  ND2_SGE readSge = {sink.data(), ULONG(kReadBytes), sinkMr.token()};
  IT_OK(client.qp->Read(Ctx(0x400), &readSge, 1, target.address + kWriteBytes, target.token, 0));
  ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x400), kClientQp},
                   "the Read");
  CheckPattern(sink.data(), kReadBytes, kReadSeed, "the Read");

  ND2_SGE doneSge = {const_cast<char*>("DONE"), 4, 0};
  IT_OK(client.qp->Send(Ctx(0x201), &doneSge, 1, ND_OP_FLAG_INLINE));
  ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x201), kClientQp},
                   "the last Send");
  ClientTeardown(peer, client);
}

// Runs the scenario with the server capturing to `path`; false (a failure reported) if the
// capture is missing.
bool CaptureScenario(const std::string& path) {
  std::remove(path.c_str());
  const char* transports = std::getenv("NDWV_TRANSPORTS");
  RunWithPeer("wire_capture_server",
              {{"env:NDWV_CAPTURE", path},
               {"env:NDWV_TRANSPORTS", transports ? transports : "iwarp"}},
              [](Channel& peer) { RunClient(peer); });
  if (::testing::Test::HasFailure()) return false;
  if (access(path.c_str(), R_OK) != 0) {
    ADD_FAILURE() << "the server wrote no capture at " << path;
    return false;
  }
  return true;
}

// tshark's common options for `path`: two passes (so that a segment whose bytes a later frame
// reassembles says so: tcp.reassembled_in), names not resolved, RPC-over-RDMA off (Wireshark
// offers it every Send's payload, and ours are no RPC messages).
std::string Tshark(const std::string& path, const std::string& options) {
  return "tshark -2 -n --disable-protocol rpcordma -r '" + path + "'" + options;
}

// One row per frame: each field's values (all occurrences, comma-separated).
struct Decoded {
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> rows;
  std::string at(size_t row, const std::string& name) const {
    for (size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i < rows[row].size() ? rows[row][i] : "";
    return "";
  }
};

Decoded Decode(const std::string& path, const std::string& options,
               const std::vector<std::string>& names) {
  Decoded d;
  d.names = names;
  std::string fields = " -T fields -E separator=/t -E occurrence=a -E aggregator=,";
  for (const auto& n : names) fields += " -e " + n;
  int status = 0;
  const std::string out = ndwv::test_support::ShellOutput(Tshark(path, options + fields), &status);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "tshark failed:\n" << out;
  d.rows = Rows(out);
  return d;
}

// Expert severities (_ws.expert.severity): chat 0x200000, note 0x400000, warning 0x600000,
// error 0x800000. Chat and notes are information (a FIN is both: "Connection finish", "This frame
// initiates the connection closing"); a warning is a finding (TCP's "Previous segment not
// captured" and "ACKed unseen segment" among them), an error a decoding failure.
constexpr long kExpertWarning = 0x600000;

// Checks what every decoded frame has in common: no malformed packet, no expert finding.
void CheckClean(const Decoded& d, const std::string& summary) {
  for (size_t i = 0; i < d.rows.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(i + 1));
    EXPECT_EQ(d.at(i, "_ws.malformed"), "") << summary;
    for (const auto& severity : Split(d.at(i, "_ws.expert.severity"), ','))
      EXPECT_LT(Number(severity), kExpertWarning) << d.at(i, "_ws.expert.message") << "\n" << summary;
  }
  EXPECT_EQ(summary.find("Malformed"), std::string::npos) << summary;
}

void Finish(const std::string& path) {
  if (std::getenv("NDWV_KEEP_PCAP") != nullptr)
    std::printf("capture kept: %s\n", path.c_str());
  else
    std::remove(path.c_str());
}

// ---- iWARP ----------------------------------------------------------------------------------------

TEST(WireCapture, IwarpDecodesAsMpaDdpRdmap) {
  if (TransportIsRoce()) GTEST_SKIP() << "this process runs RoCE (NDWV_TRANSPORTS)";
  if (!HaveTshark()) GTEST_SKIP() << "tshark is not installed (scripts/setup.sh installs it)";
  const std::string path = TempPcap("iwarp");
  if (!CaptureScenario(path)) return;

  // The MPA dissector is a heuristic on TCP, on by default: no decode-as is needed.
  const std::string summary = ndwv::test_support::ShellOutput(Tshark(path, ""));
  const Decoded d = Decode(path, "",
                           {"frame.protocols", "tcp.len", "tcp.reassembled_in",
                            "iwarp_mpa.key.req", "iwarp_mpa.key.rep", "iwarp_mpa.crc_check",
                            "iwarp_rdma.opcode", "_ws.malformed", "_ws.expert.severity",
                            "_ws.expert.message"});
  ASSERT_GT(d.rows.size(), 6u) << summary;
  CheckClean(d, summary);

  int requests = 0, replies = 0;
  size_t crcs = 0;  // FPDUs whose CRC tshark checked
  std::set<long> opcodes;
  for (size_t i = 0; i < d.rows.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(i + 1));
    const std::string protocols = d.at(i, "frame.protocols");
    EXPECT_EQ(protocols.rfind("eth:ethertype:ip:tcp", 0), 0u) << protocols;
    if (!d.at(i, "iwarp_mpa.key.req").empty()) requests++;
    if (!d.at(i, "iwarp_mpa.key.rep").empty()) replies++;
    // Every segment with payload is MPA, or a piece of an FPDU that a later frame completes.
    if (Number(d.at(i, "tcp.len")) > 0) {
      EXPECT_TRUE(protocols.find("iwarp_mpa") != std::string::npos ||
                  !d.at(i, "tcp.reassembled_in").empty())
          << protocols << "\n" << summary;
    }
    for (const auto& op : Split(d.at(i, "iwarp_rdma.opcode"), ',')) opcodes.insert(Number(op));
    crcs += Split(d.at(i, "iwarp_mpa.crc_check"), ',').size();
  }
  // Every FPDU's CRC (MPA CRC is on by default) was checked, and found good.
  const std::string verbose = ndwv::test_support::ShellOutput(Tshark(path, " -V"));
  size_t good = 0;
  for (size_t at = 0; (at = verbose.find("(Good CRC32)", at)) != std::string::npos; ++at) good++;
  EXPECT_EQ(good, crcs) << verbose;
  EXPECT_EQ(verbose.find("Bad CRC32"), std::string::npos) << verbose;
  EXPECT_EQ(requests, 1) << summary;
  EXPECT_EQ(replies, 1) << summary;
  // RDMAP opcodes: 0 RDMA Write, 1 Read Request, 2 Read Response, 3 Send.
  for (long want : {0L, 1L, 2L, 3L})
    EXPECT_TRUE(opcodes.count(want)) << "no RDMAP opcode " << want << " in\n" << summary;
  // The stream is tracked as one conversation: every byte of it is accounted for.
  EXPECT_EQ(summary.find("Previous segment not captured"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("ACKed unseen"), std::string::npos) << summary;
  Finish(path);
}

// ---- RoCE -----------------------------------------------------------------------------------------

TEST(WireCapture, RoceDecodesAsInfiniBand) {
  if (!TransportIsRoce()) GTEST_SKIP() << "this process runs iWARP (NDWV_TRANSPORTS)";
  if (!HaveTshark()) GTEST_SKIP() << "tshark is not installed (scripts/setup.sh installs it)";
  const std::string path = TempPcap("roce");
  if (!CaptureScenario(path)) return;

  // ndwv's UDP ports are not 4791: the InfiniBand dissector is applied to every port seen.
  std::set<std::string> ports;
  for (const auto& row : Rows(ndwv::test_support::ShellOutput(Tshark(path, " -T fields -e udp.srcport -e udp.dstport"))))
    for (const auto& p : row)
      if (!p.empty()) ports.insert(p);
  ASSERT_FALSE(ports.empty()) << "no UDP datagram in the capture";
  std::string decodeAs;
  for (const auto& p : ports) decodeAs += " -d udp.port==" + p + ",infiniband";

  const std::string summary = ndwv::test_support::ShellOutput(Tshark(path, decodeAs));
  const Decoded d = Decode(path, decodeAs,
                           {"frame.protocols", "infiniband.bth.opcode", "infiniband.bth.destqp",
                            "infiniband.mad.attributeid", "_ws.malformed", "_ws.expert.severity",
                            "_ws.expert.message"});
  ASSERT_GT(d.rows.size(), 8u) << summary;
  CheckClean(d, summary);

  std::set<long> opcodes;
  for (size_t i = 0; i < d.rows.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(i + 1));
    EXPECT_NE(d.at(i, "frame.protocols").find("udp:infiniband"), std::string::npos)
        << d.at(i, "frame.protocols");
    if (Number(d.at(i, "infiniband.bth.destqp")) != 1) {  // not a CM MAD (QP 1)
      for (const auto& op : Split(d.at(i, "infiniband.bth.opcode"), ','))
        opcodes.insert(Number(op));
    }
  }
  // The CM exchange, in order, by the names Wireshark gives the messages.
  size_t pos = 0;
  for (const char* want : {"CM: ConnectRequest", "CM: ConnectReply", "CM: ReadyToUse",
                           "CM: DisconnectRequest", "CM: DisconnectReply"}) {
    const size_t at = summary.find(want, pos);
    EXPECT_NE(at, std::string::npos) << "no " << want << " (in order) in\n" << summary;
    if (at != std::string::npos) pos = at;
  }
  // RC opcodes: Send (0 first, 2 last, 4 only), RDMA Write (6..8 first/middle/last, 10 only),
  // 12 Read Request, Read Response (13..15 first/middle/last, 16 only), 17 Acknowledge.
  auto any = [&](std::initializer_list<long> set) {
    for (long op : set)
      if (opcodes.count(op)) return true;
    return false;
  };
  EXPECT_TRUE(any({0, 2, 4})) << "no SEND in\n" << summary;
  EXPECT_TRUE(any({6, 7, 8, 10})) << "no RDMA WRITE in\n" << summary;
  EXPECT_TRUE(any({12})) << "no RDMA READ REQUEST in\n" << summary;
  EXPECT_TRUE(any({13, 14, 15, 16})) << "no RDMA READ RESPONSE in\n" << summary;
  EXPECT_TRUE(any({17})) << "no ACKNOWLEDGE in\n" << summary;
  Finish(path);
}

}  // namespace
}  // namespace ndit
