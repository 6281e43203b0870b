// Conformance with nd2-spi.md: one case per behaviour that ND applications rely on and that no
// other integration test already asserts, grouped by SPI object. Each case asserts the exact
// status or completion the reference names, through the public API only. Where a connection is
// needed, both ends live in this process on two instances of the 127.0.0.1 adapter
// (ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED), established with overlapped calls issued
// together (LocalPair); every wait is bounded (Ov::Finish, NextCompletion, PollOv).
//
// Sections cited as "§n" are those of nd2-spi.md.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

void* const kA = Ctx(0xA0);  // the active side's QP context
void* const kB = Ctx(0xB0);  // the passive side's QP context
constexpr ULONG_PTR kKey = 0x77;

template <class T>
sockaddr* Sa(T* address) {
  return reinterpret_cast<sockaddr*>(address);
}

uint64_t Va(const void* p) { return reinterpret_cast<uint64_t>(p); }

// An address this host does not have (TEST-NET-1): only looked up, never sent to.
sockaddr_in ForeignAddress() {
  sockaddr_in address = Loopback(0);
  address.sin_addr.s_addr = htonl(0xC0000201);  // 192.0.2.1
  return address;
}

// The final status of a request issued with `ov` (no event needed), asked of `object`, which
// need not be the object that issued it (§7 [tests]). Bounded.
HRESULT PollOv(IND2Overlapped* object, OVERLAPPED* ov, const char* what, int ms = kWaitMs) {
  Deadline deadline(ms);
  unsigned spins = 0;
  for (;;) {
    HRESULT hr = object->GetOverlappedResult(ov, FALSE);
    if (hr != ND_PENDING) return hr;
    if (deadline.Expired()) IT_FAIL(std::string(what) + " still pending after " + std::to_string(ms) + " ms");
    Pause(spins);
  }
}

// Two endpoints of this process, each on its own adapter instance: `a` the active side, `b` the
// passive side (with its listener). Connect() establishes the connection.
struct LocalPair {
  explicit LocalPair(const Shape& shape = {}) : a(adapterA, kA, shape), b(adapterB, kB, shape) {}
  LocalPair(const Shape& active, const Shape& passive)
      : a(adapterA, kA, active), b(adapterB, kB, passive) {}

  // Listens on b, connects a to it and returns once both Connect and Accept completed.
  void Connect(ULONG ird = 4, ULONG ord = 4) { Connect(ird, ord, ird, ord); }
  // The same with each side's own read limits (Connect's, then Accept's), through `active` (a
  // connector of adapterA's) if the caller gives one.
  void Connect(ULONG activeIrd, ULONG activeOrd, ULONG passiveIrd, ULONG passiveOrd,
               Ref<IND2Connector> active = {}) {
    b.listener = adapterB.CreateListener();
    IT_OK(b.listener->Bind(Sa(&listenAt), sizeof listenAt));
    IT_OK(b.listener->Listen(0));
    sockaddr_in bound{};
    ULONG size = sizeof bound;
    IT_OK(b.listener->GetLocalAddress(Sa(&bound), &size));
    uint16_t port = PortOf(bound);
    b.connector = adapterB.CreateConnector();
    Ov request;
    HRESULT hrRequest =
        b.listener->GetConnectionRequest(b.connector.get(), request.Prepare(b.listener.get()));
    a.connector = active ? std::move(active) : adapterA.CreateConnector();
    sockaddr_in local = Loopback(0), server = Loopback(port);
    IT_OK(a.connector->Bind(Sa(&local), sizeof local));
    Ov connect;
    HRESULT hrConnect = a.connector->Connect(a.qp.get(), Sa(&server), sizeof server, activeIrd,
                                             activeOrd, nullptr, 0, connect.Prepare(a.connector.get()));
    IT_OK(request.Finish(hrRequest, "GetConnectionRequest"));
    Ov accept;
    HRESULT hrAccept = b.connector->Accept(b.qp.get(), passiveIrd, passiveOrd, nullptr, 0,
                                           accept.Prepare(b.connector.get()));
    IT_OK(connect.Finish(hrConnect, "Connect"));
    CompleteConnect(a.connector.get());
    IT_OK(accept.Finish(hrAccept, "Accept"));
  }

  Adapter adapterA, adapterB;
  Endpoint a, b;
  sockaddr_in listenAt = Loopback(0);  // where b listens (the port: the kernel's choice)
};

// Registers `buffer` on `mr` and waits.
void Register(IND2MemoryRegion* mr, const void* buffer, size_t length, ULONG flags) {
  Ov ov;
  HRESULT hr = mr->Register(buffer, length, flags, ov.Prepare(mr));
  IT_OK(ov.Finish(hr, "Register"));
}

HRESULT Deregister(IND2MemoryRegion* mr) {
  Ov ov;
  HRESULT hr = mr->Deregister(ov.Prepare(mr));
  return ov.Finish(hr, "Deregister");
}

// A completion port associated with the adapter's overlapped file, closed on destruction.
struct Port {
  explicit Port(Adapter& adapter) : handle(CreateIoCompletionPort(INVALID_HANDLE_VALUE, nullptr, 0, 0)) {
    IT_CHECK(handle != nullptr);
    IT_CHECK(CreateIoCompletionPort(adapter.file(), handle, kKey, 0) == handle);
  }
  ~Port() { CloseHandle(handle); }
  // The next packet, which must be there already (zero timeout), carry `ov` and report failure.
  void ExpectFailurePacket(OVERLAPPED* ov, const char* what) {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* got = nullptr;
    BOOL ok = GetQueuedCompletionStatus(handle, &bytes, &key, &got, 0);
    IT_CHECK_MSG(got != nullptr, std::string(what) + ": no packet queued");
    IT_CHECK_MSG(got == ov, std::string(what) + ": packets out of order");
    IT_CHECK_MSG(!ok, std::string(what) + ": dequeue reported success");
    IT_CHECK_EQ(kKey, key);
  }
  void ExpectEmpty(const char* what) {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* got = nullptr;
    BOOL ok = GetQueuedCompletionStatus(handle, &bytes, &key, &got, 0);
    IT_CHECK_MSG(!ok && got == nullptr, std::string(what) + ": unexpected packet");
  }
  HANDLE handle;
};

// Posts `n` receives (contexts first, first+1, ...) of 16 bytes into `buffer` under `token`.
void PostReceives(IND2QueuePair* qp, uint8_t* buffer, UINT32 token, int n, uintptr_t first) {
  for (int i = 0; i < n; ++i) {
    ND2_SGE sge = {buffer + 16 * i, 16, token};
    IT_OK(qp->Receive(Ctx(first + i), &sge, 1));
  }
}

// =================================================================================================
// Provider / ndsupport (§16, §8)
// =================================================================================================

// §16: address validation first (size → ND_INVALID_PARAMETER_2, family → ND_INVALID_ADDRESS),
// then the IP alone (not the port) decides.
TEST(ConformanceNdsupport, CheckAddressValidatesThenMatchesTheIpOnly) {
  RunLocal([] {
    sockaddr_in loopback = Loopback(4321);
    IT_OK(NdCheckAddress(Sa(&loopback), sizeof loopback));
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, NdCheckAddress(Sa(&loopback), sizeof(sockaddr) - 1));
    IT_CHECK_HR(ND_INVALID_PARAMETER_2,
                NdCheckAddress(Sa(&loopback), SIZE_T(std::numeric_limits<uint32_t>::max()) + 1));
    sockaddr_in6 six{};
    six.sin6_family = AF_INET6;
    six.sin6_addr = in6addr_loopback;
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, NdCheckAddress(Sa(&six), sizeof(sockaddr_in)));
    sockaddr_storage unix_family{};
    unix_family.ss_family = AF_UNIX;
    IT_CHECK_HR(ND_INVALID_ADDRESS, NdCheckAddress(Sa(&unix_family), sizeof unix_family));
    sockaddr_in foreign = ForeignAddress();
    IT_CHECK_HR(ND_INVALID_ADDRESS, NdCheckAddress(Sa(&foreign), sizeof foreign));
  });
}

// §16 / §6: NdOpenAdapter validates like NdCheckAddress, answers ND_INVALID_ADDRESS when no
// provider owns the IP, and returns a new instance on every call.
TEST(ConformanceNdsupport, OpenAdapterValidationAndNewInstances) {
  RunLocal([] {
    sockaddr_in loopback = Loopback(0);
    Ref<IND2Adapter> adapter;
    IT_CHECK_HR(ND_INVALID_PARAMETER_2,
                NdOpenAdapter(IID_IND2Adapter, Sa(&loopback), sizeof(sockaddr) - 1, adapter.Out()));
    sockaddr_in6 six{};
    six.sin6_family = AF_INET6;
    six.sin6_addr = in6addr_loopback;
    IT_CHECK_HR(ND_INVALID_PARAMETER_2,
                NdOpenAdapter(IID_IND2Adapter, Sa(&six), sizeof(sockaddr_in), adapter.Out()));
    sockaddr_storage unix_family{};
    unix_family.ss_family = AF_UNIX;
    IT_CHECK_HR(ND_INVALID_ADDRESS, NdOpenAdapter(IID_IND2Adapter, Sa(&unix_family),
                                                  sizeof unix_family, adapter.Out()));
    sockaddr_in foreign = ForeignAddress();
    IT_CHECK_HR(ND_INVALID_ADDRESS,
                NdOpenAdapter(IID_IND2Adapter, Sa(&foreign), sizeof foreign, adapter.Out()));
    IT_OK(NdOpenAdapter(IID_IND2Adapter, Sa(&loopback), sizeof loopback, adapter.Out()));
    Ref<IND2Adapter> second;
    IT_OK(NdOpenAdapter(IID_IND2Adapter, Sa(&loopback), sizeof loopback, second.Out()));
    IT_CHECK(adapter.get() != second.get());
  });
}

// §16: NdResolveAddress finds the local source for a remote address (port 0), reports a too
// small output with ND_BUFFER_OVERFLOW, and an unusable input with ND_INVALID_ADDRESS.
TEST(ConformanceNdsupport, ResolveAddress) {
  RunLocal([] {
    sockaddr_in remote = Loopback(5555);
    sockaddr_in local{};
    SIZE_T size = sizeof local;
    IT_OK(NdResolveAddress(Sa(&remote), sizeof remote, Sa(&local), &size));
    IT_CHECK_EQ(SIZE_T(sizeof(sockaddr_in)), size);
    IT_CHECK_EQ(AF_INET, int(local.sin_family));
    IT_CHECK_EQ(htonl(INADDR_LOOPBACK), local.sin_addr.s_addr);
    IT_CHECK_EQ(0, int(local.sin_port));
    size = 4;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, NdResolveAddress(Sa(&remote), sizeof remote, Sa(&local), &size));
    sockaddr_storage unix_family{};
    unix_family.ss_family = AF_UNIX;
    size = sizeof local;
    IT_CHECK_HR(ND_INVALID_ADDRESS,
                NdResolveAddress(Sa(&unix_family), sizeof unix_family, Sa(&local), &size));
  });
}

// §16: NdQueryAddressList with no buffer → ND_BUFFER_OVERFLOW and the size; then the list, its
// sockaddrs stored in the same buffer, 127.0.0.1 among them.
TEST(ConformanceNdsupport, QueryAddressListSizeProtocol) {
  RunLocal([] {
    SIZE_T size = 0;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, NdQueryAddressList(0, nullptr, &size));
    IT_CHECK(size > 0);
    std::vector<uint8_t> buffer(size + 64);
    auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data());
    SIZE_T got = buffer.size();
    IT_OK(NdQueryAddressList(0, list, &got));
    IT_CHECK(got <= buffer.size());
    IT_CHECK(list->iAddressCount >= 1);
    bool loopback = false;
    for (INT i = 0; i < list->iAddressCount; ++i) {
      auto* p = reinterpret_cast<uint8_t*>(list->Address[i].lpSockaddr);
      IT_CHECK_MSG(p >= buffer.data() && p + list->Address[i].iSockaddrLength <= buffer.data() + got,
                   "a sockaddr outside the caller's buffer");
      auto* in = reinterpret_cast<sockaddr_in*>(p);
      if (in->sin_family == AF_INET && in->sin_addr.s_addr == htonl(INADDR_LOOPBACK)) loopback = true;
    }
    IT_CHECK_MSG(loopback, "127.0.0.1 is not in the list");
  });
}

// =================================================================================================
// Adapter (§9, §6)
// =================================================================================================

// §9 Query: a too-small buffer → ND_BUFFER_OVERFLOW, the required size, the buffer untouched;
// exactly sizeof(ND2_ADAPTER_INFO) succeeds; a larger buffer reports the bytes used.
TEST(ConformanceAdapter, QueryWithATooSmallBuffer) {
  RunLocal([] {
    Adapter adapter;
    ULONG size = 0;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, adapter->Query(nullptr, &size));
    IT_CHECK_EQ(ULONG(sizeof(ND2_ADAPTER_INFO)), size);
    ND2_ADAPTER_INFO info;
    std::memset(&info, 0xAB, sizeof info);
    info.InfoVersion = ND_VERSION_2;
    ND2_ADAPTER_INFO before = info;
    size = offsetof(ND2_ADAPTER_INFO, MaxCallerData);
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, adapter->Query(&info, &size));
    IT_CHECK_EQ(ULONG(sizeof(ND2_ADAPTER_INFO)), size);
    IT_CHECK_MSG(std::memcmp(&before, &info, sizeof info) == 0, "Query wrote into a too-small buffer");
    size = sizeof info;
    IT_OK(adapter->Query(&info, &size));
    IT_CHECK_EQ(ULONG(sizeof(ND2_ADAPTER_INFO)), size);
    struct {
      ND2_ADAPTER_INFO info;
      uint8_t more[64];
    } large{};
    large.info.InfoVersion = ND_VERSION_2;
    size = sizeof large;
    IT_OK(adapter->Query(&large.info, &size));
    IT_CHECK_EQ(ULONG(sizeof(ND2_ADAPTER_INFO)), size);
    IT_CHECK_EQ(info.MaxCompletionQueueDepth, large.info.MaxCompletionQueueDepth);
  });
}

