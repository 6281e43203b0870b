// NetworkDirect version 1 conformance, part 1 (nd1-spi.md §4, numbers "#n" there): loading the
// provider, its objects, the adapter, memory registration and the overlapped contract. These
// need no connection: each runs in a peer process of its own, so that it starts from a process
// with no ND object alive (DllCanUnloadNow counts them). The cases with a peer on the wire are in
// test_v1_transfer.cpp, test_v1_windows.cpp and test_v1_connection.cpp.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "harness_v1.h"

namespace ndit {
namespace {

HRESULT InvalidParameterStatus(int n) { return HRESULT(ND_INVALID_PARAMETER_1 + (n - 1)); }

// Runs the local checks of `peer` in a process of their own.
void RunInPeer(const char* peer) {
  RunWithPeer(peer, [](Channel&) {});
}

// A COM object of the application's own, passed where the provider wants one of its own.
class ForeignObject final : public INDMemoryWindow {
 public:
  HRESULT STDMETHODCALLTYPE QueryInterface(REFIID iid, void** ppv) override {
    if (iid != IID_IUnknown && iid != IID_INDMemoryWindow) {
      *ppv = nullptr;
      return E_NOINTERFACE;
    }
    *ppv = this;
    AddRef();
    return S_OK;
  }
  ULONG STDMETHODCALLTYPE AddRef() override { return ++refs_; }
  ULONG STDMETHODCALLTYPE Release() override { return --refs_; }

