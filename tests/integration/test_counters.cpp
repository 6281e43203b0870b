// Counters (ndwv_counters_*, docs/counters.md) after a known exchange: 10 Sends of known sizes,
// one RDMA Write and one RDMA Read from the client (this process) to the server (the peer). Each
// side checks its own connection row and its adapter's totals: message counts and payload bytes
// placed are exact; bytes sent are exact on iWARP (TCP never resends through us) and at least the
// payload on RoCE (retransmissions add). And NDWV_COUNTERS=exit writes the report at exit.
#include <ndwv/ndwv.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);

constexpr size_t kSendSizes[10] = {0, 1, 7, 100, 1000, 1500, 4096, 10000, 65536, 70001};
constexpr size_t kWriteBytes = 3000;
constexpr size_t kReadBytes = 5000;

uint64_t SendBytes() {
  uint64_t sum = 0;
  for (size_t size : kSendSizes) sum += size;
  return sum;
}

std::vector<ndwv_counter_row> Snapshot() {
  std::vector<ndwv_counter_row> rows(ndwv_counters_snapshot(nullptr, 0) + 8);
  rows.resize(ndwv_counters_snapshot(rows.data(), rows.size()));
  return rows;
}

uint64_t Value(const ndwv_counter_row& row, const char* name) {
  uint64_t value = ndwv_counter_value(&row, name);
  if (value == UINT64_MAX) IT_FAIL(std::string("no counter named ") + name);
  return value;
}

const char* TransportName() { return TransportIsRoce() ? "RoCEv2" : "iWARP"; }

// The adapter row of our transport.
ndwv_counter_row AdapterRow(const std::vector<ndwv_counter_row>& rows) {
  for (const ndwv_counter_row& row : rows)
    if (row.qpn == 0 && std::string(row.transport) == TransportName()) return row;
  IT_FAIL("no adapter row for the transport");
}

// The one connection row whose peer is `peer` ("127.0.0.1:port").
ndwv_counter_row ConnectionRow(const std::vector<ndwv_counter_row>& rows, const std::string& peer) {
  const ndwv_counter_row* found = nullptr;
  for (const ndwv_counter_row& row : rows)
    if (row.qpn != 0 && peer == row.peer) {
      IT_CHECK_MSG(!found, "two connection rows with the peer " + peer);
      found = &row;
    }
  IT_CHECK_MSG(found, "no connection row with the peer " + peer);
  return *found;
}

// Every counter of the adapter's totals is at least the connection's.
void CheckTotalsCover(const ndwv_counter_row& adapter, const ndwv_counter_row& connection) {
  for (size_t i = 0; i < ndwv_counter_count(); ++i)
    IT_CHECK_MSG(adapter.values[i] >= connection.values[i], ndwv_counter_name(i));
}

