// tcp_scale: the plain-TCP reference of nd_scale, with the same phases, bounds and report
// (scale_common.h; bench/README.md, "Many connections"): a client and a server process on
// 127.0.0.1, nonblocking sockets, one epoll set per process. Setup keeps K connects in flight
// (the server accepts whatever is pending whenever its listener is readable); idle leaves the
// connections alone (no keepalive: TCP sends nothing for an idle connection); echo-all writes one
// message on every connection and the server writes it back; teardown keeps K closes in flight,
// each the analogue of an ND Disconnect: shutdown(SHUT_WR), and done when the server's close
// (its FIN) has come back.
//
// With --mpa a connection also carries MPA's three setup messages before it counts as set up (a
// 24-byte request from the client, sent as soon as connect() returns; the server's 24-byte reply;
// the client's 20-byte ready-to-receive): the floor under an iWARP setup made of plain sockets by
// a process whose one thread is also the application, so that nd_scale's iWARP setup rate can be
// read against what its protocol costs, not only against bare TCP.
//
// The ledger counts, as nd_scale's does: connect (established or the error), connection (from
// established until the peer's close: expected in teardown only, as NotifyDisconnect), echo (an
// answer, right, per message sent), close (the peer's FIN after ours).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>

#include <memory>

#include "scale_common.h"

namespace {

using scale::Figures;
using scale::Loopback;
using scale::NowUs;

const char kUsage[] =
    "  --mpa                every connection also exchanges MPA's three setup messages before it\n"
    "                       counts as set up: the floor under an iWARP setup\n"
    "The client starts the server itself (the same program with --serve); see bench/README.md.\n";

std::string ErrnoName(int err) {
  const char* name = strerrorname_np(err);
  return name ? name : "errno " + std::to_string(err);
}

// Handshaking: the client waits for the MPA reply; Request and Rtr: the server for the request and
// for the ready-to-receive (--mpa).
enum class State { Idle, Connecting, Handshaking, Request, Rtr, Up, Closing, Closed, Failed };

// The sizes of MPA's setup messages as ndwv's iWARP sends them (a frame's 20 bytes, plus its
// IRD/ORD private data in the request and reply).
constexpr unsigned kMpaRequestBytes = 24, kMpaReplyBytes = 24, kMpaRtrBytes = 20;
const char kMpaMessage[kMpaRequestBytes] = {};

struct Conn {
  int fd = -1;
  State state = State::Idle;
  bool lost = false;
  bool awaiting = false;  // client: the echo's answer is due
  unsigned got = 0;       // bytes of the message received so far
  char* sendSlot = nullptr;
  char* recvSlot = nullptr;
};

// What both processes share: the epoll set, the connections and their message slots.
class TcpSide {
 protected:
  explicit TcpSide(const scale::Options& o) : o_(o) {
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) scale::Die("epoll_create1: " + ErrnoName(errno));
    conns_.resize(o.connections);
    buffer_.assign(std::size_t(o.connections) * 2 * o.size, 0);
    for (unsigned i = 0; i < o.connections; ++i) {
      conns_[i].sendSlot = buffer_.data() + std::size_t(i) * 2 * o.size;
      conns_[i].recvSlot = conns_[i].sendSlot + o.size;
    }
  }
  ~TcpSide() {
    for (auto& c : conns_)
      if (c.fd >= 0) close(c.fd);
    close(epoll_);
  }

  void Watch(int op, int fd, std::uint32_t events, std::uint32_t key) {
    epoll_event ev{};
    ev.events = events;
    ev.data.u32 = key;
    if (epoll_ctl(epoll_, op, fd, &ev) != 0) scale::Die("epoll_ctl: " + ErrnoName(errno), scale::kExitFailed);
  }

  void CloseConn(Conn& c, State state) {
    if (c.fd >= 0) close(c.fd);
    c.fd = -1;
    c.state = state;
  }

  // Reads what is there of the connection's message of `size` bytes. Returns 1 when the message
  // is whole, 0 when more is to come, -1 when the peer closed (errno 0) or the connection failed
  // (errno set).
  int ReadMessage(Conn& c, unsigned size) {
    for (;;) {
      ssize_t n = ::recv(c.fd, c.recvSlot + c.got, size - c.got, 0);
      if (n > 0) {
        c.got += unsigned(n);
        if (c.got == size) {
          c.got = 0;
          return 1;
        }
        continue;
      }
      if (n == 0) {
        errno = 0;
        return -1;
      }
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
    }
  }

  // Writes a setup message whole (an empty socket buffer takes it) or says why not.
  std::string WriteSetup(Conn& c, unsigned size) {
    ssize_t n = ::send(c.fd, kMpaMessage, size, MSG_NOSIGNAL);
    return n == ssize_t(size) ? "" : n < 0 ? ErrnoName(errno) : "short write";
  }

