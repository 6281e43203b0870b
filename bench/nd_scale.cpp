// nd_scale: many connections through ndwv, made the way an MPI-style application makes them: a
// client and a server process on 127.0.0.1, N connections, each with its own QP, all QPs on one
// shared CQ (or --cqs C), everything through the ND2 SPI's public headers. The phases, each
// bounded and measured, are scale_common.h's (bench/README.md, "Many connections"): setup with K
// Connects in flight (the server keeps K GetConnectionRequests in flight), idle, one echo on
// every connection, teardown with K Disconnects in flight. The transport is NDWV_TRANSPORTS's.
//
// Every overlapped request of a process completes through one I/O completion port, and every CQ
// is armed with Notify, so that an idle process sleeps. Every QP keeps one receive posted the
// whole time (teardown flushes it). Every request and its completion go into the ledger; a
// connection that ends before teardown (its NotifyDisconnect completes, a receive fails) is lost.
//
// tcp_scale is the same benchmark over plain TCP; bench/scale.sh runs both and prints the ratios.
#include <ndwv/ndwv.h>

#include <memory>
#include <optional>
#include <thread>

#include "nd_objects.h"
#include "scale_common.h"

namespace {

using ndtool::NdRef;
using scale::Figures;
using scale::Loopback;
using scale::NowUs;

constexpr ULONG_PTR kAdapterKey = 1, kControlKey = 2;
constexpr ULONG kQueueDepth = 2;  // a QP has at most one receive and one send outstanding

const char kUsage[] =
    "  --cqs C              completion queues the QPs share, round robin (default 1)\n"
    "Environment: NDWV_TRANSPORTS=iwarp|roce chooses the transport, as for every ndwv program.\n"
    "The client starts the server itself (the same program with --serve); see bench/README.md.\n";

std::string StatusName(HRESULT hr) {
#define NDSCALE_STATUS(s) \
  case s:                 \
    return #s;
  switch (hr) {
    NDSCALE_STATUS(ND_SUCCESS) NDSCALE_STATUS(ND_TIMEOUT) NDSCALE_STATUS(ND_PENDING)
    NDSCALE_STATUS(ND_BUFFER_OVERFLOW) NDSCALE_STATUS(ND_UNSUCCESSFUL) NDSCALE_STATUS(ND_ACCESS_VIOLATION)
    NDSCALE_STATUS(ND_INVALID_PARAMETER) NDSCALE_STATUS(ND_INVALID_DEVICE_REQUEST) NDSCALE_STATUS(ND_NO_MEMORY)
    NDSCALE_STATUS(ND_DATA_OVERRUN) NDSCALE_STATUS(ND_INSUFFICIENT_RESOURCES) NDSCALE_STATUS(ND_IO_TIMEOUT)
    NDSCALE_STATUS(ND_INTERNAL_ERROR) NDSCALE_STATUS(ND_CANCELED) NDSCALE_STATUS(ND_REMOTE_ERROR)
    NDSCALE_STATUS(ND_INVALID_ADDRESS) NDSCALE_STATUS(ND_INVALID_DEVICE_STATE)
    NDSCALE_STATUS(ND_ADDRESS_ALREADY_EXISTS) NDSCALE_STATUS(ND_CONNECTION_REFUSED)
    NDSCALE_STATUS(ND_CONNECTION_INVALID) NDSCALE_STATUS(ND_CONNECTION_ACTIVE)
    NDSCALE_STATUS(ND_NETWORK_UNREACHABLE) NDSCALE_STATUS(ND_HOST_UNREACHABLE)
    NDSCALE_STATUS(ND_CONNECTION_ABORTED) NDSCALE_STATUS(ND_DEVICE_REMOVED)
    NDSCALE_STATUS(STATUS_CONNECTION_DISCONNECTED)
    default: break;
  }
#undef NDSCALE_STATUS
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08X", unsigned(hr));
  return hex;
}

// The adapter totals that tell what many connections cost; a phase prints those that moved.
const char* const kCounters[] = {
    "tx_packets",      "rx_packets",      "keepalives_sent",  "ack_timeouts",     "retransmits",
    "retry_exceeded",  "flushes",         "cm_retransmits",   "cm_req_timeouts",  "cm_rep_timeouts",
    "cm_dreq_timeouts", "cm_drops",       "accepts_refused",  "port_send_failed"};

Figures LibraryCounters() {
  ndwv_counter_row rows[4];  // the totals rows come first, one per transport
  std::size_t n = std::min<std::size_t>(ndwv_counters_snapshot(rows, 4), 4);
  Figures f;
  for (const char* name : kCounters) {
    double sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      std::uint64_t v = rows[i].qpn == 0 ? ndwv_counter_value(&rows[i], name) : UINT64_MAX;
      if (v != UINT64_MAX) sum += double(v);
    }
    f[std::string("nd.") + name] = sum;
  }
  return f;
}

