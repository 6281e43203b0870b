// IWVProvider and IWVDevice, and the helpers every verbs object shares.
#include <sched.h>

#include <cstring>

#include "base/fork.h"
#include "base/settings.h"
#include "dev/engine.h"
#include "dev/memory.h"
#include "wv/objects.h"

namespace ndwv::wv {

HRESULT WaitResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  if (!overlapped) return WV_INVALID_PARAMETER;
  HRESULT status = base::WaitOverlapped(overlapped, wait != FALSE);
  if (bytes) *bytes = DWORD(overlapped->InternalHigh);
  return status;
}

base::HandleRef RetainedFile(HANDLE file) {
  if (!file || !base::RetainFile(file)) return {};
  return base::HandleRef::Adopt(file);
}

// ---- provider ---------------------------------------------------------------------------------

Provider::Provider() : file_(base::CreateOverlappedFile()) {}
Provider::~Provider() { CloseHandle(file_); }

// Every entry to the devices first: in a child forked from a process whose device was up, the
// device is gone (base/fork.h).
HRESULT Provider::QueryDeviceList(NET64* guids, SIZE_T* size) {
  if (base::ForkedFromDevice()) return WV_DEVICE_REMOVED;
  if (!size) return WV_INVALID_PARAMETER;
  const auto& devices = dev::Device::All();
  SIZE_T need = devices.size() * sizeof(NET64);
  if (!guids || *size < need) {
    *size = need;
    return WV_BUFFER_OVERFLOW;
  }
  for (size_t i = 0; i < devices.size(); ++i) guids[i] = devices[i]->guid();
  *size = need;
  return WV_SUCCESS;
}

HRESULT Provider::QueryDevice(NET64 guid, WV_DEVICE_ATTRIBUTES* attributes) {
  if (base::ForkedFromDevice()) return WV_DEVICE_REMOVED;
  dev::Device* device = dev::Device::Find(guid);
  if (!device) return WV_INVALID_ADDRESS;
  return Device::Describe(device, attributes);
}

HRESULT Provider::TranslateAddress(const sockaddr* address, WV_DEVICE_ADDRESS* device_address) {
  if (base::ForkedFromDevice()) return WV_DEVICE_REMOVED;
  if (!address || !device_address) return WV_INVALID_PARAMETER;
  socklen_t length = address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  const auto& devices = dev::Device::All();
  if (devices.empty()) return WV_INVALID_ADDRESS;
  if (int32_t status = dev::Device::CheckServedAddress(address, length); status != WV_SUCCESS)
    return status;
  device_address->DeviceGuid = devices.front()->guid();
  device_address->Pkey = 0xFFFF;
  device_address->PortNumber = 1;
  return WV_SUCCESS;
}

HRESULT Provider::OpenDevice(NET64 guid, IWVDevice** device) {
  if (base::ForkedFromDevice()) return WV_DEVICE_REMOVED;
  if (!device) return WV_INVALID_PARAMETER;
  dev::Device* found = dev::Device::Find(guid);
  if (!found) return WV_INVALID_ADDRESS;
  *device = new Device(found);
  return WV_SUCCESS;
}

HRESULT Provider::CreateConnectEndpoint(HANDLE file, IWVConnectEndpoint** endpoint) {
  if (base::ForkedFromDevice()) return WV_DEVICE_REMOVED;
  if (!endpoint) return WV_INVALID_PARAMETER;
  base::HandleRef retained = RetainedFile(file);
  if (!retained) return WV_INVALID_HANDLE;
  const auto& devices = dev::Device::All();
  if (devices.empty()) return WV_DEVICE_REMOVED;
  *endpoint = new ConnectEndpoint(std::move(retained), devices.front()->CreateEndpoint());
  return WV_SUCCESS;
}

// ---- device -----------------------------------------------------------------------------------

HRESULT Device::GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  return WaitResult(overlapped, bytes, wait);
}

HRESULT Device::Query(WV_DEVICE_ATTRIBUTES* attributes) { return Describe(device_, attributes); }

