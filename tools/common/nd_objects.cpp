#include "nd_objects.h"

#include <cstdio>

namespace ndtool {

// ---- library and overlapped requests ---------------------------------------------------------

NdLibrary::NdLibrary() { ND_CHECK(NdStartup(), "NdStartup"); }
NdLibrary::~NdLibrary() { NdCleanup(); }

Overlapped::Overlapped() {
  event_ = CreateEvent(nullptr, FALSE, FALSE, nullptr);  // auto-reset: one wake per completion
  if (!event_) Fail("CreateEvent", HRESULT(GetLastError()), __LINE__);
}

Overlapped::~Overlapped() {
  if (event_) CloseHandle(event_);
}

OVERLAPPED* Overlapped::Prepare(bool portPacket) {
  ov_ = OVERLAPPED{};
  ov_.hEvent = portPacket ? event_
                          : reinterpret_cast<HANDLE>(reinterpret_cast<ULONG_PTR>(event_) | 1);
  return &ov_;
}

namespace {
HRESULT ResultOf(IND2Overlapped* object, OVERLAPPED* ov, BOOL wait) {
  return object->GetOverlappedResult(ov, wait);
}
HRESULT ResultOf(INDOverlapped* object, OVERLAPPED* ov, BOOL wait) {
  SIZE_T bytes = 0;  // version 1's byte count: ND requests have none
  return object->GetOverlappedResult(ov, &bytes, wait);
}
}  // namespace

HRESULT Overlapped::Complete(IND2Overlapped* object, HRESULT issued, const char* what,
                             std::uint32_t timeoutMs) {
  return Await(object, issued, what, timeoutMs);
}

HRESULT Overlapped::Complete(INDOverlapped* object, HRESULT issued, const char* what,
                             std::uint32_t timeoutMs) {
  return Await(object, issued, what, timeoutMs);
}

template <class Object>
HRESULT Overlapped::Await(Object* object, HRESULT issued, const char* what, std::uint32_t timeoutMs) {
  if (issued != ND_PENDING) return issued;  // done inline or refused: no notification follows
  const std::uint64_t deadline = NowMicros() + std::uint64_t(timeoutMs) * 1000;
  for (;;) {
    NoteProgress();
    // Waits in slices so that the bound holds and a completion whose event went missing is
    // still found by the non-blocking check below.
    std::uint64_t now = NowMicros();
    std::uint64_t leftMs = now < deadline ? (deadline - now + 999) / 1000 : 0;
    DWORD wait = WaitForSingleObject(event_, DWORD(leftMs < 100 ? leftMs : 100));
    if (wait == WAIT_FAILED) Fail("WaitForSingleObject", HRESULT(GetLastError()), __LINE__);
    // Signalled: the request is done, so the waiting call returns at once (and gives the
    // provider its post-processing hook). Otherwise only peek.
    HRESULT hr = ResultOf(object, &ov_, wait == WAIT_OBJECT_0 ? TRUE : FALSE);
    if (hr != ND_PENDING) return hr;  // (ND_PENDING again: a further phase was started)
    if (NowMicros() >= deadline) {
      object->CancelOverlappedRequests();
      FailTimeout(what, timeoutMs, __LINE__);
    }
  }
}

// ---- adapter ---------------------------------------------------------------------------------

Adapter::~Adapter() {
  // The objects made from the adapter are gone by now; the file goes before the adapter.
  if (file_) CloseHandle(file_);
  adapter_.Reset();
}

void Adapter::Open(const sockaddr* localAddress, ULONG length) {
  ND_CHECK(NdOpenAdapter(IID_IND2Adapter, localAddress, length, adapter_.Out()), "NdOpenAdapter");
  info_ = ND2_ADAPTER_INFO{};
  info_.InfoVersion = ND_VERSION_2;
  ULONG size = sizeof(info_);
  ND_CHECK(adapter_->Query(&info_, &size), "IND2Adapter::Query");
  ND_CHECK(adapter_->CreateOverlappedFile(&file_), "IND2Adapter::CreateOverlappedFile");
}

void Adapter::OpenForPeer(const sockaddr* server, ULONG length) {
  SIZE_T size = sizeof peerSource_;
  peerSource_ = sockaddr_storage{};
  ND_CHECK(NdResolveAddress(server, length, reinterpret_cast<sockaddr*>(&peerSource_), &size),
           "NdResolveAddress");
  // The connector's Bind takes the source address with port 0: an ephemeral port.
  if (peerSource_.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&peerSource_)->sin6_port = 0;
  else
    reinterpret_cast<sockaddr_in*>(&peerSource_)->sin_port = 0;
  peerSourceLength_ = ULONG(size);
  Open(peerSource(), peerSourceLength_);
}

void Adapter::RequireInOrderDma() const {
  if (info_.AdapterFlags & ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED) return;
  FailPlain("Adapter does not support in-order RDMA.");
}

NdRef<IND2CompletionQueue> Adapter::CreateCompletionQueue(ULONG depth) {
  NdRef<IND2CompletionQueue> cq;
  ND_CHECK(adapter_->CreateCompletionQueue(IID_IND2CompletionQueue, file_, depth, 0, 0, cq.Out()),
           "IND2Adapter::CreateCompletionQueue");
  return cq;
}

NdRef<IND2MemoryRegion> Adapter::CreateMemoryRegion() {
  NdRef<IND2MemoryRegion> mr;
  ND_CHECK(adapter_->CreateMemoryRegion(IID_IND2MemoryRegion, file_, mr.Out()),
           "IND2Adapter::CreateMemoryRegion");
  return mr;
}

NdRef<IND2MemoryWindow> Adapter::CreateMemoryWindow() {
  NdRef<IND2MemoryWindow> mw;
  ND_CHECK(adapter_->CreateMemoryWindow(IID_IND2MemoryWindow, mw.Out()),
           "IND2Adapter::CreateMemoryWindow");
  return mw;
}

NdRef<IND2QueuePair> Adapter::CreateQueuePair(IND2CompletionQueue* cq, ULONG receiveDepth,
                                              ULONG initiatorDepth, ULONG receiveSge,
                                              ULONG initiatorSge, ULONG inlineSize) {
  NdRef<IND2QueuePair> qp;
  ND_CHECK(adapter_->CreateQueuePair(IID_IND2QueuePair, cq, cq, nullptr, receiveDepth,
                                     initiatorDepth, receiveSge, initiatorSge, inlineSize,
                                     qp.Out()),
           "IND2Adapter::CreateQueuePair");
  return qp;
}

NdRef<IND2Connector> Adapter::CreateConnector() {
  NdRef<IND2Connector> connector;
  ND_CHECK(adapter_->CreateConnector(IID_IND2Connector, file_, connector.Out()),
           "IND2Adapter::CreateConnector");
  return connector;
}

NdRef<IND2Listener> Adapter::CreateListener() {
  NdRef<IND2Listener> listener;
  ND_CHECK(adapter_->CreateListener(IID_IND2Listener, file_, listener.Out()),
           "IND2Adapter::CreateListener");
  return listener;
}

// ---- completion port -------------------------------------------------------------------------

CompletionPort::CompletionPort(Adapter& adapter, ULONG_PTR key, DWORD concurrentThreads) {
  port_ = CreateIoCompletionPort(adapter.file(), nullptr, key, concurrentThreads);
  if (!port_) Fail("CreateIoCompletionPort", HRESULT(GetLastError()), __LINE__);
}

CompletionPort::~CompletionPort() {
  if (port_) CloseHandle(port_);
}

OVERLAPPED* CompletionPort::Next(const char* what, std::uint32_t timeoutMs) {
  const std::uint64_t deadline = NowMicros() + std::uint64_t(timeoutMs) * 1000;
  for (;;) {
    NoteProgress();
    // In slices, so that the watchdog sees a waiting tool as alive.
    std::uint64_t now = NowMicros();
    std::uint64_t leftMs = now < deadline ? (deadline - now + 999) / 1000 : 0;
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* ov = nullptr;
    GetQueuedCompletionStatus(port_, &bytes, &key, &ov, DWORD(leftMs < 100 ? leftMs : 100));
    if (ov) return ov;  // TRUE, or FALSE for a failed request (status in Internal)
    DWORD error = GetLastError();
    if (error != WAIT_TIMEOUT) Fail("GetQueuedCompletionStatus", HRESULT(error), __LINE__);
    if (NowMicros() >= deadline) FailTimeout(what, timeoutMs, __LINE__);
  }
}

OVERLAPPED* CompletionPort::TryNext() {
  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* ov = nullptr;
  GetQueuedCompletionStatus(port_, &bytes, &key, &ov, 0);
  return ov;
}

// ---- completion queue ------------------------------------------------------------------------

CompletionQueue::CompletionQueue(Adapter& adapter, ULONG depth, bool blocking)
    : cq_(adapter.CreateCompletionQueue(depth)), blocking_(blocking) {}

ND2_RESULT CompletionQueue::Next(const char* what, std::uint32_t timeoutMs) {
  return NextCompletion<IND2CompletionQueue, ND2_RESULT>(
      cq_.get(), notify_, blocking_, [this](ND2_RESULT* r) { return Poll(r); }, what, timeoutMs);
}

// ---- memory ----------------------------------------------------------------------------------

void MemoryRegion::Register(const void* buffer, std::size_t length, ULONG flags) {
  const char* what = "IND2MemoryRegion::Register";
  ND_CHECK(RunRequest(mr_.get(), what,
                      [&](OVERLAPPED* ov) { return mr_->Register(buffer, length, flags, ov); }),
           what);
}

void MemoryRegion::Deregister() {
  const char* what = "IND2MemoryRegion::Deregister";
  ND_CHECK(RunRequest(mr_.get(), what, [&](OVERLAPPED* ov) { return mr_->Deregister(ov); }), what);
}

ULONG BuildSgl(ND2_SGE* sgl, ULONG maxSge, void* buffer, std::size_t length, UINT32 token) {
  return SplitSgl(sgl, maxSge, buffer, length, [token](ND2_SGE& sge, char* at, std::size_t bytes) {
    sge = {at, ULONG(bytes), token};
  });
}

// ---- connections -----------------------------------------------------------------------------

void RetryConnect(const char* what, const std::function<HRESULT(std::uint32_t leftMs)>& attempt) {
  const std::uint64_t end = NowMicros() + std::uint64_t(WaitTimeoutMs()) * 1000;
  for (;;) {
    std::uint64_t now = NowMicros();
    HRESULT hr = attempt(now < end ? std::uint32_t((end - now + 999) / 1000) : 1);
    if (hr == ND_SUCCESS) return;
    bool retry = hr == ND_CONNECTION_REFUSED || hr == ND_TIMEOUT || hr == ND_IO_TIMEOUT ||
                 hr == ND_NETWORK_UNREACHABLE || hr == ND_HOST_UNREACHABLE;
    if (!retry || NowMicros() + 50000 >= end) Fail(what, hr, __LINE__);
    SleepMs(50);
  }
}

NdRef<IND2Connector> Connect(Adapter& adapter, IND2QueuePair* qp, const sockaddr* server, ULONG serverLength,
                             ULONG inboundReadLimit, ULONG outboundReadLimit,
                             const void* privateData, ULONG privateDataLength) {
  NdRef<IND2Connector> connected;
  RetryConnect("IND2Connector::Connect", [&](std::uint32_t leftMs) {
    // A new connector for each attempt: a v2 connector makes one attempt.
    NdRef<IND2Connector> connector = adapter.CreateConnector();
    ND_CHECK(connector->Bind(adapter.peerSource(), adapter.peerSourceLength()), "IND2Connector::Bind");
    Overlapped ov;
    HRESULT hr = connector->Connect(qp, server, serverLength, inboundReadLimit, outboundReadLimit,
                                    privateData, privateDataLength, ov.Prepare());
    hr = ov.Complete(connector.get(), hr, "IND2Connector::Connect", leftMs);
    if (hr == ND_SUCCESS) connected = std::move(connector);
    return hr;
  });
  return connected;
}

void CompleteConnect(IND2Connector* connector) {
  RequireSuccess(connector, "IND2Connector::CompleteConnect", __LINE__,
                 [&](OVERLAPPED* ov) { return connector->CompleteConnect(ov); });
}

std::vector<char> GetPrivateData(IND2Connector* connector) {
  ULONG size = 0;
  HRESULT hr = connector->GetPrivateData(nullptr, &size);
  if (hr == ND_SUCCESS) return {};
  if (hr != ND_BUFFER_OVERFLOW) Fail("IND2Connector::GetPrivateData (size probe)", hr, __LINE__);
  std::vector<char> data(size);
  ND_CHECK(connector->GetPrivateData(data.data(), &size), "IND2Connector::GetPrivateData");
  data.resize(size);
  return data;
}

NdRef<IND2Listener> Listen(Adapter& adapter, const sockaddr* address, ULONG length) {
  NdRef<IND2Listener> listener = adapter.CreateListener();
  ND_CHECK(listener->Bind(address, length), "IND2Listener::Bind");
  ND_CHECK(listener->Listen(0), "IND2Listener::Listen");
  return listener;
}

NdRef<IND2Connector> GetConnectionRequest(Adapter& adapter, IND2Listener* listener) {
  NdRef<IND2Connector> connector = adapter.CreateConnector();
  RequireSuccess(listener, "IND2Listener::GetConnectionRequest", __LINE__, [&](OVERLAPPED* ov) {
    return listener->GetConnectionRequest(connector.get(), ov);
  });
  return connector;
}

void Accept(IND2Connector* connector, IND2QueuePair* qp, ULONG inboundReadLimit,
            ULONG outboundReadLimit, const void* privateData, ULONG privateDataLength) {
  RequireSuccess(connector, "IND2Connector::Accept", __LINE__, [&](OVERLAPPED* ov) {
    return connector->Accept(qp, inboundReadLimit, outboundReadLimit, privateData,
                             privateDataLength, ov);
  });
}

void Disconnect(IND2Connector* connector) {
  // ND_TIMEOUT (the peer never answered the disconnect request) is a success.
  const char* what = "IND2Connector::Disconnect";
  ND_CHECK(RunRequest(connector, what, [&](OVERLAPPED* ov) { return connector->Disconnect(ov); }),
           what);
}

void WaitForPeerDisconnect(IND2Connector* connector) {
  const char* what = "IND2Connector::NotifyDisconnect";
  ND_CHECK(RunRequest(connector, what,
                      [&](OVERLAPPED* ov) { return connector->NotifyDisconnect(ov); }),
           what);
}

void FailCompletion(const char* what, const ND2_RESULT& result, int line) {
  if (FAILED(result.Status)) Fail(what, result.Status, line);
  char message[200];
  std::snprintf(message, sizeof message, "%s: unexpected completion (type %d, context %p)", what,
                int(result.RequestType), result.RequestContext);
  FailMessage(message, line);
}

}  // namespace ndtool