// ---- what the client and the server share -----------------------------------------------------

enum class OpKind { Connect, CompleteConnect, GetConnectionRequest, Accept, NotifyDisconnect, Disconnect, CqNotify };

const char* KindName(OpKind k) {
  switch (k) {
    case OpKind::Connect: return "Connect";
    case OpKind::CompleteConnect: return "CompleteConnect";
    case OpKind::GetConnectionRequest: return "GetConnectionRequest";
    case OpKind::Accept: return "Accept";
    case OpKind::NotifyDisconnect: return "NotifyDisconnect";
    case OpKind::Disconnect: return "Disconnect";
    case OpKind::CqNotify: return "CQ Notify";
  }
  return "?";
}

struct Conn;

// One overlapped request slot. The port hands back &ov, which is the Op (ov comes first).
struct Op {
  OVERLAPPED ov{};
  OpKind kind = OpKind::Connect;
  Conn* conn = nullptr;
  unsigned cq = 0;  // CqNotify: which CQ
  bool pending = false;
};
static_assert(offsetof(Op, ov) == 0);

enum class State { Idle, Requested, Connecting, Completing, Accepting, Up, Disconnecting, Closed, Failed };

struct Conn {
  unsigned index = 0;
  State state = State::Idle;
  bool lost = false;      // ended before teardown asked it to
  bool awaiting = false;  // client: the echo's answer is due
  NdRef<IND2QueuePair> qp;
  NdRef<IND2Connector> connector;
  // setup: Connect then CompleteConnect (client), GetConnectionRequest then Accept (server)
  Op setup, notify, disconnect;
  unsigned pending = 0;  // overlapped requests outstanding
  char* sendSlot = nullptr;
  char* recvSlot = nullptr;
};

// The adapter, the completion port every overlapped request completes to, the CQs the QPs share,
// the message buffers and their registration, and the dispatch of packets and CQ results.
class NdSide {
 public:
  NdSide(const scale::Options& o, scale::Ledger& ledger) : o_(o), ledger_(ledger) {
    if (FAILED(NdStartup())) scale::Die("NdStartup failed");
  }
  // The derived side is gone by now: only what needs no handler (Close without draining).
  virtual ~NdSide() { Close(0, false); }

 protected:
  // After the adapter is open: the port, the CQs, the connections' slots and buffers.
  void Init() {
    // Registered before the port exists (and deregistered after it is gone): the helper waits
    // on its own event, and a packet of it would reach the port otherwise.
    buffer_.assign(std::size_t(o_.connections) * 2 * o_.size, 0);
    mr_ = std::make_unique<ndtool::MemoryRegion>(*adapter_);
    mr_->Register(buffer_.data(), buffer_.size(), ND_MR_FLAG_ALLOW_LOCAL_WRITE);
    port_ = CreateIoCompletionPort(adapter_->file(), nullptr, kAdapterKey, 0);
    if (!port_) scale::Die("CreateIoCompletionPort failed");
    const ULONG perCq = (o_.connections + o_.cqs - 1) / o_.cqs;
    const ULONG depth = 2 * perCq + 16;
    if (depth > adapter_->info().MaxCompletionQueueDepth)
      scale::Die("a CQ for " + std::to_string(perCq) + " QPs needs depth " + std::to_string(depth) +
                 ", the adapter's maximum is " + std::to_string(adapter_->info().MaxCompletionQueueDepth) +
                 ": use more --cqs");
    cqs_.resize(o_.cqs);
    for (unsigned i = 0; i < o_.cqs; ++i) {
      cqs_[i].cq = adapter_->CreateCompletionQueue(depth);
      cqs_[i].notify.kind = OpKind::CqNotify;
      cqs_[i].notify.cq = i;
    }
    conns_.reserve(o_.connections);
    for (unsigned i = 0; i < o_.connections; ++i) {
      auto c = std::make_unique<Conn>();
      c->index = i;
      c->sendSlot = buffer_.data() + std::size_t(i) * 2 * o_.size;
      c->recvSlot = c->sendSlot + o_.size;
      for (Op* op : {&c->setup, &c->notify, &c->disconnect}) op->conn = c.get();
      conns_.push_back(std::move(c));
    }
    for (auto& cq : cqs_) Arm(cq);
  }

