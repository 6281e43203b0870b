// The rings behind send and receive queues, shared receive queues and completion queues.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/object_pool.h"

namespace ndwv::dev {

// Entries addressed by a position that only grows (head and tail are positions, so full and empty
// need no flag). The storage is the capacity rounded up to a power of two: finding a position's
// entry is then a mask instead of a division, which costs ~15 cycles and a message passed a dozen
// of them on each side. The capacity the queue was created with stays the limit.
template <class Entry>
class Ring {
 public:
  explicit Ring(size_t capacity)
      : capacity_(capacity), entries_(std::bit_ceil(std::max<size_t>(capacity, 1))), mask_(entries_.size() - 1) {}

  size_t capacity() const { return capacity_; }
  Entry& operator[](uint64_t position) { return entries_[position & mask_]; }
  const Entry& operator[](uint64_t position) const { return entries_[position & mask_]; }

  // A new capacity keeping the `count` entries from position `head` on; they move to positions
  // 0 .. count-1.
  void Resize(size_t capacity, uint64_t head, size_t count) {
    Ring resized(capacity);
    for (size_t i = 0; i < count; ++i) resized[i] = (*this)[head + i];
    *this = std::move(resized);
  }

  // A deep queue's ring is larger than the caches (4096 work requests of about 300 bytes): the
  // entry the next post fills, the next incoming message takes, or the next completion lands in
  // was last touched a whole ring ago. Each operation fetches the next one's entry (its first 64
  // bytes: the fixed fields, the first SGE or the start of the inline data), so that miss is not
  // on the next message's path (a receive took ~200 ns to find its buffers without it, ~25 with it).
  void Prefetch(uint64_t position, bool for_write) const {
    const char* p = reinterpret_cast<const char*>(&(*this)[position]);
    if (for_write) {
      __builtin_prefetch(p, 1);
      __builtin_prefetch(p + 63, 1);
    } else {
      __builtin_prefetch(p, 0);
      __builtin_prefetch(p + 63, 0);
    }
  }

 private:
  size_t capacity_;
  // A QP's rings are per connection: from the pool (base/object_pool.h); a deep CQ's, past its
  // largest block, from operator new.
  std::vector<Entry, base::PoolAllocator<Entry>> entries_;
  uint64_t mask_;
};

}  // namespace ndwv::dev
