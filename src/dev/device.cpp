#include "dev/device.h"

#include <netinet/in.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>

#include <ndwv/wvstatus.h>

#include "base/fork.h"
#include "base/mutex.h"
#include "base/settings.h"
#include "dev/iwarp/endpoint.h"
#include "dev/roce/endpoint.h"

namespace ndwv::dev {

Device::Device(uint64_t guid, Transport transport, const char* name)
    : guid_(guid), transport_(transport), name_(name) {
  attributes_.max_mr_size = uint64_t(1) << 40;
  // As deep as an RNIC's (mlx4: 16,351). Programs take the maximum as their depth and some count
  // on it being large: Microsoft's ndping grants its peer (depth - 1) / 2 credits per depth / 2
  // receives, one short each time, and at 4,096 stalls after 2^22 messages, in its 256-byte round.
  attributes_.max_qp_wr = 16384;
  attributes_.max_sge = kMaxSge;
  attributes_.max_cq_entries = 65536;
  attributes_.max_inline = kMaxInline;
  attributes_.max_ird = kMaxReadLimit;
  attributes_.max_ord = kMaxReadLimit;
  attributes_.max_srq_wr = 4096;
  attributes_.max_srq_sge = kMaxSge;
  attributes_.max_transfer_length = kMaxTransferLength;
  attributes_.max_private_data = kMaxPrivateData;
  // iWARP: one TCP stream, placed front to back. RoCE: packets are placed in PSN order too.
  attributes_.in_order_placement = true;
  attributes_.cq_resize = true;
}

const std::vector<Device*>& Device::All() {
  // Never destroyed, as no static object of the library is: a program's exit runs the static
  // destructors while its other threads, and the engine, still call in (base/settings.h).
  static const std::vector<Device*>& devices = *new std::vector<Device*>([] {
    std::vector<Device*> list;
    const base::Settings* settings = base::LoadSettings();
    if (!settings) return list;
    // "ndwv" in ASCII, then the transport: stable ids, so a saved adapter id stays valid.
    static Device& iwarp = *new Device(0x6e6477760000'0001ull, Transport::Iwarp, "ndwv-iwarp");
    static Device& roce = *new Device(0x6e6477760000'0002ull, Transport::Roce, "ndwv-roce");
    // "a+b": a first. Every address of the host is served by the first device (see DESIGN.md).
    const std::string& order = settings->transports;
    for (size_t at = 0; at < order.size();) {
      size_t end = std::min(order.find('+', at), order.size());
      std::string name = order.substr(at, end - at);
      list.push_back(name == "roce" ? &roce : &iwarp);
      at = end + 1;
    }
    std::vector<Transport> transports;
    for (Device* device : list) transports.push_back(device->transport());
    StartCounterReports(transports);  // NDWV_COUNTERS
    return list;
  }());
  return devices;
}

Device* Device::Find(uint64_t guid) {
  for (Device* device : All())
    if (device->guid() == guid) return device;
  return nullptr;
}

namespace {

// The addresses found to be the host's in the last second: an application that binds a connector
// per connection asks about the same address thousands of times, and each probe costs a socket,
// a bind (a UDP port search) and a close. Only success is remembered: an address removed
// meanwhile still fails the connector's own bind, with the same status.
class ServedAddressCache {
 public:
  bool Holds(const sockaddr_storage& address, socklen_t length) {
    base::MutexLock lock(mutex_);
    const Clock::time_point now = Clock::now();
    for (const Entry& e : entries_)
      if (e.length == length && now < e.until && memcmp(&e.address, &address, length) == 0) return true;
    return false;
  }
  void Add(const sockaddr_storage& address, socklen_t length) {
    base::MutexLock lock(mutex_);
    Entry& e = entries_[next_++ % entries_.size()];
    e.address = address;
    e.length = length;
    e.until = Clock::now() + std::chrono::seconds(1);
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    sockaddr_storage address{};
    socklen_t length = 0;
    Clock::time_point until{};
  };
  base::Mutex mutex_{"ServedAddressCache::mutex_"};
  std::array<Entry, 4> entries_ NDWV_GUARDED_BY(mutex_) = {};
  size_t next_ NDWV_GUARDED_BY(mutex_) = 0;
};

ServedAddressCache& ServedAddresses() {
  static ServedAddressCache* const cache = new ServedAddressCache();  // used until exit
  return *cache;
}

}  // namespace

int32_t Device::CheckServedAddress(const sockaddr* address, socklen_t length) {
  if (!address) return WV_INVALID_ADDRESS;
  sockaddr_storage probe{};
  socklen_t need;
  if (address->sa_family == AF_INET) need = sizeof(sockaddr_in);
  else if (address->sa_family == AF_INET6) need = sizeof(sockaddr_in6);
  else return WV_INVALID_ADDRESS;
  if (length < need) return WV_INVALID_ADDRESS;
  memcpy(&probe, address, need);
  // Port 0: only the address matters. Binding succeeds exactly for the host's own addresses.
  if (probe.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(probe).sin_port = 0;
  else reinterpret_cast<sockaddr_in6&>(probe).sin6_port = 0;
  if (ServedAddresses().Holds(probe, need)) return WV_SUCCESS;
  int fd = base::OpenSocket(probe.ss_family, SOCK_DGRAM | SOCK_CLOEXEC);
  if (fd < 0) return WV_INSUFFICIENT_RESOURCES;
  bool ours = bind(fd, reinterpret_cast<sockaddr*>(&probe), need) == 0;
  base::CloseDescriptor(fd);
  if (ours) ServedAddresses().Add(probe, need);
  return ours ? WV_SUCCESS : WV_INVALID_ADDRESS;
}

std::shared_ptr<ConnectEndpoint> Device::CreateEndpoint() const {
  switch (transport_) {
    case Transport::Iwarp: return iwarp::CreateEndpoint();
    case Transport::Roce: return roce::CreateEndpoint();
  }
  return nullptr;
}

}  // namespace ndwv::dev