  virtual const std::string& Phase() const = 0;
  // A completed overlapped request of a connection (status already taken).
  virtual void OnComplete(Op& op, HRESULT hr) = 0;
  virtual void OnResult(const ND2_RESULT& r) = 0;
  // A packet posted to the port by the program itself (the server's control lines).
  virtual void OnControl(OVERLAPPED*) {}

  void Record(const char* kind, HRESULT hr, bool expected) {
    ledger_.Completed(kind, StatusName(hr), Phase(), expected);
  }

  // A synchronous call that failed: a request and its unexpected completion.
  void Refused(const char* kind, HRESULT hr) {
    ledger_.Posted(kind);
    Record(kind, hr, false);
  }

  IND2Overlapped* Object(const Op& op) const {
    switch (op.kind) {
      case OpKind::GetConnectionRequest: return listener_.get();
      case OpKind::CqNotify: return cqs_[op.cq].cq.get();
      default: return op.conn->connector.get();
    }
  }

  // Issues one overlapped request; a result other than ND_PENDING is its completion (no packet
  // follows), handled here at once.
  template <class Call>
  void Issue(Op& op, OpKind kind, Call&& call) {
    ledger_.Posted(KindName(kind));
    if (op.pending) scale::Die(std::string("bug: ") + KindName(kind) + " issued on a busy slot");
    op.ov = OVERLAPPED{};
    op.kind = kind;
    op.pending = true;
    if (op.conn) {
      op.conn->pending++;
      pendingOps_++;
    }
    HRESULT hr = call(&op.ov);
    if (hr != ND_PENDING) Finish(op, hr);
  }

  void Finish(Op& op, HRESULT hr) {
    if (!op.pending) {
      ledger_.Duplicate(KindName(op.kind));
      return;
    }
    op.pending = false;
    if (op.conn) {
      op.conn->pending--;
      pendingOps_--;
    }
    OnComplete(op, hr);
  }

  // Waits up to timeoutMs (INFINITE: no bound) for one packet and handles it; false if none came.
  bool Pump(DWORD timeoutMs) {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* ov = nullptr;
    GetQueuedCompletionStatus(port_, &bytes, &key, &ov, timeoutMs);
    if (!ov) {
      if (GetLastError() != WAIT_TIMEOUT) scale::Die("GetQueuedCompletionStatus failed", scale::kExitFailed);
      return false;
    }
    if (key == kControlKey) {
      OnControl(ov);
      return true;
    }
    Op& op = *reinterpret_cast<Op*>(ov);
    // The status comes from the object while it lives; a request outliving its object (released
    // past a bound) still carries its status in Internal.
    IND2Overlapped* object = Object(op);
    HRESULT hr = object ? object->GetOverlappedResult(ov, FALSE) : HRESULT(ov->Internal);
    if (op.kind == OpKind::CqNotify) {
      if (!op.pending) {
        ledger_.Duplicate(KindName(op.kind));
        return true;
      }
      op.pending = false;
      Record("CQ Notify", hr, hr == ND_SUCCESS || (hr == ND_CANCELED && closing_));
      if (!closing_ && SUCCEEDED(hr)) Arm(cqs_[op.cq]);
      return true;
    }
    Finish(op, hr);
    return true;
  }

