// Memory for the objects a process holds one of per connection (an iWARP stream, a RoCE link
// and port, a connection endpoint, a QP and its rings).
//
// Why: an application with thousands of connections allocates thousands of each. From the pool
// they lie packed in 2 MiB chunks, so a connection's objects share pages with its neighbours'
// instead of each touching pages of its own on the heap, and a freed block is kept for the next
// object of its size class (64-byte steps; every block is aligned to 64), never returned to the
// system: the pool's size is the process's peak of live objects. Blocks over 16 KiB come from
// operator new. Against operator new for every block, setups of 10,000 connections took up to a
// third less CPU (0-33 % in 4 pairs) and 2.5-6 MiB less resident memory per process
// (bench/README.md, "Huge pages").
//
// The chunks are ordinary pages (MADV_NOHUGEPAGE), made present 64 KiB at a time ahead of the
// blocks taken (MADV_POPULATE_WRITE, one system call for 16 pages): on this VM a page fault
// costs ~11 us and a page populated ~6 us, and a setup took about one fault per connection and
// process. With it, a 4,000-connection nd_scale run took a quarter of the faults (iWARP 8,600 ->
// 2,300, RoCE 10,300 -> 2,500), its setups 13 % (iWARP) and 22 % (RoCE) less CPU, and ran 18 %
// and 28 % faster (medians of 6 alternating pairs, bench/README.md); a process holds at most
// 64 KiB more than it touched. In 2 MiB
// transparent huge pages they took fewer faults (5,600 instead of 25,400 in a 10,000-connection
// iWARP nd_scale run), but each fault zeroes 2 MiB at once, and on a VM whose host takes free
// guest memory back (free page reporting) the host must first fault those 2 MiB in again. The
// thread that takes the fault (an application's Connect, the engine's accept) stalls while the
// connections behind it wait: set-ups with 64 outstanding ran at about three quarters of the rate
// without them (bench/README.md, "Huge pages").
//
// Under AddressSanitizer every block comes from operator new, so that a use after free is caught.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <new>
#include <set>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace ndwv::base {

void* PoolAllocate(std::size_t bytes);  // throws std::bad_alloc, as operator new does
void PoolFree(void* block, std::size_t bytes) noexcept;

// For std::allocate_shared: the object and its reference counts in one block of the pool.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    static_assert(alignof(T) <= 64, "pool blocks are aligned to 64 bytes");
    return static_cast<T*>(PoolAllocate(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept { PoolFree(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept { return true; }
};

// The containers a connection's setup fills (a RoCE CM agent's and port's tables), their blocks
// from the pool: on the heap they were a large part of the page faults left in a setup (perf).
// Not for queues on the message path: a deque allocates a block every few messages, and with
// RcLink's on the pool (its one lock taken by the posting thread and the engine in turn) RoCE's
// 64 KiB RDMA Write ran at 1,735-1,818 MB/s against 1,878-2,077 (ndrping, 4 alternating runs).
template <class Key, class Value, class Hash = std::hash<Key>>
using PooledHashMap = std::unordered_map<Key, Value, Hash, std::equal_to<Key>, PoolAllocator<std::pair<const Key, Value>>>;
template <class Key, class Hash = std::hash<Key>>
using PooledHashSet = std::unordered_set<Key, Hash, std::equal_to<Key>, PoolAllocator<Key>>;
template <class Key>
using PooledSet = std::set<Key, std::less<Key>, PoolAllocator<Key>>;

// A unique_ptr to an object of the pool; MakePoolUnique is std::make_unique, from the pool.
template <class T>
struct PoolDelete {
  void operator()(T* object) const noexcept {
    object->~T();
    PoolFree(object, sizeof(T));
  }
};
template <class T>
using PoolPtr = std::unique_ptr<T, PoolDelete<T>>;
template <class T, class... Args>
PoolPtr<T> MakePoolUnique(Args&&... args) {
  static_assert(alignof(T) <= 64, "pool blocks are aligned to 64 bytes");
  return PoolPtr<T>(new (PoolAllocate(sizeof(T))) T(std::forward<Args>(args)...));
}

// std::make_shared, from the pool.
template <class T, class... Args>
std::shared_ptr<T> MakePooled(Args&&... args) {
  return std::allocate_shared<T>(PoolAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace ndwv::base