// §8/§9 QueryAddressList of the adapter: (NULL, &0) and a buffer one byte short →
// ND_BUFFER_OVERFLOW, size set, buffer untouched; a larger buffer → ND_SUCCESS, bytes used.
TEST(ConformanceAdapter, QueryAddressListSizeProtocol) {
  RunLocal([] {
    Adapter adapter;
    ULONG size = 0;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, adapter->QueryAddressList(nullptr, &size));
    IT_CHECK(size >= sizeof(SOCKET_ADDRESS_LIST));
    ULONG required = size;
    std::vector<uint8_t> buffer(required + 64, 0xCD);
    size = required - 1;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW,
                adapter->QueryAddressList(reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data()), &size));
    IT_CHECK_EQ(required, size);
    CheckFilled(buffer.data(), buffer.size(), 0xCD, "the too-small address list buffer");
    size = ULONG(buffer.size());
    IT_OK(adapter->QueryAddressList(reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data()), &size));
    IT_CHECK_EQ(required, size);
    IT_CHECK(reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data())->iAddressCount >= 1);
  });
}

// §6: QueryInterface answers IID_IUnknown, the object's own IID and, for the overlapped objects,
// IID_IND2Overlapped; anything else E_NOINTERFACE.
TEST(ConformanceAdapter, QueryInterface) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(4);
    auto ask = [](IUnknown* object, REFIID iid) {
      void* p = nullptr;
      HRESULT hr = object->QueryInterface(iid, &p);
      if (SUCCEEDED(hr)) {
        IT_CHECK(p != nullptr);
        static_cast<IUnknown*>(p)->Release();
      }
      return hr;
    };
    IT_CHECK_HR(S_OK, ask(adapter.get(), IID_IUnknown));
    IT_CHECK_HR(S_OK, ask(adapter.get(), IID_IND2Adapter));
    IT_CHECK_HR(E_NOINTERFACE, ask(adapter.get(), IID_IND2CompletionQueue));
    IT_CHECK_HR(S_OK, ask(cq.get(), IID_IUnknown));
    IT_CHECK_HR(S_OK, ask(cq.get(), IID_IND2Overlapped));
    IT_CHECK_HR(S_OK, ask(cq.get(), IID_IND2CompletionQueue));
    IT_CHECK_HR(E_NOINTERFACE, ask(cq.get(), IID_IND2QueuePair));
    Ref<IND2Connector> connector = adapter.CreateConnector();
    IT_CHECK_HR(S_OK, ask(connector.get(), IID_IND2Overlapped));
    IT_CHECK_HR(E_NOINTERFACE, ask(connector.get(), IID_IND2Listener));
  });
}

// §6 [tests] (NdConnClose): Release returns the client-visible count only: a connector whose
// Connect completed releases to exactly 0, and so does a connected QP; a CQ a QP uses counts
// only the client's references. The peer's Accept then ends ND_CONNECTION_REFUSED (§14.1 [tests]).
TEST(ConformanceAdapter, ReleaseReturnsClientVisibleCounts) {
  RunLocal([] {
    LocalPair p;
    IT_CHECK_EQ(ULONG(2), p.a.cq->AddRef());
    IT_CHECK_EQ(ULONG(1), p.a.cq->Release());
    uint16_t port = StartListening(p.adapterB, p.b.listener);
    p.b.connector = p.adapterB.CreateConnector();
    Ov request;
    HRESULT hrRequest =
        p.b.listener->GetConnectionRequest(p.b.connector.get(), request.Prepare(p.b.listener.get()));
    p.a.connector = p.adapterA.CreateConnector();
    sockaddr_in local = Loopback(0), server = Loopback(port);
    IT_OK(p.a.connector->Bind(Sa(&local), sizeof local));
    Ov connect;
    HRESULT hrConnect = p.a.connector->Connect(p.a.qp.get(), Sa(&server), sizeof server, 0, 0,
                                               nullptr, 0, connect.Prepare(p.a.connector.get()));
    IT_OK(request.Finish(hrRequest, "GetConnectionRequest"));
    Ov accept;
    HRESULT hrAccept =
        p.b.connector->Accept(p.b.qp.get(), 0, 0, nullptr, 0, accept.Prepare(p.b.connector.get()));
    IT_OK(connect.Finish(hrConnect, "Connect"));
    IT_CHECK_EQ(ULONG(2), p.a.cq->AddRef());  // the QP's hold on its CQ is not counted
    IT_CHECK_EQ(ULONG(1), p.a.cq->Release());
    IT_CHECK_EQ(ULONG(0), p.a.connector.Reset());
    IT_CHECK_HR(ND_CONNECTION_REFUSED, accept.Finish(hrAccept, "Accept after the active side left"));
    IT_CHECK_EQ(ULONG(0), p.a.qp.Reset());
    IT_CHECK_EQ(ULONG(0), p.b.qp.Reset());
  });
}

// =================================================================================================
// Completion queue (§10)
// =================================================================================================

// §10: several Notify requests outstanding on one CQ all complete on one event (broadcast).
TEST(ConformanceCq, NotifyIsBroadcast) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(64);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(16);
    Ref<IND2QueuePair> qp = adapter.CreateQp(cq.get(), kA, 4, 4);
    ND2_RESULT drain[4];
    IT_CHECK_EQ(0u, cq->GetResults(drain, 4));
    Ov first, second, third;
    HRESULT hr1 = cq->Notify(ND_CQ_NOTIFY_ANY, first.Prepare(cq.get()));
    HRESULT hr2 = cq->Notify(ND_CQ_NOTIFY_ANY, second.Prepare(cq.get()));
    HRESULT hr3 = cq->Notify(ND_CQ_NOTIFY_SOLICITED, third.Prepare(cq.get()));
    IT_CHECK_HR(ND_PENDING, hr1);
    IT_CHECK_HR(ND_PENDING, hr2);
    IT_CHECK_HR(ND_PENDING, hr3);
    PostReceives(qp.get(), buffer.data(), mr.token(), 1, 0x10);
    IT_OK(qp->Flush());
    IT_OK(first.Finish(hr1, "first Notify"));
    IT_OK(second.Finish(hr2, "second Notify"));
    IT_OK(third.Finish(hr3, "solicited Notify (an error completion, upgraded by ANY)"));
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10), kA}, "flushed receive");
  });
}

// §10 [tests] (NdReceiveFlushQP): entries queued by Flush before Notify was called satisfy that
// Notify (no lost wake-up), whether it answers ND_SUCCESS at once or completes right after.
TEST(ConformanceCq, FlushedEntriesSatisfyALaterNotify) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(64);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(16);
    Ref<IND2QueuePair> qp = adapter.CreateQp(cq.get(), kA, 4, 4);
    ND2_RESULT drain[4];
    IT_CHECK_EQ(0u, cq->GetResults(drain, 4));
    PostReceives(qp.get(), buffer.data(), mr.token(), 2, 0x10);
    IT_OK(qp->Flush());
    Ov notify;
    HRESULT hr = cq->Notify(ND_CQ_NOTIFY_ANY, notify.Prepare(cq.get()));
    IT_OK(notify.Finish(hr, "Notify after the flush", 2000));
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10), kA}, "flushed receive 1");
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x11), kA}, "flushed receive 2");
  });
}

// §10: a SOLICITED Notify fires on any error completion (a flushed receive); an ERRORS Notify
// does not fire on completions at all (only CQ failures), and is canceled with ND_CANCELED.
TEST(ConformanceCq, NotifyTypesSolicitedAndErrors) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(64);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(16);
    Ref<IND2QueuePair> qp = adapter.CreateQp(cq.get(), kA, 4, 4);
    Ov solicited;
    HRESULT hrS = cq->Notify(ND_CQ_NOTIFY_SOLICITED, solicited.Prepare(cq.get()));
    IT_CHECK_HR(ND_PENDING, hrS);
    PostReceives(qp.get(), buffer.data(), mr.token(), 1, 0x10);
    IT_OK(qp->Flush());
    IT_OK(solicited.Finish(hrS, "solicited Notify on an error completion"));
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10), kA}, "flushed receive");
    ND2_RESULT drain[4];
    IT_CHECK_EQ(0u, cq->GetResults(drain, 4));

    Ref<IND2QueuePair> qp2 = adapter.CreateQp(cq.get(), kB, 4, 4);
    OVERLAPPED errors{};
    IT_CHECK_HR(ND_PENDING, cq->Notify(ND_CQ_NOTIFY_ERRORS, &errors));
    PostReceives(qp2.get(), buffer.data(), mr.token(), 1, 0x20);
    IT_OK(qp2->Flush());
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x20), kB}, "flushed receive");
    IT_CHECK_HR(ND_PENDING, cq->GetOverlappedResult(&errors, FALSE));
    IT_OK(cq->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(cq.get(), &errors, "canceled ERRORS Notify"));
  });
}
// §10 Resize: below the entries queued → ND_BUFFER_OVERFLOW and no change; beyond the adapter →
// ND_INVALID_PARAMETER; growing keeps every entry, in order.
TEST(ConformanceCq, ResizeKeepsEveryEntry) {
  RunLocal([] {
    Adapter adapter;
    IT_CHECK(adapter.info().AdapterFlags & ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED);
    std::vector<uint8_t> buffer(16 * 6);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(8);
    Ref<IND2QueuePair> qp = adapter.CreateQp(cq.get(), kA, 8, 8);
    PostReceives(qp.get(), buffer.data(), mr.token(), 6, 0x10);
    IT_OK(qp->Flush());
    // The flush is prompt (§12 [tests]); wait until all six are queued without taking any.
    {
      Deadline deadline(2000);
      unsigned spins = 0;
      while (cq->Resize(5) == ND_SUCCESS) {  // succeeds only while fewer than 6 are queued
        if (deadline.Expired()) IT_FAIL("the flushed receives never filled the CQ");
        IT_OK(cq->Resize(8));
        Pause(spins);
      }
    }
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, cq->Resize(4));
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, cq->Resize(5));
    IT_CHECK_HR(ND_INVALID_PARAMETER, cq->Resize(adapter.info().MaxCompletionQueueDepth + 1));
    IT_OK(cq->Resize(64));
    for (int i = 0; i < 6; ++i)
      ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10 + i), kA},
                       "entry kept across Resize");
    ExpectNoCompletion(cq.get(), "after the six", 20);
    IT_OK(cq->Resize(2));  // empty now: shrinking is fine
  });
}

// §10: a CQ that overruns fails its Notify with ND_BUFFER_OVERFLOW — an armed ERRORS Notify as
// its final status, and a later Notify at once or as its final status.
TEST(ConformanceCq, OverrunFailsNotifyWithBufferOverflow) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(16 * 8);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(2);
    Ref<IND2QueuePair> qp = adapter.CreateQp(cq.get(), kA, 8, 8);
    Ov errors;
    HRESULT hr = cq->Notify(ND_CQ_NOTIFY_ERRORS, errors.Prepare(cq.get()));
    IT_CHECK_HR(ND_PENDING, hr);
    PostReceives(qp.get(), buffer.data(), mr.token(), 8, 0x10);
    IT_OK(qp->Flush());  // eight completions for a CQ of two
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, errors.Finish(hr, "ERRORS Notify on overrun"));
    Ov later;
    hr = cq->Notify(ND_CQ_NOTIFY_ANY, later.Prepare(cq.get()));
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, later.Finish(hr, "Notify on an overrun CQ"));
  });
}

// =================================================================================================
// Overlapped model (§7)
// =================================================================================================

// §7 [tests] (ndcq): CancelOverlappedRequests completes every outstanding request of that object
// with ND_CANCELED, already queued to the completion port when it returns, in request order
// within the object and in cancel order across objects.
TEST(ConformanceOverlapped, CancelQueuesEveryRequestInOrderBeforeReturning) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2CompletionQueue> cqA = adapter.CreateCq(4);
    Ref<IND2CompletionQueue> cqB = adapter.CreateCq(4);
    Port port(adapter);
    OVERLAPPED a[3] = {}, b[2] = {};
    for (OVERLAPPED& ov : a) IT_CHECK_HR(ND_PENDING, cqA->Notify(ND_CQ_NOTIFY_ANY, &ov));
    for (OVERLAPPED& ov : b) IT_CHECK_HR(ND_PENDING, cqB->Notify(ND_CQ_NOTIFY_ANY, &ov));
    IT_OK(cqB->CancelOverlappedRequests());
    IT_OK(cqA->CancelOverlappedRequests());
    port.ExpectFailurePacket(&b[0], "CQ B, Notify 1");
    port.ExpectFailurePacket(&b[1], "CQ B, Notify 2");
    port.ExpectFailurePacket(&a[0], "CQ A, Notify 1");
    port.ExpectFailurePacket(&a[1], "CQ A, Notify 2");
    port.ExpectFailurePacket(&a[2], "CQ A, Notify 3");
    port.ExpectEmpty("after the canceled Notifies");
    for (OVERLAPPED& ov : a) IT_CHECK_HR(ND_CANCELED, cqA->GetOverlappedResult(&ov, FALSE));
    for (OVERLAPPED& ov : b) IT_CHECK_HR(ND_CANCELED, cqB->GetOverlappedResult(&ov, FALSE));
  });
}

