#include "nd/adapter.h"

#include <algorithm>
#include <limits>

#include "nd/address.h"
#include "nd/completion_queue.h"
#include "nd/connector.h"
#include "nd/listener.h"
#include "nd/memory_region.h"
#include "nd/memory_window.h"
#include "nd/queue_pair.h"
#include "nd/shared_receive_queue.h"

namespace ndwv::nd {

namespace {

// What ND applications tune their message paths by (nd2-spi.md §5): sends up to this size go
// inline, transfers above the large threshold use RDMA rather than send/receive.
constexpr SIZE_T kInlineRequestThreshold = 128;
constexpr ULONG kLargeRequestThreshold = 64 * 1024;

// Saturates a WV size to ND's 32-bit ULONG (Linux's ULONG_MAX is 64-bit: not that one).
ULONG Clamp(SIZE_T value) {
  return ULONG(std::min<SIZE_T>(value, std::numeric_limits<ULONG>::max()));
}

// The ND view of the device: its WV limits, in ND's terms.
ND2_ADAPTER_INFO Describe(NET64 guid, const WV_DEVICE_ATTRIBUTES& device) {
  ND2_ADAPTER_INFO info{};
  info.InfoVersion = ND_VERSION_2;
  info.VendorId = UINT16(device.VendorId);
  info.DeviceId = UINT16(device.VendorPartId);
  info.AdapterId = guid;
  info.MaxRegistrationSize = device.MaxMrSize;
  info.MaxWindowSize = device.MaxMrSize;
  info.MaxInitiatorSge = Clamp(device.MaxSge);
  info.MaxReceiveSge = Clamp(device.MaxSge);
  info.MaxReadSge = Clamp(device.MaxSge);
  info.MaxTransferLength = Clamp(device.MaxTransferLength);
  info.MaxInlineDataSize = Clamp(device.MaxInlineSend);
  info.MaxInboundReadLimit = Clamp(device.MaxQpResponderResources);
  info.MaxOutboundReadLimit = Clamp(device.MaxQpInitiatorDepth);
  info.MaxReceiveQueueDepth = Clamp(device.MaxQpWr);
  info.MaxInitiatorQueueDepth = Clamp(device.MaxQpWr);
  info.MaxSharedReceiveQueueDepth = device.MaxSrq != 0 ? Clamp(device.MaxSrqWr) : 0;
  info.MaxCompletionQueueDepth = Clamp(device.MaxCqEntries);
  info.InlineRequestThreshold = Clamp(std::min(kInlineRequestThreshold, device.MaxInlineSend));
  info.LargeRequestThreshold = kLargeRequestThreshold;
  // Private data travels in WV_CONNECT_PARAM, whatever more the transport could carry.
  ULONG privateData = Clamp(std::min<SIZE_T>(device.MaxPrivateData, WV_MAX_PRIVATE_DATA));
  info.MaxCallerData = privateData;
  info.MaxCalleeData = privateData;
  info.AdapterFlags = ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED;
  if (device.CapabilityFlags & WV_DEVICE_IN_ORDER_PLACEMENT)
    info.AdapterFlags |= ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED;
  if (device.CapabilityFlags & WV_DEVICE_RESIZE_CQ)
    info.AdapterFlags |= ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED;
  return info;
}

// Publishes what a New* method made: `hr` its status, `*made` the object (read once the call
// that makes it is over, whatever order the arguments were evaluated in).
template <class T>
HRESULT PublishNew(HRESULT hr, T* const* made, REFIID iid, void** ppv) {
  if (FAILED(hr)) return hr;
  return *made != nullptr ? Publish(*made, iid, ppv) : ND_NO_MEMORY;
}

template <class T>
HRESULT Made(T* object, T** out) {
  *out = object;
  return object != nullptr ? ND_SUCCESS : ND_NO_MEMORY;
}

// A handle the application passed for an object's overlapped file: held for the object's life,
// so closing it early cannot pull it from under a completion. Empty if it is not an open file.
base::HandleRef HoldOverlappedFile(HANDLE file) {
  return base::RetainFile(file) ? base::HandleRef::Adopt(file) : base::HandleRef();
}

}  // namespace

HRESULT Adapter::Open(ComPtr<IWVProvider> wv, NET64 guid, Adapter** adapter) {
  ComPtr<IWVDevice> device;
  HRESULT hr = wv->OpenDevice(guid, device.put());
  if (FAILED(hr)) {
    // An id no device has is the caller's mistake; resource failures speak for themselves.
    bool resources =
        hr == WV_NO_MEMORY || hr == WV_INSUFFICIENT_RESOURCES || hr == WV_DEVICE_REMOVED;
    return resources ? NdStatus(hr) : ND_INVALID_PARAMETER;
  }
  WV_DEVICE_ATTRIBUTES attributes{};
  if (hr = device->Query(&attributes); FAILED(hr)) return NdStatus(hr);
  ComPtr<IWVProtectionDomain> pd;
  if (hr = device->AllocateProtectionDomain(pd.put()); FAILED(hr)) return NdStatus(hr);
  *adapter =
      new (std::nothrow) Adapter(std::move(wv), std::move(device), std::move(pd), guid, attributes);
  return *adapter != nullptr ? ND_SUCCESS : ND_NO_MEMORY;
}

Adapter::Adapter(ComPtr<IWVProvider> wv, ComPtr<IWVDevice> device, ComPtr<IWVProtectionDomain> pd,
                 NET64 guid, const WV_DEVICE_ATTRIBUTES& attributes)
    : wv_(std::move(wv)),
      device_(std::move(device)),
      pd_(std::move(pd)),
      guid_(guid),
      attributes_(attributes),
      info_(Describe(guid, attributes)) {}

HRESULT Adapter::BindableAddress(const sockaddr* requested, WV_SOCKADDR* bindable) const {
  *bindable = CopySockaddr(requested);
  if (IsUnspecified(requested)) {
    // A wildcard means every address of this adapter and never another's (nd2-spi.md §14.2):
    // with one address of the family, that is simply that address.
    std::vector<WV_SOCKADDR> mine;
    for (const WV_SOCKADDR& a : ServedAddresses(wv_.get(), &guid_))
      if (a.Sa.sa_family == requested->sa_family) mine.push_back(a);
    if (mine.size() == 1) {
      if (requested->sa_family == AF_INET) bindable->Sin.sin_addr = mine[0].Sin.sin_addr;
      if (requested->sa_family == AF_INET6) bindable->Sin6.sin6_addr = mine[0].Sin6.sin6_addr;
    }
    return ND_SUCCESS;
  }
  WV_SOCKADDR ip = WithoutPort(requested);
  WV_DEVICE_ADDRESS owner{};
  HRESULT hr = wv_->TranslateAddress(&ip.Sa, &owner);
  if (hr == WV_INSUFFICIENT_RESOURCES) return ND_INSUFFICIENT_RESOURCES;  // out of descriptors
  if (FAILED(hr) || owner.DeviceGuid != guid_) return ND_INVALID_ADDRESS;
  return ND_SUCCESS;
}

HRESULT Adapter::CreateOverlappedFile(HANDLE* phOverlappedFile) {
  if (phOverlappedFile == nullptr) return ND_INVALID_PARAMETER_1;
  *phOverlappedFile = base::CreateOverlappedFile();
  return *phOverlappedFile != nullptr ? ND_SUCCESS : ND_NO_MEMORY;
}

HRESULT Adapter::Query(ND2_ADAPTER_INFO* pInfo, ULONG* pcbInfo) {
  if (pcbInfo == nullptr) return ND_INVALID_PARAMETER_2;
  if (pInfo == nullptr || *pcbInfo < sizeof(ND2_ADAPTER_INFO)) {
    *pcbInfo = sizeof(ND2_ADAPTER_INFO);
    return ND_BUFFER_OVERFLOW;
  }
  // The documentation says version 1, every caller passes ND_VERSION_2: one layout serves both.
  if (pInfo->InfoVersion != ND_VERSION_1 && pInfo->InfoVersion != ND_VERSION_2)
    return ND_INVALID_PARAMETER_1;
  *pInfo = info_;
  *pcbInfo = sizeof(ND2_ADAPTER_INFO);
  return ND_SUCCESS;
}

HRESULT Adapter::QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList, ULONG* pcbAddressList) {
  if (pcbAddressList == nullptr) return ND_INVALID_PARAMETER_2;
  return ReturnAddressList(ServedAddresses(wv_.get(), &guid_), pAddressList, pcbAddressList);
}

