// Shared pieces of the scale benchmarks (tcp_scale, nd_scale; bench/README.md, "Many
// connections"): the command line, the server process the client starts and steers over a
// control socket, the figures of a process (CPU, memory, descriptors, threads) and of the kernel
// (packets sent), a watchdog for steps that overrun their bound, the ledger of requests
// (exactly-once accounting) and the phase driver that prints the report.
//
// A run is one client process; it starts the server as its child (this program again, with
// --serve), so that both live and die together and the client can ask the server for its figures
// at every phase boundary. The phases: setup (N connections, K connects in flight), idle, echo-all
// (one message on every connection, answered), teardown (K disconnects in flight).
//
// Header-only, as bench_common.h: bench/CMakeLists.txt builds every bench/*.cpp as its own
// executable.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace scale {

// Exit status of both programs.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;   // connections lost or failed, a phase past its bound, a ledger mismatch
constexpr int kExitUsage = 2;    // bad option, too few descriptors, the server did not start
constexpr int kExitStuck = 3;    // the watchdog ended a step that never returned

inline std::uint64_t NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000u + std::uint64_t(ts.tv_nsec) / 1000u;
}

// Milliseconds from now until `untilUs` (0 if past), for poll-style waits.
inline int MsUntil(std::uint64_t untilUs) {
  std::uint64_t now = NowUs();
  if (now >= untilUs) return 0;
  std::uint64_t ms = (untilUs - now + 999) / 1000;
  return int(std::min<std::uint64_t>(ms, 1u << 30));
}

[[noreturn]] inline void Die(const std::string& message, int code = kExitUsage) {
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  _exit(code);
}

// ---- command line ----------------------------------------------------------------------------

struct Options {
  unsigned connections = 1000;
  unsigned outstanding = 64;  // connects (client) and connection requests (server) in flight
  unsigned size = 64;         // bytes of the echo message
  unsigned idleSeconds = 10;
  unsigned cqs = 1;           // nd_scale: completion queues the QPs share
  unsigned boundSeconds = 60; // bound of the setup, echo and teardown phases, each
  unsigned port = 0;          // 0: the server takes a free port and says which
  bool mpa = false;           // tcp_scale: MPA's setup messages on every connection
  bool crash = false;         // the server is killed instead of the teardown
  int serveFd = -1;           // --serve FD: this process is the server; FD is its control socket
};

inline const char* const kOptionsUsage =
    "  -n, --connections N  connections (default 1000)\n"
    "  -k, --outstanding K  connects in flight at once, and the server's connection requests\n"
    "                       (default 64); disconnects likewise\n"
    "  --size B             bytes of the echo message (default 64)\n"
    "  --idle S             seconds the connections stay idle (default 10)\n"
    "  --bound S            bound of each of the setup, echo and teardown phases (default 60)\n"
    "  --port P             the server's port on 127.0.0.1 (default 0: a free one)\n"
    "  --crash              instead of the teardown, kill the server (SIGKILL) and time how long\n"
    "                       until every connection has reported its end\n"
    "  -h, --help           this text\n";

inline unsigned ParseNumber(const char* option, const char* text, unsigned min, unsigned max) {
  char* end = nullptr;
  errno = 0;
  unsigned long v = std::strtoul(text, &end, 10);
  if (errno || end == text || *end || v < min || v > max)
    Die(std::string("bad value '") + text + "' for " + option + " (" + std::to_string(min) + ".." +
        std::to_string(max) + ")");
  return unsigned(v);
}

// `extraUsage` lists the program's own options (nd_scale: --cqs; tcp_scale: --mpa); `isNd`:
// nd_scale, which takes --cqs, not --mpa.
inline Options ParseOptions(int argc, char** argv, const char* synopsis, const char* extraUsage,
                            bool isNd) {
  enum { kSize = 256, kIdle, kCqs, kBound, kPort, kServe, kMpa, kCrash };
  static const option longOptions[] = {
      {"connections", required_argument, nullptr, 'n'}, {"outstanding", required_argument, nullptr, 'k'},
      {"size", required_argument, nullptr, kSize},      {"idle", required_argument, nullptr, kIdle},
      {"cqs", required_argument, nullptr, kCqs},        {"bound", required_argument, nullptr, kBound},
      {"port", required_argument, nullptr, kPort},      {"serve", required_argument, nullptr, kServe},
      {"mpa", no_argument, nullptr, kMpa},              {"help", no_argument, nullptr, 'h'},
      {"crash", no_argument, nullptr, kCrash},
      {nullptr, 0, nullptr, 0}};
  Options o;
  int c;
  while ((c = getopt_long(argc, argv, "n:k:h", longOptions, nullptr)) != -1) {
    switch (c) {
      case 'n': o.connections = ParseNumber("--connections", optarg, 1, 1000000); break;
      case 'k': o.outstanding = ParseNumber("--outstanding", optarg, 1, 100000); break;
      case kSize: o.size = ParseNumber("--size", optarg, 16, 65536); break;
      case kIdle: o.idleSeconds = ParseNumber("--idle", optarg, 0, 86400); break;
      case kCqs:
        if (!isNd) Die("--cqs: only nd_scale has completion queues");
        o.cqs = ParseNumber("--cqs", optarg, 1, 100000);
        break;
      case kBound: o.boundSeconds = ParseNumber("--bound", optarg, 1, 86400); break;
      case kPort: o.port = ParseNumber("--port", optarg, 0, 65535); break;
      case kServe: o.serveFd = int(ParseNumber("--serve", optarg, 0, 1 << 20)); break;
      case kMpa:
        if (isNd) Die("--mpa: only tcp_scale's reference takes it (nd_scale's iWARP does MPA itself)");
        o.mpa = true;
        break;
      case kCrash: o.crash = true; break;
      case 'h':
        std::printf("usage: %s\n%s%s", synopsis, kOptionsUsage, extraUsage);
        std::exit(kExitOk);
      default:
        std::fprintf(stderr, "usage: %s\n%s%s", synopsis, kOptionsUsage, extraUsage);
        std::exit(kExitUsage);
    }
  }
  if (optind != argc) Die(std::string("unexpected argument '") + argv[optind] + "'");
  o.cqs = std::min(o.cqs, o.connections);
  return o;
}

