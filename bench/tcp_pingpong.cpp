// tcp_pingpong: the socket reference for ndpingpong (send/receive round trip).
//
// Two processes on one host or two: the client sends `size` bytes, the server echoes them back,
// `iter` times per size. Both sides busy-poll: non-blocking sockets, spinning on recv()/send()
// until the whole message has moved, TCP_NODELAY. This is the best a plain TCP (iWARP's carrier)
// or UDP (RoCEv2's carrier, --udp) application can do, so ndwv's ratio against it is the cost of
// the RDMA layers on top.
//
// Output (client): the ND tools' table (nd-tools.md §7) with ndpingpong's meaning of the columns:
// Latency = half round trip in µs, Bytes/Sec = 2 * size * iter / s, CPU = system-wide percent
// times processors.
//
//   tcp_pingpong -s [ip][:port]          server for one client (default: all addresses, port 54400)
//   tcp_pingpong -c ip[:port]            client
//   options: --udp, --roce-datagrams, --idle-thread[=own-files], --sizes LIST, --iters N,
//            --max-iter N, --warmup N, --timeout SEC
//
// --idle-thread starts a second thread that only sleeps, as every ndwv process has its progress
// engine: a process whose file table is shared by threads pays the kernel a file reference on
// every socket call. bench/run.sh measures it as information beside the reference proper.
// --idle-thread=own-files: the thread first takes a file table of its own (close_range with
// CLOSE_RANGE_UNSHARE), which shows that the shared table is what costs, not the thread.
//
// --roce-datagrams (with --udp) sends each message the way ndwv's RoCE transport does on loopback,
// with none of its work in user space: the message framed as an IB packet (16 bytes more) and a
// 20-byte ACK datagram, both in one UDP GSO send on connected sockets, received with UDP_GRO by
// recvmsg. Against it, the RoCE ratio is the cost of ndwv's user path alone.
//
// On stderr, both sides warn about every measured interval during which they were on a CPU less
// than 90 % of the time: a busy-polling process that is not running shared its core, and its
// figure is not to be trusted (bench/run.sh reports these).
#include "bench_common.h"

#include <netinet/udp.h>
#include <unistd.h>

#include <climits>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::uint16_t kDefaultPort = 54400;
constexpr std::uint32_t kMagic = 0x6e647770;  // "ndwp"
constexpr std::uint32_t kOpRun = 1, kOpQuit = 2;
constexpr std::size_t kUdpMax = 65000;

struct Control {  // client -> server before every round (TCP mode only)
  std::uint32_t magic;
  std::uint32_t op;
  std::uint64_t size;
  std::uint64_t iters;
};
static_assert(sizeof(Control) == 24);

struct Options {
  bool server = false, client = false, udp = false, roce_datagrams = false, idle_thread = false,
       own_files = false;
  std::string address;
  std::vector<std::size_t> sizes;
  std::uint64_t iters = 0, max_iter = 100000, warmup = 1000;
  unsigned timeout = 300, connect_ms = 10000;
};

void usage(const char* prog, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s -s [ip][:port] | -c ip[:port] [options]\n"
               "  -s [ip][:port]   server: echo one client's messages (default 0.0.0.0:%u)\n"
               "  -c ip[:port]     client: measure and print the table\n"
               "  --udp            UDP datagrams instead of a TCP stream (sizes <= %zu)\n"
               "  --roce-datagrams with --udp: each message as RoCE sends it (IB framing and an\n"
               "                   ACK datagram in one GSO send; GRO receive)\n"
               "  --idle-thread    run a second thread that only sleeps (as ndwv's engine)\n"
               "  --idle-thread=own-files  the same, the thread with a file table of its own\n"
               "  --sizes LIST     comma-separated sizes, e.g. 8,64K,1M (default 1 B..4 MiB\n"
               "                   doubling; with --udp 1 B..32 KiB)\n"
               "  --iters N        iterations per size (default min(max-iter, 2097152000/size))\n"
               "  --max-iter N     cap of the default rule (default 100000, like ndpingpong)\n"
               "  --warmup N       untimed 40-byte round trips first (default 1000)\n"
               "  --timeout SEC    the process ends itself after SEC seconds (default 300)\n"
               "Latency = half round trip (us); Bytes/Sec = 2*size*iter/s.\n",
               prog, kDefaultPort, kUdpMax);
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
  std::string sizes;
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
    else if (a == "--udp") o.udp = true;
    else if (a == "--roce-datagrams") o.roce_datagrams = true;
    else if (a == "--idle-thread") o.idle_thread = true;
    else if (a == "--idle-thread=own-files") o.idle_thread = o.own_files = true;
    else if (a == "--sizes") sizes = value("--sizes");
    else if (a == "--iters") o.iters = parse_u64(value("--iters"), "--iters");
    else if (a == "--max-iter") o.max_iter = parse_u64(value("--max-iter"), "--max-iter");
    else if (a == "--warmup") o.warmup = parse_u64(value("--warmup"), "--warmup");
    else if (a == "--timeout") o.timeout = unsigned(parse_u64(value("--timeout"), "--timeout"));
    else if (a == "-h" || a == "--help") usage(argv[0], 0);
    else if (a[0] != '-') o.address = a;  // ND style: the address is the last argument
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); usage(argv[0], 2); }
  }
  if (o.server == o.client) {
    std::fprintf(stderr, "Exactly one of client (c or server (s) must be specified.\n");
    usage(argv[0], 2);
  }
  if (o.client && o.address.empty()) bench::fail("the client needs the server's address");
  if (o.roce_datagrams && !o.udp) bench::fail("--roce-datagrams needs --udp");
  std::size_t max = o.udp ? kUdpMax : bench::kMaxSize;
  o.sizes = sizes.empty() ? bench::doubling_sizes(o.udp ? 32768 : bench::kMaxSize)
                          : bench::parse_sizes(sizes, max);
  if (o.max_iter == 0) o.max_iter = 1;
  return o;
}

