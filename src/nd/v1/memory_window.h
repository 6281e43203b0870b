// INDMemoryWindow: a version 2 (type 2) window with the ND_RESULT that reports its remote
// invalidation. The window grants exactly the range and rights of its Bind, to the one connection
// it was bound through, and a peer's SendAndInvalidate that names it unbinds it and completes
// that ND_RESULT on the owner's inbound CQ (the device does both, nd1-spi.md §2.6).
#pragma once

#include "nd/v1/object.h"

namespace ndwv::nd {
class MemoryWindow;
}

namespace ndwv::nd::v1 {

class Adapter;

class MemoryWindow final : public Object<MemoryWindow, INDMemoryWindow, IID_INDMemoryWindow> {
 public:
  MemoryWindow(Adapter& adapter, Ref<nd::MemoryWindow> mw, ND_RESULT* invalidateResult);

  Adapter* adapter() const { return adapter_.get(); }
  nd::MemoryWindow& base() const { return *mw_; }

 private:
  const Ref<Adapter> adapter_;
  const Ref<nd::MemoryWindow> mw_;
};

}  // namespace ndwv::nd::v1