  DWORD WaitMsUntil(std::uint64_t untilUs) const { return DWORD(scale::MsUntil(untilUs)); }

  IND2CompletionQueue* CqOf(const Conn& c) const { return cqs_[c.index % cqs_.size()].cq.get(); }

  HRESULT CreateQueuePair(Conn& c) {
    IND2CompletionQueue* cq = CqOf(c);
    return adapter_->get()->CreateQueuePair(IID_IND2QueuePair, cq, cq, &c, kQueueDepth, kQueueDepth, 1, 1, 0,
                                           c.qp.Out());
  }

  HRESULT CreateConnector(Conn& c) {
    return adapter_->get()->CreateConnector(IID_IND2Connector, adapter_->file(), c.connector.Out());
  }

  // Every QP keeps one receive posted; a post the QP refuses is a completion with its status.
  void PostReceive(Conn& c) {
    ND2_SGE sge{c.recvSlot, o_.size, mr_->localToken()};
    ledger_.Posted("Receive");
    HRESULT hr = c.qp->Receive(&c, &sge, 1);
    if (hr == ND_SUCCESS) {
      outstanding_++;
      return;
    }
    Record("Receive", hr, false);  // the post refused: its completion
  }

  bool PostSend(Conn& c, ULONG length) {
    ND2_SGE sge{c.sendSlot, length, mr_->localToken()};
    ledger_.Posted("Send");
    HRESULT hr = c.qp->Send(&c, &sge, 1, 0);
    if (hr == ND_SUCCESS) {
      outstanding_++;
      return true;
    }
    Record("Send", hr, false);
    return false;
  }

  struct Cq {
    NdRef<IND2CompletionQueue> cq;
    Op notify;
  };

  void Drain(Cq& cq) {
    ND2_RESULT results[64];
    ULONG n;
    while ((n = cq.cq->GetResults(results, 64)) > 0)
      for (ULONG i = 0; i < n; ++i) {
        outstanding_--;
        OnResult(results[i]);
      }
  }

  // Releases everything, bounded by `untilUs` for what is still outstanding: requests in
  // flight are canceled and their completions awaited, then every object goes, then the library.
  void Close(std::uint64_t untilUs, bool drain = true) {
    if (!open_) return;
    closing_ = true;
    for (auto& c : conns_)
      if (c->pending && c->connector) c->connector->CancelOverlappedRequests();
    if (listener_) listener_->CancelOverlappedRequests();
    for (auto& cq : cqs_)
      if (cq.notify.pending) cq.cq->CancelOverlappedRequests();
    auto busy = [&] {
      if (pendingOps_ || listenerPending_) return true;
      for (auto& cq : cqs_)
        if (cq.notify.pending) return true;
      return false;
    };
    while (drain && busy() && NowUs() < untilUs) Pump(WaitMsUntil(std::min(untilUs, NowUs() + 100000)));
    // QPs released with receives posted flush them: collect those results too (bounded).
    for (auto& c : conns_) {
      c->connector.Reset();
      c->qp.Reset();
    }
    const std::uint64_t flushUntil = std::min(untilUs, NowUs() + 2000000);
    while (drain && outstanding_ > 0) {
      for (auto& cq : cqs_) Drain(cq);
      if (outstanding_ == 0 || NowUs() >= flushUntil) break;
      usleep(1000);
    }
    listener_.Reset();
    cqs_.clear();
    // Packets of requests whose objects are gone are dropped with the port.
    if (port_) CloseHandle(port_);
    port_ = nullptr;
    if (mr_) mr_->Deregister();
    mr_.reset();
    adapter_.reset();
    NdCleanup();
    open_ = false;
  }

  // Drain, then arm: a result queued after the last empty GetResults satisfies the Notify.
  void Arm(Cq& cq) {
    for (;;) {
      Drain(cq);
      ledger_.Posted("CQ Notify");
      cq.notify.ov = OVERLAPPED{};
      cq.notify.pending = true;
      HRESULT hr = cq.cq->Notify(ND_CQ_NOTIFY_ANY, &cq.notify.ov);
      if (hr == ND_PENDING) return;
      cq.notify.pending = false;
      Record("CQ Notify", hr, hr == ND_SUCCESS);
      if (FAILED(hr)) return;  // the CQ cannot be armed: the phases' bounds end the wait
    }
  }