// Stamps the first min(size, 8) bytes with the iteration number so that an echo can be checked
// (and, over UDP, a stale datagram recognised).
inline void stamp(char* buf, std::size_t size, std::uint64_t seq) {
  std::memcpy(buf, &seq, size < 8 ? size : 8);
}
inline bool stamped(const char* buf, std::size_t size, std::uint64_t seq) {
  return std::memcmp(buf, &seq, size < 8 ? size : 8) == 0;
}

// ---------------------------------------------------------------- TCP

int tcp_server(const Options& o) {
  sockaddr_in sa = bench::parse_endpoint(o.address, kDefaultPort);
  if (o.address.empty() || o.address.find('.') == std::string::npos) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  int lfd = bench::tcp_listen(sa);
  int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) bench::die("accept");
  close(lfd);
  bench::set_nodelay(fd);
  bench::set_nonblocking(fd);
  std::vector<char> buf;
  for (;;) {
    Control c;
    if (!bench::recv_all(fd, &c, sizeof c)) break;  // client gone: done
    if (c.magic != kMagic) bench::fail("protocol error (bad magic)");
    if (c.op == kOpQuit) break;
    if (c.op != kOpRun || c.size == 0 || c.size > bench::kMaxSize) bench::fail("protocol error (bad round)");
    if (buf.size() < c.size) buf.resize(c.size);
    bench::OnCpu on_cpu;
    for (std::uint64_t i = 0; i < c.iters; ++i) {
      if (!bench::recv_all(fd, buf.data(), c.size)) bench::fail("client closed mid-round");
      if (!bench::send_all(fd, buf.data(), c.size)) bench::fail("client closed mid-round");
    }
    on_cpu.report("tcp_pingpong server", std::size_t(c.size));
  }
  close(fd);
  return 0;
}

// One timed round; returns elapsed ns.
std::uint64_t tcp_round(int fd, std::size_t size, std::uint64_t iters, std::vector<char>& tx,
                        std::vector<char>& rx) {
  Control c{kMagic, kOpRun, size, iters};
  if (!bench::send_all(fd, &c, sizeof c)) bench::fail("server closed the connection");
  std::uint64_t t0 = bench::now_ns();
  for (std::uint64_t i = 0; i < iters; ++i) {
    stamp(tx.data(), size, i);
    if (!bench::send_all(fd, tx.data(), size)) bench::fail("server closed the connection");
    if (!bench::recv_all(fd, rx.data(), size)) bench::fail("server closed the connection");
    if (!stamped(rx.data(), size, i)) bench::fail("echo mismatch");
  }
  return bench::now_ns() - t0;
}

int tcp_client(const Options& o) {
  sockaddr_in sa = bench::parse_endpoint(o.address, kDefaultPort);
  int fd = bench::tcp_connect(sa, o.connect_ms);
  bench::set_nodelay(fd);
  bench::set_nonblocking(fd);
  std::size_t max = 40;
  for (auto s : o.sizes) max = s > max ? s : max;
  std::vector<char> tx(max, 'p'), rx(max);
  if (o.warmup) tcp_round(fd, 40, o.warmup, tx, rx);
  bench::print_table_header();
  for (auto size : o.sizes) {
    std::uint64_t iters = bench::iterations_for(size, o.max_iter, o.iters);
    bench::CpuSample c0 = bench::cpu_sample();
    bench::OnCpu on_cpu;
    std::uint64_t ns = tcp_round(fd, size, iters, tx, rx);
    bench::CpuSample c1 = bench::cpu_sample();
    double secs = double(ns) / 1e9;
    bench::print_table_row(size, iters, double(ns) / 1e3 / double(iters) / 2.0, bench::cpu_percent(c0, c1),
                           2.0 * double(size) * double(iters) / secs);
    on_cpu.report("tcp_pingpong client", size);
  }
  Control q{kMagic, kOpQuit, 0, 0};
  bench::send_all(fd, &q, sizeof q);
  close(fd);
  return 0;
}

