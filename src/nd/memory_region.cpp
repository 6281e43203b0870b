#include "nd/memory_region.h"

#include "nd/adapter.h"

namespace ndwv::nd {

namespace {
constexpr ULONG kKnownFlags = ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_ALLOW_REMOTE_READ |
                              ND_MR_FLAG_ALLOW_REMOTE_WRITE | ND_MR_FLAG_RDMA_READ_SINK |
                              ND_MR_FLAG_DO_NOT_SECURE_VM;
}

DWORD WvAccess(ULONG ndFlags) {
  // Every ND region may carry memory windows: ND binds read/write windows on regions registered
  // with local write only, so MW_BIND cannot depend on the remote flags.
  DWORD access = WV_ACCESS_MW_BIND;
  if (ndFlags & ND_MR_FLAG_ALLOW_LOCAL_WRITE) access |= WV_ACCESS_LOCAL_WRITE;
  if (ndFlags & ND_MR_FLAG_ALLOW_REMOTE_READ) access |= WV_ACCESS_REMOTE_READ;
  // ALLOW_REMOTE_WRITE (0x5) includes the local-write bit; its own bit is 0x4.
  if (ndFlags & (ND_MR_FLAG_ALLOW_REMOTE_WRITE & ~ND_MR_FLAG_ALLOW_LOCAL_WRITE))
    access |= WV_ACCESS_REMOTE_WRITE;
  // A read sink is written by the responses to our own Reads: local write is what the device
  // checks (the iWARP device allows read responses into LOCAL_WRITE memory of the reading QP).
  if (ndFlags & ND_MR_FLAG_RDMA_READ_SINK) access |= WV_ACCESS_LOCAL_WRITE;
  // DO_NOT_SECURE_VM concerns Windows page locking only.
  return access;
}

MemoryRegion::MemoryRegion(Adapter& adapter, base::HandleRef file)
    : adapter_(&adapter), file_(std::move(file)) {}

MemoryRegion::~MemoryRegion() {
  // The application should have deregistered; if not, do not leave the pages registered.
  if (registration_.registered) adapter_->pd()->DeregisterMemory(keys_.Lkey, nullptr);
}

MemoryRegion::Registration MemoryRegion::registration() const {
  base::MutexLock lock(mutex_);
  return registration_;
}

HRESULT MemoryRegion::CompleteAsPending(OVERLAPPED* ov, HRESULT status) {
  base::BeginOverlapped(ov);
  base::CompleteOverlapped(file_.get(), ov, status);
  return ND_PENDING;
}

HRESULT MemoryRegion::Register(const void* pBuffer, SIZE_T cbBuffer, ULONG flags,
                               OVERLAPPED* pOverlapped) {
  // The statuses ND tests expect for degenerate buffers (nd2-spi.md §11, §15.6).
  if (cbBuffer == 0) return pBuffer == nullptr ? ND_INVALID_PARAMETER : ND_INVALID_BUFFER_SIZE;
  if (pBuffer == nullptr) return ND_ACCESS_VIOLATION;
  if (cbBuffer > adapter_->info().MaxRegistrationSize) return ND_INVALID_PARAMETER;
  if (flags & ~kKnownFlags) return ND_INVALID_PARAMETER_3;

  base::MutexLock lock(mutex_);
  if (registration_.registered) return ND_INVALID_DEVICE_STATE;  // one registration at a time
  WV_MEMORY_KEYS keys{};
  HRESULT hr = adapter_->pd()->RegisterMemory(pBuffer, cbBuffer, WvAccess(flags), nullptr, &keys);
  // Refused (memory not mapped, no keys left): at once, and nothing is notified (nd2-spi: an
  // error means the request never started).
  if (FAILED(hr)) return NdStatus(hr);
  keys_ = keys;
  registration_ = {true, flags, keys.Lkey};
  return CompleteAsPending(pOverlapped, ND_SUCCESS);
}

HRESULT MemoryRegion::Deregister(OVERLAPPED* pOverlapped) {
  base::MutexLock lock(mutex_);
  if (!registration_.registered) return ND_INVALID_DEVICE_STATE;
  HRESULT hr = adapter_->pd()->DeregisterMemory(keys_.Lkey, nullptr);
  // Bound windows: the tests want the refusal at once, not through the OVERLAPPED.
  if (hr == WV_DEVICE_BUSY) return ND_DEVICE_BUSY;
  if (SUCCEEDED(hr)) {
    registration_ = {};
    keys_ = {};
  }
  return CompleteAsPending(pOverlapped, NdStatus(hr));
}

UINT32 MemoryRegion::GetLocalToken() {
  base::MutexLock lock(mutex_);
  return keys_.Lkey;
}

UINT32 MemoryRegion::GetRemoteToken() {
  base::MutexLock lock(mutex_);
  return keys_.Rkey;  // WV keeps it in network order already
}

}  // namespace ndwv::nd
