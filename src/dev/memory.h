// Protection domain: the key tables of memory regions and memory windows.
//
// Keys are unpredictable: every registration and every window bind draws a fresh key from the
// kernel's CSPRNG (base/random.h), so a peer that knows some keys cannot guess another. A region
// has two independent keys, an L_Key (local access, by SGEs) and an R_Key (remote access); a
// window has only an R_Key, a fresh one on every bind (type-2 windows). A key is 24 random bits
// over an 8-bit consumer part:
//
//   key = tag (24 bits) << 8 | consumer (8 bits)
//
// The table has a power-of-two size; the low bits of the tag are the key's entry, chosen at random
// among the free ones, so a lookup is one index and one compare of all 32 bits. The consumer part
// is the entry's generation, which advances with every key issued there: a stale key cannot match
// the next 255 keys of its entry, whatever the random bits. The table doubles when half full
// (entries keep their keys: the index just takes one more tag bit). Keys never have the top byte
// 0xFF (left to the transports' own tags) and are never 0.
//
// Every remote access is checked against key, owning QP (windows), range and rights before a byte
// moves; the check and the placement hold the table's shared lock, so Deregister (exclusive lock)
// returns only after in-flight placements into the region have finished.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/mutex.h"
#include "base/random.h"

namespace ndwv::dev {

enum Access : uint32_t {
  kRemoteRead = 0x1,
  kRemoteWrite = 0x2,
  kLocalWrite = 0x8,
  kMwBind = 0x10,
};

enum class KeyCheck { Ok, InvalidKey, OutOfBounds, NoRights, WrongQp };

class ProtectionDomain;

// A window's state; allocated by AllocateWindow and owned by the verbs object above.
struct MemoryWindow {
  ProtectionDomain* pd = nullptr;
  uint32_t entry_key = 0;   // names the window's table entry (its R_Key while bound)
  uint32_t rkey = 0;        // 0 while unbound
  uint32_t region_lkey = 0; // the region it is bound into
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t access = 0;
  uint32_t qpn = 0;         // the QP it is bound to
  // The request id a peer's Send with Invalidate of the window reports (ND v1), if any.
  bool reports_remote_invalidate = false;
  uint64_t remote_invalidate_id = 0;
};

class ProtectionDomain : public std::enable_shared_from_this<ProtectionDomain> {
 public:
  // The table's largest size; it is at most half full, and a region takes two entries.
  static constexpr uint32_t kMaxEntries = 1u << 23;
  static constexpr uint32_t kMaxRegions = kMaxEntries / 4, kMaxWindows = kMaxEntries / 4;

  ProtectionDomain();
  ~ProtectionDomain();

  // access: Access bits. Returns an NTSTATUS-style code (0 on success); WV_ACCESS_VIOLATION for
  // a range with unmapped pages (a NIC could not pin them, and placing data there would crash).
  int32_t Register(const void* addr, uint64_t length, uint32_t access, uint32_t* lkey, uint32_t* rkey);
  int32_t Deregister(uint32_t lkey);

  std::shared_ptr<MemoryWindow> AllocateWindow();
  void FreeWindow(MemoryWindow* mw);
  // Binds mw (unbound or bound) to [addr, addr+length) of the region lkey; new R_Key in *rkey.
  KeyCheck BindWindow(MemoryWindow* mw, uint32_t qpn, uint32_t lkey, uint64_t addr, uint64_t length,
                      uint32_t access, uint32_t* rkey);
  bool InvalidateWindow(MemoryWindow* mw);
  // A peer's Send with Invalidate of `rkey`, which must name a window bound to `qpn`: unbinds it.
  // *report gets the window's remote-invalidate id when it has one. False: nothing so bound.
  bool InvalidateRemote(uint32_t rkey, uint32_t qpn, std::optional<uint64_t>* report);
  void SetRemoteInvalidateId(MemoryWindow* mw, uint64_t id);

  // Local access by an SGE: the L_Key must name a region that contains the range (and grants
  // local write when `write`).
  KeyCheck CheckLocal(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const;
  KeyCheck CheckLocalLocked(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const
      NDWV_REQUIRES_SHARED(mutex_);
  // Remote access by a peer through an R_Key (region or window bound to qpn).
  KeyCheck CheckRemote(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length, uint32_t access) const;

  // Held around check-then-place of remote data, so the target cannot be deregistered meanwhile.
  base::SharedMutex& placement_lock() const NDWV_RETURN_CAPABILITY(mutex_) { return mutex_; }
  KeyCheck CheckRemoteLocked(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length,
                             uint32_t access) const NDWV_REQUIRES_SHARED(mutex_);

 private:
  struct Entry {
    // LocalKey/RemoteKey: a region's L_Key/R_Key; Window: a bound window's R_Key; Reserved: an
    // unbound window's entry (matches nothing).
    enum Kind : uint8_t { Free, LocalKey, RemoteKey, Window, Reserved } kind = Free;
    uint8_t generation = 0;  // the consumer part of the next key issued here
    uint32_t key = 0;
    uint32_t partner = 0;    // a region's other key (to deregister both)
    uint32_t bound_windows = 0;  // LocalKey: windows bound into the region
    uint32_t qpn = 0;        // Window: the QP it is bound to
    MemoryWindow* window = nullptr;  // Window: its owner
    uint32_t access = 0;
    uint64_t addr = 0, length = 0;
  };
  // Under mutex_ (exclusive): a fresh key on a free entry, claimed as `kind`; 0 if the table is
  // full or no random bits came. A key whose consumer part would equal that of `avoid_consumer`
  // (a key, 0 for none) is skipped.
  uint32_t Claim(Entry::Kind kind, uint32_t avoid_consumer = 0) NDWV_REQUIRES(mutex_);
  void Release(uint32_t key) NDWV_REQUIRES(mutex_);
  bool Grow() NDWV_REQUIRES(mutex_);
  void InvalidateLocked(MemoryWindow* mw) NDWV_REQUIRES(mutex_);  // mw bound
  Entry* Find(uint32_t key) NDWV_REQUIRES(mutex_) { return &table_[(key >> 8) & mask_]; }
  const Entry* Lookup(uint32_t key, Entry::Kind kind) const NDWV_REQUIRES_SHARED(mutex_) {
    const Entry& e = table_[(key >> 8) & mask_];
    return e.kind == kind && e.key == key ? &e : nullptr;
  }

  mutable base::SharedMutex mutex_;
  std::vector<Entry> table_ NDWV_GUARDED_BY(mutex_);
  uint32_t mask_ NDWV_GUARDED_BY(mutex_) = 0;
  uint32_t used_ NDWV_GUARDED_BY(mutex_) = 0;
  base::SecureRandom random_;
};

}  // namespace ndwv::dev
