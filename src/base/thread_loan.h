// Scratch memory each thread lends to one user at a time.
//
// Why: an iWARP stream's transmit batch (6 KiB) and receive staging (4 KiB) matter only while a
// step of that stream runs, and a process with 10,000 connections that kept one of each per
// connection would hold ~100 MiB for them, every page of it new memory to fault in and zero. A
// step borrows its thread's instead; what must outlive the step (bytes the socket did not take,
// a segment read in part) moves to memory of the connection's own, taken only then.
#pragma once
#include <cassert>
#include <memory>

#include "base/object_pool.h"

namespace ndwv::base {

template <class T>
class ThreadLoan {
 public:
  // The calling thread's T, or null while it is lent (a step nested inside another's on this
  // thread: the caller then uses memory of its own).
  static T* Borrow() {
    Slot& slot = Thread();
    if (slot.lent) return nullptr;
    if (!slot.item) slot.item = std::make_unique<T>();
    slot.lent = true;
    return slot.item.get();
  }
  // What a step uses: the caller's `own` if it has one, else the thread's; `own`, made now (from
  // the pool), if the thread's is lent already.
  static T* BorrowOr(PoolPtr<T>& own) {
    if (own) return own.get();
    if (T* lent = Borrow()) return lent;
    own = MakePoolUnique<T>();
    return own.get();
  }
  // Whether `item` is the thread's, lent by Borrow.
  static bool IsLent(const T* item) {
    const Slot& slot = Thread();
    return slot.lent && item == slot.item.get();
  }
  static void Return(T* item) {
    assert(IsLent(item));
    (void)item;
    Thread().lent = false;
  }

 private:
  struct Slot {
    std::unique_ptr<T> item;  // made at the thread's first Borrow, kept to its end
    bool lent = false;
  };
  static Slot& Thread() {
    static thread_local Slot slot;
    return slot;
  }
};

}  // namespace ndwv::base
