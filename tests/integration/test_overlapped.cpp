// The overlapped model across a real connection: one side takes every completion from an I/O
// completion port associated with the adapter's overlapped file (after its objects were made),
// the other from events; then a ping-pong where both sides block in CQ Notify +
// GetOverlappedResult(wait = TRUE), and a solicited-only Notify.
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);
constexpr ULONG_PTR kKey = 0x5151;
constexpr size_t kMessage = 64;

// ---- completion port helpers --------------------------------------------------------------------

// Nothing is queued on the port (a zero-timeout dequeue times out).
void ExpectPortEmpty(HANDLE port, const char* what) {
  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* ov = nullptr;
  BOOL ok = GetQueuedCompletionStatus(port, &bytes, &key, &ov, 0);
  IT_CHECK_MSG(!ok && ov == nullptr, std::string(what) + ": unexpected packet on the port");
  IT_CHECK_EQ(DWORD(WAIT_TIMEOUT), GetLastError());
}

// The final status of a request issued with `ov` on `object`, taken the completion-port way: a
// pending request brings exactly one packet (key kKey, this OVERLAPPED; dequeue TRUE for a success
// status, FALSE for a failure), then GetOverlappedResult gives the status. A request done inline
// brings no packet.
HRESULT ViaPort(HANDLE port, IND2Overlapped* object, OVERLAPPED* ov, HRESULT issued,
                const char* what, int ms = kWaitMs) {
  if (issued != ND_PENDING) {
    ExpectPortEmpty(port, what);
    return issued;
  }
  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* got = nullptr;
  Deadline deadline(ms);
  BOOL ok = FALSE;
  for (;;) {  // in slices, so that a dead peer is noticed
    ok = GetQueuedCompletionStatus(port, &bytes, &key, &got, DWORD(std::min(deadline.LeftMs(), 100)));
    if (ok || got != nullptr) break;
    IT_CHECK_EQ(DWORD(WAIT_TIMEOUT), GetLastError());
    if (deadline.Expired()) {
      object->CancelOverlappedRequests();
      IT_FAIL(std::string(what) + ": no completion packet within " + std::to_string(ms) + " ms");
    }
    unsigned spins = 1000;
    Pause(spins);  // only to notice a dead peer
  }
  IT_CHECK_MSG(got == ov, std::string(what) + ": the packet carries another OVERLAPPED");
  IT_CHECK_EQ(kKey, key);
  HRESULT hr = object->GetOverlappedResult(ov, FALSE);
  IT_CHECK_EQ(HRESULT(ov->Internal), hr);
  IT_CHECK_MSG(bool(ok) == NT_SUCCESS(hr), std::string(what) + ": dequeue returned " +
                                             (ok ? "TRUE" : "FALSE") + " for " + StatusName(hr));
  ExpectPortEmpty(port, what);  // exactly one packet per request
  return hr;
}

// ---- 7a. completion port on one side, events on the other ---------------------------------------

IT_PEER(events_server) {
  Adapter adapter;
  std::vector<uint8_t> buffer(2 * kMessage);
  FillPattern(buffer.data() + kMessage, kMessage, 2);
  Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
  Endpoint server(adapter, kServerQp, {.depth = 8});
  ND2_SGE in = {buffer.data(), ULONG(kMessage), mr.token()};
  IT_OK(server.qp->Receive(Ctx(0x100), &in, 1));
  Serve(parent, server);  // every overlapped call here waits on its event (Ov)

  ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), kServerQp,
                                     int64_t(kMessage)},
                   "ping");
  CheckPattern(buffer.data(), kMessage, 1, "ping");
  parent.Expect("armed");
  ND2_SGE out = {buffer.data() + kMessage, ULONG(kMessage), mr.token()};
  IT_OK(server.qp->Send(Ctx(0x200), &out, 1, 0));
  ExpectCompletion(server.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kServerQp}, "pong");

  Ov notify;
  HRESULT hr = server.connector->NotifyDisconnect(notify.Prepare(server.connector.get()));
  IT_OK(notify.Finish(hr, "NotifyDisconnect"));
  parent.Expect("client disconnected");
  IT_OK(Disconnect(server.connector.get()));
}

