#include "tool.h"

#include <ndwv/ndwv.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <thread>

namespace ndtool {

// ---- command line ----------------------------------------------------------------------------

[[noreturn]] void ExitWithUsage(const char* usage, int code) {
  std::fputs(usage, stdout);
  std::fflush(stdout);
  std::exit(code);
}

namespace {

bool Is(const char* arg, const char* a, const char* b = nullptr, const char* c = nullptr) {
  return std::strcmp(arg, a) == 0 || (b && std::strcmp(arg, b) == 0) || (c && std::strcmp(arg, c) == 0);
}

[[noreturn]] void Invalid(const char* message, const char* usage) {
  std::printf("%s\n\n", message);
  ExitWithUsage(usage, kExitUsage);
}

// Decimal port 1..65535; anything else is refused.
bool ParsePort(const char* text, std::uint16_t* port) {
  if (*text < '0' || *text > '9') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long value = std::strtoul(text, &end, 10);
  if (errno || *end || value == 0 || value > 65535) return false;
  *port = std::uint16_t(value);
  return true;
}

}  // namespace

bool ParseAddress(const char* text, std::uint16_t defaultPort, sockaddr_storage* out, ULONG* len) {
  std::string host = text;
  std::uint16_t port = defaultPort;
  bool v6 = false;
  if (!host.empty() && host[0] == '[') {  // [v6]:port or [v6]
    std::size_t close = host.find(']');
    if (close == std::string::npos) return false;
    std::string rest = host.substr(close + 1);
    host = host.substr(1, close - 1);
    v6 = true;
    if (!rest.empty() && (rest[0] != ':' || !ParsePort(rest.c_str() + 1, &port))) return false;
  } else if (host.find(':') != host.rfind(':')) {  // bare v6: two or more colons, no port
    v6 = true;
  } else if (std::size_t colon = host.find(':'); colon != std::string::npos) {
    if (!ParsePort(host.c_str() + colon + 1, &port)) return false;
    host.resize(colon);
  }
  *out = sockaddr_storage{};
  if (v6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(out);
    if (inet_pton(AF_INET6, host.c_str(), &sin6->sin6_addr) != 1) return false;
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    *len = sizeof(sockaddr_in6);
  } else {
    auto* sin = reinterpret_cast<sockaddr_in*>(out);
    if (inet_pton(AF_INET, host.c_str(), &sin->sin_addr) != 1) return false;
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    *len = sizeof(sockaddr_in);
  }
  return true;
}

bool IsZeroAddress(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr == 0;
  if (address->sa_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  return true;
}

const char* FormatAddress(const sockaddr* address, char* buffer, std::size_t size) {
  char ip[INET6_ADDRSTRLEN] = "?";
  unsigned port = 0;
  bool v6 = address->sa_family == AF_INET6;
  if (v6) {
    auto* sin6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof ip);
    port = ntohs(sin6->sin6_port);
  } else if (address->sa_family == AF_INET) {
    auto* sin = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof ip);
    port = ntohs(sin->sin_port);
  }
  if (port == 0)
    std::snprintf(buffer, size, "%s", ip);
  else
    std::snprintf(buffer, size, v6 ? "[%s]:%u" : "%s:%u", ip, port);
  return buffer;
}

bool RedirectOutput(const char* path) {
  // Truncate once, then append from both streams so that neither overwrites the other's text.
  if (!std::freopen(path, "w", stdout)) return false;
  if (!std::freopen(path, "a", stdout) || !std::freopen(path, "a", stderr)) return false;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a killed tool still leaves its finished rows
  return true;
}