HRESULT Adapter::CreateCompletionQueue(REFIID iid, HANDLE hOverlappedFile, ULONG queueDepth,
                                       USHORT group, KAFFINITY affinity, void** ppCompletionQueue) {
  // Exactly the maximum is allowed: tools create CQs of MaxCompletionQueueDepth.
  if (queueDepth == 0 || queueDepth > info_.MaxCompletionQueueDepth) return ND_INVALID_PARAMETER_3;
  if (group != 0) return ND_INVALID_PARAMETER_4;  // no processor groups; affinity is advisory
  base::HandleRef file = HoldOverlappedFile(hOverlappedFile);
  if (!file) return ND_INVALID_HANDLE;
  CompletionQueue* cq = nullptr;
  return PublishNew(NewCompletionQueue(std::move(file), queueDepth, &cq), &cq, iid,
                    ppCompletionQueue);
}

HRESULT Adapter::NewCompletionQueue(base::HandleRef file, ULONG queueDepth, CompletionQueue** cq) {
  SIZE_T entries = queueDepth;
  ComPtr<IWVCompletionQueue> wv;
  if (HRESULT hr = device_->CreateCompletionQueue(file.get(), &entries, wv.put()); FAILED(hr))
    return NdStatus(hr);
  return Made(new (std::nothrow) CompletionQueue(*this, std::move(file), std::move(wv)), cq);
}