IT_PEER(counters_server) {
  Adapter adapter;
  Endpoint server(adapter, kServerQp);
  std::vector<uint8_t> inbox(SendBytes() + 64), target(kWriteBytes + kReadBytes);
  FillPattern(target.data() + kWriteBytes, kReadBytes, 7);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Mr targetMr(adapter, target.data(), target.size(), kTargetFlags);
  size_t at = 0;
  for (size_t i = 0; i < 10; ++i) {
    ND2_SGE sge = {inbox.data() + at, ULONG(kSendSizes[i] + 1), inboxMr.token()};
    IT_OK(server.qp->Receive(Ctx(0x100 + i), &sge, 1));
    at += kSendSizes[i] + 1;
  }
  Serve(parent, server);
  parent.SendValue("address", uint64_t(reinterpret_cast<uintptr_t>(target.data())));
  parent.SendValue("token", targetMr.remoteToken());
  for (size_t i = 0; i < 10; ++i)
    ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100 + i), kServerQp,
                                       int64_t(kSendSizes[i])},
                     "a receive");
  parent.Expect("exchanged");
  CheckPlacedByPeer([&] { CheckPattern(target.data(), kWriteBytes, 3, "the Write"); });

  std::string client = parent.Receive("the client's address");
  std::vector<ndwv_counter_row> rows = Snapshot();
  ndwv_counter_row row = ConnectionRow(rows, client);
  IT_CHECK_EQ(std::string(TransportName()), std::string(row.transport));
  IT_CHECK_EQ(uint64_t(10), Value(row, "rx_sends"));
  IT_CHECK_EQ(uint64_t(1), Value(row, "rx_reads"));
  // RoCE: an idle client's keepalive is a zero-length Write too.
  if (TransportIsRoce()) IT_CHECK(Value(row, "rx_writes") >= 1);
  else IT_CHECK_EQ(uint64_t(1), Value(row, "rx_writes"));
  IT_CHECK_EQ(SendBytes() + kWriteBytes, Value(row, "rx_bytes"));
  IT_CHECK_EQ(uint64_t(0), Value(row, "tx_sends"));
  if (TransportIsRoce()) IT_CHECK(Value(row, "tx_bytes") >= kReadBytes);
  else IT_CHECK_EQ(uint64_t(kReadBytes), Value(row, "tx_bytes"));
  IT_CHECK(Value(row, "rx_packets") >= 12);
  IT_CHECK_EQ(uint64_t(0), Value(row, "flushes"));
  CheckTotalsCover(AdapterRow(rows), row);
  parent.Send("checked");

  ServerTeardown(parent, server);
  // Ended connections stay in the adapter's totals (this process had no other).
  ndwv_counter_row totals = AdapterRow(Snapshot());
  IT_CHECK_EQ(uint64_t(10), Value(totals, "rx_sends"));
  IT_CHECK_EQ(SendBytes() + kWriteBytes, Value(totals, "rx_bytes"));
  if (TransportIsRoce()) {
    IT_CHECK(Value(totals, "cm_req_received") >= 1);
    IT_CHECK(Value(totals, "cm_rep_sent") >= 1);
  } else {
    IT_CHECK_EQ(uint64_t(1), Value(totals, "mpa_requests_received"));
    IT_CHECK_EQ(uint64_t(1), Value(totals, "mpa_replies_sent"));
  }
  parent.Send("done");
}