Options ParseOptions(int argc, char* argv[], const ToolSpec& spec) {
  Options o;
  bool client = false, polling = false, write = false, read = false;
  const char* usage = spec.usage;
  const bool countsCycles = spec.defaultCycles != 0;
  o.cycles = spec.defaultCycles;
  // -h anywhere (also as the only argument) wins, as a user typing it expects.
  for (int i = 1; i < argc; ++i)
    if (Is(argv[i], "-h", "--help")) ExitWithUsage(usage, 0);
  if (argc < 2) Invalid("Exactly one of client (c or server (s) must be specified.", usage);

  // Options are every argument but the last, which is the address.
  int last = argc - 1;
  for (int i = 1; i < last; ++i) {
    const char* arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= last) ExitWithUsage(usage, kExitMissingValue);  // would swallow the address
      return argv[++i];
    };
    if (Is(arg, "-s", "-S")) {
      o.server = true;
    } else if (Is(arg, "-c", "-C")) {
      client = true;
    } else if (!countsCycles && Is(arg, "-b", "-B")) {
      o.blocking = true;
    } else if (!countsCycles && Is(arg, "-p", "-P")) {
      polling = true;
    } else if (spec.takesMemoryWait && Is(arg, "-m", "-M")) {
      o.memoryWait = true;
    } else if (Is(arg, "-n", "-N")) {
      (countsCycles ? o.cycles : o.nSge) = ULONG(std::strtoul(value(), nullptr, 10));
    } else if (!countsCycles && Is(arg, "-q", "-Q")) {
      o.queueDepth = ULONG(std::strtoul(value(), nullptr, 10));
    } else if (Is(arg, "-l", "-L", "--logFile")) {
      const char* path = value();
      if (!RedirectOutput(path)) {
        std::fprintf(stderr, "Cannot open log file %s: %s\n", path, std::strerror(errno));
        std::exit(kExitUsage);
      }
    } else if (spec.takesRdmaOp && Is(arg, "-w", "-W", "--write")) {
      write = true;
    } else if (spec.takesRdmaOp && Is(arg, "-r", "-R", "--read")) {
      read = true;
    } else {
      std::printf("Unknown option: %s\n\n", arg);
      ExitWithUsage(usage, kExitUsage);
    }
  }

  if (o.server == client) Invalid("Exactly one of client (c or server (s) must be specified.", usage);
  if (!ParseAddress(argv[last], spec.defaultPort, &o.address, &o.addressLength) ||
      IsZeroAddress(reinterpret_cast<sockaddr*>(&o.address)))
    Invalid("Bad address.", usage);
  if (int(o.blocking) + int(polling) + int(o.memoryWait) > 1)
    Invalid(spec.takesMemoryWait ? "At most one of blocking (b, polling (p or memory (m may be specified."
                                 : "Exactly one of blocking (b or polling (p must be specified.",
            usage);
  if (o.nSge == 0) Invalid("Invalid or missing SGE length", usage);
  if (countsCycles && o.cycles == 0) Invalid("Invalid or missing cycle count", usage);
  if (write && read) Invalid("At most one of write (w or read (r may be specified.", usage);
  o.op = read ? RdmaOp::Read : RdmaOp::Write;
  WaitTimeoutMs();  // a bad bound in the environment is refused now, not in the middle of a run
  RunTimeoutMs();
  StartWatchdog(spec.name);
  return o;
}

LocalOptions ParseLocalOptions(int argc, char* argv[], const LocalToolSpec& spec) {
  LocalOptions o;
  const char* usage = spec.usage;
  for (int i = 1; i < argc; ++i)
    if (Is(argv[i], "-h", "--help")) ExitWithUsage(usage, 0);
  if (argc < 2) ExitWithUsage(usage, kExitNoArguments);

  int last = argc - 1;
  for (int i = 1; i < last; ++i) {
    const char* arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= last) ExitWithUsage(usage, kExitMissingValue);  // would swallow the address
      return argv[++i];
    };
    if (spec.takesThreads && Is(arg, "-t", "-T", "--threads")) {
      o.threads = ULONG(std::strtoul(value(), nullptr, 10));
    } else if (Is(arg, "-l", "-L", "--logFile")) {
      const char* path = value();
      if (!RedirectOutput(path)) {
        std::fprintf(stderr, "Cannot open log file %s: %s\n", path, std::strerror(errno));
        std::exit(kExitUsage);
      }
    } else {
      std::printf("Unknown option: %s\n\n", arg);
      ExitWithUsage(usage, kExitUsage);
    }
  }

  if (!ParseAddress(argv[last], 0, &o.address, &o.addressLength) ||
      IsZeroAddress(reinterpret_cast<sockaddr*>(&o.address)))
    Invalid("Bad address.", usage);
  if (o.threads == 0) Invalid("Invalid or missing thread count", usage);
  WaitTimeoutMs();  // a bad bound in the environment is refused now
  StartWatchdog(spec.name);
  return o;
}

