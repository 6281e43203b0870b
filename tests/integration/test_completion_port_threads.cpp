// Connections set up and torn down by completion-port worker threads, the way Microsoft's ndconn
// (and MS-MPI) drive ND: every QP of a side shares one send CQ and one receive CQ; several worker
// threads take every completion (Connect, Accept, Disconnect, CQ notifications) from one I/O
// completion port and run the next step of that connection, so one worker releases a finished
// connection's QP while another polls the CQs its transport still fed a moment ago.
//
// Each cycle: the server pre-posts a receive and accepts; the client pre-posts a receive,
// connects and sends; the server answers once both its Accept and its receive completed; the
// client disconnects when the answer arrives; the server disconnects when its send completed;
// each side releases the cycle's connector and QP on the worker that saw its Disconnect end.
// Both sides check every status and count every cycle; several cycles run at once.
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

constexpr size_t kMessage = 64;
constexpr int kCycles = 300;
constexpr int kInFlight = 8;  // client cycles running at once
constexpr int kWorkers = 2;   // ndconn's default

// An OVERLAPPED that knows which step it ends.
struct Step : OVERLAPPED {
  void (*done)(Step*) = nullptr;
  void* owner = nullptr;
  void Reset() { static_cast<OVERLAPPED&>(*this) = OVERLAPPED{}; }
};

// One side: adapter, CQs, buffer, the port and its workers. Cycles report to it.
class Side {
 public:
  explicit Side(int cycles) : target_(cycles) {
    sendCq = adapter.CreateCq(4096);
    recvCq = adapter.CreateCq(4096);
    mr = std::make_unique<Mr>(adapter, buffer, sizeof buffer, kSinkFlags);
    // After the registration, whose completion the harness takes through its event.
    port_ = CreateIoCompletionPort(INVALID_HANDLE_VALUE, nullptr, 0, 0);
    IT_CHECK(port_ != nullptr);
    IT_CHECK(CreateIoCompletionPort(adapter.file(), port_, 0, 0) == port_);
  }
  ~Side() {
    StopWorkers();
    CloseHandle(port_);
  }
  // Before the owner releases what the workers use.
  void StopWorkers() {
    stop_ = true;
    for (auto& w : workers_) w.join();
    workers_.clear();
  }

  // Arms both CQs and starts the workers.
  void Start() {
    sendNotify_.done = &Side::OnSendCq;
    sendNotify_.owner = this;
    recvNotify_.done = &Side::OnRecvCq;
    recvNotify_.owner = this;
    Arm(sendCq.get(), &sendNotify_);
    Arm(recvCq.get(), &recvNotify_);
    for (int i = 0; i < kWorkers; ++i) workers_.emplace_back([this] { Work(); });
  }

  // Waits (bounded) until `target` cycles ended, or a worker found an error.
  void WaitForCycles(int ms) {
    Deadline deadline(ms);
    unsigned spins = 0;
    while (finished_.load() < target_ && error_.load() == nullptr && !deadline.Expired()) Pause(spins);
    std::lock_guard lock(error_mutex_);
    if (const char* e = error_.load()) IT_FAIL(std::string("worker: ") + e + " (" + detail_ + ")");
    IT_CHECK_EQ(target_, finished_.load());
  }

  // A worker's check: the first failure is kept and reported by WaitForCycles (a worker thread
  // cannot throw into the test).
  bool Check(bool ok, const char* what, HRESULT hr, ULONG bytes = 0) {
    if (ok) return true;
    std::lock_guard lock(error_mutex_);
    if (error_.load() == nullptr) {
      detail_ = StatusName(hr) + (bytes ? ", " + std::to_string(bytes) + " bytes" : std::string());
      error_ = what;
    }
    return false;
  }

  // Each cycle receives into and sends from a slot of its own: the cycles run at once, and
  // receives of two connections into the same bytes would be a data race (ThreadSanitizer). A
  // slot comes round again kSlots cycles later; at most kInFlight cycles run at once.
  uint8_t* TakeSlot() { return buffer + (next_slot_++ % kSlots) * kMessage; }
  ND2_SGE Sge(uint8_t* slot) { return {slot, ULONG(kMessage), mr->token()}; }
  void Finished() { finished_++; }
  int finished() const { return finished_.load(); }

  Adapter adapter;
  Ref<IND2CompletionQueue> sendCq, recvCq;
  std::unique_ptr<Mr> mr;
  static constexpr size_t kSlots = 64;
  alignas(64) uint8_t buffer[kSlots * kMessage] = {};
  // The receive/send contexts are the cycles themselves: each type of result calls its handler.
  void (*onReceive)(void* cycle, HRESULT status, ULONG bytes) = nullptr;
  void (*onSend)(void* cycle, HRESULT status) = nullptr;