TEST(IntegrationOverlapped, CompletionPortOnOneSideEventsOnTheOther) {
  RunWithPeer("events_server", [](Channel& peer) {
    Adapter adapter;
    HANDLE port = CreateIoCompletionPort(INVALID_HANDLE_VALUE, nullptr, 0, 0);
    IT_CHECK(port != nullptr);
    struct PortCloser {
      HANDLE port;
      ~PortCloser() { CloseHandle(port); }
    } closer{port};

    // Objects first, then the association (allowed, and what ndconn does).
    Ref<IND2MemoryRegion> mr = adapter.CreateMr();
    Ref<IND2MemoryRegion> mr2 = adapter.CreateMr();
    Endpoint client(adapter, kClientQp, {.depth = 8});
    IT_CHECK(CreateIoCompletionPort(adapter.file(), port, kKey, 0) == port);

    std::vector<uint8_t> buffer(2 * kMessage);
    FillPattern(buffer.data(), kMessage, 1);
    OVERLAPPED ov{};
    HRESULT hr = mr->Register(buffer.data(), buffer.size(), kSinkFlags, &ov);
    IT_OK(ViaPort(port, mr.get(), &ov, hr, "Register"));
    UINT32 token = mr->GetLocalToken();

    // hEvent with bit 0 set: the event is signalled, the port gets nothing.
    HANDLE event = CreateEvent(nullptr, TRUE, FALSE, nullptr);
    IT_CHECK(event != nullptr);
    ov = OVERLAPPED{};
    ov.hEvent = reinterpret_cast<HANDLE>(reinterpret_cast<uintptr_t>(event) | 1);
    hr = mr2->Register(buffer.data(), kMessage, kSourceFlags, &ov);
    if (hr == ND_PENDING) IT_CHECK_EQ(DWORD(WAIT_OBJECT_0), WaitForSingleObject(event, kWaitMs));
    IT_OK(mr2->GetOverlappedResult(&ov, FALSE));
    ExpectPortEmpty(port, "Register with a port-suppressing event");
    CloseHandle(event);
    ov = OVERLAPPED{};
    IT_OK(ViaPort(port, mr2.get(), &ov, mr2->Deregister(&ov), "Deregister"));

    ND2_SGE in = {buffer.data() + kMessage, ULONG(kMessage), token};
    IT_OK(client.qp->Receive(Ctx(0x100), &in, 1));

    // Connect and CompleteConnect through the port.
    uint16_t serverPort = uint16_t(peer.ReceiveValue("port"));
    client.connector = adapter.CreateConnector();
    IND2Connector* connector = client.connector.get();
    sockaddr_in local = Loopback(0), server = Loopback(serverPort);
    IT_OK(connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
    ov = OVERLAPPED{};
    hr = connector->Connect(client.qp.get(), reinterpret_cast<sockaddr*>(&server), sizeof server,
                            0, 0, nullptr, 0, &ov);
    IT_OK(ViaPort(port, connector, &ov, hr, "Connect"));
    ov = OVERLAPPED{};
    IT_OK(ViaPort(port, connector, &ov, connector->CompleteConnect(&ov), "CompleteConnect"));
    peer.Expect("accepted");  // sent by Serve

    ND2_SGE out = {buffer.data(), ULONG(kMessage), token};
    IT_OK(client.qp->Send(Ctx(0x200), &out, 1, 0));
    ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), kClientQp},
                     "ping");

    // CQ Notify through the port. A consumer drains (a GetResults that returns fewer than asked)
    // before it arms, else what it has not seen drained fires the Notify at once (no lost
    // wake-up). Armed on a drained CQ it pends until the pong arrives.
    ND2_RESULT drain[4];
    IT_CHECK_EQ(0u, client.cq->GetResults(drain, 4));
    ov = OVERLAPPED{};
    hr = client.cq->Notify(ND_CQ_NOTIFY_ANY, &ov);
    IT_CHECK_HR(ND_PENDING, hr);
    peer.Send("armed");
    IT_OK(ViaPort(port, client.cq.get(), &ov, hr, "CQ Notify"));
    ExpectCompletion(client.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), kClientQp,
                                       int64_t(kMessage)},
                     "pong");
    CheckPattern(buffer.data() + kMessage, kMessage, 2, "pong");

    // A canceled Notify: its failure packet is queued before CancelOverlappedRequests returns.
    IT_CHECK_EQ(0u, client.cq->GetResults(drain, 4));
    ov = OVERLAPPED{};
    IT_CHECK_HR(ND_PENDING, client.cq->Notify(ND_CQ_NOTIFY_ANY, &ov));
    IT_OK(client.cq->CancelOverlappedRequests());
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* got = nullptr;
    BOOL dequeued = GetQueuedCompletionStatus(port, &bytes, &key, &got, 0);
    IT_CHECK_MSG(got == &ov, "the canceled Notify's packet was not on the port");
    IT_CHECK_MSG(!dequeued, "dequeue returned TRUE for " + StatusName(HRESULT(ov.Internal)));
    IT_CHECK_EQ(kKey, key);
    IT_CHECK_EQ(DWORD(ERROR_OPERATION_ABORTED), GetLastError());
    IT_CHECK_HR(ND_CANCELED, client.cq->GetOverlappedResult(&ov, FALSE));

    // The application's own packets share the port.
    IT_CHECK(PostQueuedCompletionStatus(port, 7, 0xABC, nullptr));
    got = &ov;
    IT_CHECK(GetQueuedCompletionStatus(port, &bytes, &key, &got, kWaitMs));
    IT_CHECK(got == nullptr);
    IT_CHECK_EQ(DWORD(7), bytes);
    IT_CHECK_EQ(ULONG_PTR(0xABC), key);

    ov = OVERLAPPED{};
    IT_OK(ViaPort(port, connector, &ov, connector->Disconnect(&ov), "Disconnect"));
    peer.Send("client disconnected");
    ov = OVERLAPPED{};
    IT_OK(ViaPort(port, mr.get(), &ov, mr->Deregister(&ov), "Deregister"));
  });
}

