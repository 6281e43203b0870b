#include "nd/memory_window.h"

#include "nd/adapter.h"

namespace ndwv::nd {

MemoryWindow::MemoryWindow(Adapter& adapter, ComPtr<IWVMemoryWindow> mw)
    : adapter_(&adapter), mw_(std::move(mw)) {}

}  // namespace ndwv::nd