inline sockaddr_in Loopback(unsigned port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(std::uint16_t(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return sa;
}

// The echo message of connection `index`: its number, a tag, then a pattern of its own, so that an
// answer that comes back on the wrong connection or altered does not compare equal.
inline void FillMessage(char* slot, unsigned index, unsigned size) {
  const std::uint32_t words[2] = {index, 0x6e647363};  // "ndsc"
  std::memcpy(slot, words, sizeof words);
  for (unsigned i = sizeof words; i < size; ++i) slot[i] = char(index * 31 + i);
}

// What a process of this run needs: TCP and iWARP a socket per connection; RoCE (the first
// transport NDWV_TRANSPORTS names) none per connection: the ports its connectors take in turn
// (NDWV_ROCE_CONNECTOR_PORTS, 64), a listener's, and up to 64 flows (a socket per peer port) for
// each of the two; all plus the library's few and the program's own.
inline unsigned DescriptorsNeeded(const Options& o, bool isNd) {
  const char* transports = std::getenv("NDWV_TRANSPORTS");
  if (!isNd || !transports || std::strncmp(transports, "roce", 4) != 0) return o.connections + 64;
  const char* ports = std::getenv("NDWV_ROCE_CONNECTOR_PORTS");
  return (ports ? unsigned(std::strtoul(ports, nullptr, 10)) : 64) + 2 * 64 + 64;
}

// Raises the descriptor limit to the hard limit and says whether `need` descriptors fit; a run
// that cannot fit ends here, before it starts, instead of failing somewhere in its setup.
inline void EnsureDescriptors(const char* program, unsigned need, bool quiet) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) Die("getrlimit(RLIMIT_NOFILE)");
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
    getrlimit(RLIMIT_NOFILE, &lim);
  }
  if (lim.rlim_cur < need)
    Die(std::string(program) + ": this run needs about " + std::to_string(need) +
        " descriptors per process, the limit is " + std::to_string(lim.rlim_cur) + " (hard " +
        std::to_string(lim.rlim_max) + "): lower -n, or raise the hard limit (as root: ulimit -Hn)");
  if (!quiet)
    std::printf("descriptors: limit %llu per process, this run needs about %u\n",
                (unsigned long long)lim.rlim_cur, need);
}

// ---- figures ---------------------------------------------------------------------------------

// Named numbers, sent between the processes as "name=value ..." and printed per phase.
using Figures = std::map<std::string, double>;

inline std::string Format(const Figures& f) {
  std::string out;
  char buf[64];
  for (const auto& [name, value] : f) {
    std::snprintf(buf, sizeof buf, "%.10g", value);
    if (!out.empty()) out += ' ';
    out += name + '=' + buf;
  }
  return out;
}

inline Figures ParseFigures(const std::string& text) {
  Figures f;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    std::size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    f[word.substr(0, eq)] = std::strtod(word.c_str() + eq + 1, nullptr);
  }
  return f;
}

inline double Get(const Figures& f, const std::string& name) {
  auto it = f.find(name);
  return it == f.end() ? 0.0 : it->second;
}

// "Name:   value kB" from /proc/self/status.
inline double StatusField(const char* name) {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  double v = -1;
  std::size_t n = std::strlen(name);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, name, n) == 0 && line[n] == ':') {
      v = std::strtod(line + n + 1, nullptr);
      break;
    }
  std::fclose(f);
  return v;
}

inline double OpenDescriptors() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  double n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // not the directory's own descriptor
}

inline double CpuMs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
         double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

// The CPU time so far of the process's threads by role, named by their thread names: ndwv's
// engine ("ndwv-engine"), its work pool ("ndwv-work"), and the program's own ("app"), from each
// thread's run time in nanoseconds (/proc/self/task/*/schedstat; getrusage's ticks are too coarse
// for one thread). With K requests in flight a setup runs at the pace of its busiest thread, and
// these say which one that is. A thread gone by the next sample takes its time with it.
inline std::map<std::string, double> ThreadCpuMs() {
  std::map<std::string, double> ms{{"app", 0}, {"engine", 0}, {"work", 0}};
  DIR* d = opendir("/proc/self/task");
  if (!d) return ms;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = std::string("/proc/self/task/") + e->d_name;
    char comm[32] = "", stat[128] = "";
    if (FILE* f = std::fopen((task + "/comm").c_str(), "r")) {
      if (!std::fgets(comm, sizeof comm, f)) comm[0] = 0;
      std::fclose(f);
    }
    if (FILE* f = std::fopen((task + "/schedstat").c_str(), "r")) {
      if (!std::fgets(stat, sizeof stat, f)) stat[0] = 0;
      std::fclose(f);
    }
    comm[std::strcspn(comm, "\n")] = 0;
    const char* role = std::strcmp(comm, "ndwv-engine") == 0 ? "engine"
                       : std::strcmp(comm, "ndwv-work") == 0 ? "work"
                                                              : "app";
    ms[role] += std::strtod(stat, nullptr) / 1e6;
  }
  closedir(d);
  return ms;
}