 private:
  void Arm(IND2CompletionQueue* cq, Step* step) {
    step->Reset();
    HRESULT hr = cq->Notify(ND_CQ_NOTIFY_ANY, step);
    Check(hr == ND_PENDING || hr == ND_SUCCESS, "Notify", hr);
  }
  // As ndconn: drain the CQ, then arm it again.
  static void OnSendCq(Step* step) {
    Side* self = static_cast<Side*>(step->owner);
    ND2_RESULT r;
    while (self->sendCq->GetResults(&r, 1) == 1) self->onSend(r.RequestContext, r.Status);
    self->Arm(self->sendCq.get(), step);
  }
  static void OnRecvCq(Step* step) {
    Side* self = static_cast<Side*>(step->owner);
    ND2_RESULT r;
    while (self->recvCq->GetResults(&r, 1) == 1) self->onReceive(r.RequestContext, r.Status, r.BytesTransferred);
    self->Arm(self->recvCq.get(), step);
  }
  void Work() {
    while (!stop_) {
      DWORD bytes = 0;
      ULONG_PTR key = 0;
      OVERLAPPED* ov = nullptr;
      GetQueuedCompletionStatus(port_, &bytes, &key, &ov, 50);
      if (!ov) continue;
      Step* step = static_cast<Step*>(ov);
      if (Check(step->done != nullptr, "a packet for an OVERLAPPED the test did not issue", 0)) step->done(step);
    }
  }

  HANDLE port_ = nullptr;
  const int target_;
  std::atomic<int> finished_{0};
  std::atomic<unsigned> next_slot_{0};
  std::mutex error_mutex_;
  std::atomic<const char*> error_{nullptr};  // the first failure (set under error_mutex_)
  std::string detail_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
  Step sendNotify_, recvNotify_;
};

// ---- the server ---------------------------------------------------------------------------------

struct ServerCycle {
  Side* side;
  uint8_t* slot;
  Ref<IND2Connector> connector;
  Ref<IND2QueuePair> qp;
  Step accept, disconnect, notify;
  std::atomic<int> ready{0};  // Accept and the receive: the answer goes when both are done
  // The Disconnect and the NotifyDisconnect: the cycle's memory (their OVERLAPPEDs) goes when
  // both have ended.
  std::atomic<int> ends{2};
  void End() {
    if (--ends == 0) delete this;
  }
};

class Server {
 public:
  explicit Server(int cycles) : side_(cycles) {
    side_.onReceive = &Server::OnReceive;
    side_.onSend = &Server::OnSend;
    port_ = StartListening(side_.adapter, listener_);
  }
  ~Server() { side_.StopWorkers(); }
  uint16_t port() const { return port_; }
  void Run() {
    side_.Start();
    NextRequest();
  }
  void Wait(int ms) { side_.WaitForCycles(ms); }
  void Stop() { listener_->CancelOverlappedRequests(); }

