#include "dev/counters.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "base/fork.h"
#include "base/mutex.h"
#include "base/log.h"
#include "base/settings.h"
#include "dev/address.h"
#include "dev/engine.h"

namespace ndwv::dev {

namespace {

enum Scope : uint8_t {
  kIwarp = 1, kRoce = 2, kBoth = 3,
  kConnection = 4,  // a connection's row has it too (else only the adapter's)
};

struct CounterInfo {
  const char* name;
  uint8_t scope;
};

constexpr CounterInfo kInfo[kCounters] = {
    {"tx_packets", kBoth | kConnection},
    {"tx_bytes", kBoth | kConnection},
    {"rx_packets", kBoth | kConnection},
    {"rx_bytes", kBoth | kConnection},
    {"tx_sends", kBoth | kConnection},
    {"tx_writes", kBoth | kConnection},
    {"tx_reads", kBoth | kConnection},
    {"rx_sends", kBoth | kConnection},
    {"rx_writes", kBoth | kConnection},
    {"rx_reads", kBoth | kConnection},
    {"flushes", kBoth | kConnection},
    {"flushed_requests", kBoth | kConnection},
    {"retransmits", kRoce | kConnection},
    {"ack_timeouts", kRoce | kConnection},
    {"keepalives_sent", kRoce | kConnection},
    {"rx_duplicates", kRoce | kConnection},
    {"rx_out_of_sequence", kRoce | kConnection},
    {"naks_sent_sequence", kRoce | kConnection},
    {"naks_sent_rnr", kRoce | kConnection},
    {"naks_sent_access", kRoce | kConnection},
    {"naks_sent_invalid_request", kRoce | kConnection},
    {"naks_sent_remote_op", kRoce | kConnection},
    {"naks_received_sequence", kRoce | kConnection},
    {"naks_received_rnr", kRoce | kConnection},
    {"naks_received_access", kRoce | kConnection},
    {"naks_received_invalid_request", kRoce | kConnection},
    {"naks_received_remote_op", kRoce | kConnection},
    {"retry_exceeded", kRoce | kConnection},
    {"rnr_retry_exceeded", kRoce | kConnection},
    {"tx_confirm_reads", kIwarp | kConnection},
    {"rx_confirm_reads", kIwarp | kConnection},
    {"tx_coalesced", kIwarp | kConnection},
    {"terminates_sent_rdmap", kIwarp | kConnection},
    {"terminates_sent_ddp", kIwarp | kConnection},
    {"terminates_sent_llp", kIwarp | kConnection},
    {"terminates_received_rdmap", kIwarp | kConnection},
    {"terminates_received_ddp", kIwarp | kConnection},
    {"terminates_received_llp", kIwarp | kConnection},
    {"drops_bad_crc", kIwarp | kConnection},
    {"drops_bad_ddp", kIwarp | kConnection},
    {"mpa_requests_sent", kIwarp},
    {"mpa_requests_received", kIwarp},
    {"mpa_replies_sent", kIwarp},
    {"mpa_replies_received", kIwarp},
    {"mpa_rejects_sent", kIwarp},
    {"mpa_rejects_received", kIwarp},
    {"drops_bad_mpa", kIwarp},
    {"port_datagrams_sent", kRoce},
    {"port_datagrams_received", kRoce},
    {"port_send_failed", kRoce},
    {"drops_bad_packet", kRoce},
    {"drops_bad_icrc", kRoce},
    {"drops_unknown_qp", kRoce},
    {"drops_wrong_source", kRoce},
    {"drops_bad_mad", kRoce},
    {"cm_req_sent", kRoce},
    {"cm_mra_sent", kRoce},
    {"cm_rej_sent", kRoce},
    {"cm_rep_sent", kRoce},
    {"cm_rtu_sent", kRoce},
    {"cm_dreq_sent", kRoce},
    {"cm_drep_sent", kRoce},
    {"cm_req_received", kRoce},
    {"cm_mra_received", kRoce},
    {"cm_rej_received", kRoce},
    {"cm_rep_received", kRoce},
    {"cm_rtu_received", kRoce},
    {"cm_dreq_received", kRoce},
    {"cm_drep_received", kRoce},
    {"cm_retransmits", kRoce},
    {"cm_duplicate_answers", kRoce},
    {"cm_req_timeouts", kRoce},
    {"cm_rep_timeouts", kRoce},
    {"cm_dreq_timeouts", kRoce},
    {"cm_drops", kRoce},
    {"accepts_refused", kIwarp},
    {"reads_beyond_ird", kIwarp | kConnection},
    {"listen_backlog_full", kIwarp},
    {"mpa_request_timeouts", kIwarp},
    {"mpa_requests_abandoned", kIwarp},
    {"mpa_requests_expired", kIwarp},
    {"cm_reqs_invalid", kRoce},
    {"cm_reqs_backlog_full", kRoce},
    {"cm_reqs_expired", kRoce},
    {"cm_drops_wrong_source", kRoce},
    {"cm_clamped_timeouts", kRoce},
    {"cm_clamped_retries", kRoce},
    {"cm_clamped_mra_timeouts", kRoce},
    {"cm_mras_ignored", kRoce},
    {"cm_clamped_read_limits", kRoce},
    {"cm_clamped_rnr_retries", kRoce},
    {"cm_peer_address_mismatches", kRoce},
    {"late_engine_takeovers", kBoth},
    {"illegal_endpoint_transitions", kBoth},
    {"icmp_errors_ignored", kRoce},
    {"port_datagrams_overflowed", kRoce},
    {"cm_reqs_shed", kRoce},
    {"listen_backlog_waits", kIwarp},
    {"cm_reqs_backlog_waits", kRoce},
    {"peer_probes", kRoce},
    {"cnps_sent", kRoce | kConnection},
    {"cnps_received", kRoce | kConnection},
    {"port_datagrams_congestion_marked", kRoce},
};

const char* TransportName(Transport t) { return t == Transport::Roce ? "RoCEv2" : "iWARP"; }

}  // namespace

const char* CounterName(Counter c) { return size_t(c) < kCounters ? kInfo[size_t(c)].name : "?"; }
bool CounterApplies(Counter c, Transport t) {
  return size_t(c) < kCounters && (kInfo[size_t(c)].scope & (t == Transport::Roce ? kRoce : kIwarp));
}
// A connection's slots (counters.h) are exactly the counters its rows show.
constexpr bool SlotsAreThePerConnectionCounters() {
  for (size_t i = 0; i < kCounters; ++i)
    if (bool(kInfo[i].scope & kConnection) != (ConnectionSlot(Counter(i)) >= 0)) return false;
  return true;
}
static_assert(SlotsAreThePerConnectionCounters());

bool CounterPerConnection(Counter c) { return size_t(c) < kCounters && (kInfo[size_t(c)].scope & kConnection); }

// One per transport; never destroyed, so that connections (and the exit report) outlive static
// teardown safely. Its mutex is a leaf: nothing else is locked while it is held.
struct CounterRegistry {
  base::Mutex mutex{"CounterRegistry::mutex"};
  // The live connections in the order they registered: a list through the connections
  // themselves (their prev_ and next_ are under this mutex too), so that one ends in O(1)
  // however many live (a vector's erase was a scan).
  ConnectionCounters* first NDWV_GUARDED_BY(mutex) = nullptr;
  ConnectionCounters* last NDWV_GUARDED_BY(mutex) = nullptr;
  size_t live NDWV_GUARDED_BY(mutex) = 0;

