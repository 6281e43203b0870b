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
  static const std::vector<SettingInfo> table = {
    {"NDWV_LOG_LEVEL", SettingType::Choice, "error", 0, 0, "error,warn,info,debug,trace",
     "Least severe log level written to stderr."},
    {"NDWV_TRANSPORTS", SettingType::Choice, "iwarp", 0, 0, "iwarp",
     "Transports offered as adapters, in order of preference."},
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
     "Connection setup (TCP connect and MPA exchange) time limit, in milliseconds."},
    {"NDWV_DISCONNECT_TIMEOUT_MS", SettingType::Integer, "5000", 10, 600000, nullptr,
     "How long Disconnect waits for the peer's close before it flushes anyway (ND_TIMEOUT)."},
    {"NDWV_WORK_THREADS", SettingType::Integer, "2", 1, 16, nullptr,
     "Threads in the process's shared work pool (QP state changes, flushes)."},
    {"NDWV_POLL_PROGRESS", SettingType::Boolean, "1", 0, 1, nullptr,
     "A caller polling an empty CQ also drives receive progress (saves a thread hand-off)."},
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

const Settings* LoadSettings() {
  static Settings settings;
  static bool ok = false;
  static std::once_flag once;
  std::call_once(once, [] {
    ok = true;
    for (const SettingInfo& s : SettingTable()) {
      const char* env = getenv(s.name);
      const char* text = env ? env : s.default_value;
      int64_t number = 0;
      std::string choice;
      if (!Parse(s, text, &number, &choice)) {
        Refuse(s, text);
        ok = false;
        continue;
      }
      std::string_view n = s.name;
      if (n == "NDWV_LOG_LEVEL") {
        settings.log_level = int(number);
        g_log_level.store(int(number), std::memory_order_relaxed);
      }
      else if (n == "NDWV_TRANSPORTS") settings.transports = choice;
      else if (n == "NDWV_MPA_CRC") settings.mpa_crc = number;
      else if (n == "NDWV_IWARP_CONFIRM") settings.confirm = Settings::Confirm(number);
      else if (n == "NDWV_MPA_MAX_ULPDU") settings.mpa_max_ulpdu = uint32_t(number);
      else if (n == "NDWV_CM_TIMEOUT_MS") settings.cm_timeout_ms = uint32_t(number);
      else if (n == "NDWV_DISCONNECT_TIMEOUT_MS") settings.disconnect_timeout_ms = uint32_t(number);
      else if (n == "NDWV_WORK_THREADS") settings.work_threads = uint32_t(number);
      else if (n == "NDWV_POLL_PROGRESS") settings.poll_progress = number;
    }
  });
  return ok ? &settings : nullptr;
}

}  // namespace ndwv::base

extern "C" void ndwv_settings_describe(FILE* out) {
  for (const auto& s : ndwv::base::SettingTable()) {
    const char* env = getenv(s.name);
    fprintf(out, "%-28s default %-8s%s%s%s\n    %s", s.name, s.default_value, env ? " (set: " : "",
            env ? env : "", env ? ")" : "", s.meaning);
    if (s.type == ndwv::base::SettingType::Integer)
      fprintf(out, " Range %lld..%lld.", (long long)s.min, (long long)s.max);
    else if (s.type == ndwv::base::SettingType::Choice)
      fprintf(out, " One of: %s.", s.choices);
    fprintf(out, "\n");
  }
}
