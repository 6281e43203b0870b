// Runs a piece of work on one thread at a time, under its lock, without making callers wait: a
// caller that finds the lock taken leaves a kick for the holder, who looks for one after it
// unlocks and goes round again. The uncontended call costs a try-lock and two loads, no other
// read-modify-write. (The iWARP stream's transmit and its receive path; rxe's task runner plays
// the same part.)
#pragma once
#include <atomic>
#include <cstdint>

#include "base/mutex.h"

namespace ndwv::base {

class KickedRunner {
 public:
  // Runs `work` with `mutex` held, now or by the thread that holds it. `work` returns false to
  // end without looking for kicks (what it found is for its caller to act on after the lock).
  template <class Work>
  void Run(Mutex& mutex, Work&& work) NDWV_EXCLUDES(mutex) {
    bool kicked = false;
    for (;;) {
      if (!mutex.try_lock()) {
        if (kicked) return;
        kicks_.fetch_add(1, std::memory_order_acq_rel);
        kicked = true;
        continue;  // the holder may have unlocked before it saw our kick: try once more
      }
      uint64_t seen = kicks_.load(std::memory_order_acquire);
      bool again = work();
      mutex.unlock();
      if (!again || kicks_.load(std::memory_order_acquire) == seen) return;
    }
  }

 private:
  std::atomic<uint64_t> kicks_{0};
};

}  // namespace ndwv::base
