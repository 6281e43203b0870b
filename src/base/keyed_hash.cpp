#include "base/keyed_hash.h"

#include <sodium.h>
#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "base/log.h"

namespace ndwv::base {
namespace {

struct ProcessKey {
  unsigned char bytes[crypto_shorthash_KEYBYTES];
  ProcessKey() {
    if (sodium_init() < 0) NDWV_LOG(Warn, "libsodium did not initialise; its hash works without");
    if (getrandom(bytes, sizeof bytes, 0) == ssize_t(sizeof bytes)) return;
    // No getrandom (a kernel before 3.17): a key a peer cannot read off the wire, if guessable
    // by someone on this host.
    NDWV_LOG(Warn, "getrandom failed: table hashes are keyed with the clock and the process ID");
    uint64_t parts[2] = {uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()), uint64_t(getpid())};
    static_assert(sizeof parts == sizeof bytes);
    memcpy(bytes, parts, sizeof bytes);
  }
};

const ProcessKey& Key() {
  static const ProcessKey key;
  return key;
}

}  // namespace

uint64_t KeyedHash(const void* data, size_t length) {
  unsigned char out[crypto_shorthash_BYTES];
  crypto_shorthash(out, static_cast<const unsigned char*>(data), length, Key().bytes);
  uint64_t hash;
  memcpy(&hash, out, sizeof hash);
  return hash;
}

}  // namespace ndwv::base
