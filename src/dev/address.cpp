#include "dev/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include <ndwv/wvstatus.h>

#include "base/fork.h"
#include "base/keyed_hash.h"

namespace ndwv::dev {

uint16_t PortOf(const sockaddr_storage& a) {
  return ntohs(a.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(a).sin6_port
                                       : reinterpret_cast<const sockaddr_in&>(a).sin_port);
}

void SetPort(sockaddr_storage& a, uint16_t port) {
  if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(a).sin6_port = htons(port);
  else reinterpret_cast<sockaddr_in&>(a).sin_port = htons(port);
}

sockaddr_storage HostOf(const sockaddr_storage& a) {
  sockaddr_storage host = a;
  SetPort(host, 0);
  return host;
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

bool IsWildcard(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr == htonl(INADDR_ANY);
  return a.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr);
}

bool IsLoopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr) >> 24) == IN_LOOPBACKNET;
  if (a.ss_family != AF_INET6) return false;
  const in6_addr& in6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&in6) || (IN6_IS_ADDR_V4MAPPED(&in6) && in6.s6_addr[12] == IN_LOOPBACKNET);
}

bool RouteSource(const sockaddr_storage& peer, sockaddr_storage* local) {
  int fd = base::OpenSocket(peer.ss_family, SOCK_DGRAM | SOCK_CLOEXEC);
  if (fd < 0) return false;
  socklen_t len = sizeof *local;
  bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&peer), AddressLength(peer)) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(local), &len) == 0;
  base::CloseDescriptor(fd);
  SetPort(*local, 0);
  return ok;
}

PackedAddress PackedAddress::Of(const sockaddr_storage& a) {
  PackedAddress packed;
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    memcpy(packed.ip, &in.sin_addr, sizeof in.sin_addr);
    packed.port = in.sin_port;
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    memcpy(packed.ip, &in6.sin6_addr, sizeof in6.sin6_addr);
    packed.port = in6.sin6_port;
  } else {
    return packed;
  }
  packed.family = a.ss_family;
  return packed;
}

size_t AddressHash(const sockaddr_storage& a) { return base::KeyedHasher()(PackedAddress::Of(a)); }

std::string Describe(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, host, sizeof host);
  if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, host, sizeof host);
  return std::string(host) + ":" + std::to_string(PortOf(a));
}

namespace {

void SetReuseAddress(int fd, int on) { setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on); }

bool OutOfResources(int error) { return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM; }

int32_t BindError(int error, bool ephemeral) {
  if (error == EADDRINUSE) return ephemeral ? WV_TOO_MANY_ADDRESSES : WV_SHARING_VIOLATION;
  return OutOfResources(error) ? WV_INSUFFICIENT_RESOURCES : WV_INVALID_ADDRESS;
}

// bind() and, for port 0, the port the kernel chose read back into `local`.
int32_t BindAndReadBack(int fd, sockaddr_storage& local) {
  bool ephemeral = PortOf(local) == 0;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&local), AddressLength(local)) != 0)
    return BindError(errno, ephemeral);
  if (ephemeral) {
    socklen_t length = sizeof local;
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
  }
  return WV_SUCCESS;
}

}  // namespace

int32_t BindUdpPort(int fd, sockaddr_storage& local) { return BindAndReadBack(fd, local); }

int32_t PortClaim::Take(const sockaddr_storage& local) {
  Drop();
  sockaddr_un name{};
  name.sun_family = AF_UNIX;
  // sun_path[0] = 0: the abstract namespace, where nothing is left behind in the file system.
  int length = snprintf(name.sun_path + 1, sizeof name.sun_path - 1, "ndwv tcp port %s", Describe(local).c_str());
  socklen_t size = socklen_t(offsetof(sockaddr_un, sun_path) + 1 + length);
  int fd = base::OpenSocket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC);
  if (fd < 0) return WV_INSUFFICIENT_RESOURCES;
  if (bind(fd, reinterpret_cast<const sockaddr*>(&name), size) != 0) {
    int error = errno;
    base::CloseDescriptor(fd);
    return error == EADDRINUSE ? WV_SHARING_VIOLATION : WV_INSUFFICIENT_RESOURCES;
  }
  fd_ = fd;
  return WV_SUCCESS;
}

void PortClaim::Drop() {
  if (fd_ >= 0) base::CloseDescriptor(fd_);
  fd_ = -1;
}

int32_t BindTcpPort(int fd, sockaddr_storage& local, PortClaim& claim) {
  if (PortOf(local) == 0) {
    // Nothing to bind: connect() or listen() picks the address and port the same way, without
    // the two system calls.
    if (IsWildcard(local)) return WV_SUCCESS;
    int on = 1;
    if (setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof on) != 0) return BindAndReadBack(fd, local);
    // The port is chosen at connect() or listen(): a read-back now would find it still 0.
    return bind(fd, reinterpret_cast<const sockaddr*>(&local), AddressLength(local)) == 0 ? WV_SUCCESS
                                                                                          : BindError(errno, true);
  }
  // A retry of a failed Connect binds a new socket to the port its endpoint still holds.
  if (!claim.held())
    if (int32_t status = claim.Take(local); status != WV_SUCCESS) return status;
  SetReuseAddress(fd, 1);
  int32_t status = BindAndReadBack(fd, local);
  if (status != WV_SUCCESS) claim.Drop();
  return status;
}

void ReleaseTcpPort(int fd) { SetReuseAddress(fd, 1); }

}  // namespace ndwv::dev
