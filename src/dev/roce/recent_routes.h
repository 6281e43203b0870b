// The IB path MTU codes a shared port found lately, by peer host.
#pragma once
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "base/mutex.h"
#include "dev/address.h"

namespace ndwv::dev::roce {

// A shared port's connections with one host (a listener's, or its connectors'; most of them, in
// an MPI job) ask the kernel for the route once a second, not once each (a probe socket is four
// system calls, a flow's read one). A connection's MTU is fixed when it is set up, so a route's
// change is missed for at most that second, as it is for good by the connections set up before
// it. A fixed table, one entry per hash of the address: whatever peers come, it holds no more.
class RecentRoutes {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kLifetime = std::chrono::seconds(1);

  std::optional<uint8_t> Find(const sockaddr_storage& peer) {
    const sockaddr_storage host = HostOf(peer);
    base::MutexLock lock(mutex_);
    const Entry& e = entries_[SlotOf(host)];
    if (e.until <= Clock::now() || !SameAddress(e.host, host)) return std::nullopt;
    return e.code;
  }
  void Remember(const sockaddr_storage& peer, uint8_t code) {
    const sockaddr_storage host = HostOf(peer);
    base::MutexLock lock(mutex_);
    entries_[SlotOf(host)] = {host, code, Clock::now() + kLifetime};
  }

 private:
  static size_t SlotOf(const sockaddr_storage& host) { return AddressHash(host) % kEntries; }
  struct Entry {
    sockaddr_storage host{};  // port 0
    uint8_t code = 0;
    Clock::time_point until{};
  };
  static constexpr size_t kEntries = 64;
  base::Mutex mutex_{"roce::RecentRoutes::mutex_"};
  Entry entries_[kEntries] NDWV_GUARDED_BY(mutex_);
};

}  // namespace ndwv::dev::roce
