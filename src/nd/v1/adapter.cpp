#include "nd/v1/adapter.h"

#include <algorithm>
#include <mutex>

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/completion_queue.h"
#include "nd/connector.h"
#include "nd/listener.h"
#include "nd/memory_window.h"
#include "nd/v1/completion_queue.h"
#include "nd/v1/connector.h"
#include "nd/v1/listen.h"
#include "nd/v1/memory_window.h"

namespace ndwv::nd::v1 {

namespace {

// Version 1's view of the adapter: the version 2 limits under their version 1 names. Inbound is
// the receive queue, outbound the initiator queue.
ND_ADAPTER_INFO1 Describe(const ND2_ADAPTER_INFO& info, const WV_DEVICE_ATTRIBUTES& device) {
  ND_ADAPTER_INFO1 v1{};
  v1.VendorId = device.VendorId;
  v1.DeviceId = device.VendorPartId;
  v1.MaxInboundSge = info.MaxReceiveSge;
  v1.MaxInboundRequests = info.MaxReceiveQueueDepth;
  v1.MaxInboundLength = info.MaxTransferLength;
  v1.MaxOutboundSge = info.MaxInitiatorSge;
  v1.MaxOutboundRequests = info.MaxInitiatorQueueDepth;
  v1.MaxOutboundLength = info.MaxTransferLength;
  v1.MaxInlineData = info.MaxInlineDataSize;
  v1.MaxInboundReadLimit = info.MaxInboundReadLimit;
  v1.MaxOutboundReadLimit = info.MaxOutboundReadLimit;
  v1.MaxCqEntries = info.MaxCompletionQueueDepth;
  v1.MaxRegistrationSize = info.MaxRegistrationSize;
  v1.MaxWindowSize = info.MaxWindowSize;
  v1.LargeRequestThreshold = info.LargeRequestThreshold;
  v1.MaxCallerData = info.MaxCallerData;
  v1.MaxCalleeData = info.MaxCalleeData;
  return v1;
}

// A version 1 registration may be written locally (receives, Read sinks) and carry windows; it
// grants the peer nothing: version 1 has no token to give it, so remote access goes through
// windows only (nd1-spi.md §2.4, D5).
constexpr DWORD kRegistrationAccess = WV_ACCESS_LOCAL_WRITE | WV_ACCESS_MW_BIND;

// The most registrations one adapter names at once (each handle is a table slot).
constexpr size_t kMaxRegistrations = size_t(1) << 20;

template <class T, class Interface>
HRESULT Hand(T* object, Interface** out) {
  if (object == nullptr) return ND_NO_MEMORY;
  *out = object;
  return ND_SUCCESS;
}

}  // namespace

HRESULT Adapter::Open(nd::Adapter* adapter, const WV_SOCKADDR& ip, Adapter** out) {
  Ref<nd::Adapter> base = Adopt(adapter);
  HANDLE file = base::CreateOverlappedFile();
  if (file == nullptr) return ND_NO_MEMORY;
  // The adapter holds the handle (GetFileHandle's) as an application holds those it creates, and
  // closes it when it goes; its own reference keeps the file until then.
  base::RetainHandle(file);
  *out = new (std::nothrow) Adapter(std::move(base), base::HandleRef::Adopt(file), ip);
  if (*out != nullptr) return ND_SUCCESS;
  CloseHandle(file);
  base::ReleaseHandle(file);
  return ND_NO_MEMORY;
}

Adapter::Adapter(Ref<nd::Adapter> base, base::HandleRef file, const WV_SOCKADDR& ip)
    : base_(std::move(base)),
      file_(std::move(file)),
      ip_(ip),
      info_(Describe(base_->info(), base_->attributes())),
      registrations_(std::min(base_->attributes().MaxMr, kMaxRegistrations)) {}

Adapter::~Adapter() {
  // The application should have deregistered; if not, the pages do not stay registered.
  {
    base::MutexLock lock(registrations_.mutex());
    for (const Registrations::Region& region : registrations_.All())
      base_->pd()->DeregisterMemory(region.lkey, nullptr);
  }
  // Its objects are gone (each holds the adapter): no request is pending through the file.
  CloseHandle(file_.get());
}

HRESULT Adapter::CompleteAsPending(OVERLAPPED* ov, HRESULT status) {
  base::BeginOverlapped(ov);
  base::CompleteOverlapped(file_.get(), ov, status);
  return ND_PENDING;
}

HRESULT Adapter::Query(DWORD VersionRequested, ND_ADAPTER_INFO* pInfo, SIZE_T* pBufferSize) {
  if (pBufferSize == nullptr) return ND_INVALID_PARAMETER_3;
  if (VersionRequested != ND_VERSION_1) return ND_NOT_SUPPORTED;
  if (pInfo == nullptr || *pBufferSize < sizeof(ND_ADAPTER_INFO1)) {
    *pBufferSize = sizeof(ND_ADAPTER_INFO1);
    return ND_BUFFER_OVERFLOW;
  }
  *pInfo = info_;
  *pBufferSize = sizeof(ND_ADAPTER_INFO1);
  return ND_SUCCESS;
}

HRESULT Adapter::Control(DWORD, const void*, SIZE_T, void*, SIZE_T, SIZE_T* pBytesReturned,
                         OVERLAPPED*) {
  // No vendor escape hatch: nothing reaches the device that the SPI does not define (D13).
  if (pBytesReturned != nullptr) *pBytesReturned = 0;
  return ND_NOT_SUPPORTED;
}

HRESULT Adapter::CreateCompletionQueue(SIZE_T nEntries, INDCompletionQueue** ppCq) {
  if (ppCq == nullptr) return ND_INVALID_PARAMETER_2;
  // Exactly the maximum is allowed, as in version 2.
  if (nEntries == 0 || nEntries > info_.MaxCqEntries) return ND_INVALID_PARAMETER;
  nd::CompletionQueue* cq = nullptr;
  if (HRESULT hr = base_->NewCompletionQueue(file_, ULONG(nEntries), &cq); FAILED(hr)) return hr;
  return Hand(new (std::nothrow) CompletionQueue(*this, Adopt(cq)), ppCq);
}

HRESULT Adapter::RegisterMemory(const void* pBuffer, SIZE_T BufferSize, OVERLAPPED* pOverlapped,
                                ND_MR_HANDLE* phMr) {
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_3;
  if (phMr == nullptr) return ND_INVALID_PARAMETER_4;
  if (BufferSize == 0) return ND_INVALID_BUFFER_SIZE;
  if (BufferSize > info_.MaxRegistrationSize) return ND_INVALID_PARAMETER_2;
  if (pBuffer == nullptr) return ND_ACCESS_VIOLATION;

  base::MutexLock lock(registrations_.mutex());
  WV_MEMORY_KEYS keys{};
  // Failures are reported at once and signal nothing (nd1-spi.md §2.3).
  if (HRESULT hr = base_->pd()->RegisterMemory(pBuffer, BufferSize, kRegistrationAccess, nullptr,
                                               &keys);
      FAILED(hr))
    return NdStatus(hr);
  ND_MR_HANDLE handle =
      registrations_.Add({reinterpret_cast<uint64_t>(pBuffer), BufferSize, keys.Lkey});
  if (handle == nullptr) {
    base_->pd()->DeregisterMemory(keys.Lkey, nullptr);
    return ND_INSUFFICIENT_RESOURCES;
  }
  *phMr = handle;
  return CompleteAsPending(pOverlapped, ND_SUCCESS);
}

HRESULT Adapter::DeregisterMemory(ND_MR_HANDLE hMr, OVERLAPPED* pOverlapped) {
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_2;
  base::MutexLock lock(registrations_.mutex());
  Registrations::Region region;
  if (!registrations_.Find(hMr, &region)) return ND_INVALID_HANDLE;
  HRESULT hr = base_->pd()->DeregisterMemory(region.lkey, nullptr);
  if (hr == WV_DEVICE_BUSY) return ND_DEVICE_BUSY;  // windows are bound to it
  if (FAILED(hr)) return NdStatus(hr);
  registrations_.Remove(hMr);
  return CompleteAsPending(pOverlapped, ND_SUCCESS);
}

HRESULT Adapter::CreateMemoryWindow(ND_RESULT* pInvalidateResult, INDMemoryWindow** ppMw) {
  if (pInvalidateResult == nullptr) return ND_INVALID_PARAMETER_1;
  if (ppMw == nullptr) return ND_INVALID_PARAMETER_2;
  nd::MemoryWindow* mw = nullptr;
  if (HRESULT hr = base_->NewMemoryWindow(&mw); FAILED(hr)) return hr;
  return Hand(new (std::nothrow) MemoryWindow(*this, Adopt(mw), pInvalidateResult), ppMw);
}

HRESULT Adapter::CreateConnector(INDConnector** ppConnector) {
  if (ppConnector == nullptr) return ND_INVALID_PARAMETER_1;
  nd::Connector* connector = nullptr;
  if (HRESULT hr = base_->NewConnector(file_, &connector); FAILED(hr)) return hr;
  return Hand(new (std::nothrow) Connector(*this, Adopt(connector)), ppConnector);
}

HRESULT Adapter::Listen(SIZE_T Backlog, INT Protocol, USHORT Port, USHORT* pAssignedPort,
                        INDListen** ppListen) {
  if (ppListen == nullptr) return ND_INVALID_PARAMETER_5;
  if (!IsProtocolNumber(Protocol)) return ND_INVALID_PARAMETER_2;
  if (Port == 0 && pAssignedPort == nullptr) return ND_INVALID_PARAMETER_MIX;
  nd::Listener* created = nullptr;
  if (HRESULT hr = base_->NewListener(file_, &created); FAILED(hr)) return hr;
  Ref<nd::Listener> listener = Adopt(created);
  if (HRESULT hr = SetProtocol(listener->wv(), Protocol); FAILED(hr)) return hr;

  WV_SOCKADDR local = ip_;
  SetPort(&local, Port);
  HRESULT hr = listener->Bind(&local.Sa, SockaddrLength(local.Sa.sa_family));
  // Version 1 names a port in use so (nd1-spi.md §2.4); version 2 says ND_SHARING_VIOLATION.
  if (hr == ND_SHARING_VIOLATION || hr == STATUS_ADDRESS_ALREADY_ASSOCIATED)
    return ND_ADDRESS_ALREADY_EXISTS;
  if (FAILED(hr)) return hr;
  // Backlog 0 is "no limit", as in version 2; beyond a ULONG it is no limit either.
  if (hr = listener->Listen(ULONG(std::min<SIZE_T>(Backlog, 0xFFFFFFFFu))); FAILED(hr)) return hr;
  if (pAssignedPort != nullptr) {
    WV_SOCKADDR bound{};
    ULONG length = sizeof bound;
    if (hr = listener->GetLocalAddress(&bound.Sa, &length); FAILED(hr)) return hr;
    *pAssignedPort = PortOf(bound);
  }
  return Hand(new (std::nothrow) v1::Listen(*this, std::move(listener)), ppListen);
}

}  // namespace ndwv::nd::v1
