#include "base/object_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <new>

#include "base/mutex.h"

#if defined(__SANITIZE_ADDRESS__)
#define NDWV_POOL_PASSTHROUGH 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NDWV_POOL_PASSTHROUGH 1
#endif
#endif

namespace ndwv::base {

namespace {
constexpr std::align_val_t kAlignment{64};  // what a pooled block has (object_pool.h)
}  // namespace

#ifdef NDWV_POOL_PASSTHROUGH

void* PoolAllocate(std::size_t bytes) { return ::operator new(bytes, kAlignment); }
void PoolFree(void* block, std::size_t bytes) noexcept { ::operator delete(block, kAlignment); }

#else

namespace {

constexpr std::size_t kStep = 64;  // size classes, and the blocks' alignment
constexpr std::size_t kMaxPooled = 16 << 10;
constexpr std::size_t kChunk = 2 << 20;  // one huge page
constexpr std::size_t kFirstChunk = 256 << 10;  // ~20 iWARP or ~45 RoCE connections

struct FreeBlock {
  FreeBlock* next;
};

class Pool {
 public:
  void* Allocate(std::size_t bytes) {
    const std::size_t size = Rounded(bytes);
    MutexLock lock(mutex_);
    if (FreeBlock*& head = free_[size / kStep]; head) {
      FreeBlock* block = head;
      head = block->next;
      return block;
    }
    if (std::size_t(end_ - next_) < size) NewChunk();
    char* block = next_;
    next_ += size;
    return block;
  }

  void Free(void* block, std::size_t bytes) noexcept {
    const std::size_t size = Rounded(bytes);
    MutexLock lock(mutex_);
    FreeBlock*& head = free_[size / kStep];
    head = new (block) FreeBlock{head};
  }

 private:
  static std::size_t Rounded(std::size_t bytes) { return (std::max<std::size_t>(bytes, 1) + kStep - 1) / kStep * kStep; }

  // What is left of the current chunk is abandoned (less than kMaxPooled).
  void NewChunk() NDWV_REQUIRES(mutex_) {
    if (chunks_++ == 0) {
      // The first: ordinary pages, so that a process with a few connections does not hold a
      // huge page for them.
      void* mapped = mmap(nullptr, kFirstChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mapped == MAP_FAILED) throw std::bad_alloc();
      next_ = static_cast<char*>(mapped);
      end_ = next_ + kFirstChunk;
      return;
    }
    // Twice the size, then the unaligned ends returned: a huge page needs a 2 MiB-aligned range.
    void* mapped = mmap(nullptr, 2 * kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    const auto start = reinterpret_cast<std::uintptr_t>(mapped);
    const std::uintptr_t aligned = (start + kChunk - 1) & ~(kChunk - 1);
    if (aligned > start) munmap(mapped, aligned - start);
    if (const std::uintptr_t tail = start + 2 * kChunk - (aligned + kChunk); tail > 0)
      munmap(reinterpret_cast<void*>(aligned + kChunk), tail);
    madvise(reinterpret_cast<void*>(aligned), kChunk, MADV_HUGEPAGE);
    next_ = reinterpret_cast<char*>(aligned);
    end_ = next_ + kChunk;
  }

  Mutex mutex_;
  FreeBlock* free_[kMaxPooled / kStep + 1] NDWV_GUARDED_BY(mutex_) = {};
  char* next_ NDWV_GUARDED_BY(mutex_) = nullptr;
  char* end_ NDWV_GUARDED_BY(mutex_) = nullptr;
  std::size_t chunks_ NDWV_GUARDED_BY(mutex_) = 0;
};

Pool& ThePool() {
  static auto* pool = new Pool;  // outlives static teardown: objects may be freed at exit
  return *pool;
}

}  // namespace

void* PoolAllocate(std::size_t bytes) {
  if (bytes > kMaxPooled) return ::operator new(bytes, kAlignment);
  return ThePool().Allocate(bytes);
}

void PoolFree(void* block, std::size_t bytes) noexcept {
  if (bytes > kMaxPooled) return ::operator delete(block, kAlignment);
  ThePool().Free(block, bytes);
}

#endif

}  // namespace ndwv::base