// §7 [tests]: cancel of a listener aborts its pending GetConnectionRequests, of a connector its
// pending Connect (a request the listener holds in its backlog): ND_CANCELED, queued on return.
TEST(ConformanceOverlapped, CancelOfListenerAndConnector) {
  RunLocal([] {
    Adapter adapter;
    Port port(adapter);
    Ref<IND2Listener> waiting;
    StartListening(adapter, waiting);
    Ref<IND2Connector> c1 = adapter.CreateConnector(), c2 = adapter.CreateConnector();
    OVERLAPPED r1{}, r2{};
    IT_CHECK_HR(ND_PENDING, waiting->GetConnectionRequest(c1.get(), &r1));
    IT_CHECK_HR(ND_PENDING, waiting->GetConnectionRequest(c2.get(), &r2));
    IT_OK(waiting->CancelOverlappedRequests());
    port.ExpectFailurePacket(&r1, "GetConnectionRequest 1");
    port.ExpectFailurePacket(&r2, "GetConnectionRequest 2");
    IT_CHECK_HR(ND_CANCELED, waiting->GetOverlappedResult(&r1, FALSE));
    IT_CHECK_HR(ND_CANCELED, waiting->GetOverlappedResult(&r2, FALSE));

    // A listener that never takes the request: Connect stays pending until canceled.
    Ref<IND2Listener> silent;
    uint16_t silentPort = StartListening(adapter, silent);
    Endpoint e(adapter, kA);
    Ref<IND2Connector> connector = adapter.CreateConnector();
    sockaddr_in local = Loopback(0), server = Loopback(silentPort);
    IT_OK(connector->Bind(Sa(&local), sizeof local));
    OVERLAPPED connect{};
    IT_CHECK_HR(ND_PENDING, connector->Connect(e.qp.get(), Sa(&server), sizeof server, 0, 0,
                                               nullptr, 0, &connect));
    ExpectNoCompletion(e.cq.get(), "while connecting", 100);
    IT_CHECK_HR(ND_PENDING, connector->GetOverlappedResult(&connect, FALSE));
    IT_OK(connector->CancelOverlappedRequests());
    port.ExpectFailurePacket(&connect, "Connect");
    IT_CHECK_HR(ND_CANCELED, connector->GetOverlappedResult(&connect, FALSE));
    port.ExpectEmpty("after the cancels");
  });
}

// §7 [tests] (ndmrrate): GetOverlappedResult resolves the request from the OVERLAPPED itself,
// whichever object of the adapter it is called on; with hEvent NULL and wait = TRUE it returns at
// once for a finished request.
TEST(ConformanceOverlapped, GetOverlappedResultOnAnyObject) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(4096);
    Ref<IND2MemoryRegion> mrA = adapter.CreateMr(), mrB = adapter.CreateMr();
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(4);
    OVERLAPPED ov{};
    HRESULT hr = mrB->Register(buffer.data(), buffer.size(), kSinkFlags, &ov);
    IT_CHECK_MSG(hr == ND_PENDING || hr == ND_SUCCESS, StatusName(hr));
    if (hr == ND_PENDING) IT_OK(PollOv(mrA.get(), &ov, "Register, asked of another MR"));
    IT_OK(mrA->GetOverlappedResult(&ov, TRUE));
    IT_OK(cq->GetOverlappedResult(&ov, FALSE));
    OVERLAPPED dereg{};
    hr = mrB->Deregister(&dereg);
    IT_CHECK_MSG(hr == ND_PENDING || hr == ND_SUCCESS, StatusName(hr));
    if (hr == ND_PENDING) IT_OK(PollOv(mrA.get(), &dereg, "Deregister, asked of another MR"));
    IT_OK(mrA->GetOverlappedResult(&dereg, TRUE));
  });
}

// =================================================================================================
// Memory region and memory window (§11, §12 Bind/Invalidate, §15.2, §15.5)
// =================================================================================================

// The passive side's region and window; `a` accesses it with Read/Write.
struct WindowSetup {
  explicit WindowSetup(LocalPair& p) : target(8192), sink(8192) {
    FillPattern(target.data(), target.size(), 41);
    mr = p.adapterB.CreateMr();
    Register(mr.get(), target.data(), target.size(), kSinkFlags);  // LOCAL_WRITE only (§12)
    IT_OK(p.adapterB->CreateMemoryWindow(IID_IND2MemoryWindow, mw.Out()));
    sinkMr = p.adapterA.CreateMr();
    Register(sinkMr.get(), sink.data(), sink.size(), kReadSinkFlags);
  }
  ~WindowSetup() {
    mw.Reset();
    HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
    for (IND2MemoryRegion* m : {mr.get(), sinkMr.get()}) {
      OVERLAPPED ov{};
      ov.hEvent = event;
      HRESULT hr = m->Deregister(&ov);
      for (int i = 0; hr == ND_PENDING && i < 100; ++i) {
        WaitForSingleObject(event, 50);
        hr = m->GetOverlappedResult(&ov, FALSE);
      }
    }
    CloseHandle(event);
  }
  // Binds [offset, offset + length) of the target with `flags` on b's QP; returns the token.
  UINT32 Bind(LocalPair& p, size_t offset, size_t length, ULONG flags, uintptr_t context) {
    IT_OK(p.b.qp->Bind(Ctx(context), mr.get(), mw.get(), target.data() + offset, length, flags));
    UINT32 token = mw->GetRemoteToken();  // valid as soon as Bind returns (§11)
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeBind, Ctx(context), kB}, "Bind");
    return token;
  }
  void Invalidate(LocalPair& p, uintptr_t context) {
    IT_OK(p.b.qp->Invalidate(Ctx(context), mw.get(), 0));
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeInvalidate, Ctx(context), kB},
                     "Invalidate");
  }
  // a Reads `length` bytes at target offset `offset` under `token`; returns the completion.
  ND2_RESULT Read(LocalPair& p, size_t offset, size_t length, UINT32 token, uintptr_t context) {
    ND2_SGE sge = {sink.data(), ULONG(length), sinkMr->GetLocalToken()};
    IT_OK(p.a.qp->Read(Ctx(context), &sge, 1, Va(target.data() + offset), token, 0));
    return NextCompletion(p.a.cq.get(), "Read through the window");
  }
  std::vector<uint8_t> target, sink;
  Ref<IND2MemoryRegion> mr, sinkMr;
  Ref<IND2MemoryWindow> mw;
};

void ExpectStatus(const ND2_RESULT& r, HRESULT status, ND2_REQUEST_TYPE type, void* context,
                  const char* what) {
  if (r.Status != status || r.RequestType != type || r.RequestContext != context)
    IT_FAIL(std::string(what) + ": completion " + Describe(r) + ", expected " + StatusName(status));
}

// §11 [rec]/[tests]: every Bind gives a fresh remote token, usable at once; after Invalidate and
// a new Bind, the old token is refused: the initiator's Read completes ND_ACCESS_VIOLATION.
TEST(ConformanceMw, FreshTokenPerBindAndStaleTokenRefused) {
  RunLocal([] {
    LocalPair p;
    p.Connect();
    WindowSetup w(p);
    UINT32 first = w.Bind(p, 1024, 1024, ND_OP_FLAG_ALLOW_READ, 0x31);
    ExpectStatus(w.Read(p, 1024, 256, first, 0x41), ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x41), "read 1");
    IT_CHECK(std::memcmp(w.sink.data(), w.target.data() + 1024, 256) == 0);
    w.Invalidate(p, 0x32);
    UINT32 second = w.Bind(p, 1024, 1024, ND_OP_FLAG_ALLOW_READ, 0x33);
    IT_CHECK_MSG(second != first, "the same token after Invalidate and Bind");
    ExpectStatus(w.Read(p, 1280, 256, second, 0x42), ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x42), "read 2");
    IT_CHECK(std::memcmp(w.sink.data(), w.target.data() + 1280, 256) == 0);
    ExpectStatus(w.Read(p, 1024, 256, first, 0x43), ND_ACCESS_VIOLATION, Nd2RequestTypeRead,
                 Ctx(0x43), "read with the stale token");
  });
}

// §11 [tests]: Deregister of an MR with a bound window → ND_DEVICE_BUSY at once (not through the
// OVERLAPPED); after Invalidate it succeeds. §15.5 [tests]: Bind with flags 0 succeeds.
TEST(ConformanceMw, DeregisterWithABoundWindowIsBusy) {
  RunLocal([] {
    LocalPair p;
    p.Connect();
    WindowSetup w(p);
    w.Bind(p, 0, 4096, 0, 0x31);
    Ov ov;
    IT_CHECK_HR(ND_DEVICE_BUSY, w.mr->Deregister(ov.Prepare(w.mr.get())));
    w.Invalidate(p, 0x32);
    IT_OK(Deregister(w.mr.get()));
  });
}

// §12 Bind/Invalidate: ALLOW_WRITE on an MR without LOCAL_WRITE → ND_ACCESS_VIOLATION at once;
// Bind on a QP never connected → ND_CONNECTION_INVALID.
TEST(ConformanceMw, BindAndInvalidateErrors) {
  RunLocal([] {
    LocalPair p;
    p.Connect();
    WindowSetup w(p);
    std::vector<uint8_t> readOnly(256);
    Ref<IND2MemoryRegion> roMr = p.adapterB.CreateMr();
    Register(roMr.get(), readOnly.data(), readOnly.size(), kSourceFlags);
    IT_CHECK_HR(ND_ACCESS_VIOLATION, p.b.qp->Bind(Ctx(0x30), roMr.get(), w.mw.get(), readOnly.data(),
                                                  readOnly.size(), ND_OP_FLAG_ALLOW_WRITE));
    Ref<IND2QueuePair> idle = p.adapterB.CreateQp(p.b.cq.get(), Ctx(0x1D), 4, 4);
    IT_CHECK_HR(ND_CONNECTION_INVALID, idle->Bind(Ctx(0x31), w.mr.get(), w.mw.get(), w.target.data(),
                                                  256, ND_OP_FLAG_ALLOW_READ));
    ExpectNoCompletion(p.b.cq.get(), "refused Binds", 20);
    IT_OK(Deregister(roMr.get()));
  });
}

// §12 Invalidate / §3: Invalidate of a window that is not bound completes
// ND_INVALID_DEVICE_REQUEST (nd2-spi.md §12 Invalidate).
TEST(ConformanceMw, InvalidateOfAnUnboundWindow) {
  RunLocal([] {
    LocalPair p;
    p.Connect();
    WindowSetup w(p);
    IT_OK(p.b.qp->Invalidate(Ctx(0x32), w.mw.get(), 0));
    ExpectCompletion(p.b.cq.get(), {ND_INVALID_DEVICE_REQUEST, Nd2RequestTypeInvalidate, Ctx(0x32), kB},
                     "Invalidate of an unbound window");
  });
}

// §11/§15.2 [tests]: access outside what the window grants fails at the initiator with
// ND_ACCESS_VIOLATION: past its end (Read and Write), a Write into a read-only window, a Read
// through an invalidated window.
struct WindowCase {
  const char* name;
  bool write;
  size_t offset;       // into the target; the window is [1024, 2048)
  ULONG bindFlags;
  bool invalidate;
};
class ConformanceMwViolation : public ::testing::TestWithParam<WindowCase> {};

TEST_P(ConformanceMwViolation, InitiatorCompletesAccessViolation) {
  const WindowCase& c = GetParam();
  RunLocal([&] {
    LocalPair p;
    p.Connect();
    WindowSetup w(p);
    std::vector<uint8_t> original = w.target;
    UINT32 token = w.Bind(p, 1024, 1024, c.bindFlags, 0x31);
    if (c.invalidate) w.Invalidate(p, 0x32);
    ND2_SGE sge = {w.sink.data(), 64, w.sinkMr->GetLocalToken()};
    if (c.write) {
      FillPattern(w.sink.data(), 64, 99);
      IT_OK(p.a.qp->Write(Ctx(0x51), &sge, 1, Va(w.target.data() + c.offset), token, 0));
    } else {
      IT_OK(p.a.qp->Read(Ctx(0x51), &sge, 1, Va(w.target.data() + c.offset), token, 0));
    }
    ExpectStatus(NextCompletion(p.a.cq.get(), c.name), ND_ACCESS_VIOLATION,
                 c.write ? Nd2RequestTypeWrite : Nd2RequestTypeRead, Ctx(0x51), c.name);
    // Nothing changed outside the window; nothing at all where no write was allowed.
    bool writable = (c.bindFlags & ND_OP_FLAG_ALLOW_WRITE) && !c.invalidate;
    IT_CHECK_MSG(std::memcmp(original.data(), w.target.data(), 1024) == 0, "written before the window");
    IT_CHECK_MSG(std::memcmp(original.data() + 2048, w.target.data() + 2048, original.size() - 2048) == 0,
                 "written past the window");
    if (!writable) IT_CHECK_MSG(original == w.target, "written where no write was allowed");
  });
}

INSTANTIATE_TEST_SUITE_P(
    Conformance, ConformanceMwViolation,
    ::testing::Values(
        WindowCase{"ReadPastTheWindow", false, 2048 - 32, ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE, false},
        WindowCase{"WritePastTheWindow", true, 2048 - 32, ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE, false},
        WindowCase{"WriteIntoAReadOnlyWindow", true, 1024, ND_OP_FLAG_ALLOW_READ, false},
        WindowCase{"ReadThroughAnInvalidatedWindow", false, 1024, ND_OP_FLAG_ALLOW_READ, true}),
    [](const ::testing::TestParamInfo<WindowCase>& info) { return std::string(info.param.name); });

// =================================================================================================
// Queue pair (§12)
// =================================================================================================

// §12 Flush: cancels the outstanding requests of this QP only (another QP on the same CQ keeps
// its receives) on a QP that was never connected; a post that failed (queue full) leaves the QP
// usable.
TEST(ConformanceQp, FlushIsPerQueuePairAndAFullQueueLeavesItUsable) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(16 * 64);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(8192);
    Ref<IND2QueuePair> one = adapter.CreateQp(cq.get(), kA, 4, 4);
    Ref<IND2QueuePair> two = adapter.CreateQp(cq.get(), kB, 4, 4);
    PostReceives(one.get(), buffer.data(), mr.token(), 2, 0x10);
    PostReceives(two.get(), buffer.data(), mr.token(), 2, 0x20);
    IT_OK(one->Flush());
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10), kA}, "QP 1 receive 1");
    ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x11), kA}, "QP 1 receive 2");
    ExpectNoCompletion(cq.get(), "QP 2 untouched by QP 1's Flush", 50);

    // Fill QP 2's receive queue (the provider may grant more than 4): ND_NO_MORE_ENTRIES.
    ND2_SGE sge = {buffer.data(), 16, mr.token()};
    ULONG posted = 2;
    HRESULT hr = ND_SUCCESS;
    while (posted <= adapter.info().MaxReceiveQueueDepth) {
      hr = two->Receive(Ctx(0x20 + posted), &sge, 1);
      if (hr != ND_SUCCESS) break;
      ++posted;
    }
    IT_CHECK_HR(ND_NO_MORE_ENTRIES, hr);
    IT_CHECK(posted >= 4);
    IT_OK(two->Flush());
    for (ULONG i = 0; i < posted; ++i)
      ExpectCompletion(cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x20 + i), kB}, "QP 2 receive");
    ExpectNoCompletion(cq.get(), "after QP 2's flush", 20);
  });
}

