// Unpredictable numbers from the kernel's CSPRNG (getrandom), for values a peer must not guess
// (memory keys). Drawn in batches: one system call serves many values.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ndwv::base {

// Not thread-safe: its owner serializes the calls (a protection domain under its table lock).
// A forked child has no device, so a pool copied into it is never drawn from again.
class SecureRandom {
 public:
  // False only if the kernel gave nothing (getrandom unavailable): nothing predictable is made up.
  bool Next(uint32_t* out);

 private:
  static constexpr size_t kBatch = 64;
  uint32_t values_[kBatch];
  size_t left_ = 0;
};

}  // namespace ndwv::base
