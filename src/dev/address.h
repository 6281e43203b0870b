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
std::string Describe(const sockaddr_storage& a);  // "addr:port"

// Binds fd to `local`. Port 0 means a port of the ND ephemeral range (49152-65535), tried from a
// random start, written back into `local`. Returns a WV status: WV_SHARING_VIOLATION when the
// port is taken, WV_TOO_MANY_ADDRESSES when the range is exhausted, WV_INVALID_ADDRESS otherwise.
int32_t BindNdPort(int fd, sockaddr_storage& local);

}  // namespace ndwv::dev
