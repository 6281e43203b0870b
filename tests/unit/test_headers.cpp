// The public headers: ND application code written against the SPI compiles with them, and the
// values, layouts and vtable order are the SPI's. Uses only public names.

#include <gtest/gtest.h>

#include <cstring>
#include <type_traits>
#include <vector>

#include "ndwv/ndsupport.h"

namespace {

TEST(PublicHeaders, StatusClassesFollowTheSeverityBits) {
  EXPECT_TRUE(SUCCEEDED(ND_SUCCESS));
  EXPECT_TRUE(SUCCEEDED(ND_TIMEOUT));
  EXPECT_TRUE(SUCCEEDED(ND_PENDING));
  EXPECT_TRUE(NT_SUCCESS(ND_PENDING));
  EXPECT_TRUE(FAILED(ND_BUFFER_OVERFLOW));
  EXPECT_TRUE(FAILED(ND_DEVICE_BUSY));
  EXPECT_TRUE(FAILED(ND_NO_MORE_ENTRIES));
  EXPECT_TRUE(FAILED(ND_CANCELED));
  EXPECT_TRUE(FAILED(E_NOINTERFACE));
  EXPECT_TRUE(SUCCEEDED(S_FALSE));

  EXPECT_EQ(ND_LOCAL_LENGTH, ND_DATA_OVERRUN);
  EXPECT_EQ(ND_INVALIDATION_ERROR, ND_INVALID_DEVICE_REQUEST);
  EXPECT_EQ(ND_INVALID_PARAMETER_10 - ND_INVALID_PARAMETER_1, 9);
  EXPECT_EQ(static_cast<uint32_t>(STATUS_ADDRESS_ALREADY_ASSOCIATED), 0xC0000238u);
  EXPECT_EQ(static_cast<uint32_t>(STATUS_DATA_ERROR), 0xC000003Eu);
  EXPECT_EQ(ND_PENDING, 0x103);
}

TEST(PublicHeaders, InterfaceIdsAreDistinctExceptTheSharedWindowId) {
  const std::vector<IID> ids = {
      IID_IUnknown,          IID_IND2Overlapped,     IID_IND2CompletionQueue,
      IID_IND2SharedReceiveQueue, IID_IND2MemoryWindow, IID_IND2MemoryRegion,
      IID_IND2QueuePair,     IID_IND2Connector,      IID_IND2Listener,
      IID_IND2Adapter,       IID_IND2Provider,       IID_INDOverlapped,
      IID_INDCompletionQueue, IID_INDEndpoint,       IID_INDConnector,
      IID_INDListen,         IID_INDAdapter,         IID_INDProvider};
  for (size_t i = 0; i < ids.size(); ++i) {
    for (size_t j = 0; j < ids.size(); ++j) EXPECT_EQ(ids[i] == ids[j], i == j) << i << "," << j;
  }
  EXPECT_TRUE(IsEqualIID(IID_INDMemoryWindow, IID_IND2MemoryWindow));
  EXPECT_EQ(IID_IND2Adapter.Data1, 0xD89C798Cu);
  EXPECT_EQ(IID_IND2Adapter.Data4[7], 0xF3);
}

TEST(PublicHeaders, FlagsAndRequestTypes) {
  EXPECT_EQ(ND_MR_FLAG_ALLOW_REMOTE_WRITE & ND_MR_FLAG_ALLOW_LOCAL_WRITE,
            ND_MR_FLAG_ALLOW_LOCAL_WRITE);
  const ULONG allOpFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE |
                           ND_OP_FLAG_SEND_AND_SOLICIT_EVENT | ND_OP_FLAG_ALLOW_READ |
                           ND_OP_FLAG_ALLOW_WRITE | ND_OP_FLAG_INLINE;
  EXPECT_EQ(allOpFlags, 0x3Fu);
  EXPECT_EQ(Nd2RequestTypeReceive, 0);
  EXPECT_EQ(Nd2RequestTypeWrite, 5);
  EXPECT_EQ(NDVER, ND_VERSION_2);
  EXPECT_EQ(ND_CQ_NOTIFY_SOLICITED, 2);
}

// What an application does with the structures.
TEST(PublicHeaders, StructuresAreUsableTheSpiWay) {
  ND2_ADAPTER_INFO info = {};
  info.InfoVersion = ND_VERSION_2;
  ULONG cbInfo = sizeof(info);
  EXPECT_EQ(cbInfo, 96u);

  char buffer[32];
  ND2_SGE sge = {buffer, sizeof(buffer), 0x1234};
  EXPECT_EQ(sge.BufferLength, 32u);

  ND2_RESULT result = {};
  result.Status = ND_CANCELED;
  result.RequestType = Nd2RequestTypeRead;
  EXPECT_TRUE(FAILED(result.Status));

  // A SOCKET_ADDRESS_LIST with its addresses stored after the array, as QueryAddressList fills it.
  alignas(8) unsigned char storage[sizeof(SOCKET_ADDRESS_LIST) + sizeof(sockaddr_in)] = {};
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(storage);
  auto* v4 = reinterpret_cast<sockaddr_in*>(storage + sizeof(SOCKET_ADDRESS_LIST));
  v4->sin_family = AF_INET;
  list->iAddressCount = 1;
  list->Address[0].lpSockaddr = reinterpret_cast<sockaddr*>(v4);
  list->Address[0].iSockaddrLength = sizeof(*v4);
  EXPECT_EQ(list->Address[0].lpSockaddr->sa_family, AF_INET);
}

// Typical ND2 client code: compiled, not run (it needs a provider).
[[maybe_unused]] HRESULT FinalStatus(IND2Overlapped* object, OVERLAPPED* ov, HRESULT hr) {
  return hr == ND_PENDING ? object->GetOverlappedResult(ov, TRUE) : hr;
}

[[maybe_unused]] HRESULT ClientSketch(IND2Adapter* adapter, const sockaddr_in& local,
                                      const sockaddr_in& peer) {
  ND2_ADAPTER_INFO info = {};
  info.InfoVersion = ND_VERSION_2;
  ULONG cbInfo = sizeof(info);
  HRESULT hr = adapter->Query(&info, &cbInfo);
  if (FAILED(hr)) return hr;
  if ((info.AdapterFlags & ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED) == 0) return E_FAIL;

  HANDLE file = nullptr;
  hr = adapter->CreateOverlappedFile(&file);
  if (FAILED(hr)) return hr;
  HANDLE port = CreateIoCompletionPort(file, nullptr, 0, 0);

  IND2CompletionQueue* cq = nullptr;
  IND2QueuePair* qp = nullptr;
  IND2MemoryRegion* mr = nullptr;
  IND2MemoryWindow* mw = nullptr;
  IND2Connector* connector = nullptr;
  adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, info.MaxCompletionQueueDepth, 0,
                                 0, reinterpret_cast<void**>(&cq));
  adapter->CreateQueuePair(IID_IND2QueuePair, cq, cq, nullptr, 4, 4, 1, 1,
                           info.InlineRequestThreshold, reinterpret_cast<void**>(&qp));
  adapter->CreateMemoryRegion(IID_IND2MemoryRegion, file, reinterpret_cast<void**>(&mr));
  adapter->CreateMemoryWindow(IID_IND2MemoryWindow, reinterpret_cast<void**>(&mw));
  adapter->CreateConnector(IID_IND2Connector, file, reinterpret_cast<void**>(&connector));