// What the process costs right now: resident memory, open descriptors, threads, and the CPU time
// so far (all threads, user + system; and by thread role, "cpu_<role>_ms"), read before and
// after the sampling ("cpu_ms", "cpu_after_ms"...) so that a phase's CPU leaves out the sampling
// itself (scanning /proc/self/fd at 10,000 descriptors is not free). `extra` adds the program's
// own figures.
template <class Extra>
Figures SampleProcess(Extra&& extra) {
  Figures f;
  const double before = CpuMs();
  const auto threads_before = ThreadCpuMs();
  f["rss_kb"] = StatusField("VmRSS");
  f["fds"] = OpenDescriptors();
  f["threads"] = StatusField("Threads");
  extra(f);
  f["cpu_ms"] = before;
  for (const auto& [role, ms] : threads_before) f["cpu_" + role + "_ms"] = ms;
  for (const auto& [role, ms] : ThreadCpuMs()) f["cpu_" + role + "_after_ms"] = ms;
  f["cpu_after_ms"] = CpuMs();
  return f;
}

inline Figures SampleProcess() {
  return SampleProcess([](Figures&) {});
}

// CPU milliseconds between two samples, without the sampling: of the whole process, or of the
// threads of one role ("app", "engine", "work").
inline double CpuDuring(const Figures& a, const Figures& b, const std::string& role = "") {
  const std::string key = role.empty() ? "cpu" : "cpu_" + role;
  return Get(b, key + "_ms") - Get(a, key + "_after_ms");
}

// The kernel's packet counters of this network namespace (/proc/net/snmp): TCP segments and UDP
// datagrams sent, keepalive probes and ACKs included. bench/scale.sh runs each pair in a network
// namespace of its own, where they count this run's packets only. And the packets the kernel
// dropped because a CPU's input backlog was full (/proc/net/softnet_stat, the second column, of
// every namespace: the machine's): on loopback every packet passes that queue of
// net.core.netdev_max_backlog (1,000 by default), and a burst sent from one softirq (TCP
// keepalive probes whose timers fall due together) can overflow it.
inline Figures SampleKernel() {
  Figures f;
  if (FILE* stat = std::fopen("/proc/net/softnet_stat", "r")) {
    unsigned dropped;
    double drops = 0;
    while (std::fscanf(stat, "%*x %x%*[^\n]", &dropped) == 1) drops += dropped;
    std::fclose(stat);
    f["backlog_drops"] = drops;
  }
  FILE* in = std::fopen("/proc/net/snmp", "r");
  if (!in) return f;
  char header[1024], values[1024];
  while (std::fgets(header, sizeof header, in) && std::fgets(values, sizeof values, in)) {
    std::string proto = header;
    proto = proto.substr(0, proto.find(':'));
    if (proto != "Tcp" && proto != "Udp") continue;
    std::istringstream names(header + proto.size() + 1), numbers(values + proto.size() + 1);
    std::string name;
    double v;
    while (names >> name && numbers >> v) {
      if (proto == "Tcp" && name == "OutSegs") f["tcp_out_segs"] = v;
      if (proto == "Udp" && name == "OutDatagrams") f["udp_out_datagrams"] = v;
    }
  }
  std::fclose(in);
  return f;
}

// ---- watchdog ----------------------------------------------------------------------------------
// A call that never returns (a library bug the benchmark is meant to find) must end the run with
// a message, not hang it: every step is armed with its bound; past it SIGALRM names the step,
// kills the server child and exits kExitStuck.

inline std::atomic<const char*> g_step{""};
inline std::atomic<pid_t> g_child{0};
inline const char* g_program = "scale";

