// The pool of per-connection objects (base/object_pool.h): blocks are aligned, never overlap
// (also across chunks, and between threads), freed blocks are reused by size class, objects
// made with MakePooled are destroyed exactly once, and a new block's pages are present before
// it is touched.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "base/object_pool.h"

namespace ndwv::base {
namespace {

struct Block {
  unsigned char* data;
  size_t size;
  unsigned char fill;
};

bool Intact(const Block& b) {
  for (size_t i = 0; i < b.size; ++i)
    if (b.data[i] != b.fill) return false;
  return true;
}

TEST(BaseObjectPool, BlocksAreAlignedAndKeepTheirBytesAcrossChunks) {
  // Sizes of the objects the pool serves (a stream, a link, an endpoint, a QP, a ring), 6 MiB
  // in all: through three chunks.
  const size_t sizes[] = {12704, 2008, 1464, 424, 600, 64, 1, 16384};
  std::vector<Block> blocks;
  size_t total = 0;
  for (unsigned i = 0; total < (6u << 20); ++i) {
    size_t size = sizes[i % std::size(sizes)];
    auto* p = static_cast<unsigned char*>(PoolAllocate(size));
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % 64, 0u) << "block " << i;
    unsigned char fill = static_cast<unsigned char>(i * 37 + 1);
    std::memset(p, fill, size);
    blocks.push_back({p, size, fill});
    total += size;
  }
  for (size_t i = 0; i < blocks.size(); ++i) ASSERT_TRUE(Intact(blocks[i])) << "block " << i << " overwritten";
  for (const Block& b : blocks) PoolFree(b.data, b.size);
}

// The pool populates its chunk's pages ahead of the blocks it hands out (one system call for
// many page faults): a new block's pages are present before anyone touches them.
TEST(BaseObjectPool, ANewBlocksPagesArePresentBeforeItIsTouched) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer every block comes from operator new";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "under AddressSanitizer every block comes from operator new";
#endif
#endif
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  {
    void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(probe, MAP_FAILED);
    const bool supported = madvise(probe, page, 23 /* MADV_POPULATE_WRITE */) == 0;
    munmap(probe, page);
    if (!supported) GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14)";
  }
  // 16 KiB, the largest class: no block of it is freed in this test's process, so each comes new
  // from the chunk. 200 of them cross a chunk's end.
  constexpr size_t kSize = 16 << 10;
  std::vector<void*> blocks;
  for (int i = 0; i < 200; ++i) {
    auto* block = static_cast<unsigned char*>(PoolAllocate(kSize));
    blocks.push_back(block);
    const std::uintptr_t first = reinterpret_cast<std::uintptr_t>(block) / page * page;
    const std::uintptr_t end = reinterpret_cast<std::uintptr_t>(block) + kSize;
    std::vector<unsigned char> present((end - first + page - 1) / page);
    ASSERT_EQ(mincore(reinterpret_cast<void*>(first), end - first, present.data()), 0);
    for (size_t p = 0; p < present.size(); ++p) EXPECT_TRUE(present[p] & 1) << "block " << i << ", page " << p;
  }
  for (void* block : blocks) PoolFree(block, kSize);
}

TEST(BaseObjectPool, AFreedBlockServesTheNextRequestOfItsSizeClass) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer every block comes from operator new";
#else
  void* first = PoolAllocate(1400);
  PoolFree(first, 1400);
  void* again = PoolAllocate(1390);  // the same 64-byte class (1345 to 1408 bytes)
  EXPECT_EQ(again, first);
  void* other = PoolAllocate(1500);  // another class: not that block
  EXPECT_NE(other, first);
  PoolFree(again, 1390);
  PoolFree(other, 1500);
#endif
}

TEST(BaseObjectPool, BlocksPastTheLargestClassComeFromOperatorNew) {
  auto* p = static_cast<unsigned char*>(PoolAllocate(100000));
  std::memset(p, 0x5a, 100000);
  EXPECT_TRUE(Intact({p, 100000, 0x5a}));
  PoolFree(p, 100000);
}

struct Counted {
  explicit Counted(int* destroyed, int value) : destroyed(destroyed), value(value) {}
  ~Counted() { ++*destroyed; }
  int* destroyed;
  int value;
  alignas(64) char payload[3000];
};

TEST(BaseObjectPool, MakePooledObjectsAreAlignedAndDestroyedOnce) {
  int destroyed = 0;
  {
    std::shared_ptr<Counted> a = MakePooled<Counted>(&destroyed, 7);
    std::shared_ptr<Counted> b = a;
    EXPECT_EQ(a->value, 7);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.get()) % alignof(Counted), 0u);
    std::weak_ptr<Counted> weak = a;
    a.reset();
    EXPECT_EQ(destroyed, 0);
    b.reset();
    EXPECT_EQ(destroyed, 1);
    EXPECT_TRUE(weak.expired());
  }
  EXPECT_EQ(destroyed, 1);
}

TEST(BaseObjectPool, ThreadsNeverShareABlock) {
  constexpr int kThreads = 4, kRounds = 2000, kHeld = 16;
  std::vector<std::thread> threads;
  std::vector<int> failures(kThreads, 0);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([t, &failures] {
      std::vector<Block> held;
      for (int r = 0; r < kRounds; ++r) {
        size_t size = 200 + size_t((r * 7 + t) % 5) * 900;
        auto* p = static_cast<unsigned char*>(PoolAllocate(size));
        unsigned char fill = static_cast<unsigned char>(t * 50 + r % 50 + 1);
        std::memset(p, fill, size);
        held.push_back({p, size, fill});
        if (held.size() == kHeld) {
          for (const Block& b : held) {
            if (!Intact(b)) failures[t]++;
            PoolFree(b.data, b.size);
          }
          held.clear();
        }
      }
      for (const Block& b : held) {
        if (!Intact(b)) failures[t]++;
        PoolFree(b.data, b.size);
      }
    });
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace ndwv::base
