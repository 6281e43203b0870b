// Protection domain: the key tables of memory regions and memory windows.
//
// A key is 32 bits: a 24-bit slot index and an 8-bit generation, so a key that was released and
// reused is not accepted again for a while. Regions have an L_Key (local access) and an R_Key
// (remote access); a window has only an R_Key, a fresh one on every bind (type-2 windows).
// Every remote access is checked against key, owning QP (windows), range and rights before a byte
// moves; the check and the placement hold the table's shared lock, so Deregister (exclusive lock)
// returns only after in-flight placements into the region have finished.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/mutex.h"

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
  uint32_t slot = 0;
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
  KeyCheck CheckLocalLocked(uint32_t lkey, uint64_t addr, uint64_t length, bool write) const;
  // Remote access by a peer through an R_Key (region or window bound to qpn).
  KeyCheck CheckRemote(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length, uint32_t access) const;

  // Held around check-then-place of remote data, so the target cannot be deregistered meanwhile.
  base::SharedMutex& placement_lock() const { return mutex_; }
  KeyCheck CheckRemoteLocked(uint32_t rkey, uint32_t qpn, uint64_t addr, uint64_t length,
                             uint32_t access) const;

 private:
  struct Slot {
    enum Kind : uint8_t { Free, Region, Window } kind = Free;
    uint8_t generation = 0;
    uint64_t addr = 0, length = 0;
    uint32_t access = 0;
    uint32_t bound_windows = 0;  // regions: windows bound into them
    MemoryWindow* window = nullptr;
  };
  uint32_t AllocSlot(Slot::Kind kind);  // under mutex_; 0 if none (slot 0 is never used)
  void InvalidateLocked(MemoryWindow* mw);  // under mutex_, mw bound
  const Slot* Lookup(uint32_t key, Slot::Kind kind) const;

  mutable base::SharedMutex mutex_;
  std::vector<Slot> slots_{1};
  std::vector<uint32_t> free_slots_;
};

}  // namespace ndwv::dev