inline void WriteRaw(const char* s) {
  ssize_t ignored = write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

inline void OnAlarm(int) {
  WriteRaw(g_program);
  WriteRaw(": watchdog: step '");
  WriteRaw(g_step.load());
  WriteRaw("' overran its bound (a call that never returned?); ending the run\n");
  if (pid_t child = g_child.load(); child > 0) kill(child, SIGKILL);
  _exit(kExitStuck);
}

inline void Watch(const char* step, unsigned seconds) {
  static bool installed = false;
  if (!installed) {
    struct sigaction sa{};
    sa.sa_handler = OnAlarm;
    sigaction(SIGALRM, &sa, nullptr);
    installed = true;
  }
  g_step = step;
  alarm(seconds);
}

// ---- control channel ---------------------------------------------------------------------------
// Lines of text over a socket pair. Client -> server:
//   begin PHASE                        -> "figures NAME=VALUE ..." (taken at once)
//   end PHASE COUNTER TARGET BOUND_MS  -> "figures reached=0|1 ..." once the server's COUNTER
//                                         reaches TARGET, or when BOUND_MS has passed
//   quit BOUND_MS                      -> "ledger LINE" lines, then "done ...": the server
//                                         cancels what is outstanding, releases everything, exits
// Server -> client first: "ready port=P" (listening), or "error MESSAGE".

class LineChannel {
 public:
  explicit LineChannel(int fd = -1) : fd_(fd) {}
  int fd() const { return fd_; }
  bool eof() const { return eof_; }

  void Send(const std::string& line) {
    std::string out = line + '\n';
    const char* p = out.data();
    std::size_t left = out.size();
    while (left) {
      ssize_t n = ::send(fd_, p, left, MSG_NOSIGNAL);
      if (n > 0) {
        p += n;
        left -= std::size_t(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else {
        return;  // the peer is gone; its absence shows on the next Receive
      }
    }
  }

  // The next line, waiting at most timeoutMs (-1: no bound). False on timeout or end of stream.
  bool Receive(std::string* line, int timeoutMs) {
    const std::uint64_t until = timeoutMs < 0 ? 0 : NowUs() + std::uint64_t(timeoutMs) * 1000;
    for (;;) {
      if (TakeLine(line)) return true;
      if (eof_) return false;
      pollfd p{fd_, POLLIN, 0};
      int wait = timeoutMs < 0 ? -1 : MsUntil(until);
      int r = poll(&p, 1, wait);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) return false;
      ReadSome();
    }
  }

  // Without waiting: reads what the socket holds (for an event loop that saw it readable).
  bool ReadSome() {
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      buffer_.append(buf, std::size_t(n));
      return true;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) eof_ = true;
    return false;
  }

  bool TakeLine(std::string* line) {
    std::size_t nl = buffer_.find('\n');
    if (nl == std::string::npos) return false;
    *line = buffer_.substr(0, nl);
    buffer_.erase(0, nl + 1);
    return true;
  }

 private:
  int fd_;
  bool eof_ = false;
  std::string buffer_;
};

// The client's handle on its server: this program again, with "--serve 3" and the control socket
// on descriptor 3. The server dies with the client (PR_SET_PDEATHSIG).
class ServerProcess {
 public:
  void Start(int argc, char** argv) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) Die("socketpair failed");
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t parent = getpid();
    pid_ = fork();
    if (pid_ < 0) Die("fork failed");
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(kExitUsage);
      if (sv[1] == 3) {
        fcntl(3, F_SETFD, 0);
      } else if (dup2(sv[1], 3) != 3) {
        _exit(kExitUsage);
      }
      std::vector<char*> args(argv, argv + argc);
      static char serve[] = "--serve", three[] = "3";
      args.push_back(serve);
      args.push_back(three);
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      _exit(kExitUsage);
    }
    close(sv[1]);
    channel_ = LineChannel(sv[0]);
    g_child = pid_;
  }

  pid_t pid() const { return pid_; }
  void Send(const std::string& line) { channel_.Send(line); }
  bool Receive(std::string* line, int timeoutMs) { return channel_.Receive(line, timeoutMs); }

  // Sends `request` and returns the reply, which must start with `expect`; a server that does not
  // answer within timeoutMs is stuck (or dead): it is killed and the run ends.
  std::string Ask(const std::string& request, const std::string& expect, int timeoutMs) {
    Send(request);
    return Expect(expect, "answer '" + request + "'", timeoutMs);
  }

  // The server's next line that starts with `expect` (what follows it), within timeoutMs.
  std::string Expect(const std::string& expect, const std::string& what, int timeoutMs) {
    std::string line;
    for (;;) {
      if (!Receive(&line, timeoutMs)) {
        Kill();
        Die("the server did not " + what + " within " + std::to_string(timeoutMs / 1000) + " s (" +
                (channel_.eof() ? "it exited" : "stuck") + ")",
            channel_.eof() ? kExitFailed : kExitStuck);
      }
      if (line.rfind(expect, 0) == 0) return line.substr(std::min(line.size(), expect.size() + 1));
      std::fprintf(stderr, "server: %s\n", line.c_str());  // anything else is the server's news
    }
  }

  void Kill() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }

  // Waits (bounded) for the server to exit; returns its exit status, or -1 if it had to be killed.
  int Wait(unsigned timeoutMs) {
    const std::uint64_t until = NowUs() + std::uint64_t(timeoutMs) * 1000;
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (NowUs() >= until) {
        Kill();
        waitpid(pid_, &status, 0);
        g_child = 0;
        return -1;
      }
      usleep(10000);
    }
    g_child = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  LineChannel channel_;
};

// ---- ledger ----------------------------------------------------------------------------------
// Exactly-once accounting: every request posted, and every completion with its status and the
// phase it came in, marked expected or not by the program. A request posted and never completed,
// a completion for a request that was not outstanding, and an unexpected status are mismatches.

class Ledger {
 public:
  void Posted(const std::string& kind) { Entry(kind).posted++; }
  void Completed(const std::string& kind, const std::string& status, const std::string& phase,
                 bool expected) {
    auto& e = Entry(kind);
    e.completed++;
    e.outcomes[{!expected, status, phase}]++;
  }
  // A completion for a request that was not outstanding (not counted as a completion).
  void Duplicate(const std::string& kind) { Entry(kind).duplicates++; }

  unsigned Mismatches() const {
    unsigned n = 0;
    for (const auto& [kind, e] : entries_) {
      n += e.duplicates + (e.posted > e.completed ? e.posted - e.completed : 0);
      for (const auto& [key, count] : e.outcomes)
        if (std::get<0>(key)) n += count;
    }
    return n;
  }

  // One line per kind of request: "Receive: posted 2000, completed 2000: ND_SUCCESS 1000 in
  // echo, ND_CANCELED 1000 in teardown", mismatches in capitals.
  std::vector<std::string> Lines() const {
    std::vector<std::string> out;
    for (const auto& kind : order_) {
      const auto& e = entries_.at(kind);
      std::string line = kind + ": posted " + std::to_string(e.posted) + ", completed " +
                         std::to_string(e.completed);
      const char* sep = ": ";
      for (const auto& [key, count] : e.outcomes) {
        const auto& [unexpected, status, phase] = key;
        line += sep;
        if (unexpected) line += "UNEXPECTED ";
        line += status + " " + std::to_string(count) + " in " + phase;
        sep = ", ";
      }
      if (e.posted > e.completed) line += "; NEVER COMPLETED " + std::to_string(e.posted - e.completed);
      if (e.posted < e.completed) line += "; MORE COMPLETIONS THAN REQUESTS";
      if (e.duplicates) line += "; COMPLETED TWICE " + std::to_string(e.duplicates);
      out.push_back(line);
    }
    return out;
  }