 private:
  void NextRequest() {
    auto cycle = std::make_unique<ServerCycle>();
    cycle->side = &side_;
    cycle->slot = side_.TakeSlot();
    IT_OK(side_.adapter->CreateConnector(IID_IND2Connector, side_.adapter.file(), cycle->connector.Out()));
    request_.Reset();
    request_.done = &Server::OnRequest;
    request_.owner = this;
    waiting_ = std::move(cycle);
    HRESULT hr = listener_->GetConnectionRequest(waiting_->connector.get(), &request_);
    side_.Check(hr == ND_PENDING || hr == ND_SUCCESS, "GetConnectionRequest", hr);
  }
  static void OnRequest(Step* step) {
    Server* self = static_cast<Server*>(step->owner);
    HRESULT hr = self->listener_->GetOverlappedResult(step, FALSE);
    if (hr == ND_CANCELED) return;  // Stop()
    if (!self->side_.Check(hr == ND_SUCCESS, "GetConnectionRequest completion", hr)) return;
    ServerCycle* cycle = self->waiting_.release();
    self->NextRequest();
    Side& side = self->side_;
    if (!side.Check(SUCCEEDED(side.adapter->CreateQueuePair(
                        IID_IND2QueuePair, side.recvCq.get(), side.sendCq.get(), cycle, 1, 1, 1, 1, 0,
                        cycle->qp.Out())),
                    "CreateQueuePair", 0))
      return;
    ND2_SGE sge = side.Sge(cycle->slot);
    side.Check(cycle->qp->Receive(cycle, &sge, 1) == ND_SUCCESS, "Receive", 0);
    cycle->accept.done = &Server::OnAccept;
    cycle->accept.owner = cycle;
    hr = cycle->connector->Accept(cycle->qp.get(), 0, 0, nullptr, 0, &cycle->accept);
    side.Check(hr == ND_PENDING || hr == ND_SUCCESS, "Accept", hr);
  }
  static void OnAccept(Step* step) {
    ServerCycle* cycle = static_cast<ServerCycle*>(step->owner);
    HRESULT hr = cycle->connector->GetOverlappedResult(step, FALSE);
    if (!cycle->side->Check(hr == ND_SUCCESS, "Accept completion", hr)) return;
    cycle->notify.done = &Server::OnNotifyDisconnect;
    cycle->notify.owner = cycle;
    hr = cycle->connector->NotifyDisconnect(&cycle->notify);
    cycle->side->Check(hr == ND_PENDING || hr == ND_SUCCESS, "NotifyDisconnect", hr);
    if (++cycle->ready == 2) Answer(cycle);
  }
  // Canceled by OnDisconnect, or done when the client's disconnect came first.
  static void OnNotifyDisconnect(Step* step) { static_cast<ServerCycle*>(step->owner)->End(); }
  static void OnReceive(void* context, HRESULT status, ULONG bytes) {
    ServerCycle* cycle = static_cast<ServerCycle*>(context);
    if (!cycle->side->Check(status == ND_SUCCESS && bytes == kMessage, "server receive", status, bytes)) return;
    if (++cycle->ready == 2) Answer(cycle);
  }
  // Neither here nor below is the cycle touched after the call that starts its next step: another
  // worker may end the cycle (and free it) before the call returns.
  static void Answer(ServerCycle* cycle) {
    Side* side = cycle->side;
    ND2_SGE sge = side->Sge(cycle->slot);
    HRESULT hr = cycle->qp->Send(cycle, &sge, 1, 0);
    side->Check(hr == ND_SUCCESS, "server Send", hr);
  }
  static void OnSend(void* context, HRESULT status) {
    ServerCycle* cycle = static_cast<ServerCycle*>(context);
    if (!cycle->side->Check(status == ND_SUCCESS, "server send completion", status)) return;
    cycle->disconnect.done = &Server::OnDisconnect;
    cycle->disconnect.owner = cycle;
    Side* side = cycle->side;
    HRESULT hr = cycle->connector->Disconnect(&cycle->disconnect);
    side->Check(hr == ND_PENDING || hr == ND_SUCCESS, "server Disconnect", hr);
  }
  static void OnDisconnect(Step* step) {
    ServerCycle* cycle = static_cast<ServerCycle*>(step->owner);
    HRESULT hr = cycle->connector->GetOverlappedResult(step, FALSE);
    if (!cycle->side->Check(hr == ND_SUCCESS || hr == ND_TIMEOUT, "server Disconnect completion", hr)) return;
    cycle->connector->CancelOverlappedRequests();  // the NotifyDisconnect, as ndconn does
    Side* side = cycle->side;
    cycle->connector.Reset();
    cycle->qp.Reset();  // while the other worker polls the CQs this QP fed
    side->Finished();
    cycle->End();
  }

  Side side_;
  Ref<IND2Listener> listener_;
  uint16_t port_ = 0;
  Step request_;
  std::unique_ptr<ServerCycle> waiting_;
};

// ---- the client ---------------------------------------------------------------------------------

class Client;
struct ClientCycle {
  Side* side;
  uint8_t* slot;
  Client* client;
  Ref<IND2Connector> connector;
  Ref<IND2QueuePair> qp;
  Step connect, complete, disconnect;
};

class Client {
 public:
  Client(int cycles, uint16_t port) : side_(cycles), left_(cycles), server_(Loopback(port)) {
    side_.onReceive = &Client::OnReceive;
    side_.onSend = &Client::OnSend;
  }
  ~Client() { side_.StopWorkers(); }
  void Run() {
    side_.Start();
    for (int i = 0; i < kInFlight; ++i) Launch();
  }
  void Wait(int ms) { side_.WaitForCycles(ms); }