 private:
  ULONG refs_ = 1;
};

// #3: an object answers IID_IUnknown and `own` (AddRef'ing for each), refuses `others` with
// E_NOINTERFACE and a NULL pointer.
void CheckQueryInterface(IUnknown* object, const std::vector<IID>& own,
                         const std::vector<IID>& others, const char* what) {
  std::vector<IID> answered = own;
  answered.push_back(IID_IUnknown);
  for (const IID& iid : answered) {
    void* p = nullptr;
    IT_CHECK_MSG(object->QueryInterface(iid, &p) == S_OK, what);
    IT_CHECK_MSG(p == object, what);  // single inheritance: the same pointer
    // The creator's reference, the one QueryInterface added, and this one.
    IT_CHECK_EQ(3u, object->AddRef());
    IT_CHECK_EQ(2u, object->Release());
    IT_CHECK_EQ(1u, static_cast<IUnknown*>(p)->Release());
  }
  for (const IID& iid : others) {
    void* p = &p;
    IT_CHECK_MSG(object->QueryInterface(iid, &p) == E_NOINTERFACE, what);
    IT_CHECK_MSG(p == nullptr, what);
  }
}

// ---- loading -------------------------------------------------------------------------------------

// #1, #2: the entry points a version 1 loader uses, and DllCanUnloadNow as objects come and go.
IT_PEER(v1_loader) {
  IT_CHECK_HR(S_OK, DllCanUnloadNow());  // NdStartup holds no ND object
  IClassFactory* factory = nullptr;
  const GUID anyProviderId = {0x12345678, 0x9ABC, 0xDEF0, {1, 2, 3, 4, 5, 6, 7, 8}};
  IT_OK(DllGetClassObject(anyProviderId, IID_IClassFactory, reinterpret_cast<void**>(&factory)));
  IT_CHECK_HR(S_FALSE, DllCanUnloadNow());
  void* p = &p;
  IT_CHECK_HR(E_NOINTERFACE, DllGetClassObject(anyProviderId, IID_INDAdapter, &p));
  IT_CHECK(p == nullptr);

  ForeignObject outer;
  p = &p;
  IT_CHECK_HR(CLASS_E_NOAGGREGATION, factory->CreateInstance(&outer, IID_INDProvider, &p));
  IT_CHECK(p == nullptr);
  p = &p;
  IT_CHECK_HR(E_NOINTERFACE, factory->CreateInstance(nullptr, IID_INDAdapter, &p));
  IT_CHECK(p == nullptr);
  INDProvider* provider = nullptr;
  IT_OK(factory->CreateInstance(nullptr, IID_INDProvider, reinterpret_cast<void**>(&provider)));
  // The version 2 framework asks the factory, or the DLL directly, for IND2Provider.
  IND2Provider* v2 = nullptr;
  IT_OK(factory->CreateInstance(nullptr, IID_IND2Provider, reinterpret_cast<void**>(&v2)));
  IT_CHECK_EQ(0u, v2->Release());
  IT_OK(DllGetClassObject(anyProviderId, IID_IND2Provider, reinterpret_cast<void**>(&v2)));
  IT_CHECK_EQ(0u, v2->Release());
  IT_CHECK_EQ(0u, factory->Release());
  IT_CHECK_HR(S_FALSE, DllCanUnloadNow());  // the provider lives

  sockaddr_in loopback = Loopback(0);
  INDAdapter* adapter = nullptr;
  IT_OK(provider->OpenAdapter(reinterpret_cast<sockaddr*>(&loopback), sizeof loopback, &adapter));
  IT_CHECK_EQ(0u, provider->Release());  // the adapter keeps what it needs
  IT_CHECK_HR(S_FALSE, DllCanUnloadNow());
  INDCompletionQueue* cq = nullptr;
  IT_OK(adapter->CreateCompletionQueue(8, &cq));
  IT_CHECK_EQ(0u, adapter->Release());
  IT_CHECK_HR(S_FALSE, DllCanUnloadNow());  // a child object alone keeps the library in use
  IT_CHECK_EQ(0u, cq->Release());
  IT_CHECK_HR(S_OK, DllCanUnloadNow());

  // LockServer counts too.
  IT_OK(DllGetClassObject(anyProviderId, IID_IClassFactory, reinterpret_cast<void**>(&factory)));
  IT_OK(factory->LockServer(TRUE));
  IT_CHECK_EQ(0u, factory->Release());
  IT_CHECK_HR(S_FALSE, DllCanUnloadNow());
  IT_OK(DllGetClassObject(anyProviderId, IID_IClassFactory, reinterpret_cast<void**>(&factory)));
  IT_OK(factory->LockServer(FALSE));
  IT_CHECK_EQ(0u, factory->Release());
  IT_CHECK_HR(S_OK, DllCanUnloadNow());
}

TEST(ConformanceV1Loading, ClassFactoryProviderAndUnloading) { RunInPeer("v1_loader"); }

// #3: every object answers its own IID, IID_IUnknown and (overlapped ones) IID_INDOverlapped,
// AddRef'ing; nothing else, not even its version 2 counterpart.
IT_PEER(v1_query_interface) {
  IClassFactory* factory = nullptr;
  IT_OK(DllGetClassObject(IID_INDProvider, IID_IClassFactory, reinterpret_cast<void**>(&factory)));
  CheckQueryInterface(factory, {IID_IClassFactory}, {IID_INDProvider, IID_IND2Provider},
                      "class factory");
  Ref<INDProvider> provider;
  IT_OK(factory->CreateInstance(nullptr, IID_INDProvider, provider.Out()));
  factory->Release();
  CheckQueryInterface(provider.get(), {IID_INDProvider}, {IID_IND2Provider, IID_INDAdapter},
                      "provider");

  V1Adapter adapter;
  CheckQueryInterface(adapter.get(), {IID_INDAdapter, IID_INDOverlapped},
                      {IID_IND2Adapter, IID_IND2Overlapped, IID_INDProvider}, "adapter");
  V1Side side(adapter);
  side.CreateEndpoint();
  CheckQueryInterface(side.cq.get(), {IID_INDCompletionQueue, IID_INDOverlapped},
                      {IID_IND2CompletionQueue, IID_INDEndpoint}, "completion queue");
  CheckQueryInterface(side.connector.get(), {IID_INDConnector, IID_INDOverlapped},
                      {IID_IND2Connector, IID_INDListen}, "connector");
  CheckQueryInterface(side.endpoint.get(), {IID_INDEndpoint},
                      {IID_INDOverlapped, IID_IND2QueuePair, IID_INDConnector}, "endpoint");
  Ref<INDListen> listen;
  adapter.Listen(listen);
  CheckQueryInterface(listen.get(), {IID_INDListen, IID_INDOverlapped},
                      {IID_IND2Listener, IID_INDConnector}, "listen");
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window;
  IT_OK(adapter->CreateMemoryWindow(&invalidated, reinterpret_cast<INDMemoryWindow**>(window.Out())));
  // The two versions' windows share an IID; the rest of version 2 is refused.
  CheckQueryInterface(window.get(), {IID_INDMemoryWindow}, {IID_INDOverlapped, IID_INDEndpoint},
                      "memory window");
}

TEST(ConformanceV1Loading, QueryInterfaceAddRefsAndAnswersOnlyItsOwn) {
  RunInPeer("v1_query_interface");
}

// #4, #6: the address list's size protocol, exact sockaddr lengths, every address opens; what
// OpenAdapter refuses (an address nobody here serves, a family ND does not use, a short length)
// and what it ignores (the port).
IT_PEER(v1_addresses) {
  Ref<INDProvider> provider;
  {
    Ref<IClassFactory> factory;
    IT_OK(DllGetClassObject(IID_INDProvider, IID_IClassFactory, factory.Out()));
    IT_OK(factory->CreateInstance(nullptr, IID_INDProvider, provider.Out()));
  }
  SIZE_T size = 0;
  IT_CHECK_HR(ND_BUFFER_OVERFLOW, provider->QueryAddressList(nullptr, &size));
  IT_CHECK(size > sizeof(SOCKET_ADDRESS_LIST));
  std::vector<uint8_t> small(size - 1, 0xAB);
  SIZE_T smallSize = small.size();
  IT_CHECK_HR(ND_BUFFER_OVERFLOW,
              provider->QueryAddressList(reinterpret_cast<SOCKET_ADDRESS_LIST*>(small.data()), &smallSize));
  IT_CHECK_EQ(size, smallSize);
  IT_CHECK(small[0] == 0xAB);  // untouched
  std::vector<uint8_t> buffer(size);
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data());
  IT_OK(provider->QueryAddressList(list, &size));
  IT_CHECK_EQ(buffer.size(), size);
  IT_CHECK(list->iAddressCount > 0);
  bool loopback = false;
  for (INT i = 0; i < list->iAddressCount; ++i) {
    const SOCKET_ADDRESS& a = list->Address[i];
    INT expected = a.lpSockaddr->sa_family == AF_INET ? 16 : 28;
    IT_CHECK_EQ(expected, a.iSockaddrLength);
    Ref<INDAdapter> adapter;
    IT_OK(provider->OpenAdapter(a.lpSockaddr, SIZE_T(a.iSockaddrLength),
                                reinterpret_cast<INDAdapter**>(adapter.Out())));
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(a.lpSockaddr);
    loopback = loopback || (v4->sin_family == AF_INET && v4->sin_addr.s_addr == htonl(INADDR_LOOPBACK));
  }
  IT_CHECK(loopback);
  IT_CHECK_HR(ND_INVALID_PARAMETER_2, provider->QueryAddressList(nullptr, nullptr));

