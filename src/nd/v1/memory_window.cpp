#include "nd/v1/memory_window.h"

#include "nd/memory_window.h"
#include "nd/v1/adapter.h"

namespace ndwv::nd::v1 {

MemoryWindow::MemoryWindow(Adapter& adapter, Ref<nd::MemoryWindow> mw, ND_RESULT* invalidateResult)
    : adapter_(&adapter), mw_(std::move(mw)) {
  // The request id of the remote invalidation's completion: version 1 ids are ND_RESULT*.
  mw_->wv()->SetRemoteInvalidateId(reinterpret_cast<UINT64>(invalidateResult));
}

}  // namespace ndwv::nd::v1
