// A queue of small plain records in one ring that doubles when full: nothing allocated until the
// first element, then a single block of the pool.
//
// Why: a RoCE link keeps its requests in flight and the Reads it owes in queues that most of the
// time hold one or two records of 32 bytes. A std::deque (LazyDeque) holds a 512-byte block and
// its map for that once used, ~0.7 KB a connection that has sent anything: 7 MiB per process at
// 10,000 connections, each of them needing one keepalive to get it. Four records take 128 bytes.
// The ring never shrinks while it lives: a connection that queued once queues again.
#pragma once
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "base/object_pool.h"

namespace ndwv::base {

template <class T>
class RingQueue {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "records are moved as bytes");

 public:
  RingQueue() = default;
  RingQueue(const RingQueue&) = delete;
  RingQueue& operator=(const RingQueue&) = delete;
  ~RingQueue() {
    if (items_) PoolFree(items_, capacity_ * sizeof(T));
  }

  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }

  // As std::deque's: on an empty queue, or past its size, undefined.
  T& operator[](size_t i) {
    assert(i < size_);
    return items_[(head_ + i) & (capacity_ - 1)];
  }
  const T& operator[](size_t i) const {
    assert(i < size_);
    return items_[(head_ + i) & (capacity_ - 1)];
  }
  T& front() { return (*this)[0]; }
  const T& front() const { return (*this)[0]; }
  T& back() { return (*this)[size_ - 1]; }
  const T& back() const { return (*this)[size_ - 1]; }

  void push_back(const T& item) {
    if (size_ == capacity_) Grow();
    items_[(head_ + size_) & (capacity_ - 1)] = item;
    ++size_;
  }
  void pop_front() {
    assert(size_ > 0);
    head_ = (head_ + 1) & (capacity_ - 1);
    --size_;
  }
  void pop_back() {
    assert(size_ > 0);
    --size_;
  }
  void clear() { head_ = size_ = 0; }

 private:
  static constexpr size_t kFirstCapacity = 4;

  // Doubles the ring; the records move to its start, in order.
  void Grow() {
    const size_t capacity = capacity_ ? 2 * capacity_ : kFirstCapacity;
    T* items = static_cast<T*>(PoolAllocate(capacity * sizeof(T)));
    for (size_t i = 0; i < size_; ++i) memcpy(&items[i], &(*this)[i], sizeof(T));
    if (items_) PoolFree(items_, capacity_ * sizeof(T));
    items_ = items;
    capacity_ = capacity;
    head_ = 0;
  }

  T* items_ = nullptr;
  size_t capacity_ = 0;  // a power of two, or 0
  size_t head_ = 0;
  size_t size_ = 0;
};

}  // namespace ndwv::base
