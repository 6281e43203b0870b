// Recording fakes of the WV interfaces, for testing the ND provider (src/nd) alone: each fake
// keeps the arguments of its last calls and returns what the test tells it to.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ndwv/winverbs.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <vector>

#include "base/overlapped.h"
#include "nd/provider.h"

namespace ndwv::nd::testing {

constexpr NET64 kGuid = 0x0102030405060708ull;

// IUnknown for a fake: counted, deleted at zero, answers no interface (ND never asks).
template <class I>
class Fake : public I {
 public:
  virtual ~Fake() = default;
  HRESULT STDMETHODCALLTYPE QueryInterface(REFIID, void** ppv) override {
    *ppv = nullptr;
    return E_NOINTERFACE;
  }
  ULONG STDMETHODCALLTYPE AddRef() override { return ++refs; }
  ULONG STDMETHODCALLTYPE Release() override {
    ULONG left = --refs;
    if (left == 0) delete this;
    return left;
  }
  std::atomic<ULONG> refs{1};
};

// IWVOverlapped for a fake: counts cancels.
template <class I>
class FakeOverlapped : public Fake<I> {
 public:
  HRESULT STDMETHODCALLTYPE CancelOverlappedRequests() override {
    ++cancels;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE GetOverlappedResult(OVERLAPPED*, DWORD*, BOOL) override {
    return WV_NOT_SUPPORTED;
  }
  int cancels = 0;
};

// A foreign COM object: something an application might pass that ndwv did not make.
class Foreign : public Fake<IUnknown> {};

class FakeCq : public FakeOverlapped<IWVCompletionQueue> {
 public:
  HRESULT STDMETHODCALLTYPE Resize(SIZE_T* entries) override {
    resizedTo = *entries;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE Peek(SIZE_T* n) override {
    *n = ready.size();
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE Notify(WV_CQ_NOTIFY_TYPE type, OVERLAPPED*) override {
    notifiedWith = type;
    return WV_IO_PENDING;
  }
  HRESULT STDMETHODCALLTYPE BatchNotify(SIZE_T, OVERLAPPED*) override { return WV_NOT_SUPPORTED; }
  SIZE_T STDMETHODCALLTYPE Poll(WV_COMPLETION completions[], SIZE_T n) override {
    ++polls;
    SIZE_T got = 0;
    for (; got < n && !ready.empty(); ++got) {
      completions[got] = ready.front();
      ready.pop_front();
    }
    return got;
  }
  std::deque<WV_COMPLETION> ready;
  SIZE_T resizedTo = 0;
  int notifiedWith = -1;
  int polls = 0;
};

class FakeMw : public Fake<IWVMemoryWindow> {
 public:
  HRESULT STDMETHODCALLTYPE SetRemoteInvalidateId(UINT64 id) override {
    remoteInvalidateId = id;
    return WV_SUCCESS;
  }
  UINT64 remoteInvalidateId = 0;
};

class FakeSrq : public FakeOverlapped<IWVSharedReceiveQueue> {
 public:
  HRESULT STDMETHODCALLTYPE Query(SIZE_T* maxWr, SIZE_T* maxSge, SIZE_T* limit) override {
    *maxWr = this->maxWr;
    *maxSge = 4;
    *limit = this->limit;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE Modify(SIZE_T maxWr, SIZE_T limit) override {
    this->maxWr = maxWr;
    this->limit = limit;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE PostReceive(UINT64 wrId, WV_SGE* sgl, SIZE_T n) override {
    lastWrId = wrId;
    sges.assign(sgl, sgl + n);
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE Notify(OVERLAPPED*) override { return WV_IO_PENDING; }
  SIZE_T maxWr = 0, limit = 0;
  UINT64 lastWrId = 0;
  std::vector<WV_SGE> sges;
};

// Records the last post of any kind.
class FakeQp : public FakeOverlapped<IWVConnectQueuePair> {
 public:
  enum class Op { None, Send, Receive, Read, Write, Bind, Invalidate };

  HRESULT STDMETHODCALLTYPE Query(WV_QP_ATTRIBUTES*) override { return WV_NOT_SUPPORTED; }
  HRESULT STDMETHODCALLTYPE Modify(WV_QP_ATTRIBUTES* attributes, DWORD options,
                                   OVERLAPPED*) override {
    modifiedState = attributes->QpState;
    modifyOptions = options;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE PostReceive(UINT64 wrId, WV_SGE* sgl, SIZE_T n) override {
    return Record(Op::Receive, wrId, sgl, n, 0);
  }
  HRESULT STDMETHODCALLTYPE PostSend(WV_SEND_REQUEST*, WV_SEND_REQUEST**) override {
    return WV_NOT_SUPPORTED;
  }
  HRESULT STDMETHODCALLTYPE Send(UINT64 wrId, WV_SGE* sgl, SIZE_T n, DWORD flags, NET32) override {
    return Record(Op::Send, wrId, sgl, n, flags);
  }
  HRESULT STDMETHODCALLTYPE Read(UINT64 wrId, WV_SGE* sgl, SIZE_T n, DWORD flags, NET64 address,
                                 NET32 rkey) override {
    remoteAddress = address;
    remoteKey = rkey;
    return Record(Op::Read, wrId, sgl, n, flags);
  }
  HRESULT STDMETHODCALLTYPE Write(UINT64 wrId, WV_SGE* sgl, SIZE_T n, DWORD flags, NET32,
                                  NET64 address, NET32 rkey) override {
    remoteAddress = address;
    remoteKey = rkey;
    return Record(Op::Write, wrId, sgl, n, flags);
  }
  HRESULT STDMETHODCALLTYPE CompareExchange(UINT64, WV_SGE*, DWORD, NET64, NET64, NET64,
                                            NET32) override {
    return WV_NOT_SUPPORTED;
  }
  HRESULT STDMETHODCALLTYPE FetchAdd(UINT64, WV_SGE*, DWORD, NET64, NET64, NET32) override {
    return WV_NOT_SUPPORTED;
  }
  HRESULT STDMETHODCALLTYPE BindMemoryWindow(IWVMemoryWindow* mw, UINT64 wrId, UINT32 lkey,
                                             DWORD access, DWORD flags, const VOID* buffer,
                                             SIZE_T length, NET32* rkey) override {
    boundWindow = mw;
    bindLkey = lkey;
    bindAccess = access;
    bindBuffer = buffer;
    bindLength = length;
    *rkey = nextRkey;
    return Record(Op::Bind, wrId, nullptr, 0, flags);
  }
  HRESULT STDMETHODCALLTYPE InvalidateMemoryWindow(IWVMemoryWindow* mw, UINT64 wrId,
                                                   DWORD flags) override {
    boundWindow = mw;
    return Record(Op::Invalidate, wrId, nullptr, 0, flags);
  }

  HRESULT Record(Op op, UINT64 wrId, WV_SGE* sgl, SIZE_T n, DWORD flags) {
    lastOp = op;
    lastWrId = wrId;
    lastFlags = flags;
    sges.assign(sgl, sgl + n);
    return postStatus;
  }

  HRESULT postStatus = WV_SUCCESS;
  Op lastOp = Op::None;
  UINT64 lastWrId = 0;
  DWORD lastFlags = 0;
  std::vector<WV_SGE> sges;
  NET64 remoteAddress = 0;
  NET32 remoteKey = 0;
  IWVMemoryWindow* boundWindow = nullptr;
  UINT32 bindLkey = 0;
  DWORD bindAccess = 0;
  const void* bindBuffer = nullptr;
  SIZE_T bindLength = 0;
  NET32 nextRkey = 0x5a5a0001;
  int modifiedState = -1;
  DWORD modifyOptions = 0;
};

class FakePd : public FakeOverlapped<IWVProtectionDomain> {
 public:
  HRESULT STDMETHODCALLTYPE CreateSharedReceiveQueue(HANDLE file, SIZE_T maxWr, SIZE_T maxSge,
                                                     SIZE_T limit,
                                                     IWVSharedReceiveQueue** srq) override {
    srqFile = file;
    srqMaxSge = maxSge;
    auto* fake = new FakeSrq;
    fake->maxWr = maxWr;
    fake->limit = limit;
    *srq = lastSrq = fake;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE CreateConnectQueuePair(WV_QP_CREATE* create,
                                                   IWVConnectQueuePair** qp) override {
    lastCreate = *create;
    *qp = lastQp = new FakeQp;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE RegisterMemory(const VOID* buffer, SIZE_T length, DWORD access,
                                           OVERLAPPED*, WV_MEMORY_KEYS* keys) override {
    registeredBuffer = buffer;
    registeredLength = length;
    registeredAccess = access;
    if (FAILED(registerStatus)) return registerStatus;
    keys->Lkey = 0x11;
    keys->Rkey = htonl(0x22);
    ++registrations;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE DeregisterMemory(UINT32 lkey, OVERLAPPED*) override {
    deregisteredLkey = lkey;
    if (SUCCEEDED(deregisterStatus)) --registrations;
    return deregisterStatus;
  }
  HRESULT STDMETHODCALLTYPE AllocateMemoryWindow(IWVMemoryWindow** mw) override {
    *mw = new FakeMw;
    return WV_SUCCESS;
  }

  HRESULT registerStatus = WV_SUCCESS;
  HRESULT deregisterStatus = WV_SUCCESS;
  const void* registeredBuffer = nullptr;
  SIZE_T registeredLength = 0;
  DWORD registeredAccess = 0;
  UINT32 deregisteredLkey = 0;
  int registrations = 0;
  WV_QP_CREATE lastCreate{};
  FakeQp* lastQp = nullptr;
  FakeSrq* lastSrq = nullptr;
  HANDLE srqFile = nullptr;
  SIZE_T srqMaxSge = 0;
};

class FakeDevice : public FakeOverlapped<IWVDevice> {
 public:
  FakeDevice() {
    attributes.VendorId = 0x1234;
    attributes.VendorPartId = 0x42;
    attributes.CapabilityFlags = WV_DEVICE_IN_ORDER_PLACEMENT | WV_DEVICE_RESIZE_CQ;
    attributes.MaxMrSize = 1ull << 32;
    attributes.MaxQpWr = 4096;
    attributes.MaxSge = 8;
    attributes.MaxCqEntries = 65536;
    attributes.MaxQpResponderResources = 16;
    attributes.MaxQpInitiatorDepth = 16;
    attributes.MaxInlineSend = 256;
    attributes.MaxSrq = 64;
    attributes.MaxSrqWr = 1024;
    attributes.MaxSrqSge = 4;
    attributes.MaxTransferLength = 1ull << 30;
    attributes.MaxPrivateData = 512;
    attributes.DeviceType = WvDeviceIwarp;
  }
  ~FakeDevice() override { pd->Release(); }
  HRESULT STDMETHODCALLTYPE Query(WV_DEVICE_ATTRIBUTES* out) override {
    *out = attributes;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE QueryPort(UINT8, WV_PORT_ATTRIBUTES*) override {
    return WV_NOT_SUPPORTED;
  }
  HRESULT STDMETHODCALLTYPE CreateCompletionQueue(HANDLE file, SIZE_T* entries,
                                                  IWVCompletionQueue** cq) override {
    cqFile = file;
    cqEntries = *entries;
    *cq = lastCq = new FakeCq;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE AllocateProtectionDomain(IWVProtectionDomain** out) override {
    pd->AddRef();
    *out = pd;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE QueryNotifyAffinity(USHORT* group, KAFFINITY* affinity) override {
    *group = notifyGroup;
    *affinity = notifyAffinity;
    return WV_SUCCESS;
  }

  WV_DEVICE_ATTRIBUTES attributes{};
  USHORT notifyGroup = 1;
  KAFFINITY notifyAffinity = 0x50;
  FakePd* pd = new FakePd;
  FakeCq* lastCq = nullptr;
  HANDLE cqFile = nullptr;
  SIZE_T cqEntries = 0;
};

class FakeEndpoint : public FakeOverlapped<IWVConnectEndpoint> {
 public:
  HRESULT STDMETHODCALLTYPE Modify(DWORD, const VOID*, SIZE_T) override { return WV_NOT_SUPPORTED; }
  HRESULT STDMETHODCALLTYPE BindAddress(const sockaddr* address) override {
    if (bound) return WV_ADDRESS_ALREADY_ASSOCIATED;
    std::memcpy(&boundTo, address, address->sa_family == AF_INET6 ? 28 : 16);
    bound = true;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE Listen(SIZE_T backlog) override {
    this->backlog = backlog;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE Reject(const VOID*, SIZE_T length) override {
    rejectedLength = length;
    return WV_SUCCESS;
  }
  // As the device: an endpoint a GetRequest awaits cannot take another, nor connect.
  HRESULT STDMETHODCALLTYPE GetRequest(IWVConnectEndpoint* endpoint, OVERLAPPED*) override {
    auto* target = static_cast<FakeEndpoint*>(endpoint);
    if (target->awaited) return WV_CONNECTION_ACTIVE;
    target->awaited = true;
    requestedFor = endpoint;
    return WV_IO_PENDING;
  }
  HRESULT STDMETHODCALLTYPE Connect(IWVConnectQueuePair* qp, const sockaddr* address,
                                    WV_CONNECT_PARAM* param, OVERLAPPED*) override {
    if (awaited) return WV_CONNECTION_ACTIVE;
    connectedQp = qp;
    std::memcpy(&connectedTo, address, address->sa_family == AF_INET6 ? 28 : 16);
    sent = *param;
    return WV_IO_PENDING;
  }
  HRESULT STDMETHODCALLTYPE Accept(IWVConnectQueuePair* qp, WV_CONNECT_PARAM* param,
                                   OVERLAPPED*) override {
    acceptedQp = qp;
    accepted = true;
    sent = *param;
    return WV_IO_PENDING;
  }
  HRESULT STDMETHODCALLTYPE Disconnect(OVERLAPPED*) override { return WV_IO_PENDING; }
  HRESULT STDMETHODCALLTYPE NotifyDisconnect(OVERLAPPED*) override { return WV_IO_PENDING; }
  HRESULT STDMETHODCALLTYPE Query(WV_CONNECT_ATTRIBUTES* attributes) override {
    *attributes = connection;
    return WV_SUCCESS;
  }

  bool bound = false;
  WV_SOCKADDR boundTo{};
  SIZE_T backlog = 0;
  SIZE_T rejectedLength = 0;
  IWVConnectEndpoint* requestedFor = nullptr;
  bool awaited = false;  // a listener's GetRequest waits to hand this endpoint a request
  IWVConnectQueuePair* connectedQp = nullptr;
  IWVConnectQueuePair* acceptedQp = nullptr;
  bool accepted = false;
  WV_SOCKADDR connectedTo{};
  WV_CONNECT_PARAM sent{};
  WV_CONNECT_ATTRIBUTES connection{};
};

// Serves 127.0.0.1 and ::1 from one device with GUID kGuid.
class FakeProvider : public Fake<IWVProvider> {
 public:
  ~FakeProvider() override { device->Release(); }
  HANDLE STDMETHODCALLTYPE GetFileHandle() override { return nullptr; }
  HRESULT STDMETHODCALLTYPE QueryDeviceList(NET64*, SIZE_T*) override { return WV_NOT_SUPPORTED; }
  HRESULT STDMETHODCALLTYPE QueryDevice(NET64, WV_DEVICE_ATTRIBUTES*) override {
    return WV_NOT_SUPPORTED;
  }
  HRESULT STDMETHODCALLTYPE TranslateAddress(const sockaddr* address,
                                             WV_DEVICE_ADDRESS* device) override {
    bool loopback =
        (address->sa_family == AF_INET &&
         reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr ==
             htonl(INADDR_LOOPBACK)) ||
        (address->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr));
    if (!loopback) return WV_INVALID_ADDRESS;
    *device = {kGuid, 0xffff, 1};
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE OpenDevice(NET64 guid, IWVDevice** out) override {
    if (guid != kGuid) return WV_INVALID_PARAMETER;
    device->AddRef();
    *out = device;
    return WV_SUCCESS;
  }
  HRESULT STDMETHODCALLTYPE CreateConnectEndpoint(HANDLE file, IWVConnectEndpoint** ep) override {
    endpointFile = file;
    *ep = lastEndpoint = new FakeEndpoint;
    return WV_SUCCESS;
  }

  FakeDevice* device = new FakeDevice;
  FakeEndpoint* lastEndpoint = nullptr;
  HANDLE endpointFile = nullptr;
};

// The WV provider the ND provider under test gets from its WvSource.
inline FakeProvider* g_fakeWv = nullptr;
inline HRESULT FakeWvSource(REFIID, LPVOID* ppv) {
  g_fakeWv->AddRef();
  *ppv = static_cast<IWVProvider*>(g_fakeWv);
  return WV_SUCCESS;
}

// An ND provider and adapter over fakes, with one overlapped file.
class NdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    g_fakeWv = wv = new FakeProvider;
    device = wv->device;
    pd = device->pd;
    Provider* made = nullptr;
    ASSERT_EQ(Provider::Create(FakeWvSource, &made), ND_SUCCESS);
    provider = made;
    ASSERT_EQ(provider->OpenAdapter(IID_IND2Adapter, kGuid, reinterpret_cast<void**>(&adapter)),
              ND_SUCCESS);
    file = base::CreateOverlappedFile();
    ASSERT_NE(file, nullptr);
  }
  void TearDown() override {
    if (adapter != nullptr) {
      EXPECT_EQ(adapter->Release(), 0u);
    }
    if (provider != nullptr) {
      EXPECT_EQ(provider->Release(), 0u);
    }
    if (file != nullptr) CloseHandle(file);
    wv->Release();
    g_fakeWv = nullptr;
  }

  ND2_ADAPTER_INFO Info() {
    ND2_ADAPTER_INFO info{};
    info.InfoVersion = ND_VERSION_2;
    ULONG size = sizeof(info);
    EXPECT_EQ(adapter->Query(&info, &size), ND_SUCCESS);
    return info;
  }
  IND2CompletionQueue* MakeCq(ULONG depth = 16) {
    IND2CompletionQueue* cq = nullptr;
    EXPECT_EQ(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, depth, 0, 0,
                                             reinterpret_cast<void**>(&cq)),
              ND_SUCCESS);
    return cq;
  }
  IND2QueuePair* MakeQp(IND2CompletionQueue* cq, void* context = nullptr) {
    IND2QueuePair* qp = nullptr;
    EXPECT_EQ(adapter->CreateQueuePair(IID_IND2QueuePair, cq, cq, context, 64, 64, 2, 2, 64,
                                       reinterpret_cast<void**>(&qp)),
              ND_SUCCESS);
    return qp;
  }
  IND2MemoryRegion* MakeMr() {
    IND2MemoryRegion* mr = nullptr;
    EXPECT_EQ(
        adapter->CreateMemoryRegion(IID_IND2MemoryRegion, file, reinterpret_cast<void**>(&mr)),
        ND_SUCCESS);
    return mr;
  }
  IND2MemoryWindow* MakeMw() {
    IND2MemoryWindow* mw = nullptr;
    EXPECT_EQ(adapter->CreateMemoryWindow(IID_IND2MemoryWindow, reinterpret_cast<void**>(&mw)),
              ND_SUCCESS);
    return mw;
  }
  IND2Connector* MakeConnector() {
    IND2Connector* connector = nullptr;
    EXPECT_EQ(
        adapter->CreateConnector(IID_IND2Connector, file, reinterpret_cast<void**>(&connector)),
        ND_SUCCESS);
    return connector;
  }
  IND2Listener* MakeListener() {
    IND2Listener* listener = nullptr;
    EXPECT_EQ(adapter->CreateListener(IID_IND2Listener, file, reinterpret_cast<void**>(&listener)),
              ND_SUCCESS);
    return listener;
  }
  // Registers `buffer` and waits for the result.
  HRESULT Register(IND2MemoryRegion* mr, const void* buffer, SIZE_T length, ULONG flags) {
    OVERLAPPED ov{};
    HRESULT hr = mr->Register(buffer, length, flags, &ov);
    return hr == ND_PENDING ? mr->GetOverlappedResult(&ov, TRUE) : hr;
  }

  static sockaddr_in Ipv4(const char* ip, uint16_t port = 0) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, ip, &a.sin_addr);
    return a;
  }
  static const sockaddr* Sa(const sockaddr_in& a) { return reinterpret_cast<const sockaddr*>(&a); }

  FakeProvider* wv = nullptr;
  FakeDevice* device = nullptr;
  FakePd* pd = nullptr;
  IND2Provider* provider = nullptr;
  IND2Adapter* adapter = nullptr;
  HANDLE file = nullptr;
};

}  // namespace ndwv::nd::testing