// ---------------------------------------------------------------- UDP
//
// The server echoes every datagram to its sender; a zero-length datagram ends it (sent a few
// times), as does --timeout or 10 s without traffic once the client has started. The client keeps
// one datagram in flight and retransmits after 100 ms of silence, so a lost datagram (rare on
// loopback) costs time, not a hang; retransmissions are reported on stderr.

// One message on a UDP socket: a datagram, or with --roce-datagrams RoCE's pair of them.
struct UdpMessages {
  static constexpr std::size_t kBth = 12, kIcrc = 4, kAck = kBth + 4 + kIcrc;  // ACK: BTH, AETH, ICRC
  bool roce;
  std::vector<char> rx = std::vector<char>(65536 + 64);
  std::size_t have = 0, first = 0;  // --roce-datagrams: bytes of the pair so far; its first datagram

  explicit UdpMessages(int fd, bool roce) : roce(roce) {
    int one = 1;
    if (roce && setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) < 0) bench::die("UDP_GRO");
  }
  // The message datagram's length; GSO wants the shorter ACK last.
  static std::size_t framed(std::size_t size) { return std::max(size + kBth + kIcrc, kAck); }

  // Sends `size` bytes of `data` on a connected socket; false with errno set.
  bool send(int fd, const char* data, std::size_t size) {
    if (!roce) return ::send(fd, data, size, 0) >= 0;
    static char header[kBth], trailer[kAck - kBth];  // contents do not matter to the kernel
    std::size_t message = framed(size);
    iovec iov[] = {{header, kBth}, {const_cast<char*>(data), size}, {trailer, message - kBth - size},
                   {header, kBth}, {trailer, kAck - kBth}};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(std::uint16_t))] = {};
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = 5;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
    std::uint16_t segment = std::uint16_t(message);
    std::memcpy(CMSG_DATA(c), &segment, sizeof segment);
    return sendmsg(fd, &m, 0) >= 0;
  }

  // One receive call: the payload's size once the message is whole (payload() has it), else -1
  // or the call's error. `from`, when given, receives the sender's address.
  ssize_t receive(int fd, sockaddr_in* from = nullptr) {
    socklen_t flen = sizeof *from;
    if (!roce) return recvfrom(fd, rx.data(), rx.size(), 0, reinterpret_cast<sockaddr*>(from), from ? &flen : nullptr);
    // As ndwv's RoCE port reads: the sender's address and the GRO segment size come with the data.
    sockaddr_in source{};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    iovec iov{rx.data() + have, rx.size() - have};
    msghdr m{};
    m.msg_name = &source;
    m.msg_namelen = sizeof source;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = control;
    m.msg_controllen = sizeof control;
    ssize_t n = recvmsg(fd, &m, 0);
    if (n <= 0) return n;
    if (from) *from = source;
    std::size_t segment = std::size_t(n);
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
      if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
        int gro;
        std::memcpy(&gro, CMSG_DATA(c), sizeof gro);
        segment = std::size_t(gro);
      }
    if (have == 0) first = segment;
    have += std::size_t(n);
    if (have < first + kAck) return -1;  // the ACK datagram is still to come
    bool pair = have == first + kAck && first >= kAck;
    have = 0;
    return pair ? ssize_t(first - kBth - kIcrc) : -1;  // anything else: stray, dropped
  }
  // The payload size an echo of `size` bytes comes back with (a message is framed to >= kAck).
  std::size_t echoed(std::size_t size) const { return roce ? framed(size) - kBth - kIcrc : size; }
  const char* payload() const { return rx.data() + (roce ? kBth : 0); }
};