  const scale::Options& o_;
  scale::Ledger& ledger_;
  bool open_ = true, closing_ = false;
  std::optional<ndtool::Adapter> adapter_{std::in_place};
  HANDLE port_ = nullptr;
  std::vector<Cq> cqs_;
  std::vector<char> buffer_;
  std::unique_ptr<ndtool::MemoryRegion> mr_;
  std::vector<std::unique_ptr<Conn>> conns_;
  NdRef<IND2Listener> listener_;  // the server's
  unsigned pendingOps_ = 0;       // connections' overlapped requests outstanding
  unsigned listenerPending_ = 0;  // the server's GetConnectionRequests outstanding
  long outstanding_ = 0;          // receives and sends posted, not yet completed
};

// ---- client ----------------------------------------------------------------------------------

class Client : public scale::ClientSide, public NdSide {
 public:
  Client(const scale::Options& o, unsigned serverPort) : NdSide(o, ledger), server_(Loopback(serverPort)) {
    adapter_->OpenForPeer(reinterpret_cast<const sockaddr*>(&server_), sizeof server_);
    Init();
  }

  std::string Transport() override {
    const char* t = ndwv_adapter_transport(adapter_->info().AdapterId);
    return t ? t : "unknown transport";
  }
  Figures Counters() override { return open_ ? LibraryCounters() : Figures{}; }

  unsigned Setup(std::uint64_t untilUs, std::vector<std::uint64_t>* times) override {
    phase_ = "setup";
    times_ = times;
    return ConnectAll(
        o_, untilUs, [this](unsigned i) { StartConnect(*conns_[i]); },
        [this](std::uint64_t until) { Pump(WaitMsUntil(until)); },
        [this] {
          cancelingSetup_ = true;
          for (auto& c : conns_)
            if (c->state == State::Connecting || c->state == State::Completing)
              c->connector->CancelOverlappedRequests();
        });
  }

  unsigned Idle(std::uint64_t untilUs) override {
    phase_ = "idle";
    while (NowUs() < untilUs) Pump(WaitMsUntil(untilUs));
    return established_ - lost_;
  }

  unsigned Echo(std::uint64_t untilUs, unsigned* sent) override {
    phase_ = "echo";
    unsigned count = 0;
    for (auto& cp : conns_) {
      Conn& c = *cp;
      if (c.state != State::Up || c.lost) continue;
      scale::FillMessage(c.sendSlot, c.index, o_.size);
      c.awaiting = true;
      awaiting_++;
      sendsDue_++;
      if (PostSend(c, o_.size)) {
        count++;
      } else {
        c.awaiting = false;
        awaiting_--;
        sendsDue_--;
      }
    }
    *sent = count;
    while ((awaiting_ > 0 || sendsDue_ > 0) && NowUs() < untilUs) Pump(WaitMsUntil(untilUs));
    return answered_;
  }

  unsigned Teardown(std::uint64_t untilUs) override {
    phase_ = "teardown";
    std::size_t next = 0;
    for (;;) {
      while (disconnecting_ < o_.outstanding && next < conns_.size()) {
        Conn& c = *conns_[next++];
        if (c.state != State::Up) continue;
        c.state = State::Disconnecting;
        disconnecting_++;
        Issue(c.disconnect, OpKind::Disconnect, [&](OVERLAPPED* ov) { return c.connector->Disconnect(ov); });
      }
      if ((next >= conns_.size() && pendingOps_ == 0) || NowUs() >= untilUs) break;
      Pump(WaitMsUntil(untilUs));
    }
    return closed_;
  }

  unsigned AwaitEnds(std::uint64_t untilUs) override {
    phase_ = "crash";
    const unsigned before = lost_;
    // The application goes on talking on one connection; the others are idle.
    for (auto& c : conns_)
      if (c->state == State::Up && !c->lost) {
        scale::FillMessage(c->sendSlot, c->index, o_.size);
        PostSend(*c, o_.size);
        break;
      }
    while (lost_ < established_ && NowUs() < untilUs) Pump(WaitMsUntil(untilUs));
    return lost_ - before;
  }

