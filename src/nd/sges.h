// ND2_SGE[] (or version 1's ND_SGE[]) → WV_SGE[] for one post. The array lives on the stack for
// the usual few entries; the caller's array may itself be on its stack and is not kept
// (nd2-spi.md §5).
#pragma once

#include <memory>
#include <new>

#include "nd/com.h"

namespace ndwv::nd {

class WvSges {
 public:
  // Room for n entries, to be filled through data(). A count no device takes is not allocated
  // (ok() is false): the caller's count is checked against its limits after this.
  explicit WvSges(SIZE_T n) : size_(n) {
    if (n > kOnStack && n <= kMostOnHeap) heap_.reset(new (std::nothrow) WV_SGE[n]);
  }
  WvSges(const ND2_SGE sge[], ULONG n) : WvSges(SIZE_T(n)) {
    if (!ok()) return;
    WV_SGE* out = data();
    for (ULONG i = 0; i < n; ++i)
      out[i] = {sge[i].Buffer, sge[i].BufferLength, sge[i].MemoryRegionToken};
  }
  // False only when a long list could not be allocated.
  bool ok() const { return size_ <= kOnStack || heap_ != nullptr; }
  WV_SGE* data() { return heap_ ? heap_.get() : local_; }
  SIZE_T size() const { return size_; }

 private:
  static constexpr SIZE_T kOnStack = 16;
  static constexpr SIZE_T kMostOnHeap = SIZE_T(1) << 20;
  SIZE_T size_;
  WV_SGE local_[kOnStack];
  std::unique_ptr<WV_SGE[]> heap_;
};

// The checks shared by every post of a scatter/gather list, before any entry is read: NULL with
// entries → argument 2; more entries than `most` (the adapter's limit) → ND_DATA_OVERRUN, as the
// SPI names, not a copy of what the caller's count claims.
inline HRESULT CheckSges(const ND2_SGE sge[], ULONG nSge, ULONG most) {
  if (sge == nullptr && nSge != 0) return ND_INVALID_PARAMETER_2;
  return nSge > most ? ND_DATA_OVERRUN : ND_SUCCESS;
}

}  // namespace ndwv::nd