HRESULT Adapter::CreateMemoryRegion(REFIID iid, HANDLE hOverlappedFile, void** ppMemoryRegion) {
  base::HandleRef file = HoldOverlappedFile(hOverlappedFile);
  if (!file) return ND_INVALID_HANDLE;
  MemoryRegion* mr = nullptr;
  return PublishNew(Made(new (std::nothrow) MemoryRegion(*this, std::move(file)), &mr), &mr, iid,
                    ppMemoryRegion);
}

HRESULT Adapter::CreateMemoryWindow(REFIID iid, void** ppMemoryWindow) {
  MemoryWindow* mw = nullptr;
  return PublishNew(NewMemoryWindow(&mw), &mw, iid, ppMemoryWindow);
}

HRESULT Adapter::NewMemoryWindow(MemoryWindow** mw) {
  ComPtr<IWVMemoryWindow> wv;
  if (HRESULT hr = pd_->AllocateMemoryWindow(wv.put()); FAILED(hr)) return NdStatus(hr);
  return Made(new (std::nothrow) MemoryWindow(*this, std::move(wv)), mw);
}

HRESULT Adapter::CreateSharedReceiveQueue(REFIID iid, HANDLE hOverlappedFile, ULONG queueDepth,
                                          ULONG maxRequestSge, ULONG notifyThreshold, USHORT group,
                                          KAFFINITY affinity, void** ppSharedReceiveQueue) {
  if (info_.MaxSharedReceiveQueueDepth == 0) return ND_NOT_SUPPORTED;
  if (queueDepth == 0 || queueDepth > info_.MaxSharedReceiveQueueDepth)
    return ND_INVALID_PARAMETER_3;
  SIZE_T maxSge = attributes_.MaxSrqSge;
  if (maxRequestSge > maxSge) return ND_INVALID_PARAMETER_4;
  if (notifyThreshold > queueDepth) return ND_INVALID_PARAMETER_5;
  if (group != 0) return ND_INVALID_PARAMETER_6;
  base::HandleRef file = HoldOverlappedFile(hOverlappedFile);
  if (!file) return ND_INVALID_HANDLE;
  ComPtr<IWVSharedReceiveQueue> wv;
  // As for queue pairs, grant the adapter's SGE maximum rather than the request (§12 rounding).
  HRESULT hr =
      pd_->CreateSharedReceiveQueue(file.get(), queueDepth, maxSge, notifyThreshold, wv.put());
  if (FAILED(hr)) return NdStatus(hr);
  SharedReceiveQueue* srq = nullptr;
  return PublishNew(
      Made(new (std::nothrow) SharedReceiveQueue(*this, std::move(file), std::move(wv)), &srq), &srq,
      iid, ppSharedReceiveQueue);
}