  void Release(std::uint64_t untilUs) override {
    phase_ = "release";
    Close(untilUs);
  }

 private:
  const std::string& Phase() const override { return phase_; }

  void StartConnect(Conn& c) {
    HRESULT hr = CreateQueuePair(c);
    if (SUCCEEDED(hr)) hr = CreateConnector(c);
    if (SUCCEEDED(hr)) hr = c.connector->Bind(adapter_->peerSource(), adapter_->peerSourceLength());
    if (FAILED(hr)) {
      Refused(!c.qp ? "CreateQueuePair" : !c.connector ? "CreateConnector" : "Bind", hr);
      c.state = State::Failed;
      failed_++;
      return;
    }
    PostReceive(c);
    c.state = State::Connecting;
    connecting_++;
    Issue(c.setup, OpKind::Connect, [&](OVERLAPPED* ov) {
      return c.connector->Connect(c.qp.get(), reinterpret_cast<const sockaddr*>(&server_), sizeof server_, 0, 0,
                                  nullptr, 0, ov);
    });
  }

  void SetupFailed(Conn& c) {
    c.state = State::Failed;
    connecting_--;
    failed_++;
  }

  void MarkLost(Conn& c) {
    if (c.lost || c.state != State::Up) return;
    c.lost = true;
    lost_++;
  }

  void OnComplete(Op& op, HRESULT hr) override {
    Conn& c = *op.conn;
    const bool canceled = hr == ND_CANCELED && (cancelingSetup_ || phase_ == "teardown" || closing_);
    const bool crashed = phase_ == "crash";  // any end of a connection whose peer was killed
    switch (op.kind) {
      case OpKind::Connect:
        Record("Connect", hr, hr == ND_SUCCESS || canceled);
        if (hr != ND_SUCCESS) return SetupFailed(c);
        c.state = State::Completing;
        Issue(c.setup, OpKind::CompleteConnect, [&](OVERLAPPED* ov) { return c.connector->CompleteConnect(ov); });
        return;
      case OpKind::CompleteConnect:
        Record("CompleteConnect", hr, hr == ND_SUCCESS || canceled);
        if (hr != ND_SUCCESS) return SetupFailed(c);
        c.state = State::Up;
        connecting_--;
        established_++;
        times_->push_back(NowUs());
        Issue(c.notify, OpKind::NotifyDisconnect, [&](OVERLAPPED* ov) { return c.connector->NotifyDisconnect(ov); });
        return;
      case OpKind::NotifyDisconnect: {
        // After our Disconnect it completes STATUS_CONNECTION_DISCONNECTED (docs/teardown.md); any
        // completion before it means the connection ended by itself.
        bool ours = c.state == State::Disconnecting || c.state == State::Closed;
        Record("NotifyDisconnect", hr,
               (ours && (hr == STATUS_CONNECTION_DISCONNECTED || hr == ND_SUCCESS)) || (closing_ && canceled) || crashed);
        if (!ours) MarkLost(c);
        return MaybeReleased(c);
      }
      case OpKind::Disconnect:
        Record("Disconnect", hr, SUCCEEDED(hr) || c.lost);
        c.state = State::Closed;
        disconnecting_--;
        closed_++;
        return MaybeReleased(c);
      default:
        return;
    }
  }

  // A closed connection's objects go as soon as its last request completed, as an application
  // would release them (the connector first, then the QP).
  void MaybeReleased(Conn& c) {
    if (c.state != State::Closed || c.pending) return;
    c.connector.Reset();
    c.qp.Reset();
  }

