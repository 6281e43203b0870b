// The rings behind send and receive queues, shared receive queues and completion queues.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>
#include <vector>

#include "base/object_pool.h"

namespace ndwv::dev {

// Entries addressed by a position that only grows (head and tail are positions, so full and empty
// need no flag). The storage is the capacity rounded up to a power of two: finding a position's
// entry is then a mask instead of a division, which costs ~15 cycles and a message passed a dozen
// of them on each side. The capacity the queue was created with stays the limit.
//
// An entry may take fewer bytes than sizeof(Entry) (`entry_bytes`): a work request ends in its
// SGEs or inline data, and a queue keeps room for as many as it was created for, not for the
// most any queue may have (16 SGEs made every request 328 bytes, and a depth-64 QP's two rings
// 38 KiB, where most QPs take one SGE: 88 and 40 bytes). The users write and read no more of the
// tail than that (the post checks the queue's limits); an entry is built by default
// initialization, which leaves the tail alone, on zeroed memory.
template <class Entry>
class Ring {
  static_assert(alignof(Entry) <= alignof(uint64_t), "entries are laid out in 8-byte words");

 public:
  explicit Ring(size_t capacity, size_t entry_bytes = sizeof(Entry))
      : capacity_(capacity),
        count_(std::bit_ceil(std::max<size_t>(capacity, 1))),
        mask_(count_ - 1),
        stride_(Words(std::min(entry_bytes, sizeof(Entry)))),
        words_(count_ * stride_) {
    for (size_t i = 0; i < count_; ++i) new (Slot(i)) Entry;
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  Ring& operator=(Ring&& other) noexcept {
    Destroy();
    capacity_ = other.capacity_;
    count_ = std::exchange(other.count_, 0);
    mask_ = other.mask_;
    stride_ = other.stride_;
    words_ = std::move(other.words_);
    return *this;
  }
  ~Ring() { Destroy(); }

  size_t capacity() const { return capacity_; }
  Entry& operator[](uint64_t position) { return *std::launder(reinterpret_cast<Entry*>(Slot(position & mask_))); }
  const Entry& operator[](uint64_t position) const {
    return *std::launder(reinterpret_cast<const Entry*>(Slot(position & mask_)));
  }

  // A new capacity keeping the `count` entries from position `head` on; they move to positions
  // 0 .. count-1.
  void Resize(size_t capacity, uint64_t head, size_t count) {
    static_assert(std::is_trivially_copyable_v<Entry>, "entries are moved as bytes");
    Ring resized(capacity, stride_ * sizeof(uint64_t));
    for (size_t i = 0; i < count; ++i) memcpy(resized.Slot(i), Slot((head + i) & mask_), stride_ * sizeof(uint64_t));
    *this = std::move(resized);
  }

  // A deep queue's ring is larger than the caches (4096 work requests of about 300 bytes): the
  // entry the next post fills, the next incoming message takes, or the next completion lands in
  // was last touched a whole ring ago. Each operation fetches the next one's entry (its first 64
  // bytes: the fixed fields, the first SGE or the start of the inline data), so that miss is not
  // on the next message's path (a receive took ~200 ns to find its buffers without it, ~25 with it).
  void Prefetch(uint64_t position, bool for_write) const {
    const char* p = reinterpret_cast<const char*>(Slot(position & mask_));
    if (for_write) {
      __builtin_prefetch(p, 1);
      __builtin_prefetch(p + 63, 1);
    } else {
      __builtin_prefetch(p, 0);
      __builtin_prefetch(p + 63, 0);
    }
  }

 private:
  static size_t Words(size_t bytes) { return (bytes + sizeof(uint64_t) - 1) / sizeof(uint64_t); }
  uint64_t* Slot(size_t index) { return words_.data() + index * stride_; }
  const uint64_t* Slot(size_t index) const { return words_.data() + index * stride_; }
  void Destroy() {
    if constexpr (!std::is_trivially_destructible_v<Entry>)
      for (size_t i = 0; i < count_; ++i) (*this)[i].~Entry();
    count_ = 0;
  }

  size_t capacity_;
  size_t count_;  // entries in the storage: a power of two
  uint64_t mask_;
  size_t stride_;  // words from one entry to the next
  // A QP's rings are per connection: from the pool (base/object_pool.h); a deep CQ's, past its
  // largest block, from operator new. Zeroed.
  std::vector<uint64_t, base::PoolAllocator<uint64_t>> words_;
};

}  // namespace ndwv::dev
