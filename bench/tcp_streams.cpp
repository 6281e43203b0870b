// tcp_streams: the plain-TCP reference of nd_streams: a client and a server process on
// 127.0.0.1, N TCP connections, every one streaming SIZE-byte messages one way for SECONDS.
// Prints the aggregate rate of the bytes the server received (1 GB = 1e9 bytes), in the fields
// nd_streams prints; bench/streams.sh runs both and prints the ratio.
//
//   tcp_streams [-n N] [-s SIZE] [-t SECONDS] [--port P]    (defaults 128, 65536, 5)
//
// The client starts the server itself (this program again, with --serve; scale_common.h's
// ServerProcess, whose control socket also carries the server's report). Both sides are one
// thread with nonblocking sockets in an epoll set, and sleep in epoll_wait: a writer whose every
// socket is full has nothing to do until the reader makes room (the kernel moves the data).
// The client writes messages back to back on every writable connection (TCP_NODELAY, as
// tcp_stream), stops after SECONDS and half-closes every connection (shutdown SHUT_WR). The server
// reads into a buffer of one message's size (the footprint of an RDMA Write target) and discards,
// counting every byte until every connection's EOF, then reports the total. The rate is bytes
// delivered over the time from the first write to that report. Every wait has a bound (kBoundS,
// and a watchdog behind it); a failed call prints its step and errno and exits nonzero.
#include <sys/epoll.h>

#include <vector>

#include "bench_common.h"
#include "scale_common.h"
#include "streams_common.h"

namespace {

using streams::Options;
using scale::NowUs;

constexpr unsigned kBoundS = 60;  // each wait of this program

const char kUsage[] =
    "usage: tcp_streams [-n N] [-s SIZE] [-t SECONDS] [--port P]\n"
    "  -n N        connections (default 128)\n"
    "  -s SIZE     bytes of each message (default 65536)\n"
    "  -t SECONDS  how long the messages are written (default 5)\n"
    "  --port P    the server's port on 127.0.0.1 (default 0: a free one)\n"
    "The client starts the server itself.\n";

[[noreturn]] void DieErrno(const std::string& step) {
  scale::Die(step + ": " + std::strerror(errno), scale::kExitFailed);
}

void Add(int epoll, int fd, std::uint32_t events, std::uint32_t key) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u32 = key;
  if (epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev) != 0) DieErrno("epoll_ctl");
}

// ---- server ------------------------------------------------------------------------------------

int Serve(const Options& o) {
  scale::LineChannel control(o.serveFd);
  sockaddr_in local = scale::Loopback(o.port);
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) DieErrno("socket");
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // A backlog for all N: the client connects them one after another without waiting for accept.
  if (bind(listener, reinterpret_cast<const sockaddr*>(&local), sizeof local) != 0) DieErrno("bind");
  if (listen(listener, int(std::min(o.connections, 65535u))) != 0) DieErrno("listen");
  socklen_t length = sizeof local;
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&local), &length) != 0) DieErrno("getsockname");
  control.Send("ready port=" + std::to_string(ntohs(local.sin_port)));

  scale::Watch("server: accepting", kBoundS + 10);
  const std::uint64_t acceptUntil = NowUs() + kBoundS * 1000000ull;
  std::vector<int> fds;
  while (fds.size() < o.connections) {
    pollfd p{listener, POLLIN, 0};
    if (poll(&p, 1, scale::MsUntil(acceptUntil)) == 0)
      scale::Die("accepted " + std::to_string(fds.size()) + " of " + std::to_string(o.connections) +
                     " connections in " + std::to_string(kBoundS) + " s", scale::kExitFailed);
    int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) fds.push_back(fd);
    else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) DieErrno("accept");
  }
  close(listener);
  control.Send("up");

  const int epoll = epoll_create1(EPOLL_CLOEXEC);
  if (epoll < 0) DieErrno("epoll_create1");
  for (std::uint32_t i = 0; i < fds.size(); ++i) Add(epoll, fds[i], EPOLLIN, i);
  std::vector<char> buffer(o.size);
  std::uint64_t bytes = 0;
  unsigned ended = 0, errors = 0;
  // The client writes for SECONDS, then half-closes; its drain and teardown have their bounds.
  scale::Watch("server: reading", o.seconds + 2 * kBoundS + 30);
  const std::uint64_t until = NowUs() + (o.seconds + 2 * kBoundS) * 1000000ull;
  std::vector<epoll_event> events(256);
  while (ended < fds.size() && NowUs() < until) {
    int ready = epoll_wait(epoll, events.data(), int(events.size()), scale::MsUntil(until));
    if (ready < 0 && errno != EINTR) DieErrno("epoll_wait");
    for (int e = 0; e < ready; ++e) {
      int& fd = fds[events[e].data.u32];
      // A few reads a turn: the others' data waits no longer than that (level-triggered).
      for (int reads = 0; reads < 16 && fd >= 0; ++reads) {
        ssize_t n = ::recv(fd, buffer.data(), buffer.size(), 0);
        if (n > 0) {
          bytes += std::uint64_t(n);
          continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) break;
        if (n < 0) {
          std::fprintf(stderr, "tcp_streams server: recv: %s\n", std::strerror(errno));
          errors++;
        }
        close(fd);  // EOF (or an error): this connection is done
        fd = -1;
        ended++;
      }
    }
  }
  control.Send("total bytes=" + std::to_string(bytes) + " ended=" + std::to_string(ended) +
               " errors=" + std::to_string(errors));
  for (int fd : fds)
    if (fd >= 0) close(fd);
  close(epoll);
  return ended == fds.size() && errors == 0 ? scale::kExitOk : scale::kExitFailed;
}