  static char buffer[4096];
  OVERLAPPED ov = {};
  ov.hEvent = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  hr = FinalStatus(mr, &ov,
                   mr->Register(buffer, sizeof(buffer),
                                ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ, &ov));
  ND2_SGE sge = {buffer, sizeof(buffer), mr->GetLocalToken()};
  qp->Receive(&sge, &sge, 1);

  connector->Bind(reinterpret_cast<const sockaddr*>(&local), sizeof(local));
  hr = FinalStatus(connector, &ov,
                   connector->Connect(qp, reinterpret_cast<const sockaddr*>(&peer), sizeof(peer),
                                      0, 0, nullptr, 0, &ov));
  if (hr == ND_TIMEOUT || hr == ND_CONNECTION_REFUSED) return hr;  // caller retries
  ULONG inbound = 0, outbound = 0;
  connector->GetReadLimits(&inbound, &outbound);
  hr = FinalStatus(connector, &ov, connector->CompleteConnect(&ov));

  qp->Bind(nullptr, mr, mw, buffer, sizeof(buffer), ND_OP_FLAG_ALLOW_READ);
  qp->Send(nullptr, &sge, 1, ND_OP_FLAG_INLINE | ND_OP_FLAG_SEND_AND_SOLICIT_EVENT);
  qp->Write(nullptr, &sge, 1, 0x1000, 0x55, ND_OP_FLAG_SILENT_SUCCESS);
  qp->Read(nullptr, &sge, 1, 0x1000, mw->GetRemoteToken(), ND_OP_FLAG_READ_FENCE);

