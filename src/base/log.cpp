#include "base/log.h"

#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <unistd.h>

namespace ndwv::base {

std::atomic<int> g_log_level{int(LogLevel::Error)};

void LogWrite(LogLevel level, const char* format, ...) {
  static const char* const names[] = {"error", "warn", "info", "debug", "trace"};
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  char line[1024];
  int n = snprintf(line, sizeof line, "%lld.%06ld ndwv[%d] %s: ", (long long)now.tv_sec,
                   now.tv_nsec / 1000, int(getpid()), names[int(level)]);
  va_list args;
  va_start(args, format);
  n += vsnprintf(line + n, sizeof line - n - 1, format, args);
  va_end(args);
  if (n > int(sizeof line) - 2) n = sizeof line - 2;
  line[n++] = '\n';
  (void)!write(STDERR_FILENO, line, n);  // one write per line: lines of threads don't interleave
}

}  // namespace ndwv::base