 private:
  struct Kind {
    unsigned posted = 0, completed = 0, duplicates = 0;
    // (unexpected, status, phase) -> count; expected outcomes sort first
    std::map<std::tuple<bool, std::string, std::string>, unsigned> outcomes;
  };
  Kind& Entry(const std::string& kind) {
    auto [it, added] = entries_.try_emplace(kind);
    if (added) order_.push_back(kind);
    return it->second;
  }
  std::map<std::string, Kind> entries_;
  std::vector<std::string> order_;
};

// ---- the server's side of the control protocol ---------------------------------------------------

// What a server counts, for the client's "end" waits and its figures: connections accepted,
// answers sent, connections closed, and connections lost (ended by the peer before teardown).
struct ServerCounts {
  unsigned accepted = 0, echoed = 0, closed = 0, lost = 0;

  double operator()(const std::string& name) const {
    if (name == "accepted") return accepted;
    if (name == "echoed") return echoed;
    if (name == "closed") return closed;
    if (name == "lost") return lost;
    return 0;
  }
  void AddTo(Figures& f) const {
    for (const char* name : {"accepted", "echoed", "closed", "lost"}) f[name] = (*this)(name);
  }
};

// The server's event loop hands it the client's lines and calls Check() after every event; it
// answers with the server's figures. `counter(name)` reads one of the server's counts
// ("accepted", "echoed", "closed", "lost") cheaply, as Check() runs after every event; `figures()`
// takes everything (process figures included) for a reply.
class ServerControl {
 public:
  using CounterFn = std::function<double(const std::string&)>;
  using FiguresFn = std::function<Figures()>;
  ServerControl(int fd, CounterFn counter, FiguresFn figures)
      : channel_(fd), counter_(std::move(counter)), figures_(std::move(figures)) {}
  LineChannel& channel() { return channel_; }
  const std::string& phase() const { return phase_; }
  bool quitting() const { return quitting_; }
  std::uint64_t quitDeadlineUs() const { return quitDeadline_; }

  void OnLine(const std::string& line) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    if (verb == "begin") {
      in >> phase_;
      Reply(-1);
    } else if (verb == "end") {
      unsigned boundMs = 0;
      in >> phase_ >> waitCounter_ >> target_ >> boundMs;
      waitDeadline_ = NowUs() + std::uint64_t(boundMs) * 1000;
      waiting_ = true;
      Check();
    } else if (verb == "quit") {
      unsigned boundMs = 0;
      in >> boundMs;
      phase_ = "release";
      quitting_ = true;
      quitDeadline_ = NowUs() + std::uint64_t(boundMs) * 1000;
    } else {
      channel_.Send("error unknown request '" + line + "'");
    }
  }

  // Answers a pending "end" whose counter reached its target or whose bound has passed.
  void Check() {
    if (!waiting_) return;
    bool reached = counter_(waitCounter_) >= target_;
    if (!reached && NowUs() < waitDeadline_) return;
    waiting_ = false;
    Reply(reached ? 1 : 0);
  }

  // How long the event loop may sleep: until the pending wait's bound (-1: no bound).
  int WaitMs() const { return waiting_ ? MsUntil(waitDeadline_) : -1; }

  // The last words: the ledger, then "done" with the figures and the mismatch count.
  void Finish(const Ledger& ledger) {
    for (const auto& line : ledger.Lines()) channel_.Send("ledger " + line);
    Figures out = figures_();
    out["mismatches"] = ledger.Mismatches();
    channel_.Send("done " + Format(out));
  }

 private:
  void Reply(int reached) {
    Figures f = figures_();
    if (reached >= 0) f["reached"] = reached;
    channel_.Send("figures " + Format(f));
  }

  LineChannel channel_;
  CounterFn counter_;
  FiguresFn figures_;
  std::string phase_ = "start", waitCounter_;
  double target_ = 0;
  bool waiting_ = false, quitting_ = false;
  std::uint64_t waitDeadline_ = 0, quitDeadline_ = 0;
};

// ---- the client's phase driver -------------------------------------------------------------------

// What a benchmark's client side does in each phase; the driver times the phases, takes both
// processes' figures around them, asks the server for its view and prints the report.
class ClientSide {
 public:
  virtual ~ClientSide() = default;
  virtual std::string Transport() = 0;
  // Each runs until its work is done or `untilUs`, and returns how many succeeded.
  // Setup: connections established (their completion times appended to `times`, in µs).
  virtual unsigned Setup(std::uint64_t untilUs, std::vector<std::uint64_t>* times) = 0;
  // Idle: connections still up at `untilUs` (the call waits until then).
  virtual unsigned Idle(std::uint64_t untilUs) = 0;
  // Echo: answers received, right; `sent` is set to the messages sent.
  virtual unsigned Echo(std::uint64_t untilUs, unsigned* sent) = 0;
  // Teardown: connections disconnected (all of them are ended, the failed ones too).
  virtual unsigned Teardown(std::uint64_t untilUs) = 0;
  // Crash (instead of teardown; the server was just killed): connections that reported their end,
  // waiting until every one up has or `untilUs`.
  virtual unsigned AwaitEnds(std::uint64_t untilUs) = 0;
  // Releases what is left; bounded by the watchdog.
  virtual void Release(std::uint64_t untilUs) = 0;
  // Library counters (ndwv), prefixed "nd."; none for TCP.
  virtual Figures Counters() { return {}; }
  static constexpr unsigned kGraceS = 10;  // for connects in flight when setup's bound passes
  // Connections that ended by themselves (before teardown), and connects that failed.
  unsigned Lost() const { return lost_; }
  unsigned Failed() const { return failed_; }
  Ledger ledger;

