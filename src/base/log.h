// Logging: one line per event to stderr, off below the configured level and cheap when off
// (the level test is one load and compare before any formatting).
#pragma once
#include <atomic>

namespace ndwv::base {

enum class LogLevel { Error = 0, Warn, Info, Debug, Trace };

extern std::atomic<int> g_log_level;

void LogWrite(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace ndwv::base

#define NDWV_LOG(level, ...)                                                              \
  do {                                                                                    \
    if (int(::ndwv::base::LogLevel::level) <= ::ndwv::base::g_log_level.load(std::memory_order_relaxed)) \
      ::ndwv::base::LogWrite(::ndwv::base::LogLevel::level, __VA_ARGS__);                 \
  } while (0)
