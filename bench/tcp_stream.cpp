// tcp_stream: the socket reference for one-way bandwidth (ndrping -w RDMA Write rate, ndping send
// rate): one TCP stream, the client writes `size`-byte messages, the server reads them.
//
// One connection per size. The client sends a small header, an untimed warm-up (the server
// acknowledges it with one byte, so the clock starts on a warm connection), then `iter` messages
// of `size` bytes -- stopping early when --seconds have passed -- and half-closes. The server
// counts every byte until end of stream and answers with the count; the clock stops when that
// answer arrives, so the figure is bytes delivered to the reading application, not bytes queued.
//
// Output (client): the ND tools' table (nd-tools.md §7): Latency = µs per message,
// Bytes/Sec = size * iter / s, CPU = system-wide percent times processors.
//
//   tcp_stream -s [ip][:port]            server (default: all addresses, port 54410)
//   tcp_stream -c ip[:port]              client
//   options: --sizes LIST, --iters N, --max-iter N, --seconds S, --blocking, --timeout SEC
//
// Both sides busy-poll by default (non-blocking sockets, spinning on EAGAIN), as the ND tools do
// with -p; on loopback this is also the faster way for one stream (measured on a 2-core VM:
// 64 KiB ~4.3 GB/s polling vs ~3.3 GB/s blocking).
//
// On stderr, both sides warn about every measured interval during which they were on a CPU less
// than 90 % of the time: a busy-polling process that is not running shared its core, and its
// figure is not to be trusted (bench/run.sh reports these).
#include "bench_common.h"

#include <string>
#include <vector>

namespace {

constexpr std::uint16_t kDefaultPort = 54410;
constexpr std::uint32_t kMagic = 0x6e647773;  // "ndws"
constexpr std::uint32_t kOpRun = 1, kOpQuit = 2;

struct Header {  // client -> server at the start of each connection
  std::uint32_t magic;
  std::uint32_t op;
  std::uint64_t size;
  std::uint64_t warmup_bytes;
};
static_assert(sizeof(Header) == 24);

struct Options {
  bool server = false, client = false, poll = true;
  std::string address;
  std::vector<std::size_t> sizes{64u << 10, 1u << 20};
  std::uint64_t iters = 0, max_iter = 500000;
  double seconds = 3.0;
  unsigned timeout = 300, connect_ms = 10000;
};

void usage(const char* prog, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s -s [ip][:port] | -c ip[:port] [options]\n"
               "  -s [ip][:port]   server: read what clients send (default 0.0.0.0:%u)\n"
               "  -c ip[:port]     client: write, measure and print the table\n"
               "  --sizes LIST     comma-separated message sizes, e.g. 64K,1M (default 64K,1M;\n"
               "                   'all' = 1 B..4 MiB doubling)\n"
               "  --iters N        messages per size (default min(max-iter, 2097152000/size))\n"
               "  --max-iter N     cap of the default rule (default 500000, like ndping)\n"
               "  --seconds S      stop a size early after S seconds (default 3)\n"
               "  --blocking       blocking send/recv calls (default: busy-poll non-blocking\n"
               "                   sockets, like the ND tools' -p)\n"
               "  --timeout SEC    the process ends itself after SEC seconds (default 300)\n"
               "Latency = us per message; Bytes/Sec = size*iter/s, measured to the server's\n"
               "acknowledgement of the last byte.\n",
               prog, kDefaultPort);
  std::exit(code);
}

std::uint64_t parse_u64(const char* s, const char* what) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (!*s || *end) bench::fail(std::string("bad value for ") + what + ": '" + s + "'");
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* what) -> const char* {
      if (i + 1 >= argc) bench::fail(std::string("missing value for ") + what);
      return argv[++i];
    };
    auto optional_value = [&]() {
      if (i + 1 < argc && argv[i + 1][0] != '-') o.address = argv[++i];
    };
    if (a == "-s") { o.server = true; optional_value(); }
    else if (a == "-c") { o.client = true; optional_value(); }
    else if (a == "--sizes") {
      std::string list = value("--sizes");
      o.sizes = list == "all" ? bench::doubling_sizes(bench::kMaxSize) : bench::parse_sizes(list, bench::kMaxSize);
    }
    else if (a == "--iters") o.iters = parse_u64(value("--iters"), "--iters");
    else if (a == "--max-iter") o.max_iter = parse_u64(value("--max-iter"), "--max-iter");
    else if (a == "--seconds") {
      const char* v = value("--seconds");
      char* end = nullptr;
      o.seconds = std::strtod(v, &end);
      if (*end || o.seconds <= 0) bench::fail(std::string("bad value for --seconds: '") + v + "'");
    }
    else if (a == "--poll") o.poll = true;
    else if (a == "--blocking") o.poll = false;
    else if (a == "--timeout") o.timeout = unsigned(parse_u64(value("--timeout"), "--timeout"));
    else if (a == "-h" || a == "--help") usage(argv[0], 0);
    else if (a[0] != '-') o.address = a;
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); usage(argv[0], 2); }
  }
  if (o.server == o.client) {
    std::fprintf(stderr, "Exactly one of client (c or server (s) must be specified.\n");
    usage(argv[0], 2);
  }
  if (o.client && o.address.empty()) bench::fail("the client needs the server's address");
  if (o.max_iter == 0) o.max_iter = 1;
  return o;
}

