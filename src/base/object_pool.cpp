#include "base/object_pool.h"

#include <sys/mman.h>

#include <algorithm>
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
constexpr std::size_t kChunk = 2 << 20;  // ~400 iWARP connections' objects per mmap
// Pages are made present this many at a time, ahead of the blocks taken (object_pool.h).
constexpr std::size_t kPopulate = 64 << 10;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older kernels refuse it, and pages fault as before
#endif

struct FreeBlock {
  FreeBlock* next;
};

class Pool {
 public:
  void* Allocate(std::size_t bytes) {
    const std::size_t size = Rounded(bytes);
    char* block;
    char* populate = nullptr;
    {
      MutexLock lock(mutex_);
      if (FreeBlock*& head = free_[size / kStep]; head) {
        FreeBlock* free = head;
        head = free->next;
        return free;
      }
      if (std::size_t(end_ - next_) < size) NewChunk();
      block = next_;
      next_ += size;
      if (next_ > populated_) {
        populate = populated_;
        populated_ += kPopulate;
      }
    }
    // Outside the lock: a block of the range touched meanwhile just faults its page as before.
    if (populate) madvise(populate, kPopulate, MADV_POPULATE_WRITE);
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

  // What is left of the current chunk is abandoned (less than kMaxPooled). The chunk's pages are
  // ordinary ones, touched as blocks are taken; never huge pages, even where the system makes
  // them the default (object_pool.h says why).
  void NewChunk() NDWV_REQUIRES(mutex_) {
    void* mapped = mmap(nullptr, kChunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) throw std::bad_alloc();
    madvise(mapped, kChunk, MADV_NOHUGEPAGE);
    next_ = populated_ = static_cast<char*>(mapped);
    end_ = next_ + kChunk;
  }

  Mutex mutex_;
  FreeBlock* free_[kMaxPooled / kStep + 1] NDWV_GUARDED_BY(mutex_) = {};
  char* next_ NDWV_GUARDED_BY(mutex_) = nullptr;
  char* end_ NDWV_GUARDED_BY(mutex_) = nullptr;
  char* populated_ NDWV_GUARDED_BY(mutex_) = nullptr;  // the chunk's pages below are made present
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