int udp_server(const Options& o) {
  sockaddr_in sa = bench::parse_endpoint(o.address, kDefaultPort);
  if (o.address.empty() || o.address.find('.') == std::string::npos) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) bench::die("socket");
  if (bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) < 0) bench::die("bind");
  bench::set_nonblocking(fd);
  UdpMessages messages(fd, o.roce_datagrams);
  bool started = false;
  std::uint64_t last = bench::now_ns(), spins = 0;
  const std::uint64_t idle_ns = 10ull * 1000000000ull;
  for (;;) {
    sockaddr_in from{};
    ssize_t n = messages.receive(fd, &from);
    if (n < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNREFUSED) bench::die("recvfrom");
      if (started && (++spins & 1023) == 0 && bench::now_ns() - last > idle_ns) break;
      continue;
    }
    if (n == 0) break;
    if (!started && o.roce_datagrams) {
      // ndwv answers a RoCE peer through a socket connected to it (its flow).
      if (connect(fd, reinterpret_cast<const sockaddr*>(&from), sizeof from) < 0) bench::die("connect");
    }
    started = true;
    last = bench::now_ns();
    for (;;) {
      bool sent = o.roce_datagrams ? messages.send(fd, messages.payload(), std::size_t(n))
                                   : sendto(fd, messages.payload(), std::size_t(n), 0,
                                            reinterpret_cast<sockaddr*>(&from), sizeof from) >= 0;
      if (sent) break;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) bench::die("sendto");
    }
  }
  close(fd);
  return 0;
}

struct UdpClient {
  int fd;
  UdpMessages messages;
  std::uint64_t retransmits = 0;

  // One round trip of `size` bytes carrying sequence number `seq`.
  void round_trip(std::vector<char>& tx, std::size_t size, std::uint64_t seq) {
    stamp(tx.data(), size, seq);
    const std::uint64_t rto = 100000000ull;  // 100 ms
    for (unsigned attempt = 0;; ++attempt) {
      if (attempt > 100) bench::fail("no answer from the UDP server for 10 s");
      if (attempt) ++retransmits;
      while (!messages.send(fd, tx.data(), size)) {
        if (errno == ECONNREFUSED) continue;  // ICMP from an earlier datagram: server not up yet
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) bench::die("send");
      }
      std::uint64_t deadline = bench::now_ns() + rto, spins = 0;
      for (;;) {
        ssize_t n = messages.receive(fd);
        if (n == ssize_t(messages.echoed(size)) && stamped(messages.payload(), size, seq)) return;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNREFUSED)
          bench::die("recv");
        if ((++spins & 255) == 0 && bench::now_ns() > deadline) break;  // lost: send again
      }
    }
  }
};

int udp_client(const Options& o) {
  sockaddr_in sa = bench::parse_endpoint(o.address, kDefaultPort);
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) bench::die("socket");
  if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) < 0) bench::die("connect");
  bench::set_nonblocking(fd);
  UdpClient c{fd, UdpMessages(fd, o.roce_datagrams)};
  std::vector<char> tx(65536, 'p');
  std::uint64_t seq = 1;
  c.round_trip(tx, 40, seq++);  // first contact (the server may still be starting)
  for (std::uint64_t i = 0; i < o.warmup; ++i) c.round_trip(tx, 40, seq++);
  c.retransmits = 0;
  bench::print_table_header();
  for (auto size : o.sizes) {
    std::uint64_t iters = bench::iterations_for(size, o.max_iter, o.iters);
    std::uint64_t before = c.retransmits;
    bench::CpuSample c0 = bench::cpu_sample();
    bench::OnCpu on_cpu;
    std::uint64_t t0 = bench::now_ns();
    for (std::uint64_t i = 0; i < iters; ++i) c.round_trip(tx, size, seq++);
    std::uint64_t ns = bench::now_ns() - t0;
    bench::CpuSample c1 = bench::cpu_sample();
    double secs = double(ns) / 1e9;
    bench::print_table_row(size, iters, double(ns) / 1e3 / double(iters) / 2.0, bench::cpu_percent(c0, c1),
                           2.0 * double(size) * double(iters) / secs);
    on_cpu.report("udp pingpong client", size);
    if (c.retransmits != before)
      std::fprintf(stderr, "warning: size %zu: %llu retransmissions (latency includes 100 ms each)\n", size,
                   (unsigned long long)(c.retransmits - before));
  }
  for (int i = 0; i < 3; ++i) ::send(fd, tx.data(), 0, 0);  // end the server
  close(fd);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  bench::arm_watchdog(o.timeout);
  if (o.idle_thread) {
    std::thread([own_files = o.own_files] {
      // Its own table, holding none of the process's files (so none is kept open by it).
      if (own_files && close_range(0, UINT_MAX, CLOSE_RANGE_UNSHARE) != 0) bench::die("close_range");
      for (;;) pause();
    }).detach();
  }
  if (o.udp) return o.server ? udp_server(o) : udp_client(o);
  return o.server ? tcp_server(o) : tcp_client(o);
}