// §12 SGE rules: more SGEs than the QP holds (or than the adapter allows) → ND_DATA_OVERRUN, more
// bytes than MaxTransferLength → ND_BUFFER_OVERFLOW (the QP stays usable); [tests] (ndmw) a 2-SGE Send on a QP created with maxInitiatorRequestSge = 1
// succeeds; unknown
// flags → ND_INVALID_PARAMETER_4 (Send) / _6 (Read, Write).
TEST(ConformanceQp, SgeRulesAndFlags) {
  RunLocal([] {
    std::vector<uint8_t> out(1024), in(1024, 0);
    LocalPair p({.depth = 16, .sge = 1});
    Mr outMr(p.adapterA, out.data(), out.size(), kReadSinkFlags);
    Mr inMr(p.adapterB, in.data(), in.size(), kSinkFlags);
    ND2_SGE receive = {in.data(), 512, inMr.token()};
    IT_OK(p.b.qp->Receive(Ctx(0x10), &receive, 1));
    IT_OK(p.b.qp->Receive(Ctx(0x11), &receive, 1));
    std::vector<ND2_SGE> many(p.adapterB.info().MaxReceiveSge + 1, receive);
    IT_CHECK_HR(ND_DATA_OVERRUN, p.b.qp->Receive(Ctx(0x12), many.data(), ULONG(many.size())));
    // A QP holds one SGE more than asked, and what fills its entries' cache lines: not the
    // adapter's maximum (a 1-SGE receive entry holds 2, a send entry 3).
    IT_CHECK_HR(ND_DATA_OVERRUN, p.b.qp->Receive(Ctx(0x13), many.data(), 4));
    p.Connect();

    FillPattern(out.data(), 200, 5);
    ND2_SGE two[2] = {{out.data(), 100, outMr.token()}, {out.data() + 100, 100, outMr.token()}};
    IT_OK(p.a.qp->Send(Ctx(0x20), two, 2, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "2-SGE send");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 200}, "its receive");
    CheckPattern(in.data(), 200, 5, "2-SGE message");

    std::vector<ND2_SGE> tooMany(p.adapterA.info().MaxInitiatorSge + 1, two[0]);
    IT_CHECK_HR(ND_DATA_OVERRUN, p.a.qp->Send(Ctx(0x21), tooMany.data(), ULONG(tooMany.size()), 0));
    IT_CHECK_HR(ND_DATA_OVERRUN, p.a.qp->Send(Ctx(0x26), tooMany.data(), 5, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_4, p.a.qp->Send(Ctx(0x22), two, 1, 0x40));
    IT_CHECK_HR(ND_INVALID_PARAMETER_6, p.a.qp->Write(Ctx(0x23), two, 1, Va(in.data()), 0,
                                                      ND_OP_FLAG_SEND_AND_SOLICIT_EVENT));
    IT_CHECK_HR(ND_INVALID_PARAMETER_6, p.a.qp->Read(Ctx(0x24), two, 1, Va(in.data()), 0,
                                                     ND_OP_FLAG_INLINE));
    // More bytes than one request may move (the adapter's MaxTransferLength): ND_BUFFER_OVERFLOW.
    IT_CHECK(p.adapterA.info().MaxTransferLength < 0xFFFFFFFFu);
    // A count beyond the adapter's SGEs is refused as such, before any entry is read (here far
    // more than the array holds).
    const ULONG absurd = ULONG(1) << 21;
    IT_CHECK_HR(ND_DATA_OVERRUN, p.a.qp->Send(Ctx(0x2B), two, absurd, 0));
    IT_CHECK_HR(ND_DATA_OVERRUN, p.a.qp->Send(Ctx(0x2C), two, absurd, ND_OP_FLAG_INLINE));
    IT_CHECK_HR(ND_DATA_OVERRUN, p.a.qp->Write(Ctx(0x2D), two, absurd, Va(in.data()), 0, 0));
    IT_CHECK_HR(ND_DATA_OVERRUN, p.a.qp->Read(Ctx(0x2E), two, absurd, Va(in.data()), 0, 0));
    IT_CHECK_HR(ND_DATA_OVERRUN, p.b.qp->Receive(Ctx(0x2F), &receive, absurd));
    ND2_SGE huge = {out.data(), 0xFFFFFFFFu, outMr.token()};
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, p.a.qp->Send(Ctx(0x27), &huge, 1, 0));
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, p.a.qp->Write(Ctx(0x28), &huge, 1, Va(in.data()), 0, 0));
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, p.a.qp->Read(Ctx(0x29), &huge, 1, Va(in.data()), 0, 0));
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, p.b.qp->Receive(Ctx(0x2A), &huge, 1));
    ExpectNoCompletion(p.a.cq.get(), "refused posts", 20);
    IT_OK(p.a.qp->Send(Ctx(0x25), two, 1, 0));  // still usable
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x25), kA}, "send after refusals");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x11), kB, 100}, "its receive");
  });
}

// §5/§12: zero-byte requests (nSge 0, sge NULL): a Send to a zero-byte Receive completes it with
// 0 bytes; a zero-byte Write and Read complete ND_SUCCESS.
TEST(ConformanceQp, ZeroByteOperations) {
  RunLocal([] {
    LocalPair p;
    IT_OK(p.b.qp->Receive(Ctx(0x10), nullptr, 0));
    p.Connect();
    IT_OK(p.a.qp->Send(Ctx(0x20), nullptr, 0, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "zero-byte send");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 0},
                     "zero-byte receive");
    IT_OK(p.a.qp->Write(Ctx(0x21), nullptr, 0, 0, 0, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x21), kA}, "zero-byte write");
    IT_OK(p.a.qp->Read(Ctx(0x22), nullptr, 0, 0, 0, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x22), kA}, "zero-byte read");
    ExpectNoCompletion(p.b.cq.get(), "nothing else at the target", 20);
  });
}

// §12 Inline: an inline Write copies its data at post time (the buffer is reused at once), its
// SGE token may be garbage and its SGE count is not limited by maxInitiatorRequestSge.
TEST(ConformanceQp, InlineWriteCopiesAtPostTime) {
  RunLocal([] {
    std::vector<uint8_t> target(256, 0xEE);
    LocalPair p({.depth = 16, .sge = 1, .inlineSize = 64});
    Mr targetMr(p.adapterB, target.data(), target.size(), kTargetFlags);
    p.Connect();
    uint8_t data[48];
    FillPattern(data, sizeof data, 8);
    ND2_SGE sges[3] = {{data, 16, 0xDEADBEEF}, {data + 16, 16, 0x12345678}, {data + 32, 16, 0}};
    IT_OK(p.a.qp->Write(Ctx(0x20), sges, 3, Va(target.data() + 8), targetMr.remoteToken(),
                        ND_OP_FLAG_INLINE));
    std::memset(data, 0, sizeof data);  // reused at once
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x20), kA}, "inline write");
    CheckPattern(target.data() + 8, 48, 8, "inline-written data");
    CheckFilled(target.data(), 8, 0xEE, "before the write");
    CheckFilled(target.data() + 56, target.size() - 56, 0xEE, "after the write");
  });
}

// §4/§12 READ_FENCE: a Write fenced behind a Read starts only after the Read completed, so it
// carries the data the Read brought into the same local buffer.
TEST(ConformanceQp, ReadFenceOrdersAWriteBehindARead) {
  RunLocal([] {
    constexpr size_t kSize = 512 * 1024;
    std::vector<uint8_t> remote(2 * kSize, 0), local(kSize, 0);
    FillPattern(remote.data(), kSize, 77);
    LocalPair p;
    Mr remoteMr(p.adapterB, remote.data(), remote.size(), kTargetFlags);
    Mr localMr(p.adapterA, local.data(), local.size(), kReadSinkFlags);
    p.Connect();
    ND2_SGE sge = {local.data(), ULONG(kSize), localMr.token()};
    IT_OK(p.a.qp->Read(Ctx(0x20), &sge, 1, Va(remote.data()), remoteMr.remoteToken(), 0));
    IT_OK(p.a.qp->Write(Ctx(0x21), &sge, 1, Va(remote.data() + kSize), remoteMr.remoteToken(),
                        ND_OP_FLAG_READ_FENCE));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x20), kA}, "read");
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x21), kA}, "fenced write");
    CheckPattern(remote.data() + kSize, kSize, 77, "what the fenced Write carried");
  });
}

// §4/§12 SILENT_SUCCESS: a successful silent request brings no completion; a failing one still
// completes (here a silent Write under a wrong token: ND_ACCESS_VIOLATION).
TEST(ConformanceQp, SilentSuccessSuppressesOnlySuccess) {
  RunLocal([] {
    std::vector<uint8_t> out(256), in(256), target(256);
    LocalPair p;
    Mr outMr(p.adapterA, out.data(), out.size(), kSourceFlags);
    Mr inMr(p.adapterB, in.data(), in.size(), kSinkFlags);
    Mr targetMr(p.adapterB, target.data(), target.size(), kTargetFlags);
    PostReceives(p.b.qp.get(), in.data(), inMr.token(), 2, 0x10);
    p.Connect();
    ND2_SGE sge = {out.data(), 16, outMr.token()};
    IT_OK(p.a.qp->Send(Ctx(0x20), &sge, 1, ND_OP_FLAG_SILENT_SUCCESS));
    IT_OK(p.a.qp->Send(Ctx(0x21), &sge, 1, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x21), kA},
                     "the signalled send (the silent one brings nothing)");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 16}, "receive 1");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x11), kB, 16}, "receive 2");
    ExpectNoCompletion(p.a.cq.get(), "nothing for the silent send", 50);
    IT_OK(p.a.qp->Write(Ctx(0x22), &sge, 1, Va(target.data()), targetMr.remoteToken() ^ 0x5A5A5A5A,
                        ND_OP_FLAG_SILENT_SUCCESS));
    ExpectStatus(NextCompletion(p.a.cq.get(), "silent write with a wrong token"), ND_ACCESS_VIOLATION,
                 Nd2RequestTypeWrite, Ctx(0x22), "silent write with a wrong token");
  });
}

// §3/§12 [tests] (NdSendNoReceive): a Send that finds no receive posted at the peer ends
// ND_IO_TIMEOUT well within 5 s. docs/iwarp.md: unless Sends are confirmed
// (NDWV_IWARP_CONFIRM=all), an iWARP Send completes when handed to TCP (ND_SUCCESS) — the
// documented transport difference; the 5 s bound holds either way.
TEST(ConformanceQp, SendWithNoReceiveEndsWithinFiveSeconds) {
  RunLocal([] {
    std::vector<uint8_t> out(64);
    LocalPair p;
    Mr outMr(p.adapterA, out.data(), out.size(), kSourceFlags);
    p.Connect();
    ND2_SGE sge = {out.data(), 64, outMr.token()};
    auto start = std::chrono::steady_clock::now();
    IT_OK(p.a.qp->Send(Ctx(0x20), &sge, 1, 0));
    ND2_RESULT r = NextCompletion(p.a.cq.get(), "the send nobody had a receive for", 5000);
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
    bool ok = r.Status == ND_IO_TIMEOUT || (!SendsConfirmed() && r.Status == ND_SUCCESS);
    if (!ok || r.RequestType != Nd2RequestTypeSend || r.RequestContext != Ctx(0x20))
      IT_FAIL("completion " + Describe(r) + " after " + std::to_string(ms) + " ms");
    IT_CHECK_MSG(ms < 5000, std::to_string(ms) + " ms");
  });
}

// =================================================================================================
// Shared receive queue (§13, §9)
// =================================================================================================

// §9 CreateSharedReceiveQueue: depth beyond the adapter → ND_INVALID_PARAMETER_3, SGEs beyond →
// ND_INVALID_PARAMETER_4. §13: Receive with more SGEs than maxRequestSge → ND_DATA_OVERRUN;
// Modify beyond the adapter → ND_INVALID_PARAMETER, below the receives outstanding →
// ND_BUFFER_OVERFLOW; a full SRQ → ND_NO_MORE_ENTRIES.
TEST(ConformanceSrq, CreationPostingAndModify) {
  RunLocal([] {
    Adapter adapter;
    const ND2_ADAPTER_INFO& info = adapter.info();
    IT_CHECK(info.MaxSharedReceiveQueueDepth > 0);
    Ref<IND2SharedReceiveQueue> srq;
    IT_CHECK_HR(ND_INVALID_PARAMETER_3,
                adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, adapter.file(),
                                                  info.MaxSharedReceiveQueueDepth + 1, 1, 0, 0, 0, srq.Out()));
    IT_CHECK_HR(ND_INVALID_PARAMETER_4,
                adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, adapter.file(), 8,
                                                  info.MaxReceiveSge + 1, 0, 0, 0, srq.Out()));
    IT_OK(adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, adapter.file(), 8, 2, 0, 0,
                                            0, srq.Out()));
    std::vector<uint8_t> buffer(64);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    ND2_SGE sges[3] = {{buffer.data(), 8, mr.token()}, {buffer.data() + 8, 8, mr.token()},
                       {buffer.data() + 16, 8, mr.token()}};
    // More SGEs than the adapter has (the provider may round maxRequestSge up, as for QPs, §12).
    std::vector<ND2_SGE> many(info.MaxReceiveSge + 1, sges[0]);
    IT_CHECK_HR(ND_DATA_OVERRUN, srq->Receive(Ctx(0x10), many.data(), ULONG(many.size())));
    ULONG posted = 0;
    HRESULT hr = ND_SUCCESS;
    while (posted <= info.MaxSharedReceiveQueueDepth) {
      hr = srq->Receive(Ctx(0x10 + posted), sges, 1);
      if (hr != ND_SUCCESS) break;
      ++posted;
    }
    IT_CHECK_HR(ND_NO_MORE_ENTRIES, hr);
    IT_CHECK(posted >= 8);
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, srq->Modify(4, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER, srq->Modify(info.MaxSharedReceiveQueueDepth + 1, 0));
    IT_OK(srq->Modify(posted + 8, 0));
    IT_OK(srq->Receive(Ctx(0x10 + posted), sges, 1));  // room again
  });
}

