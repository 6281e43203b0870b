// The counter block, the per-connection registry and the public counters API (ndwv.h), without a
// wire: names, applicability, adding into the adapter totals when a connection ends, the snapshot
// and the report formats.
#include <gtest/gtest.h>

#include <ndwv/ndwv.h>
#include <netinet/in.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dev/counters.h"
#include "dev/device.h"

namespace ndwv::dev {
namespace {

sockaddr_storage Loopback(uint16_t port) {
  sockaddr_storage a{};
  auto& in = reinterpret_cast<sockaddr_in&>(a);
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  in.sin_port = htons(port);
  return a;
}

std::string Report(const char* format) {
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  EXPECT_EQ(ndwv_counters_write(out, format), 0);
  fclose(out);
  std::string report(text, size);
  free(text);
  return report;
}

const CounterRow* FindRow(const std::vector<CounterRow>& rows, uint32_t qpn) {
  for (const CounterRow& row : rows)
    if (!row.adapter && row.qpn == qpn) return &row;
  return nullptr;
}

TEST(CounterBlock, AddsAndReads) {
  CounterBlock block;
  EXPECT_EQ(block.Get(Counter::TxPackets), 0u);
  block.Add(Counter::TxPackets);
  block.Add(Counter::TxBytes, 1500);
  block.AddShared(Counter::Flushes, 2);
  EXPECT_EQ(block.Get(Counter::TxPackets), 1u);
  EXPECT_EQ(block.Get(Counter::TxBytes), 1500u);
  EXPECT_EQ(block.Get(Counter::Flushes), 2u);
  CounterValues sum{};
  sum[size_t(Counter::TxBytes)] = 10;
  block.AddTo(sum);
  EXPECT_EQ(sum[size_t(Counter::TxBytes)], 1510u);
  EXPECT_EQ(sum[size_t(Counter::RxBytes)], 0u);
}

TEST(CounterBlock, SharedAddsFromManyThreadsAreNotLost) {
  CounterBlock block;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) block.AddShared(Counter::FlushedRequests);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(block.Get(Counter::FlushedRequests), 40000u);
}

TEST(CounterNames, AreUniqueAndApplyToATransport) {
  std::set<std::string> names;
  for (size_t i = 0; i < kCounters; ++i) {
    Counter c = Counter(i);
    std::string name = CounterName(c);
    EXPECT_FALSE(name.empty());
    EXPECT_EQ(name.find_first_not_of("abcdefghijklmnopqrstuvwxyz_"), std::string::npos) << name;
    EXPECT_TRUE(names.insert(name).second) << name << " twice";
    EXPECT_TRUE(CounterApplies(c, Transport::Iwarp) || CounterApplies(c, Transport::Roce)) << name;
    EXPECT_STREQ(ndwv_counter_name(i), name.c_str());
  }
  EXPECT_EQ(ndwv_counter_count(), kCounters);
  EXPECT_LE(kCounters, size_t(NDWV_COUNTERS_MAX));
  EXPECT_EQ(ndwv_counter_name(kCounters), nullptr);
  EXPECT_TRUE(CounterApplies(Counter::TxPackets, Transport::Iwarp));
  EXPECT_TRUE(CounterApplies(Counter::TxPackets, Transport::Roce));
  EXPECT_FALSE(CounterApplies(Counter::NaksSentRnr, Transport::Iwarp));
  EXPECT_FALSE(CounterApplies(Counter::DropsBadCrc, Transport::Roce));
  EXPECT_TRUE(CounterPerConnection(Counter::Retransmits));
  EXPECT_FALSE(CounterPerConnection(Counter::CmReqSent));
}

TEST(ConnectionCounters, IdentityNamesBothEndsAndQpns) {
  ConnectionCounters roce;
  roce.Register(Transport::Roce, 5, 7, Loopback(49152), Loopback(4791));
  EXPECT_EQ(roce.Identity(), "roce qp 5 [127.0.0.1:49152 -> 127.0.0.1:4791 qp 7]");
  ConnectionCounters iwarp;
  iwarp.Register(Transport::Iwarp, 6, 0, Loopback(50000), Loopback(54325));
  EXPECT_EQ(iwarp.Identity(), "iwarp qp 6 [127.0.0.1:50000 -> 127.0.0.1:54325]");
}

TEST(ConnectionCounters, LiveRowThenTotalsWhenTheConnectionEnds) {
  constexpr uint32_t kQpn = 0xFFF001;  // no real QP has it
  auto before = CollectCounters({Transport::Roce});
  ASSERT_FALSE(before.empty());
  ASSERT_TRUE(before[0].adapter);
  uint64_t sends_before = before[0].values[size_t(Counter::TxSends)];

  auto connection = std::make_unique<ConnectionCounters>();
  connection->Register(Transport::Roce, kQpn, 9, Loopback(49153), Loopback(4791));
  connection->Add(Counter::TxSends, 3);
  connection->Add(Counter::NaksReceivedRnr);
  auto live = CollectCounters({Transport::Roce});
  const CounterRow* row = FindRow(live, kQpn);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->transport, Transport::Roce);
  EXPECT_EQ(row->peer_qpn, 9u);
  EXPECT_EQ(row->values[size_t(Counter::TxSends)], 3u);
  EXPECT_EQ(row->values[size_t(Counter::NaksReceivedRnr)], 1u);
  EXPECT_GE(live[0].values[size_t(Counter::TxSends)], sends_before + 3);  // totals include live rows