// ---- output ----------------------------------------------------------------------------------

void PrintBegin(const char* tool) {
  std::printf("Beginning test: %s.exe\n", tool);
  std::fflush(stdout);
}

void PrintCounters() {
  std::printf("\n");
  std::fflush(stdout);
  ndwv_counters_write(stdout, "adapters");
}

void PrintEnd(const char* tool) {
  std::printf("End of test: %s.exe\n", tool);
  std::fflush(stdout);
}

void PrintProcessors() {
  std::printf("Using %u processors. Sender Frequency is %llu\n\n", ProcessorCount(),
              (unsigned long long)kTimerFrequency);
  std::fflush(stdout);
}

void PrintTableHeader() {
  PrintProcessors();
  std::printf("%9s%9s%9s%7s%11s\n", "Size", "Iter", "Latency", "CPU", "Bytes/Sec");
  std::fflush(stdout);
}

void PrintTableRow(std::size_t size, std::uint64_t iterations, double latencyUs, double cpu,
                   double bytesPerSecond) {
  // The literal 'l' after Size and Iter reproduces the original's format typo (nd-tools.md §7).
  std::printf("%9zul%9llul%9.2f%7.2f%11.0f\n", size, (unsigned long long)iterations, latencyUs, cpu,
              bytesPerSecond);
  std::fflush(stdout);
}

// ---- timing ----------------------------------------------------------------------------------

std::uint64_t NowMicros() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000u + std::uint64_t(ts.tv_nsec) / 1000u;
}

void SleepMs(unsigned milliseconds) {
  timespec ts{time_t(milliseconds / 1000), long(milliseconds % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

unsigned ProcessorCount() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? unsigned(n) : 1u;
}

namespace {

// First line of /proc/stat: user nice system idle iowait irq softirq steal ...
void ReadCpuTimes(unsigned long long* idle, unsigned long long* total) {
  *idle = *total = 0;
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return;
  unsigned long long v[8] = {};
  if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3],
                  &v[4], &v[5], &v[6], &v[7]) == 8) {
    for (auto x : v) *total += x;
    *idle = v[3] + v[4];  // idle + iowait: time no process ran
  }
  std::fclose(f);
}

}  // namespace

void CpuMeter::Start() { ReadCpuTimes(&idle_, &total_); }

double CpuMeter::Stop() const {
  unsigned long long idle, total;
  ReadCpuTimes(&idle, &total);
  if (total <= total_) return 0.0;
  double busy = 1.0 - double(idle - idle_) / double(total - total_);
  return busy * 100.0 * ProcessorCount();
}

// ---- failures and bounds ---------------------------------------------------------------------

namespace {

[[noreturn]] void Die() {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(kExitFailure);
}

std::uint32_t EnvMs(const char* name, std::uint32_t fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  errno = 0;
  unsigned long long value = std::strtoull(text, &end, 10);
  if (errno || *end || value == 0 || value > 0xFFFFFFFEull) {
    std::printf("%s=%s: expected milliseconds, 1..4294967294\n", name, text);
    std::fflush(stdout);
    std::exit(kExitUsage);
  }
  return std::uint32_t(value);
}

}  // namespace

void Fail(const char* what, HRESULT hr, int line) {
  std::printf("%s failed: %08x  Line: %d\n", what, unsigned(hr), line);
  Die();
}

void FailMessage(const char* message, int line) {
  std::printf("%s  Line: %d\n", message, line);
  Die();
}

void FailPlain(const char* message) {
  std::printf("%s\n", message);
  Die();
}

void FailTimeout(const char* what, std::uint32_t timeoutMs, int line) {
  std::printf("%s failed: %08x  Line: %d\n", what, unsigned(0xC00000B5u), line);
  std::printf("  nothing happened within %u ms (bound set by NDWV_TOOL_TIMEOUT_MS)\n", timeoutMs);
  Die();
}

namespace {
std::atomic<std::uint64_t> progress{0};
}  // namespace