  void OnResult(const ND2_RESULT& r) override {
    Conn& c = *static_cast<Conn*>(r.RequestContext);
    const bool flush = r.Status == ND_CANCELED && (phase_ == "teardown" || phase_ == "crash" || closing_);
    if (r.RequestType == Nd2RequestTypeSend) {
      Record("Send", r.Status, r.Status == ND_SUCCESS || flush || phase_ == "crash");
      if (phase_ == "echo" && sendsDue_ > 0) sendsDue_--;
      if (r.Status != ND_SUCCESS && !flush) MarkLost(c);
      return;
    }
    if (r.Status != ND_SUCCESS) {
      Record("Receive", r.Status, flush);
      if (!flush) MarkLost(c);
      if (c.awaiting) {
        c.awaiting = false;
        awaiting_--;
      }
      return;
    }
    bool right = c.awaiting && r.BytesTransferred == o_.size && std::memcmp(c.recvSlot, c.sendSlot, o_.size) == 0;
    Record("Receive", r.Status, phase_ == "echo");
    if (c.awaiting) {
      c.awaiting = false;
      awaiting_--;
      if (right) answered_++;
    }
    if (!right) ledger_.Completed("Answer", "WRONG DATA", phase_, false);
    if (c.qp) PostReceive(c);  // one receive stays posted, for teardown to flush
  }

  sockaddr_in server_;
  std::string phase_ = "start";
  std::vector<std::uint64_t>* times_ = nullptr;
  bool cancelingSetup_ = false;
  unsigned awaiting_ = 0, sendsDue_ = 0, answered_ = 0;
  unsigned disconnecting_ = 0, closed_ = 0;
};

// ---- server ----------------------------------------------------------------------------------

// A line from the control socket, posted to the port by the reader thread.
struct ControlPacket {
  OVERLAPPED ov{};
  std::string line;
  bool eof = false;
};

class Server : public NdSide {
 public:
  Server(const scale::Options& o, scale::Ledger& ledger)
      : NdSide(o, ledger),
        control_(o.serveFd, [this](const std::string& name) { return counts_(name); },
                 [this] { return AllFigures(); }) {
    sockaddr_in local = Loopback(o.port);
    const sockaddr* address = reinterpret_cast<const sockaddr*>(&local);
    adapter_->Open(address, sizeof local);
    Init();
    listener_ = ndtool::Listen(*adapter_, address, sizeof local);
    sockaddr_in bound{};
    ULONG length = sizeof bound;
    ND_CHECK(listener_->GetLocalAddress(reinterpret_cast<sockaddr*>(&bound), &length),
             "IND2Listener::GetLocalAddress");
    control_.channel().Send("ready port=" + std::to_string(ntohs(bound.sin_port)));
  }

  // Serves until the client says quit, then releases everything; returns the exit status.
  int Run() {
    // The control socket is read by a thread of its own that posts each line to the port, so
    // that the loop below sleeps in one wait for everything.
    HANDLE port = port_;
    scale::LineChannel* channel = &control_.channel();
    std::thread([port, channel] {
      for (;;) {
        auto* packet = new ControlPacket;
        packet->eof = !channel->Receive(&packet->line, -1);
        bool last = packet->eof || packet->line.rfind("quit", 0) == 0;
        PostQueuedCompletionStatus(port, 0, kControlKey, &packet->ov);
        if (last) return;
      }
    }).detach();

    IssueRequests();
    while (!control_.quitting()) {
      int wait = control_.WaitMs();
      Pump(wait < 0 ? INFINITE : DWORD(wait));
      control_.Check();
    }
    Close(control_.quitDeadlineUs());
    control_.Finish(ledger_);
    return scale::kExitOk;
  }

 private:
  const std::string& Phase() const override { return control_.phase(); }

  Figures AllFigures() {
    return scale::SampleProcess([this](Figures& f) {
      if (open_)
        for (auto& [k, v] : LibraryCounters()) f[k] = v;
      counts_.AddTo(f);
    });
  }

  void OnControl(OVERLAPPED* ov) override {
    std::unique_ptr<ControlPacket> packet(reinterpret_cast<ControlPacket*>(ov));
    if (packet->eof) _exit(scale::kExitFailed);  // the client is gone: nobody to report to
    control_.OnLine(packet->line);
  }

  // Keeps K connection requests in flight until N have been asked for.
  void IssueRequests() {
    while (listenerPending_ < o_.outstanding && requested_ < o_.connections && !closing_) {
      Conn& c = *conns_[requested_++];
      if (HRESULT hr = CreateConnector(c); FAILED(hr)) {
        Refused("CreateConnector", hr);
        c.state = State::Failed;
        continue;
      }
      c.state = State::Requested;
      listenerPending_++;
      Issue(c.setup, OpKind::GetConnectionRequest,
            [&](OVERLAPPED* ov) { return listener_->GetConnectionRequest(c.connector.get(), ov); });
    }
  }

