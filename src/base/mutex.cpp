#include "base/mutex.h"

#include <cstdio>
#include <cstdlib>

namespace ndwv::base::detail {

void LockNotHeld(const char* name, const void* lock, const char* function, const char* file,
                 int line) noexcept {
  fprintf(stderr, "ndwv: lock assertion failed: %s (%p) is not held by this thread in %s (%s:%d)\n",
          name, lock, function, file, line);
  abort();
}

}  // namespace ndwv::base::detail