// The client's side of the exchange; checks its own counters when `check`.
void RunClient(Channel& peer, bool check) {
  Adapter adapter;
  Endpoint client(adapter, kClientQp);
  std::vector<uint8_t> outbox(SendBytes() + kWriteBytes), sink(kReadBytes);
  FillPattern(outbox.data() + SendBytes(), kWriteBytes, 3);
  Mr outboxMr(adapter, outbox.data(), outbox.size(), kSourceFlags);
  Mr sinkMr(adapter, sink.data(), sink.size(), kReadSinkFlags);
  uint16_t port = uint16_t(peer.ReceiveValue("port"));
  client.connector = adapter.CreateConnector();
  IT_OK(Connect(client.connector.get(), client.qp.get(), port, 4, 4));
  CompleteConnect(client.connector.get());
  peer.Expect("accepted");
  uint64_t address = peer.ReceiveValue("address");
  UINT32 token = UINT32(peer.ReceiveValue("token"));

  size_t at = 0;
  for (size_t i = 0; i < 10; ++i) {
    ND2_SGE sge = {outbox.data() + at, ULONG(kSendSizes[i]), outboxMr.token()};
    IT_OK(client.qp->Send(Ctx(0x200 + i), kSendSizes[i] ? &sge : nullptr, kSendSizes[i] ? 1 : 0, 0));
    at += kSendSizes[i];
  }
  for (size_t i = 0; i < 10; ++i)
    ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200 + i), kClientQp}, "a Send");
  ND2_SGE writeSge = {outbox.data() + SendBytes(), ULONG(kWriteBytes), outboxMr.token()};
  IT_OK(client.qp->Write(Ctx(0x300), &writeSge, 1, address, token, 0));
  ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x300), kClientQp}, "the Write");
  ND2_SGE readSge = {sink.data(), ULONG(kReadBytes), sinkMr.token()};
  IT_OK(client.qp->Read(Ctx(0x400), &readSge, 1, address + kWriteBytes, token, 0));
  ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x400), kClientQp}, "the Read");
  CheckPattern(sink.data(), kReadBytes, 7, "the Read");
  peer.Send("exchanged");

  sockaddr_in local{};
  ULONG length = sizeof local;
  IT_OK(client.connector->GetLocalAddress(reinterpret_cast<sockaddr*>(&local), &length));
  char name[64];
  snprintf(name, sizeof name, "127.0.0.1:%u", unsigned(PortOf(local)));
  // RoCE: the peer knows our UDP port, which is the connector's own (no NDWV_ROCE_PORT in tests).
  peer.Send(name);
  peer.Expect("checked");

  if (check) {
    std::vector<ndwv_counter_row> rows = Snapshot();
    ndwv_counter_row row = ConnectionRow(rows, "127.0.0.1:" + std::to_string(port));
    IT_CHECK_EQ(uint64_t(10), Value(row, "tx_sends"));
    IT_CHECK_EQ(uint64_t(1), Value(row, "tx_writes"));
    IT_CHECK_EQ(uint64_t(1), Value(row, "tx_reads"));
    IT_CHECK_EQ(uint64_t(kReadBytes), Value(row, "rx_bytes"));
    IT_CHECK_EQ(uint64_t(0), Value(row, "rx_sends"));
    if (TransportIsRoce()) {
      IT_CHECK(Value(row, "tx_bytes") >= SendBytes() + kWriteBytes);
      IT_CHECK_EQ(uint64_t(0), Value(row, "naks_received_access"));
      IT_CHECK(row.peer_qpn != 0);
    } else {
      IT_CHECK_EQ(SendBytes() + kWriteBytes, Value(row, "tx_bytes"));
      IT_CHECK_EQ(uint64_t(0), Value(row, "terminates_received_rdmap"));
      IT_CHECK_EQ(uint64_t(0), Value(row, "drops_bad_crc"));
    }
    IT_CHECK(Value(row, "tx_packets") >= 12);
    IT_CHECK(std::string(row.local).rfind("127.0.0.1:", 0) == 0);
    CheckTotalsCover(AdapterRow(rows), row);
  }
  ClientTeardown(peer, client);
  peer.Expect("done");
}

TEST(Counters, KnownExchangeCountsExactly) {
  RunWithPeer("counters_server", [](Channel& peer) { RunClient(peer, true); });
}

// `item` ("name=value") is one of the report's items.
bool HasItem(const std::string& report, const std::string& item) {
  for (size_t at = report.find(" " + item); at != std::string::npos; at = report.find(" " + item, at + 1)) {
    size_t end = at + 1 + item.size();
    if (end == report.size() || report[end] == ' ' || report[end] == '\n') return true;
  }
  return false;
}

TEST(Counters, ExitReportIsWritten) {
  std::string path = "/tmp/ndwv-counters-test-" + std::to_string(getpid()) + ".txt";
  std::remove(path.c_str());
  RunWithPeer("counters_server", {{"env:NDWV_COUNTERS", "exit"}, {"env:NDWV_COUNTERS_FILE", path}},
              [](Channel& peer) { RunClient(peer, false); });
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path.c_str());
  const std::string report = text.str();
  EXPECT_NE(report.find(std::string("ndwv counters: ") + TransportName() + " adapter\n"), std::string::npos)
      << report;
  EXPECT_TRUE(HasItem(report, "rx_sends=10")) << report;
  EXPECT_TRUE(HasItem(report, "rx_reads=1")) << report;
}

TEST(Counters, UnknownFormatIsRefused) {
  FILE* null = std::fopen("/dev/null", "w");
  ASSERT_NE(null, nullptr);
  EXPECT_EQ(ndwv_counters_write(null, "xml"), -1);
  EXPECT_EQ(ndwv_counters_write(null, "json"), 0);
  std::fclose(null);
}

}  // namespace
}  // namespace ndit