  void OnComplete(Op& op, HRESULT hr) override {
    Conn& c = *op.conn;
    const std::string& phase = Phase();
    const bool canceled = hr == ND_CANCELED && closing_;
    switch (op.kind) {
      case OpKind::GetConnectionRequest: {
        listenerPending_--;
        Record("GetConnectionRequest", hr, hr == ND_SUCCESS || canceled);
        if (hr != ND_SUCCESS) {
          c.state = State::Failed;
          return;
        }
        IssueRequests();
        if (hr = CreateQueuePair(c); FAILED(hr)) {
          Refused("CreateQueuePair", hr);
          c.state = State::Failed;
          return;
        }
        PostReceive(c);
        c.state = State::Accepting;
        Issue(c.setup, OpKind::Accept,
              [&](OVERLAPPED* ov) { return c.connector->Accept(c.qp.get(), 0, 0, nullptr, 0, ov); });
        return;
      }
      case OpKind::Accept:
        Record("Accept", hr, hr == ND_SUCCESS || canceled);
        if (hr != ND_SUCCESS) {
          c.state = State::Failed;
          return;
        }
        c.state = State::Up;
        counts_.accepted++;
        Issue(c.notify, OpKind::NotifyDisconnect, [&](OVERLAPPED* ov) { return c.connector->NotifyDisconnect(ov); });
        return;
      case OpKind::NotifyDisconnect:
        // The client disconnects in teardown; before that, a disconnect is a lost connection.
        Record("NotifyDisconnect", hr, (phase == "teardown" && hr == ND_SUCCESS) || canceled);
        if (phase != "teardown" && !closing_) {
          c.lost = true;
          counts_.lost++;
        }
        if (c.state == State::Up && !closing_) {
          c.state = State::Disconnecting;
          Issue(c.disconnect, OpKind::Disconnect, [&](OVERLAPPED* ov) { return c.connector->Disconnect(ov); });
        }
        return;
      case OpKind::Disconnect:
        Record("Disconnect", hr, SUCCEEDED(hr) || c.lost);
        c.state = State::Closed;
        counts_.closed++;
        if (c.pending == 0) {
          c.connector.Reset();
          c.qp.Reset();
        }
        return;
      default:
        return;
    }
  }

  void OnResult(const ND2_RESULT& r) override {
    Conn& c = *static_cast<Conn*>(r.RequestContext);
    const std::string& phase = Phase();
    const bool flush = r.Status == ND_CANCELED && (phase == "teardown" || closing_);
    if (r.RequestType == Nd2RequestTypeSend) {
      Record("Send", r.Status, r.Status == ND_SUCCESS || flush);
      if (r.Status == ND_SUCCESS) counts_.echoed++;
      return;
    }
    Record("Receive", r.Status, (r.Status == ND_SUCCESS && phase == "echo") || flush);
    if (r.Status != ND_SUCCESS || !c.qp) return;
    // The answer is the message itself; the receive is posted again first, as an application
    // that must never leave its peer without one would.
    std::memcpy(c.sendSlot, c.recvSlot, r.BytesTransferred);
    PostReceive(c);
    PostSend(c, r.BytesTransferred);
  }

  scale::ServerCounts counts_;
  scale::ServerControl control_;
  unsigned requested_ = 0;
};

// The process this program becomes with --serve: exits through _exit, so that the detached
// control reader never outlives the objects it posts to.
[[noreturn]] void ServeAndExit(const scale::Options& o) {
  scale::Ledger ledger;
  int rc;
  {
    Server server(o, ledger);
    rc = server.Run();
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}

}  // namespace

int main(int argc, char** argv) {
  return scale::Main(
      argc, argv, "nd_scale", kUsage, true, [](const scale::Options& o) -> int { ServeAndExit(o); },
      [](const scale::Options& o, unsigned port) { return std::make_unique<Client>(o, port); });
}
