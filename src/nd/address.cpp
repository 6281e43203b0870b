#include "nd/address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "base/fork.h"

namespace ndwv::nd {

ULONG SockaddrLength(int family) {
  switch (family) {
    case AF_INET: return sizeof(sockaddr_in);
    case AF_INET6: return sizeof(sockaddr_in6);
    default: return 0;
  }
}

HRESULT CheckSockaddr(const sockaddr* address, SIZE_T length, int n, int lengthArg) {
  if (lengthArg == 0) lengthArg = n + 1;
  if (address == nullptr) return InvalidParameter(n);
  if (length < sizeof(sockaddr) || length > std::numeric_limits<ULONG>::max())
    return InvalidParameter(lengthArg);
  ULONG needed = SockaddrLength(address->sa_family);
  if (needed == 0) return ND_INVALID_ADDRESS;
  if (length < needed) return InvalidParameter(lengthArg);
  return ND_SUCCESS;
}

WV_SOCKADDR CopySockaddr(const sockaddr* address) {
  WV_SOCKADDR copy{};
  std::memcpy(&copy, address, SockaddrLength(address->sa_family));
  return copy;
}

WV_SOCKADDR WithoutPort(const sockaddr* address) {
  WV_SOCKADDR copy = CopySockaddr(address);
  SetPort(&copy, 0);
  return copy;
}

USHORT PortOf(const WV_SOCKADDR& address) {
  return address.Sa.sa_family == AF_INET6 ? address.Sin6.sin6_port : address.Sin.sin_port;
}

void SetPort(WV_SOCKADDR* address, USHORT port) {
  if (address->Sa.sa_family == AF_INET) address->Sin.sin_port = port;
  if (address->Sa.sa_family == AF_INET6) address->Sin6.sin6_port = port;
}

bool IsUnspecified(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(address)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (address->sa_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  return false;
}

bool SameIp(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  if (a->sa_family == AF_INET6)
    return IN6_ARE_ADDR_EQUAL(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                              &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr);
  return false;
}

HRESULT ReturnSockaddr(const sockaddr* address, sockaddr* out, ULONG* pcb) {
  ULONG size = SockaddrLength(address->sa_family);
  if (out == nullptr || *pcb < size) {
    *pcb = size;
    return ND_BUFFER_OVERFLOW;
  }
  std::memcpy(out, address, size);
  *pcb = size;
  return ND_SUCCESS;
}

std::vector<WV_SOCKADDR> ServedAddresses(IWVProvider* wv, const NET64* device) {
  std::vector<WV_SOCKADDR> served;
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return served;
  for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || SockaddrLength(i->ifa_addr->sa_family) == 0) continue;
    WV_SOCKADDR address = WithoutPort(i->ifa_addr);
    WV_DEVICE_ADDRESS owner{};
    if (FAILED(wv->TranslateAddress(&address.Sa, &owner))) continue;
    if (device != nullptr && owner.DeviceGuid != *device) continue;
    bool seen = false;  // one address may sit on several interfaces
    for (const WV_SOCKADDR& s : served) seen = seen || SameIp(&s.Sa, &address.Sa);
    if (!seen) served.push_back(address);
  }
  freeifaddrs(interfaces);
  return served;
}

SIZE_T AddressListSize(const std::vector<WV_SOCKADDR>& addresses) {
  SIZE_T size = offsetof(SOCKET_ADDRESS_LIST, Address) + addresses.size() * sizeof(SOCKET_ADDRESS);
  for (const WV_SOCKADDR& a : addresses) size += SockaddrLength(a.Sa.sa_family);
  return size;
}

void WriteAddressList(const std::vector<WV_SOCKADDR>& addresses, SOCKET_ADDRESS_LIST* list) {
  SOCKET_ADDRESS* entries = list->Address;  // really iAddressCount long
  auto* next = reinterpret_cast<BYTE*>(entries + addresses.size());
  list->iAddressCount = INT(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    ULONG size = SockaddrLength(addresses[i].Sa.sa_family);
    std::memcpy(next, &addresses[i], size);
    entries[i].lpSockaddr = reinterpret_cast<sockaddr*>(next);
    entries[i].iSockaddrLength = INT(size);
    next += size;
  }
}

HRESULT RouteSource(const sockaddr* remote, WV_SOCKADDR* local) {
  WV_SOCKADDR target = CopySockaddr(remote);
  // A connect to port 0 is refused; the port plays no part in the route anyway.
  if (target.Sa.sa_family == AF_INET && target.Sin.sin_port == 0) target.Sin.sin_port = htons(9);
  if (target.Sa.sa_family == AF_INET6 && target.Sin6.sin6_port == 0)
    target.Sin6.sin6_port = htons(9);

  int s = base::OpenSocket(target.Sa.sa_family, SOCK_DGRAM | SOCK_CLOEXEC);
  if (s < 0) return ND_UNSUCCESSFUL;
  HRESULT hr = ND_SUCCESS;
  socklen_t length = sizeof(*local);
  if (connect(s, &target.Sa, SockaddrLength(target.Sa.sa_family)) != 0) {
    hr = errno == ENETUNREACH    ? ND_NETWORK_UNREACHABLE
         : errno == EHOSTUNREACH ? ND_HOST_UNREACHABLE
                                 : ND_UNSUCCESSFUL;
  } else if (getsockname(s, &local->Sa, &length) != 0) {
    hr = ND_UNSUCCESSFUL;
  } else {
    *local = WithoutPort(&local->Sa);
  }
  base::CloseDescriptor(s);
  return hr;
}

}  // namespace ndwv::nd
