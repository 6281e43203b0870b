// The last-byte protocol of the RDMA Write ping-pongs (ndrpingpong, nd1rpingpong): the writer
// marks the last byte of a transfer, and the reader, which relies on in-order placement, spins on
// that byte alone.
#pragma once

#include <atomic>
#include <cstdio>

#include "tool.h"

namespace ndtool {

// Marks of the last byte: ping and pong, in the warm-up and in the measured rounds.
struct Marks {
  char ping, pong;
};
constexpr Marks kWarmupMarks{'A', 'B'};
constexpr Marks kTestMarks{'X', 'Y'};

// Atomic accesses that carry their order (the rest of the write is visible too), not fences
// around volatile ones: the same instructions, and ThreadSanitizer sees the order.
inline char LoadByte(const char* at) {
  return std::atomic_ref<char>(*const_cast<char*>(at)).load(std::memory_order_acquire);
}

inline void StoreByte(char* at, char value) {
  std::atomic_ref<char>(*at).store(value, std::memory_order_release);
}

// The rounds, over an endpoint of either version. Ep has:
//   char* data()                              the buffer the peer writes into and we write from
//   bool pollsWhileWaiting() const            -p: the CQ is polled while the byte is awaited
//                                             (not with -b, results waited for, nor with -m)
//   void Write(std::size_t size)              posts the RDMA Write of the first `size` bytes
//   void PollWrite(int* writes, const char*)  polls the CQ once; a Write's result found there is
//                                             counted off *writes, anything else fails the tool
//   void ReapWrite(const char* what)          waits for the one Write's result

// Spins until the last byte of a `size` transfer equals `mark`. With -p the CQ is polled on the
// way (drives a busy-polling provider's progress); a Write's result seen there counts in *writes.
// With -m only the memory is watched, as Microsoft's ndrpingpong and MPI eager protocols do.
template <class Ep>
void AwaitByte(Ep& ep, std::size_t size, char mark, int* writes, const char* what) {
  const char* last = ep.data() + size - 1;
  SpinDeadline deadline(WaitTimeoutMs());
  while (LoadByte(last) != mark) {
    if (ep.pollsWhileWaiting()) ep.PollWrite(writes, what);
    CpuRelax();
    if (deadline.Expired()) {
      std::printf("  (size %zu: byte %zu is 0x%02x, waiting for '%c')\n", size, size - 1,
                  unsigned(static_cast<unsigned char>(LoadByte(last))), mark);
      FailTimeout(what, deadline.timeoutMs(), __LINE__);
    }
  }
}

// Client: last byte := ping mark, write, wait for the pong mark, reap the write.
template <class Ep>
void Ping(Ep& ep, std::size_t size, Marks marks) {
  StoreByte(ep.data() + size - 1, marks.ping);
  ep.Write(size);
  int writes = 1;
  AwaitByte(ep, size, marks.pong, &writes, "Waiting for the pong write");
  if (writes != 0) ep.ReapWrite("RDMA Write");
}

// Server: wait for the ping mark, answer with the pong mark, reap the write. Any other result
// meanwhile (the client's terminate) means that the two schedules differ.
template <class Ep>
void Pong(Ep& ep, std::size_t size, Marks marks) {
  int writes = 0;
  AwaitByte(ep, size, marks.ping, &writes, "Waiting for the ping write");
  StoreByte(ep.data() + size - 1, marks.pong);
  ep.Write(size);
  ep.ReapWrite("RDMA Write (pong)");
}

}  // namespace ndtool
