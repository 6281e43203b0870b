#include "dev/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <ndwv/wvstatus.h>

namespace ndwv::dev {

uint16_t PortOf(const sockaddr_storage& a) {
  return ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(a).sin6_port
                                       : reinterpret_cast<const sockaddr_in&>(a).sin_port);
}

void SetPort(sockaddr_storage& a, uint16_t port) {
  if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(a).sin6_port = htons(port);
  else reinterpret_cast<sockaddr_in&>(a).sin_port = htons(port);
}

socklen_t AddressLength(const sockaddr_storage& a) {
  return a.ss_family == AF_INET ? sizeof(sockaddr_in) : a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : 0;
}

bool SameAddress(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family || PortOf(a) != PortOf(b)) return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  if (a.ss_family == AF_INET6)
    return memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                  &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, sizeof(in6_addr)) == 0;
  return false;
}

size_t AddressHash(const sockaddr_storage& a) {
  // FNV-1a over what SameAddress compares.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&](const void* data, size_t n) {
    for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(data)[i]) * 0x100000001b3ull;
  };
  uint16_t port = PortOf(a);
  mix(&a.ss_family, sizeof a.ss_family);
  mix(&port, sizeof port);
  if (a.ss_family == AF_INET) mix(&reinterpret_cast<const sockaddr_in&>(a).sin_addr, sizeof(in_addr));
  if (a.ss_family == AF_INET6) mix(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, sizeof(in6_addr));
  return size_t(h);
}

std::string Describe(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, host, sizeof host);
  if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(PortOf(a));
}

namespace {

constexpr uint16_t kFirstEphemeral = 49152;
constexpr uint32_t kEphemeralCount = 65536 - kFirstEphemeral;

void SetReuseAddress(int fd, int on) { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on); }

// bind(); with `take_time_wait`, when the port is taken, once more with SO_REUSEADDR. Linux grants
// that only if every other socket on the port has SO_REUSEADDR too and none listens: connections
// in TIME_WAIT that ReleaseTcpPort marked, never a live connector of ours (the flag is cleared
// again once bound; a listener sets it, but listening holds the port anyway).
bool TryBind(int fd, sockaddr_storage& local, bool take_time_wait) {
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&local);
  if (bind(fd, address, AddressLength(local)) == 0) return true;
  if (!take_time_wait || errno != EADDRINUSE) return false;
  SetReuseAddress(fd, 1);
  bool bound = bind(fd, address, AddressLength(local)) == 0;
  int error = errno;
  SetReuseAddress(fd, 0);
  errno = error;
  return bound;
}

// One sweep of the ephemeral range from `start`: the first port that binds.
bool BindEphemeral(int fd, sockaddr_storage& local, uint32_t start, bool take_time_wait) {
  for (uint32_t i = 0; i < kEphemeralCount; ++i) {
    SetPort(local, uint16_t(kFirstEphemeral + (start + i) % kEphemeralCount));
    if (TryBind(fd, local, take_time_wait)) return true;
    if (errno != EADDRINUSE) return false;
  }
  return false;
}

int32_t Bind(int fd, sockaddr_storage& local, bool tcp) {
  if (PortOf(local) != 0) {
    if (TryBind(fd, local, tcp)) return WV_SUCCESS;
    return errno == EADDRINUSE ? WV_SHARING_VIOLATION : WV_INVALID_ADDRESS;
  }
  static thread_local std::minstd_rand random{std::random_device{}()};
  uint32_t start = random() % kEphemeralCount;
  // A free port first: on a port in TIME_WAIT, a connection to the same peer may be refused
  // (the address pair lingers).
  if (BindEphemeral(fd, local, start, false)) return WV_SUCCESS;
  if (tcp && errno == EADDRINUSE && BindEphemeral(fd, local, start, true)) return WV_SUCCESS;
  int32_t status = errno == EADDRINUSE ? WV_TOO_MANY_ADDRESSES : WV_INVALID_ADDRESS;
  SetPort(local, 0);
  return status;
}

}  // namespace

int32_t BindNdPort(int fd, sockaddr_storage& local) { return Bind(fd, local, false); }

int32_t BindNdTcpPort(int fd, sockaddr_storage& local) { return Bind(fd, local, true); }

void ReleaseTcpPort(int fd) { SetReuseAddress(fd, 1); }

}  // namespace ndwv::dev