  // Writes one message; a socket with an empty buffer takes 64 bytes whole, so a short write is
  // reported, not retried.
  bool WriteMessage(Conn& c, const char* data, const char* phase) {
    ledger_->Posted("send");
    ssize_t n = ::send(c.fd, data, o_.size, MSG_NOSIGNAL);
    if (n == ssize_t(o_.size)) {
      ledger_->Completed("send", "sent", phase, true);
      return true;
    }
    // After the peer was killed (crash) its reset may be there first.
    ledger_->Completed("send", n < 0 ? ErrnoName(errno) : "short write", phase, std::strcmp(phase, "crash") == 0);
    return false;
  }

  const scale::Options& o_;
  scale::Ledger* ledger_ = nullptr;
  int epoll_ = -1;
  std::vector<Conn> conns_;
  std::vector<char> buffer_;
};

// ---- client ----------------------------------------------------------------------------------

class Client : public scale::ClientSide, public TcpSide {
 public:
  Client(const scale::Options& o, unsigned serverPort) : TcpSide(o), server_(Loopback(serverPort)) {
    ledger_ = &ledger;
  }

  std::string Transport() override { return o_.mpa ? "TCP+MPA" : "TCP"; }

  unsigned Setup(std::uint64_t untilUs, std::vector<std::uint64_t>* times) override {
    phase_ = "setup";
    times_ = times;
    return ConnectAll(
        o_, untilUs, [this](unsigned i) { StartConnect(i); }, [this](std::uint64_t until) { Pump(until); },
        [this] {
          for (auto& c : conns_)
            if (c.state == State::Connecting || c.state == State::Handshaking) ConnectFailed(c, "abandoned", true);
        });
  }

  unsigned Idle(std::uint64_t untilUs) override {
    phase_ = "idle";
    while (NowUs() < untilUs) Pump(untilUs);
    return established_ - lost_;
  }

  unsigned Echo(std::uint64_t untilUs, unsigned* sent) override {
    phase_ = "echo";
    unsigned count = 0;
    for (unsigned i = 0; i < conns_.size(); ++i) {
      Conn& c = conns_[i];
      if (c.state != State::Up || c.lost) continue;
      scale::FillMessage(c.sendSlot, i, o_.size);
      if (!WriteMessage(c, c.sendSlot, "echo")) continue;
      ledger.Posted("echo");
      c.awaiting = true;
      awaiting_++;
      count++;
    }
    *sent = count;
    while (awaiting_ > 0 && NowUs() < untilUs) Pump(untilUs);
    return answered_;
  }

  unsigned Teardown(std::uint64_t untilUs) override {
    phase_ = "teardown";
    std::size_t next = 0;
    for (;;) {
      while (closing_ < o_.outstanding && next < conns_.size()) {
        Conn& c = conns_[next++];
        if (c.state != State::Up) continue;
        ledger.Posted("close");
        if (shutdown(c.fd, SHUT_WR) != 0) {
          ledger.Completed("close", ErrnoName(errno), phase_, false);
          EndConnection(c, ErrnoName(errno));
          continue;
        }
        c.state = State::Closing;
        closing_++;
      }
      if ((next >= conns_.size() && closing_ == 0) || NowUs() >= untilUs) break;
      Pump(untilUs);
    }
    return closed_;
  }

  unsigned AwaitEnds(std::uint64_t untilUs) override {
    phase_ = "crash";
    const unsigned before = lost_;
    // The application goes on talking on one connection, as nd_scale's does.
    for (unsigned i = 0; i < conns_.size(); ++i)
      if (conns_[i].state == State::Up && !conns_[i].lost) {
        scale::FillMessage(conns_[i].sendSlot, i, o_.size);
        WriteMessage(conns_[i], conns_[i].sendSlot, "crash");
        break;
      }
    while (lost_ < established_ && NowUs() < untilUs) Pump(untilUs);
    return lost_ - before;
  }

  void Release(std::uint64_t) override {
    phase_ = "release";
    for (auto& c : conns_) {  // what teardown did not end in its bound
      if (c.state == State::Closing) ledger.Completed("close", "abandoned", phase_, false);
      if (c.state == State::Up || c.state == State::Closing) ledger.Completed("connection", "abandoned", phase_, false);
      CloseConn(c, c.state);
    }
  }