 private:
  void Launch() {
    if (left_.fetch_sub(1) <= 0) return;
    // Value-initialized: its OVERLAPPEDs start zeroed, as Windows requires (a stale hEvent with
    // its low bit set would keep the completion off the port, and the cycle would wait forever).
    auto* cycle = new ClientCycle();
    cycle->side = &side_;
    cycle->slot = side_.TakeSlot();
    cycle->client = this;
    Adapter& adapter = side_.adapter;
    if (!side_.Check(SUCCEEDED(adapter->CreateConnector(IID_IND2Connector, adapter.file(), cycle->connector.Out())),
                     "CreateConnector", 0) ||
        !side_.Check(SUCCEEDED(adapter->CreateQueuePair(IID_IND2QueuePair, side_.recvCq.get(), side_.sendCq.get(),
                                                        cycle, 1, 1, 1, 1, 0, cycle->qp.Out())),
                     "CreateQueuePair", 0))
      return;
    ND2_SGE sge = side_.Sge(cycle->slot);
    side_.Check(cycle->qp->Receive(cycle, &sge, 1) == ND_SUCCESS, "Receive", 0);
    sockaddr_in any = Loopback(0);
    HRESULT hr = cycle->connector->Bind(reinterpret_cast<const sockaddr*>(&any), sizeof any);
    if (!side_.Check(hr == ND_SUCCESS, "Bind", hr)) return;
    cycle->connect.done = &Client::OnConnect;
    cycle->connect.owner = cycle;
    hr = cycle->connector->Connect(cycle->qp.get(), reinterpret_cast<const sockaddr*>(&server_), sizeof server_,
                                   0, 0, nullptr, 0, &cycle->connect);
    side_.Check(hr == ND_PENDING || hr == ND_SUCCESS, "Connect", hr);
  }
  static void OnConnect(Step* step) {
    ClientCycle* cycle = static_cast<ClientCycle*>(step->owner);
    Client* self = cycle->client;
    HRESULT hr = cycle->connector->GetOverlappedResult(step, FALSE);
    if (!self->side_.Check(hr == ND_SUCCESS, "Connect completion", hr)) return;
    cycle->complete.done = &Client::OnComplete;
    cycle->complete.owner = cycle;
    hr = cycle->connector->CompleteConnect(&cycle->complete);
    if (hr == ND_SUCCESS) return OnCompleted(self, cycle, hr);  // no packet comes: go on here
    self->side_.Check(hr == ND_PENDING, "CompleteConnect", hr);
  }
  static void OnComplete(Step* step) {
    ClientCycle* cycle = static_cast<ClientCycle*>(step->owner);
    OnCompleted(cycle->client, cycle, cycle->connector->GetOverlappedResult(step, FALSE));
  }
  static void OnCompleted(Client* self, ClientCycle* cycle, HRESULT hr) {
    if (!self->side_.Check(hr == ND_SUCCESS, "CompleteConnect completion", hr)) return;
    ND2_SGE sge = self->side_.Sge(cycle->slot);
    // The Send's context is the side, not the cycle: the peer's answer can overtake the Send's
    // acknowledgement, and the cycle is freed at its Disconnect, which one worker may complete
    // before another reaps this Send.
    hr = cycle->qp->Send(&self->side_, &sge, 1, 0);
    self->side_.Check(hr == ND_SUCCESS, "client Send", hr);
  }
  static void OnSend(void* context, HRESULT status) {
    static_cast<Side*>(context)->Check(status == ND_SUCCESS, "client send completion", status);
  }
  static void OnReceive(void* context, HRESULT status, ULONG bytes) {
    ClientCycle* cycle = static_cast<ClientCycle*>(context);
    if (!cycle->side->Check(status == ND_SUCCESS && bytes == kMessage, "client receive", status, bytes)) return;
    cycle->disconnect.done = &Client::OnDisconnect;
    cycle->disconnect.owner = cycle;
    Side* side = cycle->side;
    HRESULT hr = cycle->connector->Disconnect(&cycle->disconnect);
    side->Check(hr == ND_PENDING || hr == ND_SUCCESS, "client Disconnect", hr);
  }
  static void OnDisconnect(Step* step) {
    std::unique_ptr<ClientCycle> cycle(static_cast<ClientCycle*>(step->owner));
    Client* self = cycle->client;
    HRESULT hr = cycle->connector->GetOverlappedResult(step, FALSE);
    if (!self->side_.Check(hr == ND_SUCCESS || hr == ND_TIMEOUT, "client Disconnect completion", hr)) {
      cycle.release();
      return;
    }
    cycle->connector.Reset();
    cycle->qp.Reset();  // while the other worker polls the CQs
    self->side_.Finished();
    self->Launch();
  }

  Side side_;
  std::atomic<int> left_;
  sockaddr_in server_;
};

IT_PEER(completion_port_client) {
  uint16_t port = uint16_t(parent.ReceiveValue("port"));
  Client client(kCycles, port);
  client.Run();
  client.Wait(120000);
  parent.Send("done");
}

TEST(IntegrationCompletionPortThreads, WorkersCycleConnectionsOnSharedCqsWhileOthersPoll) {
  RunWithPeer("completion_port_client", [](Channel& peer) {
    Server server(kCycles);
    server.Run();
    peer.SendValue("port", server.port());
    server.Wait(120000);
    peer.Expect("done", 120000);
    server.Stop();
  });
}

}  // namespace
}  // namespace ndit