// §13: SRQ Notify is not armed by default; an armed Notify completes ND_SUCCESS once the
// receives outstanding drop below notifyThreshold, not before. Receives taken from the SRQ
// complete on the consuming QP's receive CQ with its context.
TEST(ConformanceSrq, NotifyFiresBelowTheThreshold) {
  RunLocal([] {
    std::vector<uint8_t> out(64), in(16 * 4);
    LocalPair p;
    Ref<IND2SharedReceiveQueue> srq;
    IT_OK(p.adapterB->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, p.adapterB.file(), 16, 1,
                                               3, 0, 0, srq.Out()));
    IT_OK(p.adapterB->CreateQueuePairWithSrq(IID_IND2QueuePair, p.b.cq.get(), p.b.cq.get(), srq.get(),
                                             kB, 16, 1, 0, p.b.qp.Out()));
    Mr outMr(p.adapterA, out.data(), out.size(), kSourceFlags);
    Mr inMr(p.adapterB, in.data(), in.size(), kSinkFlags);
    for (int i = 0; i < 4; ++i) {
      ND2_SGE sge = {in.data() + 16 * i, 16, inMr.token()};
      IT_OK(srq->Receive(Ctx(0x10 + i), &sge, 1));
    }
    OVERLAPPED notify{};
    IT_CHECK_HR(ND_PENDING, srq->Notify(&notify));
    p.Connect();
    ND2_SGE sge = {out.data(), 16, outMr.token()};
    IT_OK(p.a.qp->Send(Ctx(0x20), &sge, 1, 0));
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 16}, "receive 1");
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "send 1");
    IT_CHECK_HR(ND_PENDING, srq->GetOverlappedResult(&notify, FALSE));  // 3 left: not below 3
    IT_OK(p.a.qp->Send(Ctx(0x21), &sge, 1, 0));
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x11), kB, 16}, "receive 2");
    IT_OK(PollOv(srq.get(), &notify, "SRQ Notify with 2 receives left", 2000));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x21), kA}, "send 2");
  });
}

// =================================================================================================
// Connector and listener (§14)
// =================================================================================================

// Starts a Connect of `connector` (bound to 127.0.0.1:0) to 127.0.0.1:port; returns its status.
HRESULT StartConnect(IND2Connector* connector, IND2QueuePair* qp, uint16_t port, OVERLAPPED* ov,
                     bool bind = true) {
  sockaddr_in local = Loopback(0), server = Loopback(port);
  if (bind) IT_OK(connector->Bind(Sa(&local), sizeof local));
  return connector->Connect(qp, Sa(&server), sizeof server, 0, 0, nullptr, 0, ov);
}

// §14.2 [tests]: releasing a listener cancels its pending GetConnectionRequests (ND_CANCELED)
// and new Connects to its port are refused (ND_CONNECTION_REFUSED).
TEST(ConformanceListener, ReleaseCancelsRequestsAndRefusesConnects) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2Listener> listener;
    uint16_t port = StartListening(adapter, listener);
    Ref<IND2Connector> c1 = adapter.CreateConnector(), c2 = adapter.CreateConnector();
    OVERLAPPED r1{}, r2{};
    IT_CHECK_HR(ND_PENDING, listener->GetConnectionRequest(c1.get(), &r1));
    IT_CHECK_HR(ND_PENDING, listener->GetConnectionRequest(c2.get(), &r2));
    listener.Reset();
    IT_CHECK_HR(ND_CANCELED, PollOv(c1.get(), &r1, "GetConnectionRequest 1 of a released listener"));
    IT_CHECK_HR(ND_CANCELED, PollOv(c1.get(), &r2, "GetConnectionRequest 2 of a released listener"));
    Endpoint e(adapter, kA);
    Ref<IND2Connector> client = adapter.CreateConnector();
    Ov connect;
    HRESULT hr = StartConnect(client.get(), e.qp.get(), port, connect.Prepare(client.get()));
    IT_CHECK_HR(ND_CONNECTION_REFUSED, connect.Finish(hr, "Connect to a released listener's port"));
  });
}

// §14.2: many GetConnectionRequests may be outstanding; each completes with exactly one request,
// in order. §14.1 [tests] (ndmpic): GetPeerAddress works on the passive connector right after.
TEST(ConformanceListener, ConnectionRequestsCompleteInOrder) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2Listener> listener;
    uint16_t port = StartListening(adapter, listener);
    Ref<IND2Connector> s1 = adapter.CreateConnector(), s2 = adapter.CreateConnector();
    Ov r1, r2;
    HRESULT hr1 = listener->GetConnectionRequest(s1.get(), r1.Prepare(listener.get()));
    HRESULT hr2 = listener->GetConnectionRequest(s2.get(), r2.Prepare(listener.get()));
    Endpoint e1(adapter, kA), e2(adapter, kB);
    Ref<IND2Connector> c1 = adapter.CreateConnector(), c2 = adapter.CreateConnector();
    Ov k1, k2;
    HRESULT hc1 = StartConnect(c1.get(), e1.qp.get(), port, k1.Prepare(c1.get()));
    IT_OK(r1.Finish(hr1, "first GetConnectionRequest"));
    HRESULT hc2 = StartConnect(c2.get(), e2.qp.get(), port, k2.Prepare(c2.get()));
    IT_OK(r2.Finish(hr2, "second GetConnectionRequest"));
    auto port_of = [](IND2Connector* c, bool peer) {
      sockaddr_in address{};
      ULONG size = sizeof address;
      IT_OK(peer ? c->GetPeerAddress(Sa(&address), &size) : c->GetLocalAddress(Sa(&address), &size));
      return PortOf(address);
    };
    IT_CHECK_EQ(port_of(c1.get(), false), port_of(s1.get(), true));
    IT_CHECK_EQ(port_of(c2.get(), false), port_of(s2.get(), true));
    IT_OK(s1->Reject(nullptr, 0));
    IT_OK(s2->Reject(nullptr, 0));
    IT_CHECK_HR(ND_CONNECTION_REFUSED, k1.Finish(hc1, "Connect 1"));
    IT_CHECK_HR(ND_CONNECTION_REFUSED, k2.Finish(hc2, "Connect 2"));
  });
}

// §14.2: a listener bound to the wildcard address listens on every address of the adapter. A
// connection that reached it on one carries messages both ways (on RoCE the ICRC covers the IP
// addresses: each datagram is checked against the address it came to, and leaves from the one
// its peer reached), and its passive connector reports that address as its own.
TEST(ConformanceListener, AListenerOnEveryAddressServesAConnectionReachedOnOne) {
  RunLocal([] {
    for (bool wildcard : {false, true}) {
      const char* what = wildcard ? "listening on 0.0.0.0" : "listening on 127.0.0.1";
      std::vector<uint8_t> out(64), in(64, 0);
      LocalPair p;
      if (wildcard) p.listenAt.sin_addr.s_addr = htonl(INADDR_ANY);
      Mr outA(p.adapterA, out.data(), out.size(), kSinkFlags), inB(p.adapterB, in.data(), in.size(), kSinkFlags);
      ND2_SGE receive = {in.data(), 64, inB.token()};
      IT_OK(p.b.qp->Receive(Ctx(0x10), &receive, 1));
      p.Connect();

      sockaddr_in local{}, reached{};
      ULONG size = sizeof local;
      IT_OK(p.b.connector->GetLocalAddress(Sa(&local), &size));
      size = sizeof reached;
      IT_OK(p.a.connector->GetPeerAddress(Sa(&reached), &size));
      IT_CHECK_EQ(local.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
      IT_CHECK_EQ(PortOf(local), PortOf(reached));

      FillPattern(out.data(), 64, 7);
      ND2_SGE send = {out.data(), 64, outA.token()};
      IT_OK(p.a.qp->Send(Ctx(0x20), &send, 1, 0));
      ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, what);
      ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 64}, what);
      CheckPattern(in.data(), 64, 7, what);
      // And back, from the passive side.
      ND2_SGE answer = {in.data(), 64, inB.token()}, into = {out.data(), 64, outA.token()};
      IT_OK(p.a.qp->Receive(Ctx(0x30), &into, 1));
      FillPattern(in.data(), 64, 8);
      IT_OK(p.b.qp->Send(Ctx(0x40), &answer, 1, 0));
      ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x40), kB}, what);
      ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x30), kA, 64}, what);
      CheckPattern(out.data(), 64, 8, what);
    }
  });
}

// §14.1: Connect on a connector already connecting → ND_CONNECTION_ACTIVE (at once or as the
// final status); the first Connect is unaffected.
TEST(ConformanceConnector, ConnectWhileConnectingIsActive) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2Listener> silent;  // never takes the request: the Connect stays pending
    uint16_t port = StartListening(adapter, silent);
    Endpoint e(adapter, kA), other(adapter, kB);
    Ref<IND2Connector> connector = adapter.CreateConnector();
    OVERLAPPED first{};
    IT_CHECK_HR(ND_PENDING, StartConnect(connector.get(), e.qp.get(), port, &first));
    Ov again;
    HRESULT hr = StartConnect(connector.get(), other.qp.get(), port, again.Prepare(connector.get()), false);
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, again.Finish(hr, "second Connect of the connector"));
    IT_CHECK_HR(ND_PENDING, connector->GetOverlappedResult(&first, FALSE));
    // Nothing of the peer's is known before the Connect completes (§14.1 GetReadLimits).
    ULONG in = 0, out = 0, size = 0;
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->GetReadLimits(&in, &out));
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->GetPrivateData(nullptr, &size));
    // The refused Connect left both QPs as they were: the first still connects through the
    // connector, the second is free for another.
    Ref<IND2Connector> third = adapter.CreateConnector();
    Ov firstQp;
    hr = StartConnect(third.get(), e.qp.get(), port, firstQp.Prepare(third.get()));
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, firstQp.Finish(hr, "Connect with the QP the connector still connects"));
    OVERLAPPED otherQp{};
    IT_CHECK_HR(ND_PENDING, StartConnect(third.get(), other.qp.get(), port, &otherQp, false));
    IT_OK(third->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(third.get(), &otherQp, "canceled Connect with the second QP"));
    IT_OK(connector->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(connector.get(), &first, "canceled Connect"));
  });
}

// §14.1 Connect: "on failure the QP is left as it was". A QP whose Connect failed (canceled
// here) connects through another connector; the one that failed, disconnected, leaves it alone.
TEST(ConformanceConnector, AQpWhoseConnectFailedConnectsThroughAnotherConnector) {
  RunLocal([] {
    LocalPair p;
    Ref<IND2Listener> silent;
    uint16_t port = StartListening(p.adapterB, silent);
    Ref<IND2Connector> failed = p.adapterA.CreateConnector();
    OVERLAPPED first{};
    IT_CHECK_HR(ND_PENDING, StartConnect(failed.get(), p.a.qp.get(), port, &first));
    IT_OK(failed->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(failed.get(), &first, "canceled Connect"));
    p.Connect();  // the same QP, another connector
    Ov disconnect;
    HRESULT hr = failed->Disconnect(disconnect.Prepare(failed.get()));
    IT_CHECK_HR(ND_CONNECTION_INVALID, disconnect.Finish(hr, "Disconnect of the connector that failed"));
    std::vector<uint8_t> out(64), in(64, 0);
    Mr outA(p.adapterA, out.data(), out.size(), kSinkFlags), inB(p.adapterB, in.data(), in.size(), kSinkFlags);
    ND2_SGE receive = {in.data(), 64, inB.token()}, send = {out.data(), 64, outA.token()};
    IT_OK(p.b.qp->Receive(Ctx(0x10), &receive, 1));
    FillPattern(out.data(), 64, 3);
    IT_OK(p.a.qp->Send(Ctx(0x20), &send, 1, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "send");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 64}, "receive");
    CheckPattern(in.data(), 64, 3, "receive");
  });
}

// nd2-spi's connector states: a connector is the passive side once its GetConnectionRequest
// completes. While the request waits, a Connect or another GetConnectionRequest with it is
// ND_CONNECTION_ACTIVE and it knows nothing of a peer (GetReadLimits, GetPrivateData
// ND_CONNECTION_INVALID); once the request is canceled the connector is as it was, and connects.
TEST(ConformanceConnector, AConnectorWhoseConnectionRequestWasCanceledConnects) {
  RunLocal([] {
    LocalPair p;
    Ref<IND2Listener> listener, silent;
    StartListening(p.adapterA, listener);
    uint16_t silentPort = StartListening(p.adapterB, silent);
    Ref<IND2Connector> connector = p.adapterA.CreateConnector();
    Ov waiting;
    HRESULT hrWaiting = listener->GetConnectionRequest(connector.get(), waiting.Prepare(listener.get()));
    IT_CHECK_HR(ND_PENDING, hrWaiting);
    Ov again;
    HRESULT hr = listener->GetConnectionRequest(connector.get(), again.Prepare(listener.get()));
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, again.Finish(hr, "second GetConnectionRequest"));
    Ov connect;
    hr = StartConnect(connector.get(), p.a.qp.get(), silentPort, connect.Prepare(connector.get()), false);
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, connect.Finish(hr, "Connect while the request waits"));
    ULONG in = 0, out = 0, size = 0;
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->GetReadLimits(&in, &out));
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->GetPrivateData(nullptr, &size));
    IT_OK(listener->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, waiting.Finish(hrWaiting, "canceled GetConnectionRequest"));
    p.Connect(4, 4, 4, 4, std::move(connector));
  });
}

// §14.1: Connect with a QP that is already connecting through another connector →
// ND_CONNECTION_ACTIVE (nd2-spi.md §14.1 Connect, "QP or connector already connected/connecting").
TEST(ConformanceConnector, ConnectWithAQpAlreadyConnectingIsActive) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2Listener> silent;
    uint16_t port = StartListening(adapter, silent);
    Endpoint e(adapter, kA);
    Ref<IND2Connector> connector = adapter.CreateConnector();
    OVERLAPPED first{};
    IT_CHECK_HR(ND_PENDING, StartConnect(connector.get(), e.qp.get(), port, &first));
    Ref<IND2Connector> second = adapter.CreateConnector();
    Ov sameQp;
    HRESULT hr = StartConnect(second.get(), e.qp.get(), port, sameQp.Prepare(second.get()));
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, sameQp.Finish(hr, "Connect with a QP already connecting", 2000));
    IT_OK(connector->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(connector.get(), &first, "canceled Connect"));
  });
}