namespace {
// One SGE more than asked: applications post that many and expect success (nd2-spi.md §12,
// ndmw). The verbs layer rounds it up to what fills its entries; beyond that a post fails
// ND_DATA_OVERRUN, as on an RNIC whose WQE stride is the limit.
ULONG GrantedSge(ULONG asked, ULONG maximum) { return std::min(asked + 1, maximum); }
}  // namespace

HRESULT Adapter::CreateQueuePair(REFIID iid, IUnknown* pReceiveCompletionQueue,
                                 IUnknown* pInitiatorCompletionQueue, void* context,
                                 ULONG receiveQueueDepth, ULONG initiatorQueueDepth,
                                 ULONG maxReceiveRequestSge, ULONG maxInitiatorRequestSge,
                                 ULONG inlineDataSize, void** ppQueuePair) {
  CompletionQueue* receiveCq = Mine<CompletionQueue>(pReceiveCompletionQueue);
  if (receiveCq == nullptr) return ND_INVALID_PARAMETER_2;
  CompletionQueue* initiatorCq = Mine<CompletionQueue>(pInitiatorCompletionQueue);
  if (initiatorCq == nullptr) return ND_INVALID_PARAMETER_3;
  if (receiveQueueDepth == 0 || receiveQueueDepth > info_.MaxReceiveQueueDepth)
    return ND_INVALID_PARAMETER_5;
  if (initiatorQueueDepth == 0 || initiatorQueueDepth > info_.MaxInitiatorQueueDepth)
    return ND_INVALID_PARAMETER_6;
  if (maxReceiveRequestSge > info_.MaxReceiveSge) return ND_INVALID_PARAMETER_7;
  if (maxInitiatorRequestSge > info_.MaxInitiatorSge) return ND_INVALID_PARAMETER_8;
  if (inlineDataSize > info_.MaxInlineDataSize) return ND_INVALID_PARAMETER_9;
  QueuePair* qp = nullptr;
  return PublishNew(NewQueuePair(*receiveCq, *initiatorCq, nullptr, context, receiveQueueDepth,
                                 initiatorQueueDepth, GrantedSge(maxReceiveRequestSge, info_.MaxReceiveSge),
                                 GrantedSge(maxInitiatorRequestSge, info_.MaxInitiatorSge), inlineDataSize, &qp),
                    &qp, iid, ppQueuePair);
}

HRESULT Adapter::CreateQueuePairWithSrq(REFIID iid, IUnknown* pReceiveCompletionQueue,
                                        IUnknown* pInitiatorCompletionQueue,
                                        IUnknown* pSharedReceiveQueue, void* context,
                                        ULONG initiatorQueueDepth, ULONG maxInitiatorRequestSge,
                                        ULONG inlineDataSize, void** ppQueuePair) {
  if (info_.MaxSharedReceiveQueueDepth == 0) return ND_NOT_SUPPORTED;
  CompletionQueue* receiveCq = Mine<CompletionQueue>(pReceiveCompletionQueue);
  if (receiveCq == nullptr) return ND_INVALID_PARAMETER_2;
  CompletionQueue* initiatorCq = Mine<CompletionQueue>(pInitiatorCompletionQueue);
  if (initiatorCq == nullptr) return ND_INVALID_PARAMETER_3;
  SharedReceiveQueue* srq = Mine<SharedReceiveQueue>(pSharedReceiveQueue);
  if (srq == nullptr) return ND_INVALID_PARAMETER_4;
  if (initiatorQueueDepth == 0 || initiatorQueueDepth > info_.MaxInitiatorQueueDepth)
    return ND_INVALID_PARAMETER_6;
  if (maxInitiatorRequestSge > info_.MaxInitiatorSge) return ND_INVALID_PARAMETER_7;
  if (inlineDataSize > info_.MaxInlineDataSize) return ND_INVALID_PARAMETER_8;
  QueuePair* qp = nullptr;
  return PublishNew(NewQueuePair(*receiveCq, *initiatorCq, srq, context, 0, initiatorQueueDepth, 0,
                                 GrantedSge(maxInitiatorRequestSge, info_.MaxInitiatorSge), inlineDataSize, &qp),
                    &qp, iid, ppQueuePair);
}