  Ref<INDAdapter> adapter;
  auto** out = reinterpret_cast<INDAdapter**>(adapter.Out());
  sockaddr_in elsewhere = Loopback(0);
  elsewhere.sin_addr.s_addr = htonl(0xC0000201);  // 192.0.2.1 (TEST-NET-1): not this host's
  IT_CHECK_HR(ND_INVALID_ADDRESS,
              provider->OpenAdapter(reinterpret_cast<sockaddr*>(&elsewhere), sizeof elsewhere, out));
  sockaddr_in unix_family = Loopback(0);
  unix_family.sin_family = AF_UNIX;
  IT_CHECK_HR(ND_INVALID_ADDRESS,
              provider->OpenAdapter(reinterpret_cast<sockaddr*>(&unix_family), sizeof unix_family, out));
  sockaddr_in withPort = Loopback(9999);
  IT_CHECK_HR(ND_INVALID_ADDRESS,
              provider->OpenAdapter(reinterpret_cast<sockaddr*>(&withPort), sizeof withPort - 1, out));
  IT_CHECK_HR(ND_INVALID_ADDRESS, provider->OpenAdapter(nullptr, sizeof withPort, out));
  IT_CHECK(!adapter);
  IT_OK(provider->OpenAdapter(reinterpret_cast<sockaddr*>(&withPort), sizeof withPort, out));
  IT_CHECK_HR(ND_INVALID_PARAMETER_3,
              provider->OpenAdapter(reinterpret_cast<sockaddr*>(&withPort), sizeof withPort, nullptr));
}

TEST(ConformanceV1Loading, AddressListAndOpenAdapter) { RunInPeer("v1_addresses"); }

// #5: objects of another adapter, version 2 objects and the application's own COM objects are
// refused with the argument's ND_INVALID_PARAMETER_n, never used.
IT_PEER(v1_foreign_objects) {
  V1Adapter adapter, other;
  Adapter v2;
  V1Side mine(adapter), theirs(other);
  theirs.CreateEndpoint();
  mine.connector = adapter.CreateConnector();
  Ref<IND2CompletionQueue> v2Cq = v2.CreateCq(8);
  ForeignObject foreign;
  auto* foreignCq = reinterpret_cast<INDCompletionQueue*>(&foreign);
  const std::vector<std::pair<INDCompletionQueue*, const char*>> badCqs = {
      {theirs.cq.get(), "another adapter's"},
      {reinterpret_cast<INDCompletionQueue*>(v2Cq.get()), "a version 2"},
      {foreignCq, "a foreign"},
      {nullptr, "no"}};
  INDEndpoint* endpoint = nullptr;
  for (const auto& [cq, what] : badCqs) {
    IT_CHECK_MSG(mine.connector->CreateEndpoint(cq, mine.cq.get(), 4, 4, 1, 1, 0, 0, nullptr,
                                                &endpoint) == ND_INVALID_PARAMETER_1, what);
    IT_CHECK_MSG(mine.connector->CreateEndpoint(mine.cq.get(), cq, 4, 4, 1, 1, 0, 0, nullptr,
                                                &endpoint) == ND_INVALID_PARAMETER_2, what);
  }
  mine.CreateEndpoint();

  // An endpoint of another connector (or adapter), and foreign ones.
  sockaddr_in server = Loopback(1);
  OVERLAPPED ov{};
  for (INDEndpoint* bad : {theirs.endpoint.get(), reinterpret_cast<INDEndpoint*>(&foreign)}) {
    IT_CHECK_HR(ND_INVALID_PARAMETER_1,
                mine.connector->Connect(bad, reinterpret_cast<sockaddr*>(&server), sizeof server,
                                        kV1Protocol, 0, nullptr, 0, &ov));
    IT_CHECK_HR(ND_INVALID_PARAMETER_1, mine.connector->Accept(bad, nullptr, 0, &ov));
  }
  // A connector of another adapter, or a foreign one, for a listen.
  Ref<INDListen> listen;
  adapter.Listen(listen);
  for (INDConnector* bad : {theirs.connector.get(), reinterpret_cast<INDConnector*>(&foreign)})
    IT_CHECK_HR(ND_INVALID_PARAMETER_1, listen->GetConnectionRequest(bad, &ov));
  // Windows: another adapter's, or a foreign one (the endpoint is not connected, but the window
  // is looked at first).
  ND_RESULT result, invalidated;
  Ref<INDMemoryWindow> theirWindow;
  IT_OK(other->CreateMemoryWindow(&invalidated, reinterpret_cast<INDMemoryWindow**>(theirWindow.Out())));
  std::vector<uint8_t> buffer(64);
  V1Mr mr(adapter, buffer.data(), buffer.size());
  ND_MW_DESCRIPTOR descriptor;
  for (INDMemoryWindow* bad : {theirWindow.get(), static_cast<INDMemoryWindow*>(&foreign)}) {
    IT_CHECK_HR(ND_INVALID_PARAMETER_3,
                mine.endpoint->Bind(&result, mr.handle(), bad, buffer.data(), buffer.size(),
                                    ND_OP_FLAG_ALLOW_READ, &descriptor));
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, mine.endpoint->Invalidate(&result, bad, 0));
  }
  // A registration handle of another adapter names nothing here.
  V1Mr theirMr(other, buffer.data(), buffer.size());
  Ref<INDMemoryWindow> window;
  IT_OK(adapter->CreateMemoryWindow(&invalidated, reinterpret_cast<INDMemoryWindow**>(window.Out())));
  IT_CHECK_HR(ND_INVALID_HANDLE,
              mine.endpoint->Bind(&result, theirMr.handle(), window.get(), buffer.data(),
                                  buffer.size(), ND_OP_FLAG_ALLOW_READ, &descriptor));
  IT_CHECK_HR(ND_INVALID_HANDLE, V1Deregister(adapter.get(), theirMr.handle()));
}