// ---- 7a'. closing the overlapped file --------------------------------------------------------------

// CloseHandle of an overlapped file completes the requests still pending through it
// (ND_CANCELED, before it returns, with their packets on the file's port), as Windows cancels a
// file's I/O at its close, and what would have completed them later writes nothing: the program
// may free the OVERLAPPEDs at once (Microsoft's SDK harness frees the one of an unawaited
// Disconnect; a late write there corrupted its stack).
TEST(IntegrationOverlapped, ClosingTheFileCancelsItsRequestsAndNothingIsWrittenAfter) {
  RunLocal([] {
    sockaddr_in loopback = Loopback(0);
    Ref<IND2Adapter> adapter;
    IT_OK(NdOpenAdapter(IID_IND2Adapter, reinterpret_cast<const sockaddr*>(&loopback), sizeof loopback,
                        adapter.Out()));
    HANDLE file = nullptr;
    IT_OK(adapter->CreateOverlappedFile(&file));
    HANDLE port = CreateIoCompletionPort(file, nullptr, kKey, 0);
    IT_CHECK(port != nullptr);
    Ref<IND2CompletionQueue> cq;
    IT_OK(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 16, 0, 0, cq.Out()));
    OVERLAPPED first{}, second{};
    IT_CHECK_HR(ND_PENDING, cq->Notify(ND_CQ_NOTIFY_ANY, &first));
    IT_CHECK_HR(ND_PENDING, cq->Notify(ND_CQ_NOTIFY_ERRORS, &second));

    IT_CHECK(CloseHandle(file));
    for (OVERLAPPED* ov : {&first, &second}) {
      IT_CHECK_MSG(HasOverlappedIoCompleted(ov), "a request was still pending after CloseHandle");
      IT_CHECK_HR(ND_CANCELED, HRESULT(ov->Internal));
      DWORD bytes = 0;
      ULONG_PTR key = 0;
      OVERLAPPED* got = nullptr;
      IT_CHECK_MSG(!GetQueuedCompletionStatus(port, &bytes, &key, &got, 0) && got != nullptr,
                   "no failure packet on the port for a request the close canceled");
      IT_CHECK(key == kKey);
    }
    ExpectPortEmpty(port, "after the close's packets");

    // The CQ still holds the two Notifies, and ends them when it goes: they are over for the
    // program, and their OVERLAPPEDs (filled with a pattern now) are left alone.
    memset(&first, 0xA5, sizeof first);
    memset(&second, 0xA5, sizeof second);
    IT_CHECK_EQ(0u, cq.Reset());
    OVERLAPPED pattern;
    memset(&pattern, 0xA5, sizeof pattern);
    IT_CHECK_MSG(memcmp(&first, &pattern, sizeof pattern) == 0 && memcmp(&second, &pattern, sizeof pattern) == 0,
                 "an OVERLAPPED was written after its file was closed");
    ExpectPortEmpty(port, "after the CQ's release");
    IT_CHECK(CloseHandle(port));
  });
}

