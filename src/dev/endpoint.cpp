#include "dev/endpoint.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "base/checked.h"
#include "base/log.h"

namespace ndwv::dev {

int HostBacklog() {
  static const int backlog = [] {
    unsigned long value = 0;
    FILE* f = std::fopen("/proc/sys/net/core/somaxconn", "re");
    bool read = f && std::fscanf(f, "%lu", &value) == 1 && value > 0;
    if (f) std::fclose(f);
    return read ? int(std::min<unsigned long>(value, 1 << 16)) : 4096;
  }();
  return backlog;
}

void ReportIllegalTransition(Transport transport, const std::string& identity, const char* from, const char* to) {
  if constexpr (base::kCheckedBuild) {
    fprintf(stderr, "ndwv: %s: illegal state change %s -> %s\n", identity.c_str(), from, to);
    abort();
  }
  AdapterCounters(transport).AddShared(Counter::IllegalEndpointTransitions);
  NDWV_LOG(Warn, "%s: illegal state change %s -> %s (made anyway)", identity.c_str(), from, to);
}

}  // namespace ndwv::dev