TEST(ConformanceV1Loading, ForeignObjectsAreRefused) { RunInPeer("v1_foreign_objects"); }

// ---- adapter ---------------------------------------------------------------------------------------

// #7: Query's size protocol and version, and limits that agree with what the objects enforce.
IT_PEER(v1_query) {
  V1Adapter adapter;
  SIZE_T size = 0;
  IT_CHECK_HR(ND_BUFFER_OVERFLOW, adapter->Query(ND_VERSION_1, nullptr, &size));
  IT_CHECK_EQ(size_t(128), size);
  ND_ADAPTER_INFO info;
  std::memset(&info, 0xAB, sizeof info);
  size = sizeof info - 1;
  IT_CHECK_HR(ND_BUFFER_OVERFLOW, adapter->Query(ND_VERSION_1, &info, &size));
  IT_CHECK(reinterpret_cast<uint8_t*>(&info)[0] == 0xAB);  // untouched
  size = sizeof info;
  IT_CHECK_HR(ND_NOT_SUPPORTED, adapter->Query(2, &info, &size));
  IT_CHECK_HR(ND_NOT_SUPPORTED, adapter->Query(ND_VERSION_2, &info, &size));
  IT_CHECK_HR(ND_INVALID_PARAMETER_3, adapter->Query(ND_VERSION_1, &info, nullptr));
  IT_OK(adapter->Query(ND_VERSION_1, &info, &size));
  IT_CHECK_EQ(sizeof info, size);

  IT_CHECK(info.MaxInboundSge > 0 && info.MaxOutboundSge > 0);
  IT_CHECK(info.MaxInboundRequests > 0 && info.MaxOutboundRequests > 0 && info.MaxCqEntries > 0);
  IT_CHECK(info.MaxInboundLength > 0 && info.MaxInboundLength <= 0xFFFFFFFFu);
  IT_CHECK(info.MaxOutboundLength > 0 && info.MaxOutboundLength <= 0xFFFFFFFFu);
  IT_CHECK(info.MaxRegistrationSize > 0 && info.MaxWindowSize > 0);
  IT_CHECK(info.MaxInlineData > 0);

  // No endpoint reports more inline bytes than MaxInlineData.
  V1Side side(adapter);
  side.CreateEndpoint();
  IT_CHECK(side.maxInline > 0 && side.maxInline <= info.MaxInlineData);

  // The private data limits are what Connect, Accept and Reject enforce (one byte more fails).
  std::vector<uint8_t> data(std::max(info.MaxCallerData, info.MaxCalleeData) + 1);
  sockaddr_in server = Loopback(1);
  OVERLAPPED ov{};
  IT_CHECK_HR(ND_INVALID_BUFFER_SIZE,
              side.connector->Connect(side.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                      sizeof server, kV1Protocol, 0, data.data(),
                                      info.MaxCallerData + 1, &ov));
  IT_CHECK_HR(ND_INVALID_BUFFER_SIZE,
              side.connector->Accept(side.endpoint.get(), data.data(), info.MaxCalleeData + 1, &ov));
  IT_CHECK_HR(ND_INVALID_BUFFER_SIZE, side.connector->Reject(data.data(), info.MaxCalleeData + 1));
  IT_CHECK_HR(ND_NOT_SUPPORTED,
              adapter->Control(0x12345, nullptr, 0, nullptr, 0, &size, &ov));  // no escape hatch
}