// ---- client ------------------------------------------------------------------------------------

int Run(const Options& o, int argc, char** argv) {
  scale::ServerProcess server;
  server.Start(argc, argv);
  const unsigned port = unsigned(scale::Get(scale::ParseFigures(server.Expect("ready", "start listening", 30000)), "port"));
  const sockaddr_in peer = scale::Loopback(port);
  const unsigned n = o.connections;

  scale::Watch("client: connecting", kBoundS + 10);
  std::vector<int> fds(n);
  for (int& fd : fds) {
    fd = bench::tcp_connect(peer, kBoundS * 1000);
    bench::set_nodelay(fd);
    bench::set_nonblocking(fd);
  }
  server.Expect("up", "accept every connection", kBoundS * 1000);

  const int epoll = epoll_create1(EPOLL_CLOEXEC);
  if (epoll < 0) DieErrno("epoll_create1");
  for (std::uint32_t i = 0; i < n; ++i) Add(epoll, fds[i], EPOLLOUT, i);
  const std::vector<char> message(o.size, 'x');
  std::vector<unsigned> offset(n, 0);  // where each connection is in its current message
  std::uint64_t written = 0;
  unsigned errors = 0;
  std::vector<epoll_event> events(256);

  scale::Watch("client: streaming", o.seconds + kBoundS + 30);
  const std::uint64_t start = NowUs(), stopAt = start + o.seconds * 1000000ull;
  while (NowUs() < stopAt) {
    int ready = epoll_wait(epoll, events.data(), int(events.size()), scale::MsUntil(stopAt));
    if (ready < 0 && errno != EINTR) DieErrno("epoll_wait");
    for (int e = 0; e < ready; ++e) {
      const std::uint32_t i = events[e].data.u32;
      for (;;) {  // until the socket is full
        ssize_t sent = ::send(fds[i], message.data() + offset[i], o.size - offset[i], MSG_NOSIGNAL);
        if (sent > 0) {
          written += std::uint64_t(sent);
          offset[i] = (offset[i] + unsigned(sent)) % o.size;
          continue;
        }
        if (sent < 0 && (errno == EAGAIN || errno == EINTR)) break;
        std::fprintf(stderr, "tcp_streams: connection %u: send: %s\n", i, std::strerror(errno));
        errors++;
        epoll_ctl(epoll, EPOLL_CTL_DEL, fds[i], nullptr);
        break;
      }
    }
  }
  // The end of the streams: every connection half-closed, then the server's count of what came.
  for (unsigned i = 0; i < n; ++i)
    if (shutdown(fds[i], SHUT_WR) != 0) {
      std::fprintf(stderr, "tcp_streams: connection %u: shutdown: %s\n", i, std::strerror(errno));
      errors++;
    }
  scale::Watch("client: awaiting the server's report", o.seconds + 2 * kBoundS + 30);
  const scale::Figures report =
      scale::ParseFigures(server.Expect("total", "report its total", int(o.seconds + 2 * kBoundS) * 1000));
  const double seconds = double(NowUs() - start) / 1e6;
  const auto delivered = std::uint64_t(scale::Get(report, "bytes"));
  const unsigned ended = unsigned(scale::Get(report, "ended"));
  errors += unsigned(scale::Get(report, "errors"));
  for (int fd : fds) close(fd);
  close(epoll);

  std::printf("tcp_streams: TCP\n");
  std::printf("connections: %u\nsize: %u\nin flight: - (a stream)\nseconds: %.3f\nbytes written: %llu\n", n,
              o.size, seconds, (unsigned long long)written);
  std::printf("bytes completed: %llu\naggregate GB/s: %.3f\ncompletions with an error: %u\n",
              (unsigned long long)delivered, double(delivered) / seconds / 1e9, errors);
  bool ok = errors == 0;
  if (ended != n) {
    std::printf("the server saw %u of %u connections end\n", ended, n);
    ok = false;
  }
  if (delivered != written) {
    std::printf("the server received %llu bytes, %llu were written\n", (unsigned long long)delivered,
                (unsigned long long)written);
    ok = false;
  }
  const int serverExit = server.Wait(kBoundS * 1000);
  alarm(0);
  if (serverExit != 0) {
    std::printf("the server exited with status %d\n", serverExit);
    ok = false;
  }
  std::printf("result: %s\n", ok ? "ok" : "FAILED");
  return ok ? scale::kExitOk : scale::kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = streams::Parse(argc, argv, kUsage, false);
  scale::g_program = o.serveFd >= 0 ? "tcp_streams server" : "tcp_streams";
  scale::EnsureDescriptors(scale::g_program, o.connections + 64, true);
  return o.serveFd >= 0 ? Serve(o) : Run(o, argc, argv);
}
