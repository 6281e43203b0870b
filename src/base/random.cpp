#include "base/random.h"

#include <sys/random.h>

#include <cerrno>

namespace ndwv::base {

bool SecureRandom::Next(uint32_t* out) {
  if (left_ == 0) {
    // Requests of up to 256 bytes are never cut short once the pool is initialised (getrandom(2)).
    ssize_t n;
    do n = getrandom(values_, sizeof values_, 0);
    while (n < 0 && errno == EINTR);
    if (n != ssize_t(sizeof values_)) return false;
    left_ = kBatch;
  }
  *out = values_[--left_];
  return true;
}

}  // namespace ndwv::base
