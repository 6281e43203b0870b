#include "dev/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include <ndwv/wvstatus.h>

namespace ndwv::dev {

namespace {
constexpr uint32_t kMaxSlots = 1u << 22;  // keys with the top byte 0xFF are left to transports
uint32_t MakeKey(uint32_t slot, uint8_t generation) { return (slot << 8) | generation; }
bool Contains(uint64_t base, uint64_t length, uint64_t addr, uint64_t len) {
  return addr >= base && len <= length && addr - base <= length - len;
}

// Whether every page of [addr, addr + length) is mapped. mincore() fails with ENOMEM on a range
// with a hole, without touching the memory; it is asked in steps so its vector stays small.
bool Mapped(uint64_t addr, uint64_t length) {
  static const uint64_t page = uint64_t(sysconf(_SC_PAGESIZE));
  constexpr uint64_t kPagesPerCall = 4096;
  unsigned char residency[kPagesPerCall];
  uint64_t first = addr & ~(page - 1);
  uint64_t end = addr + length;
  if (end < addr) return false;  // wraps around the address space
  for (uint64_t at = first; at < end; at += kPagesPerCall * page) {
    uint64_t span = std::min(end - at, kPagesPerCall * page);
    if (mincore(reinterpret_cast<void*>(at), span, residency) != 0) return false;
  }
  return true;
}
}  // namespace

ProtectionDomain::~ProtectionDomain() = default;

uint32_t ProtectionDomain::AllocSlot(Slot::Kind kind) {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    if (slots_.size() >= kMaxSlots) return 0;
    slot = uint32_t(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.kind = kind;
  s.generation = uint8_t(s.generation + 1);
  s.bound_windows = 0;
  s.window = nullptr;
  return slot;
}

const ProtectionDomain::Slot* ProtectionDomain::Lookup(uint32_t key, Slot::Kind kind) const {
  uint32_t slot = key >> 8;
  if (slot == 0 || slot >= slots_.size()) return nullptr;
  const Slot& s = slots_[slot];
  if (s.kind != kind || s.generation != uint8_t(key)) return nullptr;
  return &s;
}

int32_t ProtectionDomain::Register(const void* addr, uint64_t length, uint32_t access, uint32_t* lkey,
                                   uint32_t* rkey) {
  if (!Mapped(reinterpret_cast<uint64_t>(addr), length)) return WV_ACCESS_VIOLATION;
  std::unique_lock lock(mutex_);
  uint32_t slot = AllocSlot(Slot::Region);
  if (!slot) return WV_INSUFFICIENT_RESOURCES;
  Slot& s = slots_[slot];
  s.addr = reinterpret_cast<uint64_t>(addr);
  s.length = length;
  s.access = access;
  // One key for both: the R_Key only works when remote rights were granted.
  *lkey = *rkey = MakeKey(slot, s.generation);
  return WV_SUCCESS;
}

int32_t ProtectionDomain::Deregister(uint32_t lkey) {
  std::unique_lock lock(mutex_);
  Slot* s = const_cast<Slot*>(Lookup(lkey, Slot::Region));
  if (!s) return WV_INVALID_PARAMETER;
  if (s->bound_windows) return WV_DEVICE_BUSY;
  s->kind = Slot::Free;
  free_slots_.push_back(lkey >> 8);
  return WV_SUCCESS;
}

std::shared_ptr<MemoryWindow> ProtectionDomain::AllocateWindow() {
  auto mw = std::make_shared<MemoryWindow>();
  mw->pd = this;
  std::unique_lock lock(mutex_);
  mw->slot = AllocSlot(Slot::Window);
  if (!mw->slot) return nullptr;
  slots_[mw->slot].window = mw.get();
  return mw;
}

void ProtectionDomain::FreeWindow(MemoryWindow* mw) {
  InvalidateWindow(mw);
  std::unique_lock lock(mutex_);
  slots_[mw->slot].kind = Slot::Free;
  slots_[mw->slot].window = nullptr;
  free_slots_.push_back(mw->slot);
}

KeyCheck ProtectionDomain::BindWindow(MemoryWindow* mw, uint32_t qpn, uint32_t lkey, uint64_t addr,
                                      uint64_t length, uint32_t access, uint32_t* rkey) {
  std::unique_lock lock(mutex_);
  Slot* region = const_cast<Slot*>(Lookup(lkey, Slot::Region));
  if (!region) return KeyCheck::InvalidKey;
  if (!Contains(region->addr, region->length, addr, length)) return KeyCheck::OutOfBounds;
  if ((access & kRemoteWrite) && !(region->access & kLocalWrite)) return KeyCheck::NoRights;
  if (mw->rkey) {  // rebinding: release the old region
    if (Slot* old = const_cast<Slot*>(Lookup(mw->region_lkey, Slot::Region))) old->bound_windows--;
  }
  Slot& s = slots_[mw->slot];
  s.generation = uint8_t(s.generation + 1);  // a fresh R_Key: tokens of earlier binds stop working
  s.addr = addr;
  s.length = length;
  s.access = access;
  region->bound_windows++;
  mw->rkey = MakeKey(mw->slot, s.generation);
  mw->region_lkey = lkey;
  mw->addr = addr;
  mw->length = length;
  mw->access = access;
  mw->qpn = qpn;
  *rkey = mw->rkey;
  return KeyCheck::Ok;
}

bool ProtectionDomain::InvalidateWindow(MemoryWindow* mw) {
  std::unique_lock lock(mutex_);
  if (!mw->rkey) return false;
  InvalidateLocked(mw);
  return true;
}

void ProtectionDomain::InvalidateLocked(MemoryWindow* mw) {
  if (Slot* region = const_cast<Slot*>(Lookup(mw->region_lkey, Slot::Region))) region->bound_windows--;
  Slot& s = slots_[mw->slot];
  s.generation = uint8_t(s.generation + 1);
  s.access = 0;
  mw->rkey = 0;
}

bool ProtectionDomain::InvalidateRemote(uint32_t rkey, uint32_t qpn, std::optional<uint64_t>* report) {
  std::unique_lock lock(mutex_);
  const Slot* s = Lookup(rkey, Slot::Window);
  // Only a window, bound now under this very key, to this connection: a region's key, a stale
  // token or another connection's window is refused (IB's and RDMAP's rules).
  if (!s || !s->window || s->window->rkey != rkey || s->window->qpn != qpn) return false;
  MemoryWindow* mw = s->window;
  if (mw->reports_remote_invalidate) *report = mw->remote_invalidate_id;
  InvalidateLocked(mw);
  return true;
}

void ProtectionDomain::SetRemoteInvalidateId(MemoryWindow* mw, uint64_t id) {
  std::unique_lock lock(mutex_);
  mw->reports_remote_invalidate = true;
  mw->remote_invalidate_id = id;
}

KeyCheck ProtectionDomain::CheckLocal(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const {
  std::shared_lock lock(mutex_);
  return CheckLocalLocked(lkey, addr, length, write);
}

KeyCheck ProtectionDomain::CheckLocalLocked(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const {
  const Slot* s = Lookup(lkey, Slot::Region);
  if (!s) return KeyCheck::InvalidKey;
  if (!Contains(s->addr, s->length, addr, length)) return KeyCheck::OutOfBounds;
  if (write && !(s->access & kLocalWrite)) return KeyCheck::NoRights;
  return KeyCheck::Ok;
}

KeyCheck ProtectionDomain::CheckRemote(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length,
                                       uint32_t access) const {
  std::shared_lock lock(mutex_);
  return CheckRemoteLocked(rkey, qpn, addr, length, access);
}

KeyCheck ProtectionDomain::CheckRemoteLocked(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length,
                                             uint32_t access) const {
  const Slot* s = Lookup(rkey, Slot::Region);
  if (!s) {
    s = Lookup(rkey, Slot::Window);
    if (!s || !s->window || s->window->rkey != rkey) return KeyCheck::InvalidKey;
    if (s->window->qpn != qpn) return KeyCheck::WrongQp;
  }
  if ((s->access & access) != access) return KeyCheck::NoRights;
  if (!Contains(s->addr, s->length, addr, length)) return KeyCheck::OutOfBounds;
  return KeyCheck::Ok;
}

}  // namespace ndwv::dev