 private:
  void StartConnect(unsigned i) {
    Conn& c = conns_[i];
    ledger.Posted("connect");
    c.fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int err = c.fd < 0 ? errno : 0;
    if (!err && connect(c.fd, reinterpret_cast<const sockaddr*>(&server_), sizeof server_) != 0 &&
        errno != EINPROGRESS)
      err = errno;
    if (err) return ConnectFailed(c, ErrnoName(err), false);
    connecting_++;
    // On this host TCP's handshake is over when connect() returns: the request goes now, as
    // ndwv's does; a socket still connecting refuses it, and it goes once the socket is writable.
    if (o_.mpa && WriteSetup(c, kMpaRequestBytes).empty()) {
      c.state = State::Handshaking;
      Watch(EPOLL_CTL_ADD, c.fd, EPOLLIN | EPOLLRDHUP, i);
      return;
    }
    c.state = State::Connecting;
    Watch(EPOLL_CTL_ADD, c.fd, EPOLLOUT, i);  // writable: the handshake is over, either way
  }

  void Pump(std::uint64_t untilUs) {
    epoll_event events[256];
    int n = epoll_wait(epoll_, events, 256, scale::MsUntil(untilUs));
    for (int i = 0; i < n; ++i) OnEvent(events[i].data.u32, events[i].events);
  }

  void OnEvent(unsigned i, std::uint32_t events) {
    Conn& c = conns_[i];
    if (c.state == State::Connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (!err && o_.mpa) {
        std::string why = WriteSetup(c, kMpaRequestBytes);
        if (!why.empty()) return ConnectFailed(c, why, false);
        c.state = State::Handshaking;
        Watch(EPOLL_CTL_MOD, c.fd, EPOLLIN | EPOLLRDHUP, i);
        return;
      }
      if (err) return ConnectFailed(c, ErrnoName(err), false);
      return Established(c, i, true);
    }
    if (c.state == State::Handshaking) {
      int r = ReadMessage(c, kMpaReplyBytes);
      if (r == 0) return;
      std::string why = r < 0 ? (errno ? ErrnoName(errno) : "closed by the peer") : WriteSetup(c, kMpaRtrBytes);
      if (!why.empty()) return ConnectFailed(c, why, false);
      return Established(c, i, false);
    }
    if (c.state != State::Up && c.state != State::Closing) return;
    for (;;) {
      int r = ReadMessage(c, o_.size);
      if (r == 0) return;
      if (r < 0) {
        std::string why = errno ? ErrnoName(errno) : "closed by the peer";
        if (c.state == State::Closing) {
          ledger.Completed("close", errno ? why : "closed", phase_, errno == 0);
          closing_--;
          closed_++;
        }
        return EndConnection(c, why);
      }
      bool right = c.awaiting && std::memcmp(c.recvSlot, c.sendSlot, o_.size) == 0;
      if (c.awaiting) {
        c.awaiting = false;
        awaiting_--;
        ledger.Completed("echo", right ? "answered" : "WRONG DATA", phase_, right && phase_ == "echo");
        if (right) answered_++;
      } else {
        ledger.Completed("unasked message", "received", phase_, false);
      }
    }
  }

  // `watchWritable`: the socket is still watched for EPOLLOUT (no MPA exchange since connect).
  void Established(Conn& c, unsigned i, bool watchWritable) {
    connecting_--;
    ledger.Completed("connect", "established", phase_, phase_ == "setup");
    ledger.Posted("connection");
    c.state = State::Up;
    established_++;
    times_->push_back(NowUs());
    if (watchWritable) Watch(EPOLL_CTL_MOD, c.fd, EPOLLIN | EPOLLRDHUP, i);
  }

  void ConnectFailed(Conn& c, const std::string& why, bool expected) {
    if (c.state == State::Connecting || c.state == State::Handshaking) connecting_--;
    ledger.Completed("connect", why, phase_, expected);
    CloseConn(c, State::Failed);
    failed_++;
  }

  // The connection has ended: ours (teardown) or by itself (lost).
  void EndConnection(Conn& c, const std::string& why) {
    bool ours = c.state == State::Closing;
    // Ours (teardown) ends with the peer's close; a killed peer's (crash) in any way.
    ledger.Completed("connection", ours ? "closed" : why, phase_,
                     ours ? why == "closed by the peer" : phase_ == "crash");
    if (!ours && !c.lost) {
      c.lost = true;
      lost_++;
    }
    if (c.awaiting) {
      c.awaiting = false;
      awaiting_--;
      ledger.Completed("echo", why, phase_, false);
    }
    CloseConn(c, State::Closed);
  }

  sockaddr_in server_;
  std::string phase_ = "start";
  std::vector<std::uint64_t>* times_ = nullptr;
  unsigned awaiting_ = 0, answered_ = 0, closing_ = 0, closed_ = 0;
};

// ---- server ----------------------------------------------------------------------------------

constexpr std::uint32_t kListenerKey = 0xffffffffu, kControlKey = 0xfffffffeu;

