#include "dev/endpoint.h"

#include <cstdio>
#include <cstdlib>

#include "base/checked.h"
#include "base/log.h"

namespace ndwv::dev {

void ReportIllegalTransition(Transport transport, const std::string& identity, const char* from, const char* to) {
  if constexpr (base::kCheckedBuild) {
    fprintf(stderr, "ndwv: %s: illegal state change %s -> %s\n", identity.c_str(), from, to);
    abort();
  }
  AdapterCounters(transport).AddShared(Counter::IllegalEndpointTransitions);
  NDWV_LOG(Warn, "%s: illegal state change %s -> %s (made anyway)", identity.c_str(), from, to);
}

}  // namespace ndwv::dev
