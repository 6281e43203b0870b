// How the device finishes requests that outlive the call that started them.
//
// An AsyncOp is the record of one outstanding asynchronous request (the device's IRP). The layer
// above allocates it when the request comes down, so the device never allocates on the way up:
// a CM handler or timer can always complete what it owes.
//
// A WorkItem is deferred work for the shared work pool (the analogue of the kernel's system
// thread pool). Whoever may need to defer work embeds one, allocated up front.
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

}  // namespace ndwv::dev