TEST(ConformanceV1Adapter, QuerySizeVersionAndConsistentLimits) { RunInPeer("v1_query"); }

// #8: depths, SGE counts and read limits exactly at the advertised maxima are accepted; one more
// names the argument. CQ depths likewise.
IT_PEER(v1_maxima) {
  V1Adapter adapter;
  const ND_ADAPTER_INFO& info = adapter.info();
  Ref<INDCompletionQueue> cq = adapter.CreateCq(info.MaxCqEntries);
  INDCompletionQueue* none = nullptr;
  IT_CHECK_HR(ND_INVALID_PARAMETER, adapter->CreateCompletionQueue(info.MaxCqEntries + 1, &none));
  IT_CHECK_HR(ND_INVALID_PARAMETER, adapter->CreateCompletionQueue(0, &none));
  IT_CHECK_HR(ND_INVALID_PARAMETER_2, adapter->CreateCompletionQueue(8, nullptr));

  SIZE_T max[] = {info.MaxInboundRequests, info.MaxOutboundRequests, info.MaxInboundSge,
                  info.MaxOutboundSge,     info.MaxInboundReadLimit, info.MaxOutboundReadLimit};
  for (int above = -1; above < 6; ++above) {
    SIZE_T a[6];
    for (int i = 0; i < 6; ++i) a[i] = max[i] + (i == above ? 1 : 0);
    Ref<INDConnector> connector = adapter.CreateConnector();
    Ref<INDEndpoint> endpoint;
    SIZE_T inline_ = 0;
    HRESULT hr = connector->CreateEndpoint(cq.get(), cq.get(), a[0], a[1], a[2], a[3], a[4], a[5],
                                           &inline_, reinterpret_cast<INDEndpoint**>(endpoint.Out()));
    // Arguments 3..8 are the six limits.
    IT_CHECK_HR(above < 0 ? ND_SUCCESS : InvalidParameterStatus(3 + above), hr);
  }
  Ref<INDConnector> connector = adapter.CreateConnector();
  INDEndpoint* endpoint = nullptr;
  IT_CHECK_HR(ND_INVALID_PARAMETER_3,
              connector->CreateEndpoint(cq.get(), cq.get(), 0, 4, 1, 1, 0, 0, nullptr, &endpoint));
  IT_CHECK_HR(ND_INVALID_PARAMETER_10,
              connector->CreateEndpoint(cq.get(), cq.get(), 4, 4, 1, 1, 0, 0, nullptr, nullptr));
  // One endpoint per connector: it is the connection's.
  Ref<INDEndpoint> first;
  IT_OK(connector->CreateEndpoint(cq.get(), cq.get(), 4, 4, 1, 1, 0, 0, nullptr,
                                  reinterpret_cast<INDEndpoint**>(first.Out())));
  IT_CHECK_HR(ND_NOT_SUPPORTED,
              connector->CreateEndpoint(cq.get(), cq.get(), 4, 4, 1, 1, 0, 0, nullptr, &endpoint));
}