HRESULT Adapter::NewQueuePair(CompletionQueue& receiveCq, CompletionQueue& initiatorCq,
                              SharedReceiveQueue* srq, void* context, ULONG receiveQueueDepth,
                              ULONG initiatorQueueDepth, ULONG receiveSge, ULONG initiatorSge,
                              ULONG inlineDataSize, QueuePair** qp) {
  WV_QP_CREATE create{};
  create.pSendCq = initiatorCq.wv();
  create.pReceiveCq = receiveCq.wv();
  create.pSharedReceiveQueue = srq != nullptr ? srq->wv() : nullptr;
  create.Context = context;  // comes back as ND2_RESULT.QueuePairContext
  create.SendDepth = initiatorQueueDepth;
  create.ReceiveDepth = receiveQueueDepth;
  create.SendSge = initiatorSge;
  create.ReceiveSge = srq != nullptr ? 0 : receiveSge;
  create.MaxInlineSend = inlineDataSize;
  create.InitiatorDepth = info_.MaxOutboundReadLimit;
  create.ResponderResources = info_.MaxInboundReadLimit;
  create.QpType = WvQpTypeRc;
  create.QpFlags = WV_QP_MEMORY_MANAGEMENT;  // ND posts memory-window binds
  ComPtr<IWVConnectQueuePair> wv;
  if (HRESULT hr = pd_->CreateConnectQueuePair(&create, wv.put()); FAILED(hr)) return NdStatus(hr);
  return Made(new (std::nothrow) QueuePair(*this, receiveCq, initiatorCq, srq, std::move(wv)), qp);
}

HRESULT Adapter::CreateConnector(REFIID iid, HANDLE hOverlappedFile, void** ppConnector) {
  base::HandleRef file = HoldOverlappedFile(hOverlappedFile);
  if (!file) return ND_INVALID_HANDLE;
  Connector* connector = nullptr;
  return PublishNew(NewConnector(std::move(file), &connector), &connector, iid, ppConnector);
}

HRESULT Adapter::NewConnector(base::HandleRef file, Connector** connector) {
  ComPtr<IWVConnectEndpoint> endpoint;
  if (HRESULT hr = wv_->CreateConnectEndpoint(file.get(), endpoint.put()); FAILED(hr))
    return NdStatus(hr);
  return Made(new (std::nothrow) Connector(*this, std::move(file), std::move(endpoint)), connector);
}

HRESULT Adapter::CreateListener(REFIID iid, HANDLE hOverlappedFile, void** ppListener) {
  base::HandleRef file = HoldOverlappedFile(hOverlappedFile);
  if (!file) return ND_INVALID_HANDLE;
  Listener* listener = nullptr;
  return PublishNew(NewListener(std::move(file), &listener), &listener, iid, ppListener);
}

HRESULT Adapter::NewListener(base::HandleRef file, Listener** listener) {
  ComPtr<IWVConnectEndpoint> endpoint;
  if (HRESULT hr = wv_->CreateConnectEndpoint(file.get(), endpoint.put()); FAILED(hr))
    return NdStatus(hr);
  return Made(new (std::nothrow) Listener(*this, std::move(file), std::move(endpoint)), listener);
}

}  // namespace ndwv::nd
