// Socket-address chores of the ND provider: argument validation with the SPI's statuses, the
// "size in, size out" return protocol, and the list of host addresses an RDMA device serves.
#pragma once

#include <ndwv/ndspi.h>
#include <ndwv/winverbs.h>

#include <vector>

namespace ndwv::nd {

// ND_INVALID_PARAMETER_n for argument n (1..10), counted as the SPI counts them.
constexpr HRESULT InvalidParameter(int n) { return ND_INVALID_PARAMETER_1 + (n - 1); }

// Bytes of a sockaddr of this family; 0 for families ND does not use.
ULONG SockaddrLength(int family);

// Validates an address argument at position `n` whose length is argument `lengthArg` (by default
// n + 1: the SPI passes them side by side): NULL → _n; a length shorter than a sockaddr, longer
// than a ULONG, or short for its family → _lengthArg; a family other than IPv4/IPv6 →
// ND_INVALID_ADDRESS.
HRESULT CheckSockaddr(const sockaddr* address, SIZE_T length, int n, int lengthArg = 0);

// A copy of a validated address (any port kept).
WV_SOCKADDR CopySockaddr(const sockaddr* address);
// The same address with port 0: what identifies an adapter.
WV_SOCKADDR WithoutPort(const sockaddr* address);
// The port of an IPv4 or IPv6 address, and setting it; network order both.
USHORT PortOf(const WV_SOCKADDR& address);
void SetPort(WV_SOCKADDR* address, USHORT port);
// 0.0.0.0 or ::.
bool IsUnspecified(const sockaddr* address);
// Same family and IP (ports ignored).
bool SameIp(const sockaddr* a, const sockaddr* b);

// Returns an address by the size protocol: *pcb too small (or `out` NULL) → ND_BUFFER_OVERFLOW
// with the size needed and `out` untouched; otherwise copies it and sets *pcb to its size.
HRESULT ReturnSockaddr(const sockaddr* address, sockaddr* out, ULONG* pcb);

// The host's IPv4 and IPv6 addresses (loopback included) that `wv` maps to an RDMA device —
// to `device` only, when given.
std::vector<WV_SOCKADDR> ServedAddresses(IWVProvider* wv, const NET64* device = nullptr);

// Bytes a SOCKET_ADDRESS_LIST of these addresses takes: header, array, then the sockaddrs.
SIZE_T AddressListSize(const std::vector<WV_SOCKADDR>& addresses);
// Lays the list out in `list` (which has AddressListSize bytes): the sockaddrs follow the array
// and the array points at them, so the buffer is self-contained.
void WriteAddressList(const std::vector<WV_SOCKADDR>& addresses, SOCKET_ADDRESS_LIST* list);

// The address-list size protocol shared by IND2Provider, IND2Adapter and NdQueryAddressList
// (Size is ULONG or SIZE_T): no address → ND_SUCCESS with *pcb = 0; a NULL or short buffer →
// ND_BUFFER_OVERFLOW with the size needed, buffer untouched; else the list and its size.
template <class Size>
HRESULT ReturnAddressList(const std::vector<WV_SOCKADDR>& addresses, SOCKET_ADDRESS_LIST* list,
                          Size* pcb) {
  if (addresses.empty()) {
    if (list != nullptr && *pcb >= offsetof(SOCKET_ADDRESS_LIST, Address)) list->iAddressCount = 0;
    *pcb = 0;
    return ND_SUCCESS;
  }
  SIZE_T needed = AddressListSize(addresses);
  if (list == nullptr || *pcb < needed) {
    *pcb = Size(needed);
    return ND_BUFFER_OVERFLOW;
  }
  WriteAddressList(addresses, list);
  *pcb = Size(needed);
  return ND_SUCCESS;
}

// The local address the host would send from to reach `remote` (port 0): a UDP socket is
// connected to it, which consults the routing table without sending anything.
// ND_NETWORK_UNREACHABLE / ND_HOST_UNREACHABLE when there is no route, ND_UNSUCCESSFUL otherwise.
HRESULT RouteSource(const sockaddr* remote, WV_SOCKADDR* local);

}  // namespace ndwv::nd