  if (cq->Notify(ND_CQ_NOTIFY_ANY, &ov) == ND_PENDING) {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* done = nullptr;
    if (!GetQueuedCompletionStatus(port, &bytes, &key, &done, INFINITE) && done == nullptr) {
      return E_FAIL;
    }
  }
  ND2_RESULT results[8];
  for (ULONG n; (n = cq->GetResults(results, 8)) != 0;) {
    for (ULONG i = 0; i < n; ++i) {
      if (results[i].RequestType == Nd2RequestTypeReceive && results[i].Status == ND_SUCCESS &&
          results[i].BytesTransferred == 0) {
        break;
      }
    }
  }

  FinalStatus(connector, &ov, connector->Disconnect(&ov));
  FinalStatus(mr, &ov, mr->Deregister(&ov));
  connector->Release();
  mw->Release();
  mr->Release();
  qp->Release();
  cq->Release();
  CloseHandle(ov.hEvent);
  CloseHandle(file);
  CloseHandle(port);
  return adapter->Release() == 0 ? ND_SUCCESS : ND_UNSUCCESSFUL;
}

static_assert(std::is_same_v<decltype(NdStartup), HRESULT()>);
static_assert(std::is_same_v<decltype(NdCleanup), HRESULT()>);
static_assert(std::is_same_v<decltype(NdFlushProviders), void()>);
static_assert(std::is_same_v<decltype(NdQueryAddressList),
                             HRESULT(DWORD, SOCKET_ADDRESS_LIST*, SIZE_T*)>);
static_assert(std::is_same_v<decltype(NdResolveAddress),
                             HRESULT(const sockaddr*, SIZE_T, sockaddr*, SIZE_T*)>);
static_assert(std::is_same_v<decltype(NdCheckAddress), HRESULT(const sockaddr*, SIZE_T)>);
static_assert(std::is_same_v<decltype(NdOpenAdapter),
                             HRESULT(REFIID, const sockaddr*, SIZE_T, void**)>);

// An application-side implementation of an interface, in the COM style.
class TestWindow final : public IND2MemoryWindow {
 public:
  HRESULT STDMETHODCALLTYPE QueryInterface(REFIID iid, void** object) override {
    if (object == nullptr) return E_POINTER;
    if (iid != IID_IUnknown && iid != IID_IND2MemoryWindow) {
      *object = nullptr;
      return E_NOINTERFACE;
    }
    AddRef();
    *object = static_cast<IND2MemoryWindow*>(this);
    return S_OK;
  }
  ULONG STDMETHODCALLTYPE AddRef() override { return ++refs_; }
  ULONG STDMETHODCALLTYPE Release() override {
    ULONG left = --refs_;
    if (left == 0) delete this;
    return left;
  }
  UINT32 STDMETHODCALLTYPE GetRemoteToken() override { return 0xABCD; }

 private:
  ULONG refs_ = 1;
};

