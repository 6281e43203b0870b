// Hashes for the tables whose keys come from packets or follow a pattern: CM communication IDs,
// CA GUIDs, a peer's QP numbers, addresses.
//
// Why: std::hash of an integer is the integer, and a table's bucket is that value modulo a prime.
// Keys with a pattern can then share one bucket, and keys a peer picks can be aimed at one: every
// lookup walks the whole chain. Our own CM IDs did this: the instance in the top byte and the
// index below it step together, and 2^24 is -1 modulo 257 (the table size at ~150-260 entries),
// so 256 IDs in a row fell into one bucket of each connector port's table.
// These hashes are SipHash-2-4 (libsodium's crypto_shorthash) under a key drawn from the kernel
// once per process: nobody who does not know the key can make keys collide.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ndwv::base {

uint64_t KeyedHash(const void* data, size_t length);

// The Hash of an unordered container whose key's bytes are its value (an integer, a packed struct).
struct KeyedHasher {
  template <class Key>
    requires std::has_unique_object_representations_v<Key>
  size_t operator()(const Key& key) const {
    return size_t(KeyedHash(&key, sizeof key));
  }
};

}  // namespace ndwv::base
