// Socket addresses as the device uses them: ports, printing, and binding with ND's port rules.
#pragma once
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace ndwv::dev {

uint16_t PortOf(const sockaddr_storage& a);
void SetPort(sockaddr_storage& a, uint16_t port);
sockaddr_storage HostOf(const sockaddr_storage& a);  // `a` with port 0: a key for tables by peer host
socklen_t AddressLength(const sockaddr_storage& a);  // of its family; 0 if neither IPv4 nor IPv6
bool SameAddress(const sockaddr_storage& a, const sockaddr_storage& b);  // address and port
bool IsWildcard(const sockaddr_storage& a);  // INADDR_ANY or in6addr_any
bool IsLoopback(const sockaddr_storage& a);  // 127.0.0.0/8, ::1 or ::ffff:127.0.0.0/104
// The local address the host would send to `peer` from (port 0); false if it has no route.
bool RouteSource(const sockaddr_storage& peer, sockaddr_storage* local);
size_t AddressHash(const sockaddr_storage& a);  // equal for SameAddress addresses

// An address and port in 20 bytes, equal when SameAddress says so: for what is kept per
// connection and read per packet, where a sockaddr_storage (128 bytes, over two cache lines)
// costs a miss of its own.
struct PackedAddress {
  uint8_t ip[16] = {};  // IPv6, or IPv4 in the first 4 bytes
  uint16_t port = 0;    // network order
  uint16_t family = 0;  // AF_INET, AF_INET6, or 0 for neither
  static PackedAddress Of(const sockaddr_storage& a);
  bool operator==(const PackedAddress&) const = default;
};
std::string Describe(const sockaddr_storage& a);  // "addr:port"

// Binds a UDP socket to `local`. Port 0: a port the kernel picks from its ephemeral range
// (net.ipv4.ip_local_port_range), written back into `local`. Returns a WV status:
// WV_SHARING_VIOLATION when the port is taken, WV_TOO_MANY_ADDRESSES when no port is free,
// WV_INSUFFICIENT_RESOURCES when the process is out of descriptors or memory, WV_INVALID_ADDRESS
// otherwise.
int32_t BindUdpPort(int fd, sockaddr_storage& local);

// An explicit TCP port held by one ND object of the host (of its network namespace), in this
// process or another: a name in the abstract socket namespace, which the kernel frees the moment
// its holder closes it or its process ends, however it ends. The kernel cannot say which sockets
// on a port are live ND objects and which are closed connections lingering in TIME_WAIT once
// both allow sharing the port (SO_REUSEADDR): the claim says it.
class PortClaim {
 public:
  PortClaim() = default;
  PortClaim(const PortClaim&) = delete;
  PortClaim& operator=(const PortClaim&) = delete;
  ~PortClaim() { Drop(); }
  // WV_SUCCESS, WV_SHARING_VIOLATION (another ND object holds `local`), or
  // WV_INSUFFICIENT_RESOURCES.
  int32_t Take(const sockaddr_storage& local);
  void Drop();
  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Binds a TCP socket for an ND object, with the ports an RDMA NIC has: a port is in use while a
// live socket holds it; closed connections lingering in TIME_WAIT do not count.
// * An explicit port: `claim` takes it (another ND object's Bind to it gets
//   WV_SHARING_VIOLATION, in this process or another), and the socket is bound with
//   SO_REUSEADDR for its whole life, so that neither the TIME_WAIT leftovers of earlier
//   connections nor the ones it leaves itself, however its process ends, keep the port from the
//   next Bind. A program outside ndwv that holds the port refuses the Bind (WV_SHARING_VIOLATION)
//   unless it allows sharing too and does not listen.
// * Port 0: only the address is bound (IP_BIND_ADDRESS_NO_PORT; a wildcard address is not bound
//   at all, which comes to the same); the kernel picks the port at connect(), by the whole
//   address pair (a port serves connections to different peers, and the TIME_WAIT of an earlier
//   connection to another peer does not block it), or at listen(). The socket shares nothing
//   while it lives; ReleaseTcpPort lets its TIME_WAIT go.
// Returns what BindUdpPort does.
int32_t BindTcpPort(int fd, sockaddr_storage& local, PortClaim& claim);
// Called before a TCP socket sends its FIN (shutdown or close), so that the TIME_WAIT it may
// leave does not keep a later BindTcpPort off the port.
void ReleaseTcpPort(int fd);

}  // namespace ndwv::dev
