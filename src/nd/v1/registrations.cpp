#include "nd/v1/registrations.h"

#include <new>
#include <random>
#include <utility>

namespace ndwv::nd::v1 {

Registrations::Registrations(size_t capacity)
    : capacity_((capacity + kBlock - 1) / kBlock * kBlock),
      firstGeneration_(std::random_device()()),
      blocks_(new std::atomic<Slot*>[capacity_ / kBlock]) {
  for (size_t i = 0; i < capacity_ / kBlock; ++i) blocks_[i].store(nullptr);
}

Registrations::~Registrations() {
  for (size_t i = 0; i < capacity_ / kBlock; ++i) delete[] blocks_[i].load();
}

const Registrations::Slot* Registrations::SlotOf(ND_MR_HANDLE handle) const {
  // Slot n is named n + 1 in the low half, so that no handle is NULL (an inline SGE).
  uint64_t number = uint32_t(reinterpret_cast<uintptr_t>(handle));
  if (number == 0 || number > capacity_) return nullptr;
  const Slot* block = blocks_[(number - 1) / kBlock].load(std::memory_order_acquire);
  return block != nullptr ? &block[(number - 1) % kBlock] : nullptr;
}

ND_MR_HANDLE Registrations::Add(const Region& region) {
  mutex_.AssertHeld();
  uint32_t number;
  if (!free_.empty()) {
    number = free_.back();
    free_.pop_back();
  } else {
    if (used_ == capacity_) return nullptr;
    number = uint32_t(++used_);
    std::atomic<Slot*>& block = blocks_[(number - 1) / kBlock];
    if (block.load() == nullptr) {
      Slot* fresh = new (std::nothrow) Slot[kBlock];
      if (fresh == nullptr) {
        --used_;
        return nullptr;
      }
      block.store(fresh, std::memory_order_release);
    }
  }
  Slot& slot = blocks_[(number - 1) / kBlock].load()[(number - 1) % kBlock];
  uint64_t entry = slot.entry.load();
  uint32_t generation = entry == 0 ? firstGeneration_ + number : uint32_t(entry >> 32) + 1;
  slot.region = region;
  slot.entry.store(uint64_t(generation) << 32 | region.lkey, std::memory_order_release);
  return reinterpret_cast<ND_MR_HANDLE>(uintptr_t(generation) << 32 | number);
}

bool Registrations::Find(ND_MR_HANDLE handle, Region* region) const {
  mutex_.AssertHeld();
  UINT32 lkey;
  if (!Lkey(handle, &lkey)) return false;
  *region = SlotOf(handle)->region;
  return true;
}

void Registrations::Remove(ND_MR_HANDLE handle) {
  mutex_.AssertHeld();
  Slot* slot = SlotOf(handle);
  // The generation stays, so the handle is stale from now on.
  slot->entry.store(uint64_t(Generation(handle)) << 32, std::memory_order_release);
  slot->region = {};
  free_.push_back(uint32_t(reinterpret_cast<uintptr_t>(handle)));
}

std::vector<Registrations::Region> Registrations::All() const {
  mutex_.AssertHeld();
  std::vector<Region> all;
  for (size_t number = 1; number <= used_; ++number) {
    const Slot& slot = blocks_[(number - 1) / kBlock].load()[(number - 1) % kBlock];
    if (uint32_t(slot.entry.load()) != 0) all.push_back(slot.region);
  }
  return all;
}

}  // namespace ndwv::nd::v1