TEST(ConformanceV1Adapter, EndpointsAtTheAdvertisedMaxima) { RunInPeer("v1_maxima"); }

// ---- memory ------------------------------------------------------------------------------------

// #9: registration through the overlapped path as MS-MPI does it (an event with its low bit
// set, GetOverlappedResult(TRUE)) and through a completion port on GetFileHandle() (one packet
// per request; none for a low-bit event). The handle is valid once the registration completed.
IT_PEER(v1_registration_paths) {
  V1Adapter adapter;
  std::vector<uint8_t> buffer(8192);
  HANDLE event = CreateEvent(nullptr, TRUE, FALSE, nullptr);
  OVERLAPPED ov{};
  ov.hEvent = reinterpret_cast<HANDLE>(reinterpret_cast<ULONG_PTR>(event) | 1);
  ov.Internal = ND_PENDING;  // as MS-MPI presets it
  ND_MR_HANDLE handle = nullptr;
  HRESULT hr = adapter->RegisterMemory(buffer.data(), buffer.size(), &ov, &handle);
  SIZE_T bytes = ~SIZE_T(0);
  if (hr == ND_PENDING) hr = adapter->GetOverlappedResult(&ov, &bytes, TRUE);
  IT_OK(hr);
  IT_CHECK(handle != nullptr);
  IT_CHECK_EQ(DWORD(WAIT_OBJECT_0), WaitForSingleObject(event, 0));  // the event, low bit off

  HANDLE port = CreateIoCompletionPort(adapter->GetFileHandle(), nullptr, 0x77, 0);
  IT_CHECK(port != nullptr);
  DWORD count = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* done = nullptr;
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, 0));  // the low-bit one: none
  IT_CHECK(done == nullptr);

  ResetEvent(event);
  OVERLAPPED viaPort{};
  viaPort.hEvent = event;
  hr = adapter->DeregisterMemory(handle, &viaPort);
  IT_CHECK(hr == ND_PENDING || hr == ND_SUCCESS);
  IT_CHECK(GetQueuedCompletionStatus(port, &count, &key, &done, kWaitMs));
  IT_CHECK(done == &viaPort && key == 0x77 && done->Internal == ND_SUCCESS);
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, 0));  // exactly one
  IT_CHECK_HR(ND_INVALID_HANDLE, V1Deregister(adapter.get(), handle));  // gone

  ND_MR_HANDLE again = V1Register(adapter.get(), buffer.data(), buffer.size());
  IT_CHECK(GetQueuedCompletionStatus(port, &count, &key, &done, kWaitMs));  // its packet
  IT_OK(V1Deregister(adapter.get(), again));
  IT_CHECK(GetQueuedCompletionStatus(port, &count, &key, &done, kWaitMs));
  CloseHandle(port);
  CloseHandle(event);
}

TEST(ConformanceV1Memory, RegistrationThroughEventsAndCompletionPorts) {
  RunInPeer("v1_registration_paths");
}