// §14.1 Accept with a QP that is already connected → ND_CONNECTION_ACTIVE; Reject with more
// than MaxCalleeData → ND_INVALID_BUFFER_SIZE; the connector then still rejects, and the
// active side's Connect ends ND_CONNECTION_REFUSED.
TEST(ConformanceConnector, AcceptWithAConnectedQpAndOversizedReject) {
  RunLocal([] {
    LocalPair p;
    p.Connect();
    Ref<IND2Connector> incoming = p.adapterB.CreateConnector();
    Ov request;
    HRESULT hrRequest =
        p.b.listener->GetConnectionRequest(incoming.get(), request.Prepare(p.b.listener.get()));
    Endpoint late(p.adapterA, Ctx(0xC2));
    Ref<IND2Connector> lateConnector = p.adapterA.CreateConnector();
    uint16_t port = 0;
    {
      sockaddr_in address{};
      ULONG size = sizeof address;
      IT_OK(p.b.listener->GetLocalAddress(Sa(&address), &size));
      port = PortOf(address);
    }
    Ov connect;
    HRESULT hrConnect = StartConnect(lateConnector.get(), late.qp.get(), port,
                                     connect.Prepare(lateConnector.get()));
    IT_OK(request.Finish(hrRequest, "GetConnectionRequest"));
    Ov accept;
    HRESULT hr = incoming->Accept(p.b.qp.get(), 0, 0, nullptr, 0, accept.Prepare(incoming.get()));
    IT_CHECK_HR(ND_CONNECTION_ACTIVE, accept.Finish(hr, "Accept with a connected QP"));
    std::vector<uint8_t> data(p.adapterB.info().MaxCalleeData + 1, 0x11);
    IT_CHECK_HR(ND_INVALID_BUFFER_SIZE, incoming->Reject(data.data(), ULONG(data.size())));
    IT_OK(incoming->Reject(data.data(), 4));
    IT_CHECK_HR(ND_CONNECTION_REFUSED, connect.Finish(hrConnect, "Connect that was rejected"));
  });
}

// The kernel's ephemeral port range (net.ipv4.ip_local_port_range), where a Bind to port 0 takes
// its port: ndwv leaves the choice to the kernel, which shares the host's ports with every program.
std::pair<int, int> EphemeralRange() {
  std::pair<int, int> range{0, 0};
  FILE* file = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  IT_CHECK(file != nullptr);
  int read = std::fscanf(file, "%d %d", &range.first, &range.second);
  std::fclose(file);
  IT_CHECK_EQ(2, read);
  return range;
}

// §14.1 Bind: port 0 → an ephemeral port (the kernel's range, where Windows has 49152–65535, the
// SPI's range; docs/user-guide.md "Addresses and ports"); a listener's port is in use →
// ND_SHARING_VIOLATION. GetLocalAddress/GetPeerAddress on an
// idle connector → ND_CONNECTION_INVALID; the listener's GetLocalAddress with a short buffer →
// ND_BUFFER_OVERFLOW, the size, the buffer untouched.
TEST(ConformanceConnector, BindPortsAndAddressGetters) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2Listener> listener;
    uint16_t port = StartListening(adapter, listener);
    sockaddr_in small{};
    std::memset(&small, 0x5C, sizeof small);
    ULONG size = 8;
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, listener->GetLocalAddress(Sa(&small), &size));
    IT_CHECK_EQ(ULONG(sizeof(sockaddr_in)), size);
    CheckFilled(reinterpret_cast<uint8_t*>(&small), sizeof small, 0x5C, "the short address buffer");

    Ref<IND2Connector> idle = adapter.CreateConnector();
    sockaddr_in address{};
    size = sizeof address;
    IT_CHECK_HR(ND_CONNECTION_INVALID, idle->GetLocalAddress(Sa(&address), &size));
    size = sizeof address;
    IT_CHECK_HR(ND_CONNECTION_INVALID, idle->GetPeerAddress(Sa(&address), &size));
    sockaddr_in listenerPort = Loopback(port);
    IT_CHECK_HR(ND_SHARING_VIOLATION, idle->Bind(Sa(&listenerPort), sizeof listenerPort));
    Endpoint e(adapter, kA);
    Ref<IND2Connector> connecting = adapter.CreateConnector();
    OVERLAPPED ov{};
    IT_CHECK_HR(ND_PENDING, StartConnect(connecting.get(), e.qp.get(), port, &ov));
    size = sizeof address;
    IT_OK(connecting->GetLocalAddress(Sa(&address), &size));
    auto [first, last] = EphemeralRange();
    IT_CHECK_MSG(PortOf(address) >= first && PortOf(address) <= last,
                 "ephemeral port " + std::to_string(PortOf(address)));
    IT_OK(connecting->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(connecting.get(), &ov, "canceled Connect"));
  });
}

// §14.1 Bind / §14.2: the local port of a connector that is connecting is in use: another
// connector's Bind to it → ND_SHARING_VIOLATION, on both transports (nd2-spi.md §14.1 Bind
// "ND_SHARING_VIOLATION (in use)", §14.2).
TEST(ConformanceConnector, BindToTheLocalPortOfAConnectingConnector) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2Listener> listener;
    uint16_t port = StartListening(adapter, listener);
    sockaddr_in address{};
    ULONG size = 0;
    Endpoint e(adapter, kA);
    Ref<IND2Connector> connecting = adapter.CreateConnector();
    OVERLAPPED ov{};
    IT_CHECK_HR(ND_PENDING, StartConnect(connecting.get(), e.qp.get(), port, &ov));
    size = sizeof address;
    IT_OK(connecting->GetLocalAddress(Sa(&address), &size));
    Ref<IND2Connector> other = adapter.CreateConnector();
    IT_CHECK_HR(ND_SHARING_VIOLATION, other->Bind(Sa(&address), sizeof address));
    IT_OK(connecting->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, PollOv(connecting.get(), &ov, "canceled Connect"));
  });
}

// =================================================================================================
// What the SDK test programs and the example tools rely on (nd-tools.md §8, §9; §6, §7, §14)
// =================================================================================================

// nd-tools.md §9: the limits the example tools and SDK test programs need: registrations and
// transfers of 64 MiB (ndmw), at least 2 SGEs (ndmemorytest, ndmw), equal receive and initiator
// depths of at least 64 (ndmval and ndping size both queues from one of them), an inline
// threshold within the inline size (the tools create QPs with inline = threshold), read limits
// of at least 1, MaxCallerData >= 40 (ndmpic), MaxCalleeData >= 36 (ndmw), IN_ORDER_DMA (ndrping,
// ndrpingpong refuse to run without it) and LOOPBACK. §15.9: Query takes InfoVersion 1 as well.
TEST(ConformanceAdapter, InfoMeetsTheToolProfile) {
  RunLocal([] {
    Adapter adapter;
    const ND2_ADAPTER_INFO& info = adapter.info();
    auto atLeast = [](uint64_t value, uint64_t floor, const char* name) {
      IT_CHECK_MSG(value >= floor, std::string(name) + " is " + std::to_string(value) + ", below " +
                                       std::to_string(floor));
    };
    atLeast(info.MaxRegistrationSize, 64ull << 20, "MaxRegistrationSize");
    atLeast(info.MaxTransferLength, 64ull << 20, "MaxTransferLength");
    atLeast(info.MaxInitiatorSge, 2, "MaxInitiatorSge");
    atLeast(info.MaxReceiveSge, 2, "MaxReceiveSge");
    atLeast(info.MaxReadSge, 1, "MaxReadSge");
    IT_CHECK(info.MaxReadSge <= info.MaxInitiatorSge);
    IT_CHECK_EQ(info.MaxReceiveQueueDepth, info.MaxInitiatorQueueDepth);
    atLeast(info.MaxReceiveQueueDepth, 64, "MaxReceiveQueueDepth");
    atLeast(info.MaxCompletionQueueDepth, 4, "MaxCompletionQueueDepth");
    IT_CHECK(info.InlineRequestThreshold <= info.MaxInlineDataSize);
    atLeast(info.MaxInboundReadLimit, 1, "MaxInboundReadLimit");
    atLeast(info.MaxOutboundReadLimit, 1, "MaxOutboundReadLimit");
    atLeast(info.MaxCallerData, 40, "MaxCallerData");
    atLeast(info.MaxCalleeData, 36, "MaxCalleeData");
    IT_CHECK(info.AdapterFlags & ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED);
    IT_CHECK(info.AdapterFlags & ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED);
    ND2_ADAPTER_INFO v1{};
    v1.InfoVersion = ND_VERSION_1;
    ULONG size = sizeof v1;
    IT_OK(adapter->Query(&v1, &size));
    IT_CHECK_EQ(ULONG(sizeof(ND2_ADAPTER_INFO)), size);
    IT_CHECK_EQ(info.MaxCompletionQueueDepth, v1.MaxCompletionQueueDepth);
  });
}

// §9 CreateCompletionQueue, nd-tools.md §9: CQ and QP depths are independent: a CQ of 2 serves
// QPs of depth 64 and of the adapter's maximum (the SDK tests attach both), and two CQs of
// exactly MaxCompletionQueueDepth can exist at once (ndcq creates two).
TEST(ConformanceCq, DepthsAreIndependentOfTheQueuePairs) {
  RunLocal([] {
    Adapter adapter;
    const ND2_ADAPTER_INFO& info = adapter.info();
    Ref<IND2CompletionQueue> full1 = adapter.CreateCq(info.MaxCompletionQueueDepth);
    Ref<IND2CompletionQueue> full2 = adapter.CreateCq(info.MaxCompletionQueueDepth);
    Ref<IND2CompletionQueue> two = adapter.CreateCq(2);
    Ref<IND2QueuePair> deep = adapter.CreateQp(two.get(), kA, 64, 64);
    Ref<IND2QueuePair> deepest =
        adapter.CreateQp(two.get(), kB, info.MaxReceiveQueueDepth, info.MaxInitiatorQueueDepth);
    std::vector<uint8_t> buffer(64);
    Mr mr(adapter, buffer.data(), buffer.size(), kSinkFlags);
    PostReceives(deep.get(), buffer.data(), mr.token(), 2, 0x10);
    IT_OK(deep->Flush());
    ExpectCompletion(two.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10), kA}, "depth 64, receive 1");
    ExpectCompletion(two.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x11), kA}, "depth 64, receive 2");
    PostReceives(deepest.get(), buffer.data(), mr.token(), 2, 0x20);
    IT_OK(deepest->Flush());
    ExpectCompletion(two.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x20), kB}, "maximum depth, receive 1");
    ExpectCompletion(two.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x21), kB}, "maximum depth, receive 2");
  });
}

// §7 [tests] (ndcq): cancel of a connector aborts its pending NotifyDisconnect, of an SRQ its
// Notify: ND_CANCELED, the failure packets already on the completion port when the call returns.
// The connection itself is untouched: a later NotifyDisconnect completes ND_SUCCESS when the peer
// disconnects.
TEST(ConformanceOverlapped, CancelOfNotifyDisconnectAndSrqNotify) {
  RunLocal([] {
    LocalPair p;
    p.Connect();
    std::vector<uint8_t> buffer(16 * 4);
    Mr mr(p.adapterA, buffer.data(), buffer.size(), kSinkFlags);
    Ref<IND2SharedReceiveQueue> srq;
    IT_OK(p.adapterA->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, p.adapterA.file(), 8, 1, 2,
                                               0, 0, srq.Out()));
    for (int i = 0; i < 4; ++i) {
      ND2_SGE sge = {buffer.data() + 16 * i, 16, mr.token()};
      IT_OK(srq->Receive(Ctx(0x10 + i), &sge, 1));
    }
    Port port(p.adapterA);
    OVERLAPPED notify{}, srqNotify{};
    IT_CHECK_HR(ND_PENDING, p.a.connector->NotifyDisconnect(&notify));
    IT_CHECK_HR(ND_PENDING, srq->Notify(&srqNotify));
    IT_OK(p.a.connector->CancelOverlappedRequests());
    port.ExpectFailurePacket(&notify, "NotifyDisconnect");
    IT_OK(srq->CancelOverlappedRequests());
    port.ExpectFailurePacket(&srqNotify, "SRQ Notify");
    port.ExpectEmpty("after the cancels");
    IT_CHECK_HR(ND_CANCELED, p.a.connector->GetOverlappedResult(&notify, FALSE));
    IT_CHECK_HR(ND_CANCELED, srq->GetOverlappedResult(&srqNotify, FALSE));

    OVERLAPPED again{};
    IT_CHECK_HR(ND_PENDING, p.a.connector->NotifyDisconnect(&again));
    IT_OK(Disconnect(p.b.connector.get()));
    IT_OK(PollOv(p.a.connector.get(), &again, "NotifyDisconnect after the cancel"));
    IT_OK(Disconnect(p.a.connector.get()));
  });
}

