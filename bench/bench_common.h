// Shared pieces of the reference benchmarks (tcp_pingpong, tcp_stream): option helpers, size
// lists, the system-wide CPU sampler and the result table in the layout of the NetworkDirect
// example tools (nd-tools.md §7), so that bench/run.sh parses ndwv's tools and these the same way.
//
// Header-only on purpose: bench/CMakeLists.txt builds every bench/*.cpp as its own executable.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace bench {

constexpr std::size_t kMaxSize = 4u << 20;            // 4 MiB, the largest ND tool size
constexpr std::uint64_t kIterBudget = 2097152000ull;  // iterations = min(maxIter, budget / size)

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "error: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

[[noreturn]] inline void fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::exit(1);
}

inline std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
}

// "8", "64K", "1M" (binary multiples); returns 0 on a malformed number.
inline std::size_t parse_size(const std::string& s) {
  if (s.empty()) return 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (end == s.c_str()) return 0;
  std::string suffix(end);
  if (suffix == "k" || suffix == "K" || suffix == "KiB") v <<= 10;
  else if (suffix == "m" || suffix == "M" || suffix == "MiB") v <<= 20;
  else if (!suffix.empty()) return 0;
  return std::size_t(v);
}

// Comma-separated list of sizes, each 1..max.
inline std::vector<std::size_t> parse_sizes(const std::string& list, std::size_t max) {
  std::vector<std::size_t> out;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    std::size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    std::string tok = list.substr(pos, comma - pos);
    std::size_t v = parse_size(tok);
    if (v == 0 || v > max) fail("bad size '" + tok + "' (1.." + std::to_string(max) + ")");
    out.push_back(v);
    pos = comma + 1;
  }
  return out;
}

// 1 B doubling up to max (inclusive), like the ND tools' 23 rows for max = 4 MiB.
inline std::vector<std::size_t> doubling_sizes(std::size_t max) {
  std::vector<std::size_t> out;
  for (std::size_t s = 1; s <= max; s <<= 1) out.push_back(s);
  return out;
}

inline std::uint64_t iterations_for(std::size_t size, std::uint64_t max_iter, std::uint64_t fixed) {
  if (fixed) return fixed;
  std::uint64_t n = kIterBudget / size;
  if (n > max_iter) n = max_iter;
  return n ? n : 1;
}

// System-wide CPU use as the ND tools report it: (1 - idle/total) * 100 * processors.
struct CpuSample {
  unsigned long long idle = 0, total = 0;
};

inline CpuSample cpu_sample() {
  CpuSample s;
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return s;
  unsigned long long v[8] = {};
  if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
                  &v[5], &v[6], &v[7]) == 8) {
    for (auto x : v) s.total += x;
    s.idle = v[3] + v[4];
  }
  std::fclose(f);
  return s;
}

inline long processors() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

inline double cpu_percent(const CpuSample& a, const CpuSample& b) {
  unsigned long long total = b.total - a.total, idle = b.idle - a.idle;
  if (total == 0) return 0.0;
  return (1.0 - double(idle) / double(total)) * 100.0 * double(processors());
}

// A busy-polling process should be on a CPU all the time. The share of wall time it actually ran
// tells whether it had its core to itself: when another process (a build, a test) shares the
// core, the figure says more about that process than about the network path.
struct OnCpu {
  std::uint64_t wall0 = now_ns(), cpu0 = process_cpu_ns();

  static std::uint64_t process_cpu_ns() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return std::uint64_t(ts.tv_sec) * 1000000000ull + std::uint64_t(ts.tv_nsec);
  }
  // Warns on stderr (the table stays clean) when the process ran less than 90 % of the interval
  // since construction; bench/run.sh collects these lines ("the CPU was shared").
  void report(const char* what, std::size_t size) const {
    std::uint64_t wall = now_ns() - wall0, cpu = process_cpu_ns() - cpu0;
    if (wall < 100000000ull) return;  // under 0.1 s (a warm-up): too short to judge
    double share = double(cpu) / double(wall);
    if (share < 0.90)
      std::fprintf(stderr, "warning: %s, size %zu: on a CPU %.0f%% of %.2f s (the CPU was shared; figure unreliable)\n",
                   what, size, share * 100.0, double(wall) / 1e9);
  }
};

// The ND tools' table (nd-tools.md §7): widths 9, 9, 9, 7, 11; Size and Iter carry a literal 'l'.
inline void print_table_header() {
  std::printf("Using %ld processors. Sender Frequency is %llu\n\n", processors(), 1000000000ull);
  std::printf("%9s%9s%9s%7s%11s\n", "Size", "Iter", "Latency", "CPU", "Bytes/Sec");
  std::fflush(stdout);
}

inline void print_table_row(std::size_t size, std::uint64_t iter, double latency_us, double cpu,
                            double bytes_per_sec) {
  std::printf("%9zul%9llul%9.2f%7.2f%11.0f\n", size, (unsigned long long)iter, latency_us, cpu,
              bytes_per_sec);
  std::fflush(stdout);
}

// "a.b.c.d[:port]", "[:]port" or "" -> address and port (host defaults to 127.0.0.1).
inline sockaddr_in parse_endpoint(const std::string& text, std::uint16_t default_port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(default_port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (text.empty()) return sa;
  std::string host = text, port;
  std::size_t colon = text.rfind(':');
  if (colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  } else if (text.find('.') == std::string::npos) {
    host.clear();  // a bare number is a port
    port = text;
  }
  if (!port.empty()) {
    char* end = nullptr;
    unsigned long p = std::strtoul(port.c_str(), &end, 10);
    if (*end || p == 0 || p > 65535) fail("bad port '" + port + "'");
    sa.sin_port = htons(std::uint16_t(p));
  }
  if (!host.empty() && inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1)
    fail("bad IPv4 address '" + host + "'");
  return sa;
}

inline void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) die("fcntl(O_NONBLOCK)");
}

inline void set_nodelay(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0) die("setsockopt(TCP_NODELAY)");
}

inline int tcp_listen(const sockaddr_in& sa) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) < 0) die("bind");
  if (listen(fd, 16) < 0) die("listen");
  return fd;
}

// Connects, retrying "refused" for up to retry_ms so that a client may start before its server.
inline int tcp_connect(const sockaddr_in& sa, unsigned retry_ms) {
  std::uint64_t deadline = now_ns() + std::uint64_t(retry_ms) * 1000000ull;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) == 0) return fd;
    int err = errno;
    close(fd);
    if ((err != ECONNREFUSED && err != ETIMEDOUT && err != ECONNRESET) || now_ns() > deadline) {
      errno = err;
      die("connect");
    }
    usleep(20000);
  }
}

// Blocking-or-spinning full transfers. With a non-blocking fd these spin (busy-poll) on EAGAIN.
// Return false when the peer closed the connection.
inline bool send_all(int fd, const void* buf, std::size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      len -= std::size_t(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      continue;
    } else {
      if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return false;
      die("send");
    }
  }
  return true;
}

inline bool recv_all(int fd, void* buf, std::size_t len) {
  char* p = static_cast<char*>(buf);
  while (len) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n > 0) {
      p += n;
      len -= std::size_t(n);
    } else if (n == 0) {
      return false;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      continue;
    } else {
      if (errno == ECONNRESET) return false;
      die("recv");
    }
  }
  return true;
}

// Every process bounds its own life (default set by each tool): SIGALRM's default action ends it.
inline void arm_watchdog(unsigned seconds) {
  if (seconds) alarm(seconds);
}

}  // namespace bench