HRESULT Device::Describe(dev::Device* device_, WV_DEVICE_ATTRIBUTES* attributes) {
  if (!attributes) return WV_INVALID_PARAMETER;
  const dev::DeviceAttributes& a = device_->attributes();
  *attributes = {};
  attributes->FwVersion = 1;
  attributes->NodeGuid = device_->guid();
  attributes->SystemImageGuid = device_->guid();
  attributes->VendorId = 0x6E64;  // "nd"
  attributes->VendorPartId = uint32_t(device_->transport()) + 1;
  attributes->CapabilityFlags = WV_DEVICE_RC_RNR_NAK_GEN | WV_DEVICE_MEM_WINDOW |
                                (a.cq_resize ? WV_DEVICE_RESIZE_CQ : 0) |
                                (a.in_order_placement ? WV_DEVICE_IN_ORDER_PLACEMENT : 0);
  attributes->MaxMrSize = a.max_mr_size;
  attributes->MaxQp = 1 << 20;
  attributes->MaxQpWr = a.max_qp_wr;
  attributes->MaxSge = a.max_sge;
  attributes->MaxCq = 1 << 20;
  attributes->MaxCqEntries = a.max_cq_entries;
  attributes->MaxMr = dev::ProtectionDomain::kMaxRegions;
  attributes->MaxPd = 1 << 20;
  attributes->MaxQpResponderResources = a.max_ird;
  attributes->MaxResponderResources = a.max_ird;
  attributes->MaxQpInitiatorDepth = a.max_ord;
  attributes->MaxInlineSend = a.max_inline;
  attributes->MaxMw = dev::ProtectionDomain::kMaxWindows;
  attributes->MaxSrq = 1 << 20;
  attributes->MaxSrqWr = a.max_srq_wr;
  attributes->MaxSrqSge = a.max_srq_sge;
  attributes->MaxTransferLength = a.max_transfer_length;
  attributes->MaxPrivateData = a.max_private_data;
  attributes->DeviceType = device_->transport() == dev::Transport::Iwarp ? WvDeviceIwarp : WvDeviceInfiniband;
  attributes->PhysPortCount = 1;
  return WV_SUCCESS;
}

HRESULT Device::QueryNotifyAffinity(USHORT* group, KAFFINITY* affinity) {
  if (!group || !affinity) return WV_INVALID_PARAMETER;
  cpu_set_t cpus;
  if (!dev::Engine::Get().EngineAffinity(&cpus)) return WV_NOT_SUPPORTED;
  constexpr int kGroupSize = 8 * sizeof(KAFFINITY);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &cpus)) ++first;
  if (first == CPU_SETSIZE) return WV_NOT_SUPPORTED;
  // The group of the engine's lowest CPU (group 0 on hosts of up to 64 CPUs).
  int base = first - first % kGroupSize;
  KAFFINITY mask = 0;
  for (int cpu = base; cpu < base + kGroupSize && cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &cpus)) mask |= KAFFINITY(1) << (cpu - base);
  *group = USHORT(base / kGroupSize);
  *affinity = mask;
  return WV_SUCCESS;
}

HRESULT Device::QueryPort(UINT8 port, WV_PORT_ATTRIBUTES* attributes) {
  if (port != 1 || !attributes) return WV_INVALID_PARAMETER;
  *attributes = {};
  attributes->State = WvPortActive;
  attributes->MaxMtu = attributes->ActiveMtu = 4096;
  attributes->GidTableLength = 1;
  attributes->PkeyTableLength = 1;
  attributes->Transport =
      device_->transport() == dev::Transport::Iwarp ? WvPortTransportIwarp : WvPortTransportRdmaoe;
  return WV_SUCCESS;
}

HRESULT Device::CreateCompletionQueue(HANDLE file, SIZE_T* entries, IWVCompletionQueue** cq) {
  if (!entries || !cq) return WV_INVALID_PARAMETER;
  if (*entries == 0 || *entries > device_->attributes().max_cq_entries) return WV_INVALID_PARAMETER;
  base::HandleRef retained = RetainedFile(file);
  if (!retained) return WV_INVALID_HANDLE;
  *cq = new CompletionQueue(this, std::move(retained), *entries);
  return WV_SUCCESS;
}

HRESULT Device::AllocateProtectionDomain(IWVProtectionDomain** pd) {
  if (!pd) return WV_INVALID_PARAMETER;
  *pd = new ProtectionDomain(this);
  return WV_SUCCESS;
}

}  // namespace ndwv::wv

HRESULT WvGetObject(REFIID riid, LPVOID* object) {
  if (!object) return WV_INVALID_PARAMETER;
  *object = nullptr;
  if (!(riid == IID_IWVProvider)) return E_NOINTERFACE;
  if (!ndwv::base::LoadSettings()) return WV_NOT_INITIALIZED;  // a refused NDWV_ setting
  *object = static_cast<IWVProvider*>(new ndwv::wv::Provider());
  return WV_SUCCESS;
}