// ---- 7b. blocking Notify + GetOverlappedResult(wait) -----------------------------------------------

// Cancels `object`'s requests if still armed after `ms`: bounds a blocking GetOverlappedResult.
class CancelGuard {
 public:
  CancelGuard(IND2Overlapped* object, int ms)
      : thread_([this, object, ms] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return done_; })) {
            fired_ = true;
            object->CancelOverlappedRequests();
          }
        }) {}
  ~CancelGuard() { Stop(); }
  bool Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    return fired_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;
};

// The next completion, the blocking way: GetResults; if empty, arm (`type`) and block in
// GetOverlappedResult(wait = TRUE) with no event in the OVERLAPPED, then look again.
ND2_RESULT BlockingNext(IND2CompletionQueue* cq, const char* what, ULONG type = ND_CQ_NOTIFY_ANY) {
  Deadline deadline;
  ND2_RESULT result{};
  for (;;) {
    if (cq->GetResults(&result, 1) == 1) return result;
    if (deadline.Expired()) IT_FAIL(std::string("no completion for ") + what);
    OVERLAPPED ov{};
    HRESULT hr = cq->Notify(type, &ov);
    if (hr == ND_PENDING) {
      CancelGuard guard(cq, deadline.LeftMs() + 1);
      hr = cq->GetOverlappedResult(&ov, TRUE);
      if (guard.Stop()) IT_FAIL(std::string("Notify for ") + what + " never completed");
    }
    IT_CHECK_HR(ND_SUCCESS, hr);
  }
}

constexpr int kRounds = 50;
constexpr int kPosted = 4;