// §6 [tests]: the SDK test harness releases MR, MW, CQ, QP and connector, closes the overlapped
// file and releases the adapter right after a Disconnect and a Deregister it did not wait for.
// Every Release returns 0 (client references only), nothing hangs or crashes, the peer sees the
// connection end (NotifyDisconnect completes, its receives are flushed, its own Disconnect
// succeeds), and the process goes on making connections.
TEST(ConformanceAdapter, ReleaseEverythingRightAfterAnUnawaitedDisconnect) {
  RunLocal([] {
    Adapter adapterB;
    Endpoint b(adapterB, kB);
    std::vector<uint8_t> inbox(64), region(4096);
    Mr inboxMr(adapterB, inbox.data(), inbox.size(), kSinkFlags);
    PostReceives(b.qp.get(), inbox.data(), inboxMr.token(), 2, 0x10);
    uint16_t port = StartListening(adapterB, b.listener);
    b.connector = adapterB.CreateConnector();
    // The SDK harness frees its OVERLAPPED right after these releases: here they outlive them,
    // filled with a pattern once the file is closed, so that a late write would show.
    OVERLAPPED disconnect{}, deregister{};
    {
      sockaddr_in loopback = Loopback(0);
      Ref<IND2Adapter> adapter;
      IT_OK(NdOpenAdapter(IID_IND2Adapter, Sa(&loopback), sizeof loopback, adapter.Out()));
      HANDLE file = nullptr;
      IT_OK(adapter->CreateOverlappedFile(&file));
      Ref<IND2CompletionQueue> cq;
      IT_OK(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 16, 0, 0, cq.Out()));
      Ref<IND2QueuePair> qp;
      IT_OK(adapter->CreateQueuePair(IID_IND2QueuePair, cq.get(), cq.get(), kA, 4, 4, 1, 1, 0, qp.Out()));
      Ref<IND2MemoryRegion> mr;
      IT_OK(adapter->CreateMemoryRegion(IID_IND2MemoryRegion, file, mr.Out()));
      Register(mr.get(), region.data(), region.size(), kTargetFlags);
      Ref<IND2MemoryWindow> mw;
      IT_OK(adapter->CreateMemoryWindow(IID_IND2MemoryWindow, mw.Out()));
      PostReceives(qp.get(), region.data(), mr->GetLocalToken(), 2, 0x30);
      Ref<IND2Connector> connector;
      IT_OK(adapter->CreateConnector(IID_IND2Connector, file, connector.Out()));

      Ov request, connect, accept;
      HRESULT hrRequest =
          b.listener->GetConnectionRequest(b.connector.get(), request.Prepare(b.listener.get()));
      HRESULT hrConnect = StartConnect(connector.get(), qp.get(), port, connect.Prepare(connector.get()));
      IT_OK(request.Finish(hrRequest, "GetConnectionRequest"));
      HRESULT hrAccept =
          b.connector->Accept(b.qp.get(), 0, 0, nullptr, 0, accept.Prepare(b.connector.get()));
      IT_OK(connect.Finish(hrConnect, "Connect"));
      CompleteConnect(connector.get());
      IT_OK(accept.Finish(hrAccept, "Accept"));

      HRESULT hr = connector->Disconnect(&disconnect);
      IT_CHECK_MSG(hr == ND_PENDING || hr == ND_SUCCESS, "Disconnect returned " + StatusName(hr));
      hr = mr->Deregister(&deregister);
      IT_CHECK_MSG(hr == ND_PENDING || hr == ND_SUCCESS, "Deregister returned " + StatusName(hr));
      IT_CHECK_EQ(0u, mr.Reset());
      IT_CHECK_EQ(0u, mw.Reset());
      IT_CHECK_EQ(0u, cq.Reset());
      IT_CHECK_EQ(0u, qp.Reset());
      IT_CHECK_EQ(0u, connector.Reset());
      IT_CHECK(CloseHandle(file));
      // The close ended what was still pending through the file (ND_CANCELED) or it had ended.
      IT_CHECK_MSG(HasOverlappedIoCompleted(&disconnect) && HasOverlappedIoCompleted(&deregister),
                   "a request was still pending after its file was closed");
      memset(&disconnect, 0xA5, sizeof disconnect);
      memset(&deregister, 0xA5, sizeof deregister);
      IT_CHECK_EQ(0u, adapter.Reset());
    }
    // Released with it pending, the connector still ends the connection (the peer sees it, the
    // QP's flush included) and writes nothing more to the Disconnect's OVERLAPPED.
    Ov notify;
    HRESULT hr = b.connector->NotifyDisconnect(notify.Prepare(b.connector.get()));
    IT_OK(notify.Finish(hr, "the peer's NotifyDisconnect"));
    ExpectCompletion(b.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x10), kB}, "the peer's receive 1");
    ExpectCompletion(b.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(0x11), kB}, "the peer's receive 2");
    IT_OK(Disconnect(b.connector.get()));
    OVERLAPPED pattern;
    memset(&pattern, 0xA5, sizeof pattern);
    IT_CHECK_MSG(memcmp(&disconnect, &pattern, sizeof pattern) == 0 && memcmp(&deregister, &pattern, sizeof pattern) == 0,
                 "an OVERLAPPED was written after its file was closed");

    LocalPair next;
    next.Connect();
  });
}

// nd-tools.md §9 (NdDualConnection), §14.1 Accept: an Accept stays pending for 10 s without the
// active side's CompleteConnect, then completes ND_SUCCESS once it comes, and the connection
// carries a message. RoCE: no keepalive probes the peer before the RTU (the passive side's link
// holds until established); the active CM answers the REP's retries with MRAs.
TEST(ConformanceConnector, AcceptWaitsTenSecondsForCompleteConnect) {
  RunLocal([] {
    LocalPair p;
    std::vector<uint8_t> out(16), in(16);
    Mr outMr(p.adapterA, out.data(), out.size(), kSourceFlags);
    Mr inMr(p.adapterB, in.data(), in.size(), kSinkFlags);
    PostReceives(p.b.qp.get(), in.data(), inMr.token(), 1, 0x10);
    uint16_t port = StartListening(p.adapterB, p.b.listener);
    p.b.connector = p.adapterB.CreateConnector();
    p.a.connector = p.adapterA.CreateConnector();
    Ov request, connect, accept;
    HRESULT hr = p.b.listener->GetConnectionRequest(p.b.connector.get(), request.Prepare(p.b.listener.get()));
    HRESULT hrConnect = StartConnect(p.a.connector.get(), p.a.qp.get(), port, connect.Prepare(p.a.connector.get()));
    IT_OK(request.Finish(hr, "GetConnectionRequest"));
    OVERLAPPED* acceptOv = accept.Prepare(p.b.connector.get());
    HRESULT hrAccept = p.b.connector->Accept(p.b.qp.get(), 0, 0, nullptr, 0, acceptOv);
    IT_OK(connect.Finish(hrConnect, "Connect"));
    IT_CHECK_HR(ND_PENDING, hrAccept);

    Deadline hold(10500);  // the hold NdDualConnection needs, not a bound on anything
    while (!hold.Expired()) {
      IT_CHECK_HR(ND_PENDING, p.b.connector->GetOverlappedResult(acceptOv, FALSE));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    CompleteConnect(p.a.connector.get());
    IT_OK(accept.Finish(hrAccept, "Accept completed after 10 s"));

    ND2_SGE sge = {out.data(), 16, outMr.token()};
    IT_OK(p.a.qp->Send(Ctx(0x20), &sge, 1, 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "send");
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, 16}, "receive");
  });
}

// The sizes a tool round uses here: a few from 1 B up, around the inline threshold, increasing.
std::vector<size_t> ToolSizes(ULONG threshold, size_t largest) {
  std::vector<size_t> sizes = {1, 40, threshold > 1 ? threshold - 1 : 1, threshold, 4096, 65536 + 3,
                               1 << 20, 4 << 20};
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](size_t s) { return s == 0 || s > largest; }),
              sizes.end());
  return sizes;
}

// nd-tools.md §8 ndpingpong: both sides post `depth` receives (one flag as their context, all into
// the one buffer) before connecting with read limits 0 and no private data, on QPs with inline
// size = InlineRequestThreshold. Ping: the client sends (INLINE below the threshold), waits for
// its send completion, then for the pong, and reposts; pong: the server waits for the receive,
// reposts, sends back and waits for its send. After the client's Disconnect the server's next
// completion is ND_CANCELED, which ends its loop, and its Disconnect succeeds.
TEST(ConformanceTools, NdpingpongRoundTrips) {
  RunLocal([] {
    Adapter probe;
    const ND2_ADAPTER_INFO& info = probe.info();
    const ULONG depth = std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth);
    const ULONG threshold = info.InlineRequestThreshold;
    const Shape shape{.depth = depth, .sge = 1, .inlineSize = threshold, .cqDepth = depth};
    LocalPair p(shape);
    constexpr size_t kBuffer = 65536 + 40;
    std::vector<uint8_t> bufA(kBuffer), bufB(kBuffer);
    Mr mrA(p.adapterA, bufA.data(), kBuffer, kSinkFlags), mrB(p.adapterB, bufB.data(), kBuffer, kSinkFlags);
    void* const kFlag = Ctx(0x1);
    auto post = [&](Endpoint& e, std::vector<uint8_t>& buffer, UINT32 token) {
      ND2_SGE sge = {buffer.data(), ULONG(buffer.size()), token};
      IT_OK(e.qp->Receive(kFlag, &sge, 1));
    };
    for (ULONG i = 0; i < depth; ++i) {
      post(p.a, bufA, mrA.token());
      post(p.b, bufB, mrB.token());
    }
    p.Connect(0, 0);
    uint64_t seed = 1;
    for (size_t size : ToolSizes(threshold, 65536 + 3)) {
      for (int i = 0; i < 3; ++i, ++seed) {
        const ULONG flags = size < threshold ? ND_OP_FLAG_INLINE : 0;
        const int64_t bytes = int64_t(size);
        FillPattern(bufA.data(), size, seed);
        ND2_SGE ping = {bufA.data(), ULONG(size), mrA.token()};
        IT_OK(p.a.qp->Send(Ctx(0x20), &ping, 1, flags));
        ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "ping send");
        ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, kFlag, kB, bytes}, "ping receive");
        CheckPattern(bufB.data(), size, seed, "ping");
        post(p.b, bufB, mrB.token());
        FillPattern(bufB.data(), size, seed + 1000);
        ND2_SGE pong = {bufB.data(), ULONG(size), mrB.token()};
        IT_OK(p.b.qp->Send(Ctx(0x30), &pong, 1, flags));
        ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x30), kB}, "pong send");
        ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, kFlag, kA, bytes}, "pong receive");
        CheckPattern(bufA.data(), size, seed + 1000, "pong");
        post(p.a, bufA, mrA.token());
      }
    }
    IT_OK(Disconnect(p.a.connector.get()));
    ExpectCompletion(p.b.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, kFlag, kB},
                     "the server's wait, ended by the client's Disconnect");
    IT_OK(Disconnect(p.b.connector.get()));
  });
}

// What ndrping's server sends its client.
struct RpingRecord {
  UINT32 token;
  ULONG inboundReadLimit;
  UINT64 address;
};
static_assert(sizeof(RpingRecord) == 16);

// nd-tools.md §8 ndrping, with §11 (windows), §12 (ordering, Reads up to the read limit) and
// §14.3: the server registers its buffer with LOCAL_WRITE plus REMOTE_READ or REMOTE_WRITE,
// posts one receive over all of it, Accepts with (MaxInboundReadLimit, 0), binds a window over
// the whole buffer with ALLOW_READ or ALLOW_WRITE and sends the record {token, read limit,
// address}; the client (MR with LOCAL_WRITE, + RDMA_READ_SINK for reads) Connects with (0, depth
// for reads else 0), keeps up to `credits` Reads or Writes (INLINE below the threshold) in
// flight through the window, each completing ND_SUCCESS with its context, then sends a zero-byte
// terminate that the server's receive takes. After both Disconnects the server releases the
// window and its Deregister succeeds.
void RunNdrpingPattern(bool read) {
  Adapter probe;
  const ND2_ADAPTER_INFO& info = probe.info();
  const ULONG threshold = info.InlineRequestThreshold;
  const ULONG serverDepth = std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth);
  ULONG depth = std::min(info.MaxCompletionQueueDepth, info.MaxInitiatorQueueDepth);
  if (read) depth = std::min(depth, info.MaxOutboundReadLimit);
  LocalPair p({.depth = depth, .sge = 1, .inlineSize = threshold, .cqDepth = depth},
              {.depth = serverDepth, .sge = 1, .cqDepth = info.MaxCompletionQueueDepth});
  constexpr size_t kBuffer = (4 << 20) + 40;
  std::vector<uint8_t> server(kBuffer), client(kBuffer);
  FillPattern(server.data(), kBuffer, 31);
  Ref<IND2MemoryRegion> serverMr = p.adapterB.CreateMr(), clientMr = p.adapterA.CreateMr();
  Register(serverMr.get(), server.data(), kBuffer,
           ND_MR_FLAG_ALLOW_LOCAL_WRITE | (read ? ND_MR_FLAG_ALLOW_REMOTE_READ : ND_MR_FLAG_ALLOW_REMOTE_WRITE));
  Register(clientMr.get(), client.data(), kBuffer,
           ND_MR_FLAG_ALLOW_LOCAL_WRITE | (read ? ND_MR_FLAG_RDMA_READ_SINK : 0));
  void* const kReceive = Ctx(0x1000);
  void* const kSend = Ctx(0x2000);
  void* const kOp = read ? Ctx(0x3000) : Ctx(0x4000);
  ND2_SGE serverAll = {server.data(), ULONG(kBuffer), serverMr->GetLocalToken()};
  IT_OK(p.b.qp->Receive(kReceive, &serverAll, 1));  // the terminate
  ND2_SGE clientAll = {client.data(), ULONG(kBuffer), clientMr->GetLocalToken()};
  IT_OK(p.a.qp->Receive(kReceive, &clientAll, 1));  // the record
  p.Connect(0, read ? depth : 0, info.MaxInboundReadLimit, 0);

  Ref<IND2MemoryWindow> mw;
  IT_OK(p.adapterB->CreateMemoryWindow(IID_IND2MemoryWindow, mw.Out()));
  IT_OK(p.b.qp->Bind(Ctx(0x5000), serverMr.get(), mw.get(), server.data(), kBuffer,
                     read ? ND_OP_FLAG_ALLOW_READ : ND_OP_FLAG_ALLOW_WRITE));
  ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeBind, Ctx(0x5000), kB}, "window bind");
  const RpingRecord record = {mw->GetRemoteToken(), info.MaxInboundReadLimit, Va(server.data())};
  std::memcpy(server.data(), &record, sizeof record);
  ND2_SGE recordSge = {server.data(), sizeof record, serverMr->GetLocalToken()};
  IT_OK(p.b.qp->Send(kSend, &recordSge, 1, 0));
  ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, kSend, kB}, "sending the record");
  ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, kReceive, kA, sizeof record},
                   "receiving the record");
  RpingRecord peer;
  std::memcpy(&peer, client.data(), sizeof peer);
  IT_CHECK_EQ(record.token, peer.token);
  IT_CHECK_EQ(record.address, peer.address);
  const ULONG credits = read ? std::min(depth, peer.inboundReadLimit) : depth;
  IT_CHECK(credits >= 1);

  size_t last = 0;
  for (size_t size : ToolSizes(threshold, 1 << 20)) {
    const ULONG flags = !read && size < threshold ? ND_OP_FLAG_INLINE : 0;
    if (!read) FillPattern(client.data(), size, size);
    ND2_SGE sge = {client.data(), ULONG(size), clientMr->GetLocalToken()};
    const ULONG iterations = size >= (1 << 20) ? 4 : 40;  // more than the read credits
    ULONG issued = 0, completed = 0, inFlight = 0;
    while (completed < iterations) {
      for (; inFlight < credits && issued < iterations; ++inFlight, ++issued)
        IT_OK(read ? p.a.qp->Read(kOp, &sge, 1, peer.address, peer.token, flags)
                   : p.a.qp->Write(kOp, &sge, 1, peer.address, peer.token, flags));
      ExpectStatus(NextCompletion(p.a.cq.get(), "an RDMA operation"), ND_SUCCESS,
                   read ? Nd2RequestTypeRead : Nd2RequestTypeWrite, kOp, "an RDMA operation");
      --inFlight;
      ++completed;
    }
    if (read) IT_CHECK_MSG(std::memcmp(client.data(), server.data(), size) == 0, "what the Reads brought");
    last = size;
  }

  IT_OK(p.a.qp->Send(kSend, nullptr, 0, 0));  // the terminate
  ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, kSend, kA}, "sending the terminate");
  ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, kReceive, kB, 0}, "the terminate");
  // Writes posted before the Send are in place once its receive completed (§12 ordering).
  if (!read) CheckPattern(server.data(), last, last, "what the Writes placed");
  IT_OK(Disconnect(p.a.connector.get()));
  IT_OK(Disconnect(p.b.connector.get()));
  IT_CHECK_EQ(0u, mw.Reset());
  IT_OK(Deregister(serverMr.get()));
  IT_OK(Deregister(clientMr.get()));
}

