// How the device finishes requests that outlive the call that started them.
//
// An AsyncOp is the record of one outstanding asynchronous request (the device's IRP). The layer
// above allocates it when the request comes down, so the device never allocates on the way up:
// a CM handler or timer can always complete what it owes.
//
// A WorkItem is deferred work for the shared work pool (the analogue of the kernel's system
// thread pool), or for the engine after its turn when the engine deferred it (Engine::Defer).
// Whoever may need to defer work embeds one, allocated up front.
#pragma once
#include <cstdint>

namespace ndwv::dev {

struct AsyncOp {
  virtual void Complete(int32_t status) = 0;
  AsyncOp* next = nullptr;  // for whoever holds the request while it is outstanding
 protected:
  ~AsyncOp() = default;
};

struct WorkItem {
  void (*run)(WorkItem*) = nullptr;
  WorkItem* next = nullptr;
  bool queued = false;  // guarded by the pool; a queued item is not queued twice
};

// Requests finished under an object's lock are completed when the Finisher goes out of scope,
// after the lock is released, so a completion callback may call back into the object.
class Finisher {
 public:
  void Add(AsyncOp* op, int32_t status) {
    if (!op) return;
    op->next = nullptr;
    *tail_ = op;
    tail_ = &op->next;
    statuses_[count_ < kMax ? count_ : kMax - 1] = status;
    count_++;
  }
  void AddList(AsyncOp*& list, int32_t status) {
    while (list) {
      AsyncOp* next = list->next;
      Add(list, status);
      list = next;
    }
  }
  ~Finisher() {
    int i = 0;
    for (AsyncOp* op = head_; op;) {
      AsyncOp* next = op->next;
      op->next = nullptr;
      op->Complete(statuses_[i < kMax ? i : kMax - 1]);
      op = next;
      i++;
    }
  }
 private:
  static constexpr int kMax = 16;
  AsyncOp* head_ = nullptr;
  AsyncOp** tail_ = &head_;
  int32_t statuses_[kMax] = {};
  int count_ = 0;
};

}  // namespace ndwv::dev