 protected:
  static constexpr std::uint64_t kGraceUs = kGraceS * 1000000ull;

  // Setup's loop: keeps K connects in flight (`start(i)` starts connection i) until N are
  // established or have failed, or `untilUs`; `pump(untilUs)` handles what comes. Past the bound
  // no connect starts, and those in flight have a grace period, then `cancel()` and another.
  template <class Start, class Pump, class Cancel>
  unsigned ConnectAll(const Options& o, std::uint64_t untilUs, Start&& start, Pump&& pump, Cancel&& cancel) {
    unsigned next = 0;
    while (established_ + failed_ < o.connections) {
      while (connecting_ < o.outstanding && next < o.connections) start(next++);
      if (NowUs() >= untilUs || (connecting_ == 0 && next >= o.connections)) break;
      pump(untilUs);
    }
    std::uint64_t grace = NowUs() + kGraceUs;
    while (connecting_ > 0 && NowUs() < grace) pump(grace);
    if (connecting_ > 0) {
      cancel();
      grace = NowUs() + kGraceUs;
      while (connecting_ > 0 && NowUs() < grace) pump(grace);
    }
    return established_;
  }

  unsigned connecting_ = 0, established_ = 0, failed_ = 0, lost_ = 0;
};

struct PhaseReport {
  std::string name, what;  // "setup", "connected"
  unsigned done = 0, of = 0;
  double seconds = 0;
  unsigned lost = 0;  // connections that ended by themselves during the phase (client's view)
  bool complete = true;  // within its bound
  Figures client0, client1, server0, server1, kernel0, kernel1;
  std::vector<double> tenths;  // setup: connections per second in each tenth of N
};

inline double Delta(const Figures& a, const Figures& b, const std::string& name) {
  return Get(b, name) - Get(a, name);
}

inline std::string Mib(double kb) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", kb / 1024.0);
  return buf;
}

inline void PrintProcess(const char* who, const Figures& a, const Figures& b) {
  std::printf("  %s: cpu %.3f s (application threads %.3f, engine %.3f, work pool %.3f), rss %s (%+.1f), fds %.0f (%+.0f), threads %.0f\n",
              who, CpuDuring(a, b) / 1e3, CpuDuring(a, b, "app") / 1e3, CpuDuring(a, b, "engine") / 1e3,
              CpuDuring(a, b, "work") / 1e3, Mib(Get(b, "rss_kb")).c_str(),
              Delta(a, b, "rss_kb") / 1024.0, Get(b, "fds"), Delta(a, b, "fds"), Get(b, "threads"));
  std::string counters;
  for (const auto& [name, value] : b)
    if (name.rfind("nd.", 0) == 0 && value - Get(a, name) != 0)
      counters += " " + name.substr(3) + "=" + std::to_string((long long)(value - Get(a, name)));
  if (!counters.empty()) std::printf("    ndwv counters during the phase:%s\n", counters.c_str());
}

