// What the hostile-peer tests of both transports share: the bound on their waits, loopback
// addresses, and a listener on a port of the kernel's choosing.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdint>

#include "dev/endpoint.h"

namespace ndwv::dev {

// The bound on every wait.
inline constexpr std::chrono::seconds kBound{5};
inline std::chrono::steady_clock::time_point Deadline() { return std::chrono::steady_clock::now() + kBound; }
inline int RemainingMs(std::chrono::steady_clock::time_point deadline) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  return ms < 0 ? 0 : int(ms);
}

inline sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Binds `endpoint` to a loopback port the kernel chooses and listens there with `backlog`: the
// port (and in `info` what Query says), or 0 if a step failed.
inline uint16_t ListenOnLoopback(ConnectEndpoint& endpoint, int backlog, ConnectionInfo* info = nullptr) {
  sockaddr_in any_port = Loopback(0);
  ConnectionInfo queried;
  if (endpoint.Bind(reinterpret_cast<sockaddr*>(&any_port), sizeof any_port) != WV_SUCCESS ||
      endpoint.Listen(backlog) != WV_SUCCESS || endpoint.Query(&queried) != WV_SUCCESS)
    return 0;
  if (info) *info = queried;
  return ntohs(reinterpret_cast<const sockaddr_in&>(queried.local).sin_port);
}

}  // namespace ndwv::dev
