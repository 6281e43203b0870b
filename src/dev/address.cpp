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

std::string Describe(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, host, sizeof host);
  if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(PortOf(a));
}

int32_t BindNdPort(int fd, sockaddr_storage& local) {
  constexpr uint16_t kFirst = 49152;
  constexpr uint32_t kCount = 65536 - kFirst;
  socklen_t length = AddressLength(local);
  if (PortOf(local) != 0) {
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), length) == 0) return WV_SUCCESS;
    return errno == EADDRINUSE ? WV_SHARING_VIOLATION : WV_INVALID_ADDRESS;
  }
  static thread_local std::minstd_rand random{std::random_device{}()};
  uint32_t start = random() % kCount;
  for (uint32_t i = 0; i < kCount; ++i) {
    SetPort(local, uint16_t(kFirst + (start + i) % kCount));
    if (bind(fd, reinterpret_cast<sockaddr*>(&local), length) == 0) return WV_SUCCESS;
    if (errno != EADDRINUSE) break;
  }
  int32_t status = errno == EADDRINUSE ? WV_TOO_MANY_ADDRESSES : WV_INVALID_ADDRESS;
  SetPort(local, 0);
  return status;
}

}  // namespace ndwv::dev
