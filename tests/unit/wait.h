// Bounded waiting for the unit tests: nothing a test waits for may hang it.
#pragma once
#include <chrono>
#include <thread>

namespace ndwv::dev {

// Checks `done` until it holds, every `step`, for at most `bound`; whether it held.
template <class Pred>
bool WaitUntil(Pred done, std::chrono::milliseconds bound = std::chrono::seconds(5),
               std::chrono::microseconds step = std::chrono::milliseconds(1)) {
  auto deadline = std::chrono::steady_clock::now() + bound;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(step);
  }
  return true;
}

}  // namespace ndwv::dev