// Reads until end of stream into a buffer of one message's size (like an RDMA Write's target
// buffer: the same memory footprint); returns the number of bytes.
std::uint64_t drain(int fd, std::vector<char>& buf, std::size_t size) {
  std::uint64_t total = 0;
  for (;;) {
    ssize_t n = ::recv(fd, buf.data(), size, 0);
    if (n > 0) total += std::uint64_t(n);
    else if (n == 0) return total;
    else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
    else if (errno == ECONNRESET) return total;
    else bench::die("recv");
  }
}

int server(const Options& o) {
  sockaddr_in sa = bench::parse_endpoint(o.address, kDefaultPort);
  if (o.address.empty() || o.address.find('.') == std::string::npos) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  int lfd = bench::tcp_listen(sa);
  std::vector<char> buf(bench::kMaxSize);
  for (;;) {
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      bench::die("accept");
    }
    if (o.poll) bench::set_nonblocking(fd);
    Header h;
    if (!bench::recv_all(fd, &h, sizeof h) || h.magic != kMagic) {
      std::fprintf(stderr, "warning: dropped a connection without a valid header\n");
      close(fd);
      continue;
    }
    if (h.op == kOpQuit) {
      close(fd);
      break;
    }
    // Warm-up bytes, then one byte of acknowledgement; then everything until end of stream.
    std::uint64_t left = h.warmup_bytes;
    while (left) {
      std::size_t chunk = left < buf.size() ? std::size_t(left) : buf.size();
      if (!bench::recv_all(fd, buf.data(), chunk)) bench::fail("client closed during warm-up");
      left -= chunk;
    }
    char ack = 'w';
    if (!bench::send_all(fd, &ack, 1)) bench::fail("client closed during warm-up");
    if (h.size == 0 || h.size > buf.size()) bench::fail("protocol error (bad size)");
    bench::OnCpu on_cpu;
    std::uint64_t total = drain(fd, buf, std::size_t(h.size));
    if (o.poll) on_cpu.report("tcp_stream server", std::size_t(h.size));
    bench::send_all(fd, &total, sizeof total);
    close(fd);
  }
  close(lfd);
  return 0;
}

int client(const Options& o) {
  sockaddr_in sa = bench::parse_endpoint(o.address, kDefaultPort);
  std::size_t max = 1;
  for (auto s : o.sizes) max = s > max ? s : max;
  std::vector<char> buf(max, 's');
  const std::uint64_t limit_ns = std::uint64_t(o.seconds * 1e9);
  bench::print_table_header();
  for (auto size : o.sizes) {
    std::uint64_t iters = bench::iterations_for(size, o.max_iter, o.iters);
    // Warm-up: about 1/20 of the budget, at least 64 messages, at most 256 MiB.
    std::uint64_t warm = iters / 20 < 64 ? 64 : iters / 20;
    if (warm * size > (256ull << 20)) warm = (256ull << 20) / size;
    if (warm == 0) warm = 1;
    int fd = bench::tcp_connect(sa, o.connect_ms);
    bench::set_nodelay(fd);  // messages go out as written, like RDMA Writes
    if (o.poll) bench::set_nonblocking(fd);
    Header h{kMagic, kOpRun, size, warm * size};
    if (!bench::send_all(fd, &h, sizeof h)) bench::fail("server closed the connection");
    for (std::uint64_t i = 0; i < warm; ++i)
      if (!bench::send_all(fd, buf.data(), size)) bench::fail("server closed the connection");
    char ack;
    if (!bench::recv_all(fd, &ack, 1)) bench::fail("server closed the connection");

    bench::CpuSample c0 = bench::cpu_sample();
    bench::OnCpu on_cpu;
    std::uint64_t t0 = bench::now_ns(), sent = 0;
    for (; sent < iters; ++sent) {
      if ((sent & 15) == 0 && sent && bench::now_ns() - t0 > limit_ns) break;
      if (!bench::send_all(fd, buf.data(), size)) bench::fail("server closed the connection");
    }
    if (shutdown(fd, SHUT_WR) < 0) bench::die("shutdown");
    std::uint64_t received = 0;
    if (!bench::recv_all(fd, &received, sizeof received)) bench::fail("server closed without a count");
    std::uint64_t ns = bench::now_ns() - t0;
    bench::CpuSample c1 = bench::cpu_sample();
    close(fd);
    if (received != sent * size)
      bench::fail("server counted " + std::to_string(received) + " bytes, sent " + std::to_string(sent * size));
    double secs = double(ns) / 1e9;
    bench::print_table_row(size, sent, double(ns) / 1e3 / double(sent), bench::cpu_percent(c0, c1),
                           double(size) * double(sent) / secs);
    if (o.poll) on_cpu.report("tcp_stream client", size);
  }
  int fd = bench::tcp_connect(sa, o.connect_ms);
  Header q{kMagic, kOpQuit, 0, 0};
  bench::send_all(fd, &q, sizeof q);
  close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  bench::arm_watchdog(o.timeout);
  return o.server ? server(o) : client(o);
}
