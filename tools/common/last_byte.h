// The last-byte protocol of the RDMA Write ping-pongs (ndrpingpong, nd1rpingpong): the writer
// marks the last byte of a transfer, and the reader, which relies on in-order placement, spins on
// that byte alone.
#pragma once

#include <atomic>

namespace ndtool {

// Marks of the last byte: ping and pong, in the warm-up and in the measured rounds.
struct Marks {
  char ping, pong;
};
constexpr Marks kWarmupMarks{'A', 'B'};
constexpr Marks kTestMarks{'X', 'Y'};

inline char LoadByte(const char* at) {
  char value = *reinterpret_cast<const volatile char*>(at);
  std::atomic_thread_fence(std::memory_order_acquire);  // the rest of the write is visible too
  return value;
}

inline void StoreByte(char* at, char value) {
  std::atomic_thread_fence(std::memory_order_release);
  *reinterpret_cast<volatile char*>(at) = value;
}

}  // namespace ndtool
