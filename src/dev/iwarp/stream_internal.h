// What the two directions of an iWARP stream (stream_tx.cpp, stream_rx.cpp) share besides the
// class: the STags of our Read Requests and probes, and how TCP says the peer stopped answering.
// Private to src/dev/iwarp/stream*.cpp.
#pragma once

#include <cerrno>
#include <cstdint>

namespace ndwv::dev::iwarp::stream_internal {

// How TCP ends a connection whose peer stopped answering (NDWV_IWARP_TIMEOUT_MS): ETIMEDOUT, or
// the soft error it met meanwhile (no route, or no neighbour, while the link is down).
inline bool NoAnswer(int error) { return error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH; }

// The STag a Read Request names as its sink: our own tag for the request's send queue position,
// so the response lands in the request's SGE list (which needs no remote rights) and MR keys
// (top byte never 0xFF) cannot be confused with it.
inline constexpr uint32_t kSinkStagTag = 0xFF000000u;
inline uint32_t SinkStag(uint64_t position) { return kSinkStagTag | uint32_t(position & 0xFFFFFF); }
// Probes (zero-length Reads confirming Writes) carry their own tag.
inline constexpr uint32_t kProbeStagTag = 0xFE000000u;
inline uint32_t ProbeStag(uint32_t seq) { return kProbeStagTag | (seq & 0xFFFFFF); }

}  // namespace ndwv::dev::iwarp::stream_internal
