// The memory registrations of a version 1 adapter, named by ND_MR_HANDLE. Version 1 gives the
// application no token: it names a registration by an opaque pointer-sized handle in every SGE
// and window bind. A handle here is a slot number and the slot's generation (64 bits, none of it
// truncated), so a made-up handle, a deregistered one, one whose slot was reused, or another
// adapter's (generations start at a random value per adapter) is recognised and refused instead
// of followed. Posting turns a handle into its L_Key with one atomic load: slots live in fixed
// blocks that never move, allocated as the table grows.
#pragma once

#include <ndwv/ndspi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/mutex.h"

namespace ndwv::nd::v1 {

class Registrations {
 public:
  struct Region {
    uint64_t address = 0;
    uint64_t length = 0;
    UINT32 lkey = 0;
  };

  // Room for `capacity` registrations at once.
  explicit Registrations(size_t capacity);
  ~Registrations();
  Registrations(const Registrations&) = delete;
  Registrations& operator=(const Registrations&) = delete;

  // The L_Key of a live registration, or false. Lock-free (the posting path).
  bool Lkey(ND_MR_HANDLE handle, UINT32* lkey) const {
    const Slot* slot = SlotOf(handle);
    if (slot == nullptr) return false;
    uint64_t entry = slot->entry.load(std::memory_order_acquire);
    if (uint32_t(entry) == 0 || (entry >> 32) != Generation(handle)) return false;
    *lkey = uint32_t(entry);
    return true;
  }

  // The registration changes below run under this lock, together with the device call they
  // record (so that a handle and its registration come and go as one).
  base::Mutex& mutex() NDWV_RETURN_CAPABILITY(mutex_) { return mutex_; }
  // A new handle for `region`; nullptr when the table is full.
  ND_MR_HANDLE Add(const Region& region) NDWV_REQUIRES(mutex_);
  // The registration `handle` names, or false.
  bool Find(ND_MR_HANDLE handle, Region* region) const NDWV_REQUIRES(mutex_);
  // Forgets `handle`, which Find just found.
  void Remove(ND_MR_HANDLE handle) NDWV_REQUIRES(mutex_);
  // Every live registration, e.g. to deregister them when the adapter goes.
  std::vector<Region> All() const NDWV_REQUIRES(mutex_);

 private:
  static constexpr size_t kBlock = 1024;
  struct Slot {
    std::atomic<uint64_t> entry{0};  // generation << 32 | L_Key; L_Key 0: free
    Region region;                   // under mutex_
  };

  static uint32_t Generation(ND_MR_HANDLE handle) {
    return uint32_t(reinterpret_cast<uintptr_t>(handle) >> 32);
  }
  const Slot* SlotOf(ND_MR_HANDLE handle) const;
  Slot* SlotOf(ND_MR_HANDLE handle) { return const_cast<Slot*>(std::as_const(*this).SlotOf(handle)); }

  const size_t capacity_;
  const uint32_t firstGeneration_;  // of a slot's first registration, random per table
  std::unique_ptr<std::atomic<Slot*>[]> blocks_;  // capacity_ / kBlock, allocated on demand
  mutable base::Mutex mutex_{"nd::v1::Registrations::mutex_"};
  size_t used_ NDWV_GUARDED_BY(mutex_) = 0;          // slots ever handed out
  std::vector<uint32_t> free_ NDWV_GUARDED_BY(mutex_);  // slot numbers free for reuse
};

}  // namespace ndwv::nd::v1
