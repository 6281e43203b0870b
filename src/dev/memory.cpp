#include "dev/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <shared_mutex>

#include <ndwv/wvstatus.h>

namespace ndwv::dev {

namespace {
constexpr uint32_t kFirstEntries = 16;
// The tag's top bit is never an index bit: clearing it keeps a key's top byte off 0xFF.
constexpr uint32_t kFreeTagBit = 1u << 23;
static_assert(ProtectionDomain::kMaxEntries <= kFreeTagBit);
// Random draws for a free entry before the next free one after the last draw is taken. The
// table is at most half full, so each draw finds one with probability 1/2 or better.
constexpr int kRandomProbes = 8;

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

ProtectionDomain::ProtectionDomain() : table_(kFirstEntries), mask_(kFirstEntries - 1) {
  // Each entry's generation starts anywhere, so that first keys differ in their consumer part too.
  for (uint32_t i = 0; i < kFirstEntries; i += 4) {
    uint32_t r = 0;
    random_.Next(&r);
    for (uint32_t j = 0; j < 4; ++j) table_[i + j].generation = uint8_t(r >> (8 * j));
  }
}

ProtectionDomain::~ProtectionDomain() = default;

bool ProtectionDomain::Grow() {
  const uint32_t size = uint32_t(table_.size());
  if (size >= kMaxEntries) return false;
  std::vector<Entry> bigger(size_t(size) * 2);
  // Both entries an old one splits into continue its generation: a key issued there before stays
  // refused by the next 255 keys of either.
  for (uint32_t i = 0; i < size; ++i) bigger[i].generation = bigger[i + size].generation = table_[i].generation;
  const uint32_t mask = 2 * size - 1;
  for (const Entry& e : table_)
    if (e.kind != Entry::Free) bigger[(e.key >> 8) & mask] = e;  // distinct in fewer bits: in more too
  table_.swap(bigger);
  mask_ = mask;
  return true;
}

uint32_t ProtectionDomain::Claim(Entry::Kind kind, uint32_t avoid_consumer) {
  if ((used_ + 1) * 2 > table_.size() && !Grow()) return 0;
  uint32_t r;
  if (!random_.Next(&r)) return 0;
  uint32_t tag = r >> 8;
  uint32_t index = tag & mask_;
  for (int draws = 1; table_[index].kind != Entry::Free; ++draws) {
    if (draws < kRandomProbes) {
      if (!random_.Next(&r)) return 0;
      tag = r >> 8;
      index = tag & mask_;
    } else {
      index = (index + 1) & mask_;
    }
  }
  tag = (tag & ~mask_) | index;
  if ((tag >> 16) == 0xFF) tag &= ~kFreeTagBit;
  Entry& e = table_[index];
  uint8_t consumer = e.generation++;
  if ((avoid_consumer && consumer == uint8_t(avoid_consumer)) || (tag == 0 && consumer == 0))
    consumer = e.generation++;
  e = Entry{kind, e.generation, (tag << 8) | consumer};
  used_++;
  return e.key;
}

void ProtectionDomain::Release(uint32_t key) {
  Entry& e = *Find(key);
  e.kind = Entry::Free;
  used_--;
}

int32_t ProtectionDomain::Register(const void* addr, uint64_t length, uint32_t access, uint32_t* lkey,
                                   uint32_t* rkey) {
  if (!Mapped(reinterpret_cast<uint64_t>(addr), length)) return WV_ACCESS_VIOLATION;
  base::WriterLock lock(mutex_);
  // Two entries, two independent keys: knowing the R_Key tells nothing of the L_Key.
  uint32_t local = Claim(Entry::LocalKey);
  if (!local) return WV_INSUFFICIENT_RESOURCES;
  uint32_t remote = Claim(Entry::RemoteKey);
  if (!remote) {
    Release(local);
    return WV_INSUFFICIENT_RESOURCES;
  }
  for (auto [key, partner] : {std::pair{local, remote}, std::pair{remote, local}}) {
    Entry& e = *Find(key);
    e.partner = partner;
    e.addr = reinterpret_cast<uint64_t>(addr);
    e.length = length;
    e.access = access;
  }
  *lkey = local;
  *rkey = remote;
  return WV_SUCCESS;
}

int32_t ProtectionDomain::Deregister(uint32_t lkey) {
  base::WriterLock lock(mutex_);
  if (!Lookup(lkey, Entry::LocalKey)) return WV_INVALID_PARAMETER;
  Entry& e = *Find(lkey);
  if (e.bound_windows) return WV_DEVICE_BUSY;
  Release(e.partner);
  Release(lkey);
  return WV_SUCCESS;
}

std::shared_ptr<MemoryWindow> ProtectionDomain::AllocateWindow() {
  auto mw = std::make_shared<MemoryWindow>();
  mw->pd = this;
  base::WriterLock lock(mutex_);
  // Held from now on, so that a bind (which moves the window to a fresh entry) never runs out.
  mw->entry_key = Claim(Entry::Reserved);
  if (!mw->entry_key) return nullptr;
  return mw;
}

void ProtectionDomain::FreeWindow(MemoryWindow* mw) {
  InvalidateWindow(mw);
  base::WriterLock lock(mutex_);
  if (mw->entry_key) Release(mw->entry_key);
  mw->entry_key = 0;
}

KeyCheck ProtectionDomain::BindWindow(MemoryWindow* mw, uint32_t qpn, uint32_t lkey, uint64_t addr,
                                      uint64_t length, uint32_t access, uint32_t* rkey) {
  base::WriterLock lock(mutex_);
  const Entry* region = Lookup(lkey, Entry::LocalKey);
  if (!region || !mw->entry_key) return KeyCheck::InvalidKey;
  if (!Contains(region->addr, region->length, addr, length)) return KeyCheck::OutOfBounds;
  if ((access & kRemoteWrite) && !(region->access & kLocalWrite)) return KeyCheck::NoRights;
  if (mw->rkey) {  // rebinding: release the old region
    if (Lookup(mw->region_lkey, Entry::LocalKey)) Find(mw->region_lkey)->bound_windows--;
  }
  // A fresh entry and key on every bind: tokens of earlier binds stop working, and the new one
  // shares nothing with them (not even its consumer part). Releasing first, the window's count
  // of entries is unchanged, so the table has room.
  const uint32_t old_key = mw->entry_key;  // the last token, also after an invalidation
  Release(old_key);
  uint32_t key = Claim(Entry::Window, old_key);
  mw->entry_key = key;
  mw->rkey = 0;
  if (!key) return KeyCheck::InvalidKey;  // no random bits from the kernel
  Entry& w = *Find(key);
  w.addr = addr;
  w.length = length;
  w.access = access;
  w.qpn = qpn;
  w.window = mw;
  Find(lkey)->bound_windows++;
  mw->rkey = key;
  mw->region_lkey = lkey;
  mw->addr = addr;
  mw->length = length;
  mw->access = access;
  mw->qpn = qpn;
  *rkey = key;
  return KeyCheck::Ok;
}

bool ProtectionDomain::InvalidateWindow(MemoryWindow* mw) {
  base::WriterLock lock(mutex_);
  if (!mw->rkey) return false;
  InvalidateLocked(mw);
  return true;
}

void ProtectionDomain::InvalidateLocked(MemoryWindow* mw) {
  if (Lookup(mw->region_lkey, Entry::LocalKey)) Find(mw->region_lkey)->bound_windows--;
  Find(mw->entry_key)->kind = Entry::Reserved;  // kept for the next bind; its key matches nothing
  mw->rkey = 0;
}

bool ProtectionDomain::InvalidateRemote(uint32_t rkey, uint32_t qpn, std::optional<uint64_t>* report) {
  base::WriterLock lock(mutex_);
  const Entry* e = Lookup(rkey, Entry::Window);
  // Only a window, bound now under this very key, to this connection: a region's key, a stale
  // token or another connection's window is refused (IB's and RDMAP's rules).
  if (!e || e->qpn != qpn) return false;
  MemoryWindow* mw = e->window;
  if (mw->reports_remote_invalidate) *report = mw->remote_invalidate_id;
  InvalidateLocked(mw);
  return true;
}

void ProtectionDomain::SetRemoteInvalidateId(MemoryWindow* mw, uint64_t id) {
  base::WriterLock lock(mutex_);
  mw->reports_remote_invalidate = true;
  mw->remote_invalidate_id = id;
}

KeyCheck ProtectionDomain::CheckLocal(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const {
  base::ReaderLock lock(mutex_);
  return CheckLocalLocked(lkey, addr, length, write);
}

KeyCheck ProtectionDomain::CheckLocalLocked(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const {
  const Entry* e = Lookup(lkey, Entry::LocalKey);
  if (!e) return KeyCheck::InvalidKey;
  if (!Contains(e->addr, e->length, addr, length)) return KeyCheck::OutOfBounds;
  if (write && !(e->access & kLocalWrite)) return KeyCheck::NoRights;
  return KeyCheck::Ok;
}

KeyCheck ProtectionDomain::CheckRemote(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length,
                                       uint32_t access) const {
  base::ReaderLock lock(mutex_);
  return CheckRemoteLocked(rkey, qpn, addr, length, access);
}

KeyCheck ProtectionDomain::CheckRemoteLocked(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length,
                                             uint32_t access) const {
  const Entry& e = table_[(rkey >> 8) & mask_];
  if (e.key != rkey || (e.kind != Entry::RemoteKey && e.kind != Entry::Window)) return KeyCheck::InvalidKey;
  if (e.kind == Entry::Window && e.qpn != qpn) return KeyCheck::WrongQp;
  if ((e.access & access) != access) return KeyCheck::NoRights;
  if (!Contains(e.addr, e.length, addr, length)) return KeyCheck::OutOfBounds;
  return KeyCheck::Ok;
}

}  // namespace ndwv::dev