class Server : public TcpSide {
 public:
  Server(const scale::Options& o, scale::Ledger& ledger)
      : TcpSide(o),
        control_(o.serveFd, [this](const std::string& name) { return counts_(name); },
                 [this] { return AllFigures(); }) {
    ledger_ = &ledger;
    sockaddr_in local = Loopback(o.port);
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (listener_ < 0 || bind(listener_, reinterpret_cast<const sockaddr*>(&local), sizeof local) != 0 ||
        listen(listener_, SOMAXCONN) != 0)
      scale::Die("listen on port " + std::to_string(o.port) + ": " + ErrnoName(errno));
    socklen_t len = sizeof local;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&local), &len);
    Watch(EPOLL_CTL_ADD, listener_, EPOLLIN, kListenerKey);
    Watch(EPOLL_CTL_ADD, o.serveFd, EPOLLIN, kControlKey);
    control_.channel().Send("ready port=" + std::to_string(ntohs(local.sin_port)));
  }

  int Run() {
    epoll_event events[256];
    while (!control_.quitting()) {
      int n = epoll_wait(epoll_, events, 256, control_.WaitMs());
      for (int i = 0; i < n; ++i) {
        std::uint32_t key = events[i].data.u32;
        if (key == kListenerKey) {
          AcceptAll();
        } else if (key == kControlKey) {
          scale::LineChannel& channel = control_.channel();
          channel.ReadSome();
          if (channel.eof()) return scale::kExitFailed;  // the client is gone
          std::string line;
          while (channel.TakeLine(&line)) control_.OnLine(line);
        } else {
          OnData(key);
        }
      }
      control_.Check();
    }
    for (auto& c : conns_)
      if (c.state == State::Up) {
        ledger_->Completed("connection", "abandoned", control_.phase(), false);
        CloseConn(c, State::Closed);
      }
    close(listener_);
    control_.Finish(*ledger_);
    return scale::kExitOk;
  }

 private:
  Figures AllFigures() {
    return scale::SampleProcess([this](Figures& f) { counts_.AddTo(f); });
  }

  void AcceptAll() {
    for (;;) {
      int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          ledger_->Posted("accept");
          ledger_->Completed("accept", ErrnoName(errno), control_.phase(), false);
        }
        return;
      }
      ledger_->Posted("accept");
      if (counts_.accepted >= conns_.size()) {  // more than the client asked for
        ledger_->Completed("accept", "unasked connection", control_.phase(), false);
        close(fd);
        continue;
      }
      ledger_->Completed("accept", "accepted", control_.phase(), control_.phase() == "setup");
      ledger_->Posted("connection");
      unsigned i = counts_.accepted++;
      conns_[i].fd = fd;
      conns_[i].state = o_.mpa ? State::Request : State::Up;
      Watch(EPOLL_CTL_ADD, fd, EPOLLIN | EPOLLRDHUP, i);
    }
  }

  void OnData(unsigned i) {
    Conn& c = conns_[i];
    const std::string& phase = control_.phase();
    while (c.state == State::Request || c.state == State::Rtr) {  // --mpa
      const bool request = c.state == State::Request;
      int r = ReadMessage(c, request ? kMpaRequestBytes : kMpaRtrBytes);
      if (r == 0) return;
      if (r < 0) return Ended(c, errno ? ErrnoName(errno) : "closed by the peer", false);
      if (!request) {
        c.state = State::Up;
      } else if (std::string why = WriteSetup(c, kMpaReplyBytes); !why.empty()) {
        return Ended(c, why, false);
      } else {
        c.state = State::Rtr;
      }
    }
    if (c.state != State::Up) return;
    for (;;) {
      int r = ReadMessage(c, o_.size);
      if (r == 0) return;
      if (r < 0) {
        // The client's close: expected in teardown only; the server closes at once (its FIN is
        // what the client's teardown waits for).
        bool closed = errno == 0;
        return Ended(c, closed ? "closed by the peer" : ErrnoName(errno), closed && phase == "teardown");
      }
      ledger_->Posted("receive");
      ledger_->Completed("receive", "received", phase, phase == "echo");
      if (WriteMessage(c, c.recvSlot, phase.c_str())) counts_.echoed++;
    }
  }

  void Ended(Conn& c, const std::string& why, bool expected) {
    const std::string& phase = control_.phase();
    ledger_->Completed("connection", why, phase, expected);
    if (phase != "teardown") {
      c.lost = true;
      counts_.lost++;
    }
    CloseConn(c, State::Closed);
    counts_.closed++;
  }

  scale::ServerCounts counts_;
  scale::ServerControl control_;
  int listener_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  return scale::Main(
      argc, argv, "tcp_scale", kUsage, false,
      [](const scale::Options& o) {
        scale::Ledger ledger;
        return Server(o, ledger).Run();
      },
      [](const scale::Options& o, unsigned port) { return std::make_unique<Client>(o, port); });
}
