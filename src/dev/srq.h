// Shared receive queue: receives that any QP using it consumes, in posting order.
#pragma once
#include <cstdint>
#include <mutex>

#include "base/mutex.h"
#include "dev/async.h"
#include "dev/qp.h"
#include "dev/ring.h"

namespace ndwv::dev {

class SharedReceiveQueue {
 public:
  SharedReceiveQueue(std::shared_ptr<ProtectionDomain> pd, uint32_t depth, uint32_t max_sge,
                     uint32_t limit);

  int32_t PostReceive(uint64_t wr_id, const Sge* sge, uint32_t num_sge);
  bool Take(RecvWqe* out);
  int32_t Modify(uint32_t depth, uint32_t limit);  // 0 leaves a value unchanged
  void Query(uint32_t* depth, uint32_t* max_sge, uint32_t* limit);
  // Completes when the receives outstanding drop below the limit.
  int32_t Notify(AsyncOp* op);
  void CancelNotifies();

 private:
  std::shared_ptr<ProtectionDomain> pd_;
  base::Mutex mutex_{"SharedReceiveQueue::mutex_"};
  Ring<RecvWqe> ring_ NDWV_GUARDED_BY(mutex_);
  uint64_t head_ NDWV_GUARDED_BY(mutex_) = 0;
  uint64_t tail_ NDWV_GUARDED_BY(mutex_) = 0;
  const uint32_t max_sge_;
  uint32_t limit_ NDWV_GUARDED_BY(mutex_);
  AsyncOp* armed_ NDWV_GUARDED_BY(mutex_) = nullptr;
};

}  // namespace ndwv::dev
