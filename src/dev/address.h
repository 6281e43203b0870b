// Socket addresses as the device uses them: ports, printing, and binding in the ND port range.
#pragma once
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace ndwv::dev {

uint16_t PortOf(const sockaddr_storage& a);
void SetPort(sockaddr_storage& a, uint16_t port);
socklen_t AddressLength(const sockaddr_storage& a);  // of its family; 0 if neither IPv4 nor IPv6
bool SameAddress(const sockaddr_storage& a, const sockaddr_storage& b);  // address and port
size_t AddressHash(const sockaddr_storage& a);  // equal for SameAddress addresses
std::string Describe(const sockaddr_storage& a);  // "addr:port"

// Binds fd to `local`. Port 0 means a port of the ND ephemeral range (49152-65535), tried from a
// random start, written back into `local`. Returns a WV status: WV_SHARING_VIOLATION when the
// port is taken, WV_TOO_MANY_ADDRESSES when the range is exhausted, WV_INVALID_ADDRESS otherwise.
int32_t BindNdPort(int fd, sockaddr_storage& local);

// BindNdPort for a TCP socket, where a port is in use while a live socket holds it, as an RDMA
// NIC sees its own ports: closed connections lingering in TIME_WAIT do not count. Those are taken
// over (explicit port), or used only when no port of the range is free (port 0). A live socket
// holds its port alone: another Bind to it gets WV_SHARING_VIOLATION, in this process or another.
int32_t BindNdTcpPort(int fd, sockaddr_storage& local);
// Called before a TCP socket sends its FIN (shutdown or close), so that the TIME_WAIT it may
// leave does not keep a later BindNdTcpPort off the port.
void ReleaseTcpPort(int fd);

}  // namespace ndwv::dev