// Prints the phase for a reader, then one "@ phase=..." line of key=value for bench/scale.sh.
inline void PrintPhase(const PhaseReport& p, double rate, const char* rateUnit) {
  if (p.what.empty())
    std::printf("%s: %.3f s", p.name.c_str(), p.seconds);
  else
    std::printf("%s: %u of %u %s %.3f s", p.name.c_str(), p.done, p.of, p.what.c_str(), p.seconds);
  if (rate > 0) std::printf(": %.0f %s", rate, rateUnit);
  if (!p.complete) std::printf("  ** INCOMPLETE within its bound **");
  if (p.lost) std::printf("  ** %u LOST **", p.lost);
  std::printf("\n");
  if (!p.tenths.empty()) {
    std::printf("  per tenth (conn/s):");
    for (double t : p.tenths) std::printf(" %.0f", t);
    std::printf("\n");
  }
  PrintProcess("client", p.client0, p.client1);
  PrintProcess("server", p.server0, p.server1);
  double segs = Delta(p.kernel0, p.kernel1, "tcp_out_segs");
  double dgrams = Delta(p.kernel0, p.kernel1, "udp_out_datagrams");
  double drops = Delta(p.kernel0, p.kernel1, "backlog_drops");
  std::printf("  kernel: %.0f TCP segments, %.0f UDP datagrams sent (this network namespace); %.0f packets"
              " dropped at a full input backlog (the machine)\n", segs, dgrams, drops);

  std::printf("@ phase=%s done=%u of=%u lost=%u complete=%d seconds=%.6f rate=%.3f", p.name.c_str(),
              p.done, p.of, p.lost, p.complete ? 1 : 0, p.seconds, rate);
  for (const auto& [side, a, b] :
       {std::tuple{"c", &p.client0, &p.client1}, std::tuple{"s", &p.server0, &p.server1}}) {
    std::printf(" %s.cpu_ms=%.3f %s.rss_kb=%.0f %s.fds=%.0f %s.threads=%.0f", side,
                CpuDuring(*a, *b), side, Get(*b, "rss_kb"), side, Get(*b, "fds"), side,
                Get(*b, "threads"));
    for (const char* role : {"app", "engine", "work"})
      std::printf(" %s.cpu_%s_ms=%.3f", side, role, CpuDuring(*a, *b, role));
    for (const auto& [name, value] : *b)
      if (name.rfind("nd.", 0) == 0)
        std::printf(" %s.%s=%.0f", side, name.c_str() + 3, value - Get(*a, name));
  }
  std::printf(" kernel.tcp_out_segs=%.0f kernel.udp_out_datagrams=%.0f kernel.backlog_drops=%.0f", segs, dgrams, drops);
  if (!p.tenths.empty()) {
    std::printf(" tenths=");
    for (std::size_t i = 0; i < p.tenths.size(); ++i) std::printf("%s%.0f", i ? "," : "", p.tenths[i]);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Connections per second in each tenth of N, from the completion times (µs since the phase
// began). Tenths not reached are left out.
inline std::vector<double> Tenths(const std::vector<std::uint64_t>& times, unsigned n) {
  std::vector<double> out;
  if (n < 10) return out;
  std::vector<std::uint64_t> t = times;
  std::sort(t.begin(), t.end());
  std::uint64_t start = 0;
  for (unsigned i = 1; i <= 10; ++i) {
    std::size_t end = std::size_t(n) * i / 10;
    if (end > t.size()) break;
    std::size_t begin = std::size_t(n) * (i - 1) / 10;
    double us = double(t[end - 1] - start);
    out.push_back(us > 0 ? double(end - begin) * 1e6 / us : 0);
    start = t[end - 1];
  }
  return out;
}

// Runs the four phases against the server and prints the report; returns the exit status.
inline int RunClient(ClientSide& side, const Options& o, ServerProcess& server, const char* program) {
  const int replyMs = 10000;  // a server's answer to "begin", which it gives at once
  const int boundMs = int(o.boundSeconds) * 1000;
  std::printf("%s: %s, %u connections, %u outstanding, %u CQ%s, %u-byte echo, idle %u s, bound %u s per phase\n",
              program, side.Transport().c_str(), o.connections, o.outstanding, o.cqs,
              o.cqs == 1 ? "" : "s", o.size, o.idleSeconds, o.boundSeconds);
  std::fflush(stdout);
  std::vector<std::string> failures;

  auto counters = [&](Figures& f) {
    for (auto& [k, v] : side.Counters()) f[k] = v;
  };
  auto begin = [&](PhaseReport& p, const char* name, const char* what, unsigned of) {
    p.name = name;
    p.what = what;
    p.of = of;
    p.server0 = ParseFigures(server.Ask(std::string("begin ") + name, "figures", replyMs));
    p.client0 = SampleProcess(counters);
    p.kernel0 = SampleKernel();
  };
  unsigned lostSoFar = 0;
  auto sample = [&](PhaseReport& p) {
    p.client1 = SampleProcess(counters);
    p.kernel1 = SampleKernel();
    p.lost = side.Lost() - lostSoFar;
    lostSoFar += p.lost;
    if (p.lost) failures.push_back(p.name + ": " + std::to_string(p.lost) + " connections lost");
  };
  auto end = [&](PhaseReport& p, const char* counter, unsigned target, int waitMs) {
    Figures s = ParseFigures(server.Ask("end " + p.name + " " + counter + " " + std::to_string(target) +
                                            " " + std::to_string(waitMs),
                                        "figures", waitMs + replyMs));
    if (Get(s, "reached") == 0) {
      p.complete = false;
      failures.push_back(p.name + ": the server's " + counter + " reached " +
                         std::to_string((long long)Get(s, counter)) + " of " + std::to_string(target));
    }
    p.server1 = s;
    return s;
  };

  // A phase that did not finish in its bound; `of` is what it should have done.
  auto incomplete = [&](PhaseReport& p, unsigned of, const char* verb) {
    p.complete = false;
    failures.push_back(p.name + ": " + std::to_string(p.done) + " of " + std::to_string(of) + " " + verb +
                       " within " + std::to_string(o.boundSeconds) + " s");
  };
  // What is left of a phase's bound that began at t0, in ms.
  auto leftMs = [&](std::uint64_t t0) {
    std::uint64_t spent = NowUs() - t0, bound = std::uint64_t(boundMs) * 1000;
    return int((bound - std::min(spent, bound)) / 1000);
  };

  // (a) setup
  PhaseReport setup;
  begin(setup, "setup", "connected in", o.connections);
  Watch("setup", o.boundSeconds + 2 * ClientSide::kGraceS + 30);
  std::uint64_t t0 = NowUs();
  std::vector<std::uint64_t> times;
  setup.done = side.Setup(t0 + std::uint64_t(boundMs) * 1000, &times);
  sample(setup);
  Watch("setup: the server's figures", o.boundSeconds + 30);
  // Setup ends when the server has accepted them all, not when the client's side is done.
  end(setup, "accepted", setup.done, leftMs(t0));
  setup.seconds = double(NowUs() - t0) / 1e6;
  for (auto& t : times) t -= t0;
  setup.tenths = Tenths(times, o.connections);
  if (setup.done < o.connections) {
    incomplete(setup, o.connections, "connected");
    failures.back() += " (" + std::to_string(side.Failed()) + " connects failed or canceled)";
  }
  PrintPhase(setup, setup.seconds > 0 ? setup.done / setup.seconds : 0, "conn/s");
  const unsigned accepted = unsigned(Get(setup.server1, "accepted"));

  // (b) idle
  PhaseReport idle;
  begin(idle, "idle", "still up after", setup.done - setup.lost);
  Watch("idle", o.idleSeconds + 30);
  t0 = NowUs();
  idle.done = side.Idle(t0 + std::uint64_t(o.idleSeconds) * 1000000);
  idle.seconds = double(NowUs() - t0) / 1e6;
  sample(idle);
  end(idle, "accepted", 0, 0);
  PrintPhase(idle, 0, "");

  // (c) echo-all
  PhaseReport echo;
  unsigned sent = 0;
  begin(echo, "echo", "answered in", idle.done);
  Watch("echo", o.boundSeconds + 30);
  t0 = NowUs();
  echo.done = side.Echo(t0 + std::uint64_t(boundMs) * 1000, &sent);
  echo.seconds = double(NowUs() - t0) / 1e6;
  sample(echo);
  end(echo, "echoed", sent, echo.done == sent ? replyMs : 0);
  if (echo.done < sent || sent < idle.done) incomplete(echo, idle.done, "answered");
  PrintPhase(echo, echo.seconds > 0 ? echo.done / echo.seconds : 0, "answers/s");

  // (d) teardown, or (--crash) the server killed: how long until every connection reports its end
  PhaseReport last;
  if (o.crash) {
    begin(last, "crash", "reported ended in", setup.done - lostSoFar);
    Watch("crash", o.boundSeconds + 30);
    server.Kill();
    t0 = NowUs();
    last.done = side.AwaitEnds(t0 + std::uint64_t(boundMs) * 1000);
    last.seconds = double(NowUs() - t0) / 1e6;
    last.client1 = SampleProcess(counters);
    last.kernel1 = SampleKernel();
    last.server1 = last.server0;  // gone: nothing more from it
    if (last.done < last.of) incomplete(last, last.of, "reported ended");
  } else {
    begin(last, "teardown", "disconnected in", setup.done);
    Watch("teardown", o.boundSeconds + 30);
    t0 = NowUs();
    last.done = side.Teardown(t0 + std::uint64_t(boundMs) * 1000);
    sample(last);
    Watch("teardown: the server's figures", o.boundSeconds + 30);
    end(last, "closed", accepted, leftMs(t0));
    last.seconds = double(NowUs() - t0) / 1e6;
    if (last.done < setup.done) incomplete(last, setup.done, "disconnected");
  }
  PrintPhase(last, last.seconds > 0 ? last.done / last.seconds : 0, "conn/s");

  // Release (both sides: what they hold afterwards shows what was not given back), then both
  // ledgers (a killed server has none).
  PhaseReport release;
  release.name = "release";
  release.client0 = last.client1;
  release.server0 = last.server1;
  release.kernel0 = SampleKernel();
  Watch("release", o.boundSeconds + 30);
  t0 = NowUs();
  side.Release(NowUs() + std::uint64_t(boundMs) * 1000);
  release.client1 = SampleProcess();
  std::vector<std::string> serverLedger;
  Figures serverDone = last.server1;
  if (!o.crash) {
    server.Send("quit " + std::to_string(boundMs));
    for (;;) {
      std::string line;
      if (!server.Receive(&line, boundMs + replyMs)) {
        server.Kill();
        failures.push_back("release: the server did not finish within " + std::to_string(o.boundSeconds) + " s");
        break;
      }
      if (line.rfind("ledger ", 0) == 0) {
        serverLedger.push_back(line.substr(7));
      } else if (line.rfind("done", 0) == 0) {
        serverDone = ParseFigures(line.substr(4));
        break;
      } else {
        std::fprintf(stderr, "server: %s\n", line.c_str());
      }
    }
  }
  release.seconds = double(NowUs() - t0) / 1e6;
  release.server1 = serverDone;
  release.kernel1 = SampleKernel();
  const int serverExit = server.Wait(10000), killed = 128 + SIGKILL;
  alarm(0);
  PrintPhase(release, 0, "");

  std::printf("accounting (every request completes once, with the status its phase calls for):\n");
  for (const auto& line : side.ledger.Lines()) std::printf("  client %s\n", line.c_str());
  for (const auto& line : serverLedger) std::printf("  server %s\n", line.c_str());
  unsigned mismatches = side.ledger.Mismatches() + unsigned(Get(serverDone, "mismatches"));
  if (mismatches) failures.push_back(std::to_string(mismatches) + " ledger mismatches");
  // Lost: ended by themselves, before the teardown (or the crash, whose ends are the point).
  unsigned lost = o.crash ? lostSoFar : side.Lost(), serverLost = unsigned(Get(serverDone, "lost"));
  if (lost || serverLost)
    failures.push_back("connections lost: " + std::to_string(lost) + " seen by the client, " +
                       std::to_string(serverLost) + " by the server");
  if (serverExit != (o.crash ? killed : 0))
    failures.push_back("the server exited with status " + std::to_string(serverExit));

  std::printf("@ result=%s lost=%u server_lost=%u failed=%u mismatches=%u\n",
              failures.empty() ? "ok" : "failed", lost, serverLost, side.Failed(), mismatches);
  if (failures.empty()) {
    std::printf("result: ok\n");
    return kExitOk;
  }
  std::printf("result: FAILED\n");
  for (const auto& f : failures) std::printf("  %s\n", f.c_str());
  return kExitFailed;
}

// main() of both programs: the options and the descriptor check, then either the server
// (--serve: `serve(options)` returns its exit status) or the client, which starts the server,
// builds its side with `makeClient(options, serverPort)` and runs the phases.
template <class Serve, class MakeClient>
int Main(int argc, char** argv, const char* program, const char* extraUsage, bool isNd, Serve&& serve,
         MakeClient&& makeClient) {
  const std::string synopsis = std::string(program) + " [options]";
  Options o = ParseOptions(argc, argv, synopsis.c_str(), extraUsage, isNd);
  const bool serving = o.serveFd >= 0;
  static std::string name;
  name = std::string(program) + (serving ? " server" : "");
  g_program = name.c_str();
  EnsureDescriptors(g_program, DescriptorsNeeded(o, isNd), serving);
  if (serving) return serve(o);
  ServerProcess server;
  server.Start(argc, argv);
  std::string ready = server.Expect("ready", "start listening", 30000);
  auto client = makeClient(o, unsigned(Get(ParseFigures(ready), "port")));
  return RunClient(*client, o, server, program);
}

}  // namespace scale