TEST(ConformanceTools, NdrpingWritesThroughAWindow) {
  RunLocal([] { RunNdrpingPattern(false); });
}

TEST(ConformanceTools, NdrpingReadsThroughAWindowUpToThePeersReadLimit) {
  RunLocal([] { RunNdrpingPattern(true); });
}

// A byte another agent (here the adapter, which stores it last and with release order) writes:
// read it fresh, then see what it wrote before. An acquire load, not a fence after a volatile
// read: ThreadSanitizer sees the order of the one, not of the other.
uint8_t LoadByte(const uint8_t* at) {
  return std::atomic_ref<uint8_t>(*const_cast<uint8_t*>(at)).load(std::memory_order_acquire);
}

// nd-tools.md §8 ndrpingpong, §4 IN_ORDER_DMA, §12 ordering: both sides register their buffer
// with LOCAL_WRITE | REMOTE_WRITE and bind a window over all of it with ALLOW_WRITE; the server
// posts two receives before Accept(0, 0), the client one before Connect(0, 0); the client binds
// and sends its record {token, address} first, the server then binds and sends its own. A ping
// writes `size` bytes (INLINE below the threshold) whose last byte is the mark; the other side
// polls that last byte, and when it shows the mark every byte before it is already in place
// (the bytes of one Write land in address order). The client's zero-byte terminate completes
// ND_SUCCESS or ND_CANCELED; the server's second receive takes it.
TEST(ConformanceTools, NdrpingpongLastBytePolling) {
  RunLocal([] {
    Adapter probe;
    const ND2_ADAPTER_INFO& info = probe.info();
    IT_CHECK(info.AdapterFlags & ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED);
    const ULONG threshold = info.InlineRequestThreshold;
    const ULONG serverDepth = std::min(info.MaxCompletionQueueDepth, info.MaxReceiveQueueDepth);
    const ULONG clientDepth = std::min(info.MaxCompletionQueueDepth, info.MaxInitiatorQueueDepth);
    LocalPair p({.depth = clientDepth, .sge = 1, .inlineSize = threshold, .cqDepth = clientDepth},
                {.depth = serverDepth, .sge = 1, .inlineSize = threshold, .cqDepth = serverDepth});
    constexpr size_t kBuffer = (4 << 20) + 40 + 32;
    constexpr size_t kLocalRecord = kBuffer - 32, kPeerRecord = kBuffer - 16;
    struct Record {
      UINT32 token;
      UINT64 address;
    };
    static_assert(sizeof(Record) == 16);
    struct Side {
      explicit Side(Endpoint& endpoint) : e(endpoint) {}
      Endpoint& e;
      std::vector<uint8_t> buffer = std::vector<uint8_t>(kBuffer, 0);
      Ref<IND2MemoryRegion> mr;
      Ref<IND2MemoryWindow> mw;
      Record peer{};
    };
    Side client(p.a), server(p.b);
    for (Side* s : {&client, &server}) {
      s->mr = s->e.adapter.CreateMr();
      Register(s->mr.get(), s->buffer.data(), kBuffer, ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_WRITE);
      IT_OK(s->e.adapter->CreateMemoryWindow(IID_IND2MemoryWindow, s->mw.Out()));
    }
    auto postRecordReceive = [](Side& s, uintptr_t context) {
      ND2_SGE sge = {s.buffer.data() + kPeerRecord, sizeof(Record), s.mr->GetLocalToken()};
      IT_OK(s.e.qp->Receive(Ctx(context), &sge, 1));
    };
    auto bindAndSendRecord = [](Side& s) {
      IT_OK(s.e.qp->Bind(Ctx(0x3000), s.mr.get(), s.mw.get(), s.buffer.data(), kBuffer, ND_OP_FLAG_ALLOW_WRITE));
      ExpectCompletion(s.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeBind, Ctx(0x3000), s.e.qpContext}, "window bind");
      Record record = {s.mw->GetRemoteToken(), Va(s.buffer.data())};
      std::memcpy(s.buffer.data() + kLocalRecord, &record, sizeof record);
      ND2_SGE sge = {s.buffer.data() + kLocalRecord, sizeof record, s.mr->GetLocalToken()};
      IT_OK(s.e.qp->Send(Ctx(0x2000), &sge, 1, 0));
      ExpectCompletion(s.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x2000), s.e.qpContext}, "the record");
    };
    auto takeRecord = [](Side& s) {
      ExpectCompletion(s.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x1000), s.e.qpContext, sizeof(Record)},
                       "the peer's record");
      std::memcpy(&s.peer, s.buffer.data() + kPeerRecord, sizeof s.peer);
    };
    postRecordReceive(server, 0x1000);
    postRecordReceive(server, 0x1001);  // the terminate
    postRecordReceive(client, 0x1000);
    p.Connect(0, 0);
    bindAndSendRecord(client);
    takeRecord(server);
    bindAndSendRecord(server);
    takeRecord(client);

    // `from` writes [0, size) with `mark` as the last byte; `to` polls that byte, then checks
    // the whole Write is there; the writer reaps its Write completion.
    auto write = [&](Side& from, Side& to, size_t size, uint64_t seed, uint8_t mark) {
      FillPattern(from.buffer.data(), size - 1, seed);
      from.buffer[size - 1] = mark;
      ND2_SGE sge = {from.buffer.data(), ULONG(size), from.mr->GetLocalToken()};
      IT_OK(from.e.qp->Write(Ctx(0x4000), &sge, 1, from.peer.address, from.peer.token,
                             size < threshold ? ND_OP_FLAG_INLINE : 0));
      Deadline deadline;
      unsigned spins = 0;
      while (LoadByte(to.buffer.data() + size - 1) != mark) {
        if (deadline.Expired()) IT_FAIL("the last byte of a " + std::to_string(size) + "-byte Write never came");
        Pause(spins);
      }
      CheckPattern(to.buffer.data(), size - 1, seed, "the bytes before the last one");
      ExpectCompletion(from.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeWrite, Ctx(0x4000), from.e.qpContext}, "the Write");
    };
    uint64_t seed = 700;
    for (size_t size : ToolSizes(threshold, 4 << 20)) {
      for (int i = 0; i < 2; ++i, seed += 2) {
        write(client, server, size, seed, 'X');      // ping
        write(server, client, size, seed + 1, 'Y');  // pong
      }
    }

    IT_OK(client.e.qp->Send(Ctx(0x2001), nullptr, 0, 0));  // the terminate
    ND2_RESULT r = NextCompletion(client.e.cq.get(), "sending the terminate");
    IT_CHECK_MSG(r.RequestType == Nd2RequestTypeSend && r.RequestContext == Ctx(0x2001) &&
                     (r.Status == ND_SUCCESS || r.Status == ND_CANCELED),
                 Describe(r));
    ExpectCompletion(server.e.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x1001), kB, 0}, "the terminate");
    IT_OK(Disconnect(client.e.connector.get()));
    IT_OK(Disconnect(server.e.connector.get()));
    for (Side* s : {&client, &server}) {
      s->mw.Reset();
      IT_OK(Deregister(s->mr.get()));
    }
  });
}

// nd-tools.md §9 (ndmw): a 64 MiB receive takes a 64 MiB message, and a 32 MiB Read completes,
// each as one request of one SGE, within MaxRegistrationSize and MaxTransferLength.
TEST(ConformanceTools, NdmwLargeReceiveAndRead) {
  RunLocal([] {
    constexpr size_t kMessage = 64 << 20, kRead = 32 << 20;
    std::vector<uint8_t> out(kMessage), in(kMessage, 0);
    FillPattern(out.data(), kMessage, 64);
    LocalPair p;
    Mr outMr(p.adapterA, out.data(), kMessage, kReadSinkFlags);
    Mr inMr(p.adapterB, in.data(), kMessage, kSinkFlags | kTargetFlags);
    ND2_SGE receive = {in.data(), ULONG(kMessage), inMr.token()};
    IT_OK(p.b.qp->Receive(Ctx(0x10), &receive, 1));
    p.Connect();
    ND2_SGE send = {out.data(), ULONG(kMessage), outMr.token()};
    IT_OK(p.a.qp->Send(Ctx(0x20), &send, 1, 0));
    ExpectCompletion(p.b.cq.get(), {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x10), kB, int64_t(kMessage)},
                     "the 64 MiB receive", 60000);
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x20), kA}, "the 64 MiB send", 60000);
    IT_CHECK_MSG(in == out, "the 64 MiB message");
    FillPattern(in.data(), kRead, 32);
    ND2_SGE sink = {out.data(), ULONG(kRead), outMr.token()};
    IT_OK(p.a.qp->Read(Ctx(0x21), &sink, 1, Va(in.data()), inMr.remoteToken(), 0));
    ExpectCompletion(p.a.cq.get(), {ND_SUCCESS, Nd2RequestTypeRead, Ctx(0x21), kA}, "the 32 MiB read", 60000);
    IT_CHECK_MSG(std::memcmp(out.data(), in.data(), kRead) == 0, "the 32 MiB read");
  });
}

// nd-tools.md §9 and §14 (ndconn): connection cycles on one CQ of depth 2 per side: each cycle a
// new QP and connector; Connect with read limits (IPPROTO_TCP, 0), the v1 leftover, and private
// data carrying the cycle number; the server reads the data and the limits (inbound 0, outbound
// 6), Accepts (0, 0), waits for the client's Disconnect with NotifyDisconnect and disconnects
// too; both release the connector, then the QP, each to 0. No QP ever completes anything.
TEST(ConformanceTools, NdconnConnectDisconnectCycles) {
  RunLocal([] {
    Adapter adapterA, adapterB;
    Ref<IND2CompletionQueue> cqA = adapterA.CreateCq(2), cqB = adapterB.CreateCq(2);
    Ref<IND2Listener> listener;
    uint16_t port = StartListening(adapterB, listener);
    constexpr uint32_t kCycles = 20;
    for (uint32_t cycle = 0; cycle < kCycles; ++cycle) {
      Ref<IND2QueuePair> qpA = adapterA.CreateQp(cqA.get(), kA, 4, 4);
      Ref<IND2Connector> server = adapterB.CreateConnector();
      Ov request;
      HRESULT hr = listener->GetConnectionRequest(server.get(), request.Prepare(listener.get()));
      Ref<IND2Connector> client = adapterA.CreateConnector();
      sockaddr_in local = Loopback(0), destination = Loopback(port);
      IT_OK(client->Bind(Sa(&local), sizeof local));
      const uint32_t data[2] = {cycle, kCycles};
      Ov connect;
      HRESULT hrConnect = client->Connect(qpA.get(), Sa(&destination), sizeof destination, IPPROTO_TCP,
                                          0, data, sizeof data, connect.Prepare(client.get()));
      IT_OK(request.Finish(hr, "GetConnectionRequest"));
      uint8_t got[256] = {};
      ULONG size = sizeof got;
      IT_OK(server->GetPrivateData(got, &size));
      IT_CHECK(size >= sizeof data);  // RoCE reports it padded (TransportIsRoce)
      IT_CHECK(std::memcmp(got, data, sizeof data) == 0);
      ULONG in = 0xDEAD, out = 0xDEAD;
      IT_OK(server->GetReadLimits(&in, &out));
      IT_CHECK_EQ(0u, in);
      IT_CHECK_EQ(ULONG(IPPROTO_TCP), out);
      Ref<IND2QueuePair> qpB = adapterB.CreateQp(cqB.get(), kB, 4, 4);
      Ov accept;
      HRESULT hrAccept = server->Accept(qpB.get(), 0, 0, nullptr, 0, accept.Prepare(server.get()));
      IT_OK(connect.Finish(hrConnect, "Connect"));
      CompleteConnect(client.get());
      IT_OK(accept.Finish(hrAccept, "Accept"));
      Ov notify;
      HRESULT hrNotify = server->NotifyDisconnect(notify.Prepare(server.get()));
      IT_OK(Disconnect(client.get()));
      IT_OK(notify.Finish(hrNotify, "the server's NotifyDisconnect"));
      IT_OK(Disconnect(server.get()));
      IT_CHECK_EQ(0u, client.Reset());
      IT_CHECK_EQ(0u, qpA.Reset());
      IT_CHECK_EQ(0u, server.Reset());
      IT_CHECK_EQ(0u, qpB.Reset());
    }
    ND2_RESULT stray;
    IT_CHECK_EQ(0u, cqA->GetResults(&stray, 1));
    IT_CHECK_EQ(0u, cqB->GetResults(&stray, 1));
  });
}

}  // namespace
}  // namespace ndit
