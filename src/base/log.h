// Logging: one line per event to stderr, off below the configured level and cheap when off
// (the level test is one load and compare before any formatting).
#pragma once
#include <atomic>
#include <cstdint>

namespace ndwv::base {

enum class LogLevel { Error = 0, Warn, Info, Debug, Trace };

extern std::atomic<int> g_log_level;

void LogWrite(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

// Lets one line a second through (by the caller's clock, in milliseconds): a peer that floods
// is counted by its counter, not logged line by line. Thread-safe.
class LogRateLimit {
 public:
  bool Allow(uint64_t now_ms) {
    uint64_t next = next_ms_.load(std::memory_order_relaxed);
    return now_ms >= next && next_ms_.compare_exchange_strong(next, now_ms + 1000, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint64_t> next_ms_{0};
};

}  // namespace ndwv::base

#define NDWV_LOG(level, ...)                                                              \
  do {                                                                                    \
    if (int(::ndwv::base::LogLevel::level) <= ::ndwv::base::g_log_level.load(std::memory_order_relaxed)) \
      ::ndwv::base::LogWrite(::ndwv::base::LogLevel::level, __VA_ARGS__);                 \
  } while (0)