// #10 (handles), #12: a made-up, another adapter's or a deregistered handle is ND_INVALID_HANDLE,
// never followed; a registration of no bytes, of more than MaxRegistrationSize or of unmapped
// memory fails at once, and nothing is left registered.
IT_PEER(v1_registration_errors) {
  V1Adapter adapter;
  std::vector<uint8_t> buffer(4096);
  IT_CHECK_HR(ND_INVALID_HANDLE,
              V1Deregister(adapter.get(), reinterpret_cast<ND_MR_HANDLE>(uintptr_t(0xDEADBEEF))));
  IT_CHECK_HR(ND_INVALID_HANDLE,
              V1Deregister(adapter.get(), reinterpret_cast<ND_MR_HANDLE>(&buffer)));
  IT_CHECK_HR(ND_INVALID_HANDLE, V1Deregister(adapter.get(), nullptr));
  ND_MR_HANDLE handle = V1Register(adapter.get(), buffer.data(), buffer.size());
  IT_OK(V1Deregister(adapter.get(), handle));
  IT_CHECK_HR(ND_INVALID_HANDLE, V1Deregister(adapter.get(), handle));
  // Its slot taken again: the old handle still names nothing.
  ND_MR_HANDLE next = V1Register(adapter.get(), buffer.data(), buffer.size());
  IT_CHECK(next != handle);
  IT_CHECK_HR(ND_INVALID_HANDLE, V1Deregister(adapter.get(), handle));
  IT_OK(V1Deregister(adapter.get(), next));

  OVERLAPPED ov{};
  ND_MR_HANDLE out = nullptr;
  IT_CHECK_HR(ND_INVALID_BUFFER_SIZE, adapter->RegisterMemory(buffer.data(), 0, &ov, &out));
  IT_CHECK_HR(ND_INVALID_PARAMETER_2,
              adapter->RegisterMemory(buffer.data(), adapter.info().MaxRegistrationSize + 1, &ov, &out));
  IT_CHECK_HR(ND_INVALID_PARAMETER_3, adapter->RegisterMemory(buffer.data(), 64, nullptr, &out));
  IT_CHECK_HR(ND_INVALID_PARAMETER_4, adapter->RegisterMemory(buffer.data(), 64, &ov, nullptr));
  IT_CHECK_HR(ND_ACCESS_VIOLATION, adapter->RegisterMemory(nullptr, 64, &ov, &out));
  long page = sysconf(_SC_PAGESIZE);
  void* area = mmap(nullptr, size_t(2 * page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  IT_CHECK(area != MAP_FAILED);
  IT_CHECK(munmap(static_cast<uint8_t*>(area) + page, size_t(page)) == 0);
  IT_CHECK_HR(ND_ACCESS_VIOLATION, adapter->RegisterMemory(area, size_t(2 * page), &ov, &out));
  IT_CHECK(out == nullptr);
  munmap(area, size_t(page));
}

TEST(ConformanceV1Memory, BadHandlesAndRegistrationsFailAtOnce) { RunInPeer("v1_registration_errors"); }

// ---- the overlapped contract, and what is left after the adapter -------------------------------

// #42: an overlapped request fails synchronously (no notification) or returns ND_PENDING and
// then signals its event and queues one packet (none when the event's low bit is set);
// GetOverlappedResult(FALSE) on a running request is ND_PENDING, and its 64-bit byte count is
// written whole (the harness's Ov checks that on every call).
IT_PEER(v1_overlapped_contract) {
  V1Adapter adapter;
  HANDLE port = CreateIoCompletionPort(adapter->GetFileHandle(), nullptr, 1, 0);
  Ref<INDCompletionQueue> cq = adapter.CreateCq(8);
  DWORD count;
  ULONG_PTR key;
  OVERLAPPED* done;

  OVERLAPPED refused{};
  IT_CHECK_HR(ND_INVALID_PARAMETER_1, cq->Notify(7, &refused));  // no such notify type
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, 100));

  Ov notify;
  HRESULT hr = cq->Notify(ND_CQ_NOTIFY_ANY, notify.Prepare(cq.get()));
  IT_CHECK_HR(ND_PENDING, hr);
  SIZE_T bytes = ~SIZE_T(0);
  IT_CHECK_HR(ND_PENDING, cq->GetOverlappedResult(notify.get(), &bytes, FALSE));
  IT_CHECK_EQ(SIZE_T(0), bytes);
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, 0));
  IT_OK(cq->CancelOverlappedRequests());
  IT_CHECK_HR(ND_CANCELED, notify.Finish(hr, "Notify canceled"));
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, kWaitMs) && done == notify.get());
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, 0) && done == nullptr);

  // The same with the port suppressed.
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  OVERLAPPED quiet{};
  quiet.hEvent = reinterpret_cast<HANDLE>(reinterpret_cast<ULONG_PTR>(event) | 1);
  IT_CHECK_HR(ND_PENDING, cq->Notify(ND_CQ_NOTIFY_ANY, &quiet));
  IT_OK(cq->CancelOverlappedRequests());
  IT_CHECK_EQ(DWORD(WAIT_OBJECT_0), WaitForSingleObject(event, kWaitMs));
  IT_CHECK_HR(ND_CANCELED, cq->GetOverlappedResult(&quiet, &bytes, TRUE));
  IT_CHECK(!GetQueuedCompletionStatus(port, &count, &key, &done, 100) && done == nullptr);
  // Any object of the adapter reports on any of its requests.
  IT_CHECK_HR(ND_CANCELED, adapter->GetOverlappedResult(&quiet, &bytes, FALSE));
  IT_CHECK_HR(ND_INVALID_PARAMETER_1, adapter->GetOverlappedResult(nullptr, &bytes, FALSE));
  CloseHandle(event);
  CloseHandle(port);
}