TEST(PublicHeaders, InterfacesCanBeImplementedAndQueried) {
  IND2MemoryWindow* window = new TestWindow;
  IUnknown* unknown = nullptr;
  ASSERT_EQ(window->QueryInterface(IID_IUnknown, reinterpret_cast<void**>(&unknown)), S_OK);
  void* other = &other;
  EXPECT_EQ(window->QueryInterface(IID_IND2QueuePair, &other), E_NOINTERFACE);
  EXPECT_EQ(other, nullptr);
  EXPECT_EQ(window->GetRemoteToken(), 0xABCDu);
  EXPECT_EQ(unknown->Release(), 1u);
  EXPECT_EQ(window->Release(), 0u);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Itanium C++ ABI: a pointer to a virtual member function holds 1 + the byte offset of its
// vtable slot.
template <class Method>
long Slot(Method method) {
  static_assert(sizeof(Method) == 2 * sizeof(void*));
  uintptr_t raw[2];
  std::memcpy(raw, &method, sizeof(raw));
  return static_cast<long>((raw[0] - 1) / sizeof(void*));
}

void ExpectConsecutiveSlots(const std::vector<long>& slots, long first) {
  for (size_t i = 0; i < slots.size(); ++i) EXPECT_EQ(slots[i], first + long(i)) << "method " << i;
}

TEST(PublicHeaders, MethodsAreInSpiVtableOrder) {
  ExpectConsecutiveSlots(
      {Slot(&IUnknown::QueryInterface), Slot(&IUnknown::AddRef), Slot(&IUnknown::Release)}, 0);
  ExpectConsecutiveSlots({Slot(&IND2Overlapped::CancelOverlappedRequests),
                          Slot(&IND2Overlapped::GetOverlappedResult)},
                         3);
  ExpectConsecutiveSlots({Slot(&IND2Provider::QueryAddressList),
                          Slot(&IND2Provider::ResolveAddress), Slot(&IND2Provider::OpenAdapter)},
                         3);
  ExpectConsecutiveSlots(
      {Slot(&IND2Adapter::CreateOverlappedFile), Slot(&IND2Adapter::Query),
       Slot(&IND2Adapter::QueryAddressList), Slot(&IND2Adapter::CreateCompletionQueue),
       Slot(&IND2Adapter::CreateMemoryRegion), Slot(&IND2Adapter::CreateMemoryWindow),
       Slot(&IND2Adapter::CreateSharedReceiveQueue), Slot(&IND2Adapter::CreateQueuePair),
       Slot(&IND2Adapter::CreateQueuePairWithSrq), Slot(&IND2Adapter::CreateConnector),
       Slot(&IND2Adapter::CreateListener)},
      3);
  ExpectConsecutiveSlots({Slot(&IND2MemoryWindow::GetRemoteToken)}, 3);
  ExpectConsecutiveSlots(
      {Slot(&IND2QueuePair::Flush), Slot(&IND2QueuePair::Send), Slot(&IND2QueuePair::Receive),
       Slot(&IND2QueuePair::Bind), Slot(&IND2QueuePair::Invalidate), Slot(&IND2QueuePair::Read),
       Slot(&IND2QueuePair::Write)},
      3);
  ExpectConsecutiveSlots(
      {Slot(&IND2CompletionQueue::GetNotifyAffinity), Slot(&IND2CompletionQueue::Resize),
       Slot(&IND2CompletionQueue::Notify), Slot(&IND2CompletionQueue::GetResults)},
      5);
  ExpectConsecutiveSlots(
      {Slot(&IND2SharedReceiveQueue::GetNotifyAffinity), Slot(&IND2SharedReceiveQueue::Modify),
       Slot(&IND2SharedReceiveQueue::Notify), Slot(&IND2SharedReceiveQueue::Receive)},
      5);
  ExpectConsecutiveSlots(
      {Slot(&IND2MemoryRegion::Register), Slot(&IND2MemoryRegion::Deregister),
       Slot(&IND2MemoryRegion::GetLocalToken), Slot(&IND2MemoryRegion::GetRemoteToken)},
      5);
  ExpectConsecutiveSlots(
      {Slot(&IND2Connector::Bind), Slot(&IND2Connector::Connect),
       Slot(&IND2Connector::CompleteConnect), Slot(&IND2Connector::Accept),
       Slot(&IND2Connector::Reject), Slot(&IND2Connector::GetReadLimits),
       Slot(&IND2Connector::GetPrivateData), Slot(&IND2Connector::GetLocalAddress),
       Slot(&IND2Connector::GetPeerAddress), Slot(&IND2Connector::NotifyDisconnect),
       Slot(&IND2Connector::Disconnect)},
      5);
  ExpectConsecutiveSlots(
      {Slot(&IND2Listener::Bind), Slot(&IND2Listener::Listen), Slot(&IND2Listener::GetLocalAddress),
       Slot(&IND2Listener::GetConnectionRequest)},
      5);
}

TEST(PublicHeaders, Version1MethodsAreInSpiVtableOrder) {
  ExpectConsecutiveSlots({Slot(&INDOverlapped::CancelOverlappedRequests),
                          Slot(&INDOverlapped::GetOverlappedResult)},
                         3);
  ExpectConsecutiveSlots({Slot(&INDProvider::QueryAddressList), Slot(&INDProvider::OpenAdapter)},
                         3);
  ExpectConsecutiveSlots(
      {Slot(&INDAdapter::GetFileHandle), Slot(&INDAdapter::Query), Slot(&INDAdapter::Control),
       Slot(&INDAdapter::CreateCompletionQueue), Slot(&INDAdapter::RegisterMemory),
       Slot(&INDAdapter::DeregisterMemory), Slot(&INDAdapter::CreateMemoryWindow),
       Slot(&INDAdapter::CreateConnector), Slot(&INDAdapter::Listen)},
      5);
  ExpectConsecutiveSlots({Slot(&INDCompletionQueue::Resize), Slot(&INDCompletionQueue::Notify),
                          Slot(&INDCompletionQueue::GetResults)},
                         5);
  ExpectConsecutiveSlots(
      {Slot(&INDEndpoint::Flush), Slot(&INDEndpoint::StartRequestBatch),
       Slot(&INDEndpoint::SubmitRequestBatch), Slot(&INDEndpoint::Send),
       Slot(&INDEndpoint::SendAndInvalidate), Slot(&INDEndpoint::Receive), Slot(&INDEndpoint::Bind),
       Slot(&INDEndpoint::Invalidate), Slot(&INDEndpoint::Read), Slot(&INDEndpoint::Write)},
      3);
  ExpectConsecutiveSlots(
      {Slot(&INDConnector::CreateEndpoint), Slot(&INDConnector::Connect),
       Slot(&INDConnector::CompleteConnect), Slot(&INDConnector::Accept),
       Slot(&INDConnector::Reject), Slot(&INDConnector::GetConnectionData),
       Slot(&INDConnector::GetLocalAddress), Slot(&INDConnector::GetPeerAddress),
       Slot(&INDConnector::NotifyDisconnect), Slot(&INDConnector::Disconnect)},
      5);
  ExpectConsecutiveSlots({Slot(&INDListen::GetConnectionRequest)}, 5);
  ExpectConsecutiveSlots({Slot(&IClassFactory::CreateInstance), Slot(&IClassFactory::LockServer)},
                         3);
}
#endif

// Version 1 structures, and the tags of Microsoft's header (nd1-spi.md §3).
TEST(PublicHeaders, Version1StructuresAndTags) {
  static_assert(std::is_same_v<ND_ADAPTER_INFO, _ND_ADAPTER_INFO1>);
  static_assert(std::is_same_v<ND2_ADAPTER_INFO, _ND2_ADAPTER_INFO> &&
                std::is_same_v<ND2_ADAPTER_INFO32, _ND2_ADAPTER_INFO32> &&
                std::is_same_v<ND2_RESULT, _ND2_RESULT> && std::is_same_v<ND2_SGE, _ND2_SGE> &&
                std::is_same_v<ND2_REQUEST_TYPE, _ND2_REQUEST_TYPE>);
  EXPECT_EQ(sizeof(ND_MR_HANDLE), sizeof(void*));
  ND_MW_DESCRIPTOR descriptor = {};
  EXPECT_EQ(sizeof descriptor, 20u);
  ND_SGE sge = {nullptr, 0, nullptr};  // hMr NULL: inline bytes
  EXPECT_EQ(sge.hMr, nullptr);
  EXPECT_EQ(IID_INDAdapter.Data1, 0xA023C5A0u);
  EXPECT_EQ(IID_IClassFactory.Data1, 1u);
  EXPECT_TRUE(FAILED(CLASS_E_NOAGGREGATION));
}

}  // namespace