  connection.reset();
  auto after = CollectCounters({Transport::Roce});
  EXPECT_EQ(FindRow(after, kQpn), nullptr);
  EXPECT_GE(after[0].values[size_t(Counter::TxSends)], sends_before + 3);  // kept in the totals
}

// A connection keeps a slot only for the counters its row shows; one it does not have is not
// lost but counted in its transport's totals.
TEST(ConnectionCounters, ACounterAConnectionDoesNotHaveGoesToTheTotals) {
  constexpr uint32_t kQpn = 0xFFF004;
  ASSERT_FALSE(CounterPerConnection(Counter::CmReqSent));
  ASSERT_TRUE(CounterPerConnection(Counter::ReadsBeyondIrd));
  const uint64_t before = CollectCounters({Transport::Roce})[0].values[size_t(Counter::CmReqSent)];
  ConnectionCounters connection;
  connection.Register(Transport::Roce, kQpn, 9, Loopback(49156), Loopback(4791));
  connection.Add(Counter::CmReqSent, 2);
  connection.AddShared(Counter::ReadsBeyondIrd, 5);
  EXPECT_EQ(connection.Get(Counter::CmReqSent), 0u);
  EXPECT_EQ(connection.Get(Counter::ReadsBeyondIrd), 5u);
  auto rows = CollectCounters({Transport::Roce});
  const CounterRow* row = FindRow(rows, kQpn);
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->values[size_t(Counter::ReadsBeyondIrd)], 5u);
  EXPECT_EQ(row->values[size_t(Counter::CmReqSent)], 0u);
  EXPECT_GE(rows[0].values[size_t(Counter::CmReqSent)], before + 2);
}

TEST(CountersApi, SnapshotListsAdaptersThenConnections) {
  if (Device::All().empty()) GTEST_SKIP() << "no device (settings refused)";
  ConnectionCounters connection;
  connection.Register(Device::All().front()->transport(), 0xFFF002, 0, Loopback(49154), Loopback(54325));
  connection.Add(Counter::RxBytes, 4242);
  size_t count = ndwv_counters_snapshot(nullptr, 0);
  ASSERT_GE(count, Device::All().size() + 1);
  std::vector<ndwv_counter_row> rows(count);
  ASSERT_EQ(ndwv_counters_snapshot(rows.data(), rows.size()), count);
  for (size_t i = 0; i < Device::All().size(); ++i) {
    EXPECT_EQ(rows[i].qpn, 0u);
    EXPECT_EQ(rows[i].local[0], '\0');
  }
  const ndwv_counter_row* ours = nullptr;
  for (const auto& row : rows)
    if (row.qpn == 0xFFF002) ours = &row;
  ASSERT_NE(ours, nullptr);
  EXPECT_STREQ(ours->local, "127.0.0.1:49154");
  EXPECT_STREQ(ours->peer, "127.0.0.1:54325");
  EXPECT_EQ(ndwv_counter_value(ours, "rx_bytes"), 4242u);
  EXPECT_EQ(ndwv_counter_value(ours, "no_such_counter"), UINT64_MAX);
  // A snapshot with less room still says how many rows there are.
  ndwv_counter_row one;
  EXPECT_EQ(ndwv_counters_snapshot(&one, 1), count);
  EXPECT_EQ(one.qpn, 0u);
  // With room for the adapters' rows alone (no connection row is built), their totals still
  // count every live connection.
  std::vector<ndwv_counter_row> adapters(Device::All().size());
  EXPECT_EQ(ndwv_counters_snapshot(adapters.data(), adapters.size()), count);
  for (size_t i = 0; i < adapters.size(); ++i) {
    EXPECT_EQ(adapters[i].qpn, 0u);
    EXPECT_EQ(ndwv_counter_value(&adapters[i], "rx_bytes"), ndwv_counter_value(&rows[i], "rx_bytes"));
  }
  EXPECT_GE(ndwv_counter_value(&adapters[0], "rx_bytes"), 4242u);
}

TEST(CountersApi, ReportsNeverLookLikeAToolTableRow) {
  if (Device::All().empty()) GTEST_SKIP() << "no device (settings refused)";
  ConnectionCounters connection;
  connection.Register(Device::All().front()->transport(), 0xFFF003, 0, Loopback(49155), Loopback(54325));
  connection.Add(Counter::TxPackets, 12345);
  std::string text = Report("text");
  EXPECT_NE(text.find("ndwv counters: "), std::string::npos);
  EXPECT_NE(text.find(" tx_packets="), std::string::npos);
  EXPECT_NE(text.find("qp 16773123 [127.0.0.1:49155 -> 127.0.0.1:54325]"), std::string::npos) << text;
  // bench/run.sh takes lines of 5 fields whose first is a number as table rows.
  std::istringstream lines(text + Report("adapters"));
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    EXPECT_TRUE(first.empty() || first.find_first_not_of("0123456789") != std::string::npos) << line;
  }
  std::string json = Report("json");
  EXPECT_EQ(json.rfind("{\"adapters\": [", 0), 0u) << json;
  EXPECT_NE(json.find("\"qpn\": 16773123"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tx_packets\": 12345"), std::string::npos) << json;
  FILE* null = fopen("/dev/null", "w");
  EXPECT_EQ(ndwv_counters_write(null, "yaml"), -1);
  fclose(null);
}

}  // namespace
}  // namespace ndwv::dev