TEST(ConformanceV1Overlapped, FailOrPendThenNotifyOnce) { RunInPeer("v1_overlapped_contract"); }

// An object used after the application released its adapter is told so: it cleans up (Release,
// Flush, GetResults, CancelOverlappedRequests, GetOverlappedResult work) and refuses the rest
// with ND_DEVICE_REMOVED, never touching freed memory. The adapter goes with the last of them,
// and closes the file handle it gave out.
IT_PEER(v1_after_the_adapter) {
  auto adapter = std::make_unique<V1Adapter>();
  const HANDLE file = (*adapter)->GetFileHandle();
  V1Side side(*adapter);
  side.CreateEndpoint();
  std::vector<uint8_t> buffer(64);
  ND_MR_HANDLE handle = V1Register(adapter->get(), buffer.data(), buffer.size());
  ND_RESULT receive;
  ND_SGE sge = V1Sge(buffer.data(), buffer.size(), handle);
  IT_OK(side.endpoint->Receive(&receive, &sge, 1));
  Ref<INDConnector> spare = adapter->CreateConnector();
  Ref<INDListen> listen;
  adapter->Listen(listen);
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window;
  IT_OK((*adapter)->CreateMemoryWindow(&invalidated, reinterpret_cast<INDMemoryWindow**>(window.Out())));
  IT_CHECK_EQ(0u, adapter->Release());  // what it made still holds it

  OVERLAPPED ov{};
  ND_RESULT result;
  INDEndpoint* endpoint = nullptr;
  IT_CHECK_HR(ND_DEVICE_REMOVED,
              spare->CreateEndpoint(side.cq.get(), side.cq.get(), 4, 4, 1, 1, 0, 0, nullptr, &endpoint));
  IT_CHECK_HR(ND_DEVICE_REMOVED, side.endpoint->Receive(&result, &sge, 1));
  IT_CHECK_HR(ND_DEVICE_REMOVED, side.endpoint->Send(&result, nullptr, 0, 0));
  IT_CHECK_HR(ND_DEVICE_REMOVED, side.cq->Notify(ND_CQ_NOTIFY_ANY, &ov));
  IT_CHECK_HR(ND_DEVICE_REMOVED, side.cq->Resize(16));
  IT_CHECK_HR(ND_DEVICE_REMOVED, listen->GetConnectionRequest(spare.get(), &ov));
  sockaddr_in server = Loopback(1);
  IT_CHECK_HR(ND_DEVICE_REMOVED,
              side.connector->Connect(side.endpoint.get(), reinterpret_cast<sockaddr*>(&server),
                                      sizeof server, kV1Protocol, 0, nullptr, 0, &ov));
  // Cleaning up works: the flushed receive comes back, into its own ND_RESULT.
  IT_OK(side.endpoint->Flush());
  V1ExpectResult(side.cq.get(), &receive, ND_CANCELED, 0, "the receive flushed after the adapter");
  IT_OK(side.cq->CancelOverlappedRequests());
  IT_CHECK_EQ(0u, window.Reset());
  IT_CHECK_EQ(0u, listen.Reset());
  IT_CHECK_EQ(0u, side.endpoint.Reset());
  IT_CHECK_EQ(0u, side.connector.Reset());
  IT_CHECK_EQ(0u, spare.Reset());
  IT_CHECK_EQ(0u, side.cq.Reset());
  IT_CHECK_HR(S_OK, DllCanUnloadNow());  // and the adapter went with the last of them
  SetLastError(ERROR_SUCCESS);
  IT_CHECK(CreateIoCompletionPort(file, nullptr, 1, 0) == nullptr);  // its file's handle is closed
  IT_CHECK_EQ(DWORD(ERROR_INVALID_HANDLE), GetLastError());
}

TEST(ConformanceV1Adapter, ObjectsAfterTheAdapterIsReleasedOnlyCleanUp) {
  RunInPeer("v1_after_the_adapter");
}

}  // namespace
}  // namespace ndit
