// Rings of queue entries and completions, and the cache.
#pragma once

namespace ndwv::dev {

// A deep queue's ring is larger than the caches (4096 work requests of about 300 bytes): the entry
// the next post fills, the next incoming message takes, or the next completion lands in was last
// touched a whole ring ago. Each operation fetches the next one's entry (its first 64 bytes: the
// fixed fields, the first SGE or the start of the inline data), so that miss is not on the next
// message's path (a receive took ~200 ns to find its buffers without it, ~25 with it).
template <class Entry>
inline void PrefetchEntry(const Entry& entry, bool for_write) {
  const char* p = reinterpret_cast<const char*>(&entry);
  if (for_write) {
    __builtin_prefetch(p, 1);
    __builtin_prefetch(p + 63, 1);
  } else {
    __builtin_prefetch(p, 0);
    __builtin_prefetch(p + 63, 0);
  }
}

}  // namespace ndwv::dev