  template <class Visit>
  void ForEachLive(Visit&& visit) const NDWV_REQUIRES(mutex) {
    for (const ConnectionCounters* c = first; c; c = c->next_) visit(*c);
  }
  CounterBlock totals;  // ended connections, and objects that count here directly
  std::atomic<LiveCounterSource> source{nullptr};

  static CounterRegistry& For(Transport t) {
    static CounterRegistry* const registries = new CounterRegistry[2];
    return registries[t == Transport::Roce ? 1 : 0];
  }
};

ConnectionCounters::~ConnectionCounters() {
  if (!registered_) return;
  CounterRegistry& registry = CounterRegistry::For(transport_);
  base::MutexLock lock(registry.mutex);
  (prev_ ? prev_->next_ : registry.first) = next_;
  (next_ ? next_->prev_ : registry.last) = prev_;
  --registry.live;
  for (size_t i = 0; i < kConnectionSlots; ++i) registry.totals.AddShared(CounterOfSlot(i), values_[i].load(std::memory_order_relaxed));
}

sockaddr_storage ConnectionCounters::Expanded(const IpAndPort& address) {
  sockaddr_storage expanded{};
  memcpy(&expanded, &address, sizeof address);
  return expanded;
}

std::string ConnectionCounters::Identity() const {
  return std::string(transport_ == Transport::Roce ? "roce" : "iwarp") + " qp " + std::to_string(qpn_) + " [" +
         Describe(local()) + " -> " + Describe(peer()) +
         (peer_qpn_ ? " qp " + std::to_string(peer_qpn_) : std::string()) + "]";
}

void ConnectionCounters::Register(Transport transport, uint32_t qpn, uint32_t peer_qpn,
                                  const sockaddr_storage& local, const sockaddr_storage& peer) {
  if (registered_) return;
  transport_ = transport;
  qpn_ = qpn;
  peer_qpn_ = peer_qpn;
  memcpy(&local_, &local, sizeof local_);  // the family's part (AF_INET or AF_INET6)
  memcpy(&peer_, &peer, sizeof peer_);
  CounterRegistry& registry = CounterRegistry::For(transport);
  base::MutexLock lock(registry.mutex);
  prev_ = registry.last;
  (registry.last ? registry.last->next_ : registry.first) = this;
  registry.last = this;
  ++registry.live;
  registered_ = true;
}

CounterBlock& AdapterCounters(Transport transport) { return CounterRegistry::For(transport).totals; }

void SetLiveCounterSource(Transport transport, LiveCounterSource source) {
  CounterRegistry::For(transport).source.store(source);
}

std::vector<CounterRow> CollectCounters(const std::vector<Transport>& transports, size_t max_connections,
                                        size_t* rows) {
  std::vector<CounterRow> adapters, connections;
  size_t all = 0;
  for (Transport t : transports) {
    CounterRow totals{t, true, 0, 0, {}, {}, {}};
    CounterRegistry& registry = CounterRegistry::For(t);
    {
      base::MutexLock lock(registry.mutex);
      registry.totals.AddTo(totals.values);
      all += 1 + registry.live;
      // Rows only for what the caller takes: a program that reads the totals now and then must
      // not copy ten thousand rows each time.
      connections.reserve(std::min(connections.size() + registry.live, max_connections));
      registry.ForEachLive([&](const ConnectionCounters& c) {
        if (connections.size() < max_connections) {
          CounterRow row{t, false, c.qpn(), c.peer_qpn(), c.local(), c.peer(), {}};
          c.AddTo(row.values);
          for (size_t i = 0; i < kCounters; ++i) totals.values[i] += row.values[i];
          connections.push_back(row);
        } else {
          c.AddTo(totals.values);
        }
      });
    }
    // After the totals: an object that ends meanwhile adds itself to totals already read, so it
    // is never counted twice (at worst missed by this one reading).
    if (LiveCounterSource source = registry.source.load()) source(totals.values);
    adapters.push_back(totals);
  }
  adapters.insert(adapters.end(), connections.begin(), connections.end());
  if (rows) *rows = all;
  return adapters;
}

namespace {

// "  name=value name=value ...", wrapped: never a line of bare numbers (bench/run.sh reads the
// tools' tables as rows of numbers).
void WriteValues(FILE* out, const CounterRow& row) {
  int column = 0;
  for (size_t i = 0; i < kCounters; ++i) {
    Counter c = Counter(i);
    if (!CounterApplies(c, row.transport) || (!row.adapter && !CounterPerConnection(c))) continue;
    char item[96];
    int n = snprintf(item, sizeof item, " %s=%llu", CounterName(c), (unsigned long long)row.values[i]);
    if (column == 0) {
      fputc(' ', out);
      column = 1;
    } else if (column + n > 100) {
      fputs("\n ", out);
      column = 1;
    }
    fputs(item, out);
    column += n;
  }
  if (column) fputc('\n', out);
}

void WriteJsonValues(FILE* out, const CounterRow& row) {
  fputs("{", out);
  bool first = true;
  for (size_t i = 0; i < kCounters; ++i) {
    Counter c = Counter(i);
    if (!CounterApplies(c, row.transport) || (!row.adapter && !CounterPerConnection(c))) continue;
    fprintf(out, "%s\"%s\": %llu", first ? "" : ", ", CounterName(c), (unsigned long long)row.values[i]);
    first = false;
  }
  fputs("}", out);
}

}  // namespace

bool WriteCounters(FILE* out, const char* format, const std::vector<Transport>& transports) {
  std::string f = format ? format : "text";
  if (f != "text" && f != "adapters" && f != "json") return false;
  std::vector<CounterRow> rows = CollectCounters(transports, f == "adapters" ? 0 : SIZE_MAX);
  if (f == "json") {
    fputs("{\"adapters\": [", out);
    bool first = true;
    for (const CounterRow& row : rows) {
      if (!row.adapter) continue;
      fprintf(out, "%s\n  {\"transport\": \"%s\", \"counters\": ", first ? "" : ",", TransportName(row.transport));
      WriteJsonValues(out, row);
      fputs("}", out);
      first = false;
    }
    fputs("],\n \"connections\": [", out);
    first = true;
    for (const CounterRow& row : rows) {
      if (row.adapter) continue;
      fprintf(out, "%s\n  {\"transport\": \"%s\", \"qpn\": %u, \"peer_qpn\": %u, \"local\": \"%s\", \"peer\": \"%s\", \"counters\": ",
              first ? "" : ",", TransportName(row.transport), row.qpn, row.peer_qpn, Describe(row.local).c_str(),
              Describe(row.peer).c_str());
      WriteJsonValues(out, row);
      fputs("}", out);
      first = false;
    }
    fputs("]}\n", out);
  } else {
    for (const CounterRow& row : rows) {
      if (f == "adapters" &&
          (!row.adapter || std::all_of(row.values.begin(), row.values.end(), [](uint64_t v) { return v == 0; })))
        continue;  // a short report: the adapters that saw traffic
      if (row.adapter)
        fprintf(out, "ndwv counters: %s adapter\n", TransportName(row.transport));
      else
        fprintf(out, "ndwv counters: %s qp %u [%s -> %s%s%s]\n", TransportName(row.transport), row.qpn,
                Describe(row.local).c_str(), Describe(row.peer).c_str(), row.peer_qpn ? " qp " : "",
                row.peer_qpn ? std::to_string(row.peer_qpn).c_str() : "");
      WriteValues(out, row);
    }
  }
  fflush(out);
  return true;
}

// ------------------------------------------------------------------------------------ reports

namespace {

std::vector<Transport>* g_report_transports = nullptr;  // set once, before any report
int g_signal_pipe[2] = {-1, -1};

// The report is composed in memory and written with one append: the reports of processes that
// share a file never interleave, and a process whose other thread calls exit() meanwhile (which
// ends it at once, this handler half run) leaves no report rather than an empty or cut one.
void WriteReport() {
  char* text = nullptr;
  size_t length = 0;
  FILE* memory = open_memstream(&text, &length);
  if (!memory) return;
  WriteCounters(memory, "text", *g_report_transports);
  fclose(memory);
  std::string path = base::Config().counters_file;
  for (size_t at; (at = path.find("%p")) != std::string::npos;) path.replace(at, 2, std::to_string(getpid()));
  int fd = path.empty() ? STDERR_FILENO : open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) {
    NDWV_LOG(Error, "NDWV_COUNTERS_FILE %s: %s", path.c_str(), strerror(errno));
  } else {
    for (size_t done = 0; done < length;) {
      ssize_t n = write(fd, text + done, length - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += size_t(n);
    }
    if (fd != STDERR_FILENO) close(fd);
  }
  free(text);
}

// SIGUSR2: only a byte into a pipe (async-signal-safe); the engine writes the report.
void OnReportSignal(int) {
  int saved = errno;
  char byte = 1;
  (void)!write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

struct ReportOnSignal final : IoHandler {
  void OnIo(uint32_t) override {
    char drain[64];
    bool asked = false;
    while (read(g_signal_pipe[0], drain, sizeof drain) > 0) asked = true;
    if (asked) WriteReport();
  }
};

}  // namespace

void StartCounterReports(const std::vector<Transport>& transports) {
  const base::Settings& settings = base::Config();
  if (settings.counters == base::Settings::Counters::Off) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    g_report_transports = new std::vector<Transport>(transports);
    for (Transport t : transports) CounterRegistry::For(t);  // exist before the exit handler
    if (settings.counters == base::Settings::Counters::Exit) {
      std::atexit(&WriteReport);
      return;
    }
    if (base::OpenPipe(g_signal_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
      NDWV_LOG(Error, "NDWV_COUNTERS=signal: no pipe (%s)", strerror(errno));
      return;
    }
    static auto* const handler = new std::shared_ptr<ReportOnSignal>(std::make_shared<ReportOnSignal>());
    Engine::Get().Watch(g_signal_pipe[0], EPOLLIN, *handler);
    struct sigaction action {};
    action.sa_handler = &OnReportSignal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR2, &action, nullptr);
  });
}

}  // namespace ndwv::dev
