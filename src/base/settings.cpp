#include "base/settings.h"

#include "base/log.h"
#include "ndwv/ndwv.h"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>
#include <mutex>

namespace ndwv::base {

const std::vector<SettingInfo>& SettingTable() {
  static const std::vector<SettingInfo>& table = *new std::vector<SettingInfo>{
    {"NDWV_LOG_LEVEL", SettingType::Choice, "error", 0, 0, "error,warn,info,debug,trace",
     "Least severe log level written to stderr."},
    {"NDWV_TRANSPORTS", SettingType::Choice, "iwarp+roce", 0, 0, "iwarp,roce,iwarp+roce,roce+iwarp",
     "Transports offered as devices, in order of preference: an adapter (an IP address) is "
     "served by the first. Both peers must use the same transport."},
    {"NDWV_MPA_CRC", SettingType::Boolean, "1", 0, 1, nullptr,
     "iWARP: request MPA CRC-32C on every FPDU (used if either side asks for it)."},
    {"NDWV_IWARP_CONFIRM", SettingType::Choice, "writes", 0, 0, "none,writes,all",
     "iWARP: which requests complete only after a zero-length Read confirms the peer placed them, "
     "so that a refusal is reported on the request itself: RDMA Writes (an access violation "
     "completes ND_ACCESS_VIOLATION), all (Sends too: no receive posted completes ND_IO_TIMEOUT, "
     "at a round trip per Send), or none (complete when handed to TCP, as RNICs do). Every ndwv "
     "peer answers such a Read."},
    {"NDWV_MPA_MAX_ULPDU", SettingType::Integer, "65000", 256, 65000, nullptr,
     "iWARP: largest DDP segment sent, in bytes. Large segments cost fewer system calls per byte; a software receiver reassembles them across TCP segments."},
    {"NDWV_CM_TIMEOUT_MS", SettingType::Integer, "10000", 10, 600000, nullptr,
     "iWARP connection setup time limit, in milliseconds: for a TCP connect and the delivery of "
     "the MPA Request, and again for a request's wait in a listener's queue for "
     "GetConnectionRequest (then it is rejected); the wait for the peer's Accept has none."},
    {"NDWV_DISCONNECT_TIMEOUT_MS", SettingType::Integer, "5000", 10, 600000, nullptr,
     "How long Disconnect waits for the peer's close before it flushes anyway (ND_TIMEOUT); on "
     "iWARP also how long a connection ended by a Terminate keeps its socket until the peer's "
     "TCP has taken the Terminate."},
    {"NDWV_IWARP_TIMEOUT_MS", SettingType::Integer, "10000", 0, 600000, nullptr,
     "iWARP: data unacknowledged by the peer's TCP this long ends the connection (TCP_USER_TIMEOUT; "
     "an idle connection is probed with TCP keepalives after 2 s of silence, then every second "
     "while unanswered): the oldest unconfirmed request ends ND_IO_TIMEOUT, the rest are flushed, "
     "NotifyDisconnect completes. Below ~8 s, a burst of probes lost on a busy host can end a "
     "healthy idle connection. 0: TCP's own default (many minutes)."},
    {"NDWV_ROCE_PORT", SettingType::Integer, "0", 0, 65535, nullptr,
     "RoCE: UDP port the process's connectors bound to port 0 share (4791 is the standard RoCEv2 "
     "port, for a process that owns the host's device); 0: they share NDWV_ROCE_CONNECTOR_PORTS "
     "ports the kernel picks. A connector bound to a given port, and a listener, have their own."},
    {"NDWV_ROCE_CONNECTOR_PORTS", SettingType::Integer, "64", 1, 1024, nullptr,
     "RoCE without NDWV_ROCE_PORT: how many UDP ports the process's connectors bound to port 0 "
     "share, per address, each the kernel's choice, taken in turn: a burst of datagrams to "
     "thousands of connections spreads over that many socket buffers. 1: one port, the fewest "
     "descriptors."},
    {"NDWV_ROCE_CM_TIMEOUT_MS", SettingType::Integer, "1000", 1, 60000, nullptr,
     "RoCE: IB CM response timeout (REQ, REP, DREQ retransmit interval), in milliseconds. A "
     "floor: while a port's answers are measured to take longer (busy engines), the wait follows "
     "them, up to 8 times this."},
    {"NDWV_ROCE_CM_RETRIES", SettingType::Integer, "7", 0, 15, nullptr,
     "RoCE: a REQ, REP or DREQ unanswered after 1 + this many response timeouts gives up (Connect "
     "ND_IO_TIMEOUT, or ND_TIMEOUT, try again, if the listener asked it to wait; v1's always "
     "ND_TIMEOUT; Disconnect ND_TIMEOUT); within that, each retransmission "
     "waits twice as long as the one before."},
    {"NDWV_ROCE_TIMEWAIT_MS", SettingType::Integer, "1000", 0, 60000, nullptr,
     "RoCE: IB CM time-wait after a disconnect, in milliseconds; also how long a connection's "
     "flow (its socket to the peer's port) stays open after it, for the next connection with "
     "that peer port."},
    {"NDWV_ROCE_ACK_TIMEOUT_MS", SettingType::Integer, "200", 1, 60000, nullptr,
     "RoCE: local ACK timeout: a request unacknowledged this long is retransmitted. A floor: "
     "while acknowledgements are measured to take longer (busy engines), the wait follows them, "
     "up to 8 times this."},
    {"NDWV_ROCE_RETRY_COUNT", SettingType::Integer, "7", 0, 7, nullptr,
     "RoCE: retransmissions without progress before requests end ND_IO_TIMEOUT and the QP "
     "fails."},
    {"NDWV_ROCE_RNR_TIMER", SettingType::Integer, "24", 0, 31, nullptr,
     "RoCE: IB RNR timer code our RNR NAKs ask the sender to wait (24 = 40.96 ms; 0 = 655 ms)."},
    {"NDWV_ROCE_RNR_RETRY", SettingType::Integer, "6", 0, 7, nullptr,
     "RoCE: times a Send refused for want of a receive is retried (7 = forever) before it "
     "ends ND_IO_TIMEOUT."},
    {"NDWV_ROCE_KEEPALIVE_MS", SettingType::Integer, "2000", 0, 600000, nullptr,
     "RoCE: an idle connection sends an acknowledged zero-length Write this often, so that a "
     "peer whose process died (no kernel closes its connections) is noticed: its requests fail "
     "ND_IO_TIMEOUT, receives are flushed, NotifyDisconnect completes. With many connections "
     "the interval is 2 ms per connection if that is longer (10,000: 20 s), so that liveness "
     "costs a process about 1 % of a core at most; a connection that finds its peer's port closed "
     "(ICMP) makes the others to that port probe it at once. 0: never."},
    {"NDWV_ROCE_SOCKET_BUFFER", SettingType::Integer, "4194304", 65536, 67108864, nullptr,
     "RoCE: bytes of receive and send buffer each UDP port of the process asks for (the kernel "
     "grants twice that; a process without CAP_NET_ADMIN at most twice net.core.rmem_max, "
     "416 KiB on Debian's defaults). A connection keeps at most as many packets unacknowledged "
     "as the granted receive buffer surely holds (64 at most; 48 of 4 KiB in 416 KiB), so that "
     "one stream cannot overflow its peer's socket, assumed to be granted the same."},
    {"NDWV_ROCE_ECN", SettingType::Boolean, "1", 0, 1, nullptr,
     "RoCE: datagrams go ECN-capable (ECT(0)), as a RoCEv2 NIC's do, so that a router with ECN "
     "marks them Congestion Experienced where it would drop them; a marked datagram makes its "
     "receiver send the sender a congestion notification (CNP), which halves the sender's "
     "window. 0: Not-ECT, and marks are not read (a network that mishandles ECN)."},
    {"NDWV_WORK_THREADS", SettingType::Integer, "2", 1, 16, nullptr,
     "Threads in the process's shared work pool (QP state changes and flushes asked for off the engine; "
     "the engine runs its own once its turn is done)."},
    {"NDWV_POLL_PROGRESS", SettingType::Boolean, "1", 0, 1, nullptr,
     "A caller polling an empty CQ also drives receive progress (saves a thread hand-off)."},
    {"NDWV_CAPTURE", SettingType::String, "", 0, 0, nullptr,
     "Packet capture: a pcap file (created or truncated at the device's first packet) to which "
     "every packet the device sends and receives is written: RoCE datagrams as UDP, iWARP "
     "connections as TCP segments (Ethernet and IP headers made up, sequence numbers counting "
     "the bytes of each direction). One write per packet, so the file stays readable if the "
     "process is killed. %p in the path becomes the process ID (two processes, two files). "
     "Empty: no capture."},
    {"NDWV_COUNTERS", SettingType::Choice, "off", 0, 0, "off,exit,signal",
     "Writes the device's counters (per adapter and per connection; docs/counters.md) to stderr, "
     "or to NDWV_COUNTERS_FILE: at process exit (exit), or whenever the process receives "
     "SIGUSR2 (signal). Programs read them at any time with ndwv_counters_snapshot."},
    {"NDWV_COUNTERS_FILE", SettingType::String, "", 0, 0, nullptr,
     "Where NDWV_COUNTERS writes its report (appended; %p in the path becomes the process ID). "
     "Empty: stderr."},
  };
  return table;
}

namespace {

bool Parse(const SettingInfo& s, const char* text, int64_t* number, std::string* choice) {
  switch (s.type) {
    case SettingType::Boolean:
      if (!strcmp(text, "1") || !strcmp(text, "true") || !strcmp(text, "yes")) { *number = 1; return true; }
      if (!strcmp(text, "0") || !strcmp(text, "false") || !strcmp(text, "no")) { *number = 0; return true; }
      return false;
    case SettingType::Integer: {
      char* end = nullptr;
      errno = 0;
      long long v = strtoll(text, &end, 0);
      if (errno || end == text || *end || v < s.min || v > s.max) return false;
      *number = v;
      return true;
    }
    case SettingType::String:
      *choice = text;
      return true;
    case SettingType::Choice: {
      std::string all = std::string(",") + s.choices + ",";
      if (!*text || strchr(text, ',') || all.find(std::string(",") + text + ",") == std::string::npos) return false;
      *choice = text;
      std::string before = all.substr(1, all.find(std::string(",") + text + ",") );
      *number = std::count(before.begin(), before.end(), ',');
      return true;
    }
  }
  return false;
}

void Refuse(const SettingInfo& s, const char* value) {
  if (s.type == SettingType::Integer)
    fprintf(stderr, "ndwv: %s=\"%s\" refused: expected an integer in [%lld, %lld]\n", s.name, value,
            (long long)s.min, (long long)s.max);
  else if (s.type == SettingType::Boolean)
    fprintf(stderr, "ndwv: %s=\"%s\" refused: expected 0 or 1\n", s.name, value);
  else
    fprintf(stderr, "ndwv: %s=\"%s\" refused: expected one of %s\n", s.name, value, s.choices);
}

}  // namespace

namespace {

// Fills `settings` from the environment (or only the defaults); false if a value was refused.
bool Fill(Settings& settings, bool environment) {
    bool ok = true;
    for (const SettingInfo& s : SettingTable()) {
      const char* env = environment ? getenv(s.name) : nullptr;
      const char* text = env ? env : s.default_value;
      int64_t number = 0;
      std::string choice;
      if (!Parse(s, text, &number, &choice)) {
        Refuse(s, text);
        ok = false;
        continue;
      }
      std::string_view n = s.name;
      if (n == "NDWV_LOG_LEVEL") settings.log_level = int(number);
      else if (n == "NDWV_TRANSPORTS") settings.transports = choice;
      else if (n == "NDWV_MPA_CRC") settings.mpa_crc = number;
      else if (n == "NDWV_IWARP_CONFIRM") settings.confirm = Settings::Confirm(number);
      else if (n == "NDWV_MPA_MAX_ULPDU") settings.mpa_max_ulpdu = uint32_t(number);
      else if (n == "NDWV_CM_TIMEOUT_MS") settings.cm_timeout_ms = uint32_t(number);
      else if (n == "NDWV_DISCONNECT_TIMEOUT_MS") settings.disconnect_timeout_ms = uint32_t(number);
      else if (n == "NDWV_IWARP_TIMEOUT_MS") settings.iwarp_timeout_ms = uint32_t(number);
      else if (n == "NDWV_ROCE_PORT") settings.roce_port = uint16_t(number);
      else if (n == "NDWV_ROCE_CONNECTOR_PORTS") settings.roce_connector_ports = uint32_t(number);
      else if (n == "NDWV_ROCE_CM_TIMEOUT_MS") settings.roce_cm_timeout_ms = uint32_t(number);
      else if (n == "NDWV_ROCE_CM_RETRIES") settings.roce_cm_retries = uint32_t(number);
      else if (n == "NDWV_ROCE_TIMEWAIT_MS") settings.roce_timewait_ms = uint32_t(number);
      else if (n == "NDWV_ROCE_ACK_TIMEOUT_MS") settings.roce_ack_timeout_ms = uint32_t(number);
      else if (n == "NDWV_ROCE_RETRY_COUNT") settings.roce_retry_count = uint8_t(number);
      else if (n == "NDWV_ROCE_RNR_TIMER") settings.roce_rnr_timer = uint8_t(number);
      else if (n == "NDWV_ROCE_RNR_RETRY") settings.roce_rnr_retry = uint8_t(number);
      else if (n == "NDWV_ROCE_KEEPALIVE_MS") settings.roce_keepalive_ms = uint32_t(number);
      else if (n == "NDWV_ROCE_SOCKET_BUFFER") settings.roce_socket_buffer = uint32_t(number);
      else if (n == "NDWV_ROCE_ECN") settings.roce_ecn = number;
      else if (n == "NDWV_WORK_THREADS") settings.work_threads = uint32_t(number);
      else if (n == "NDWV_POLL_PROGRESS") settings.poll_progress = number;
      else if (n == "NDWV_CAPTURE") settings.capture = choice;
      else if (n == "NDWV_COUNTERS") settings.counters = Settings::Counters(number);
      else if (n == "NDWV_COUNTERS_FILE") settings.counters_file = choice;
    }
    return ok;
}

}  // namespace

const Settings* LoadSettings() {
  static Settings& settings = *new Settings;  // never destroyed (settings.h)
  static bool ok = false;
  static std::once_flag once;
  std::call_once(once, [] {
    ok = Fill(settings, true);
    if (ok) g_log_level.store(settings.log_level, std::memory_order_relaxed);
  });
  return ok ? &settings : nullptr;
}

const Settings& Config() {
  if (const Settings* loaded = LoadSettings()) return *loaded;
  static const Settings& defaults = *new Settings([] {
    Settings s;
    Fill(s, false);
    return s;
  }());
  return defaults;
}

}  // namespace ndwv::base