// Both sides: receives kept posted, one message out per message in, every wait blocking.
void PingPong(Channel& channel, bool server) {
  Adapter adapter;
  std::vector<uint8_t> inbox(kPosted * kMessage), outbox(kMessage);
  Mr inboxMr(adapter, inbox.data(), inbox.size(), kSinkFlags);
  Mr outboxMr(adapter, outbox.data(), outbox.size(), kSourceFlags);
  void* qpContext = server ? kServerQp : kClientQp;
  Endpoint e(adapter, qpContext, {.depth = 8, .separateCqs = true});
  auto post = [&](int n) {
    ND2_SGE sge = {inbox.data() + (n % kPosted) * kMessage, ULONG(kMessage), inboxMr.token()};
    IT_OK(e.qp->Receive(Ctx(0x1000 + n), &sge, 1));
  };
  for (int n = 0; n < kPosted; ++n) post(n);
  if (server)
    Serve(channel, e);
  else
    ConnectTo(channel, e);

  auto send = [&](int n, uint64_t seed, ULONG flags) {
    FillPattern(outbox.data(), kMessage, seed);
    ND2_SGE sge = {outbox.data(), ULONG(kMessage), outboxMr.token()};
    IT_OK(e.qp->Send(Ctx(0x2000 + n), &sge, 1, flags));
    ND2_RESULT r = BlockingNext(e.cq.get(), "a send");
    IT_CHECK_MSG(r.Status == ND_SUCCESS && r.RequestType == Nd2RequestTypeSend &&
                     r.RequestContext == Ctx(0x2000 + n) && r.QueuePairContext == qpContext,
                 Describe(r));
  };
  int received = 0;
  auto receive = [&](uint64_t seed, ULONG type) {
    ND2_RESULT r = BlockingNext(e.receiveCq, "a receive", type);
    IT_CHECK_MSG(r.Status == ND_SUCCESS && r.RequestType == Nd2RequestTypeReceive &&
                     r.RequestContext == Ctx(0x1000 + received) && r.BytesTransferred == kMessage &&
                     r.QueuePairContext == qpContext,
                 Describe(r));
    CheckPattern(inbox.data() + (received % kPosted) * kMessage, kMessage, seed, "message");
    post(received + kPosted);
    ++received;
  };

  for (int round = 0; round < kRounds; ++round) {
    if (server) {
      receive(1000 + round, ND_CQ_NOTIFY_ANY);
      send(round, 2000 + round, 0);
    } else {
      send(round, 1000 + round, 0);
      receive(2000 + round, ND_CQ_NOTIFY_ANY);
    }
  }

  // A solicited-only Notify is not satisfied by an ordinary receive, and is by a solicited one.
  // The server proves the ordinary message was placed before the client looks: a zero-byte Read
  // behind it on the same stream completes only after the client processed the message.
  if (server) {
    channel.Expect("armed for solicited");
    send(kRounds, 3000, 0);
    IT_OK(e.qp->Read(Ctx(0x3000), nullptr, 0, 0, 0, 0));
    ND2_RESULT r = BlockingNext(e.cq.get(), "a zero-byte Read");
    IT_CHECK_MSG(r.Status == ND_SUCCESS && r.RequestType == Nd2RequestTypeRead &&
                     r.RequestContext == Ctx(0x3000),
                 Describe(r));
    channel.Send("ordinary message delivered");
    channel.Expect("still armed");
    send(kRounds + 1, 3001, ND_OP_FLAG_SEND_AND_SOLICIT_EVENT);
  } else {
    ND2_RESULT results[3];
    IT_CHECK_EQ(0u, e.receiveCq->GetResults(results, 3));
    OVERLAPPED ov{};
    HRESULT hr = e.receiveCq->Notify(ND_CQ_NOTIFY_SOLICITED, &ov);
    IT_CHECK_HR(ND_PENDING, hr);
    channel.Send("armed for solicited");
    channel.Expect("ordinary message delivered");
    hr = e.receiveCq->GetOverlappedResult(&ov, FALSE);
    if (hr != ND_PENDING) IT_FAIL("an ordinary receive completed a solicited-only Notify: " + StatusName(hr));
    channel.Send("still armed");
    {
      CancelGuard guard(e.receiveCq, kWaitMs);
      hr = e.receiveCq->GetOverlappedResult(&ov, TRUE);
      IT_CHECK_MSG(!guard.Stop(), "the solicited Notify never completed");
    }
    IT_OK(hr);
    ULONG n = e.receiveCq->GetResults(results, 3);
    IT_CHECK_MSG(n == 2, std::to_string(n) + " receives in the CQ when the solicited Notify fired");
    for (ULONG i = 0; i < n; ++i)
      IT_CHECK_MSG(results[i].Status == ND_SUCCESS &&
                       results[i].RequestContext == Ctx(0x1000 + received + i),
                   Describe(results[i]));
  }
  if (server)
    ServerTeardown(channel, e);
  else
    ClientTeardown(channel, e);
}

IT_PEER(blocking_server) { PingPong(parent, true); }

TEST(IntegrationOverlapped, BlockingNotifyPingPong) {
  RunWithPeer("blocking_server", [](Channel& peer) { PingPong(peer, false); });
}

}  // namespace
}  // namespace ndit