void NoteProgress() { progress.fetch_add(1, std::memory_order_relaxed); }

void StartWatchdog(const char* tool) {
  const std::uint64_t limitUs = (std::uint64_t(WaitTimeoutMs()) + 10000) * 1000;
  std::thread([tool, limitUs] {
    std::uint64_t seen = progress.load(std::memory_order_relaxed), since = NowMicros();
    for (;;) {
      SleepMs(500);
      std::uint64_t now = NowMicros(), count = progress.load(std::memory_order_relaxed);
      if (count != seen) {
        seen = count;
        since = now;
      } else if (now - since > limitUs) {
        std::printf("%s: a call into the ND library has not returned for %llu ms; giving up\n", tool,
                    (unsigned long long)((now - since) / 1000));
        Die();
      }
    }
  }).detach();
}

std::uint32_t WaitTimeoutMs() {
  static const std::uint32_t value = EnvMs("NDWV_TOOL_TIMEOUT_MS", 30000);
  return value;
}

std::uint32_t RunTimeoutMs() {
  static const std::uint32_t value = EnvMs("NDWV_TOOL_RUN_TIMEOUT_MS", 900000);
  return value;
}

// ---- test schedule ---------------------------------------------------------------------------

namespace {

[[noreturn]] void BadEnv(const char* name, const std::string& text, const char* expected) {
  std::printf("%s=%s: %s\n", name, text.c_str(), expected);
  std::fflush(stdout);
  std::exit(kExitUsage);
}

// "64", "64K", "1M" (binary multiples), 1..4 MiB; 0 when malformed or out of range.
std::size_t ParseSize(const std::string& token) {
  if (token.empty() || token[0] < '0' || token[0] > '9') return 0;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(token.c_str(), &end, 10);
  std::string suffix = end;
  if (suffix == "k" || suffix == "K" || suffix == "KiB")
    v <<= 10;
  else if (suffix == "m" || suffix == "M" || suffix == "MiB")
    v <<= 20;
  else if (!suffix.empty())
    return 0;
  if (errno || v == 0 || v > kMaxTransfer) return 0;
  return std::size_t(v);
}

}  // namespace

std::vector<std::size_t> TestSizes() {
  std::vector<std::size_t> sizes;
  if (const char* env = std::getenv("NDWV_BENCH_SIZES"); env && *env) {
    std::string list = env;
    std::size_t pos = 0;
    for (;;) {
      std::size_t comma = list.find(',', pos);
      std::string token = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
      std::size_t size = ParseSize(token);
      if (size == 0) BadEnv("NDWV_BENCH_SIZES", list, "expected a comma list of sizes 1..4M (K/M suffixes)");
      sizes.push_back(size);
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
  } else {
    for (std::size_t size = 1; size <= kMaxTransfer; size *= 2) sizes.push_back(size);
  }
  return sizes;
}

std::uint64_t IterationCap(std::uint64_t maxIterations) {
  std::uint64_t cap = maxIterations;
  if (const char* env = std::getenv("NDWV_BENCH_ITERS"); env && *env) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(env, &end, 10);
    if (errno || *end || v == 0) BadEnv("NDWV_BENCH_ITERS", env, "expected a positive iteration count");
    if (v < cap) cap = v;
  }
  return cap;
}

int RunMeasuringTool(int argc, char* argv[], const ToolSpec& spec, std::uint64_t maxIterations,
                     ToolSide server, ToolSide client) {
  Options options = ParseOptions(argc, argv, spec);
  std::vector<Round> rounds = TestSchedule(maxIterations);
  PrintBegin(spec.name);
  int rc = (options.server ? server : client)(options, rounds);
  PrintCounters();
  PrintEnd(spec.name);
  return rc;
}

std::vector<Round> TestSchedule(std::uint64_t maxIterations) {
  std::vector<std::size_t> sizes = TestSizes();
  std::uint64_t cap = IterationCap(maxIterations);
  std::vector<Round> rounds;
  for (std::size_t size : sizes) {
    std::uint64_t iterations = kIterBudget / size;
    if (iterations > cap) iterations = cap;
    rounds.push_back({size, iterations ? iterations : 1});
  }
  return rounds;
}

}  // namespace ndtool