extern "C" void ndwv_settings_describe(FILE* out) {
  for (const auto& s : ndwv::base::SettingTable()) {
    const char* env = getenv(s.name);
    fprintf(out, "%-28s default %-8s%s%s%s\n    %s", s.name,
            *s.default_value ? s.default_value : "(empty)", env ? " (set: " : "",
            env ? env : "", env ? ")" : "", s.meaning);
    if (s.type == ndwv::base::SettingType::Integer)
      fprintf(out, " Range %lld..%lld.", (long long)s.min, (long long)s.max);
    else if (s.type == ndwv::base::SettingType::Choice)
      fprintf(out, " One of: %s.", s.choices);
    fprintf(out, "\n");
  }
}

namespace {

// Markdown table cells: no line breaks, and a literal '|' would end the cell.
void WriteCell(FILE* out, const char* text) {
  for (const char* p = text; *p; ++p) {
    if (*p == '|') fputs("\\|", out);
    else if (*p == '\n') fputc(' ', out);
    else fputc(*p, out);
  }
}

}  // namespace

extern "C" void ndwv_settings_describe_markdown(FILE* out) {
  using ndwv::base::SettingType;
  fputs(
      "# Configuration reference\n"
      "\n"
      "<!-- Generated from the settings table in src/base/settings.cpp by `ndinfo --env --markdown`.\n"
      "     Do not edit by hand: regenerate with `cmake --build <build dir> --target configuration-doc`.\n"
      "     The test `docs_configuration` fails when this file and the table differ. -->\n"
      "\n"
      "ndwv is configured only through environment variables, all with the prefix `NDWV_`. Each is\n"
      "read once per process, when `NdStartup` first brings the device up; changing one afterwards\n"
      "has no effect. A value the variable does not accept makes `NdStartup` fail, with a message\n"
      "on stderr that names the variable and what it accepts. `ndinfo --env` prints the same list\n"
      "with the values set in the current environment.\n"
      "\n"
      "Value syntax: an integer is decimal (or hexadecimal with `0x`) within the range shown; a\n"
      "boolean is `1`, `true` or `yes`, or `0`, `false` or `no`; a choice is exactly one of the\n"
      "words listed.\n"
      "\n"
      "| Variable | Default | Accepted values | Meaning |\n"
      "|---|---|---|---|\n",
      out);
  for (const auto& s : ndwv::base::SettingTable()) {
    fprintf(out, "| `%s` | ", s.name);
    if (*s.default_value) fprintf(out, "`%s`", s.default_value);
    else fputs("(empty)", out);
    fputs(" | ", out);
    switch (s.type) {
      case SettingType::Integer:
        fprintf(out, "integer, %lld to %lld", (long long)s.min, (long long)s.max);
        break;
      case SettingType::Boolean:
        fputs("boolean", out);
        break;
      case SettingType::Choice: {
        fputs("one of ", out);
        std::string_view all = s.choices;
        bool first = true;
        while (!all.empty()) {
          size_t comma = all.find(',');
          std::string_view word = all.substr(0, comma);
          fprintf(out, "%s`%.*s`", first ? "" : ", ", int(word.size()), word.data());
          first = false;
          all = comma == std::string_view::npos ? std::string_view() : all.substr(comma + 1);
        }
        break;
      }
      case SettingType::String:
        fputs("text", out);
        break;
    }
    fputs(" | ", out);
    WriteCell(out, s.meaning);
    fputs(" |\n", out);
  }
}
