// What every NetworkDirect version 1 object shares: the COM plumbing of version 2 (nd/com.h)
// under the version 1 downcast, INDOverlapped for objects whose requests are WV requests, and
// the adoption of the version 2 object a version 1 object is made of.
#pragma once

#include "nd/com.h"

namespace ndwv::nd::v1 {

template <class Self, class Interface, const IID& interfaceIid>
using Object = nd::Object<Self, Interface, interfaceIid, Version::V1>;

// INDOverlapped: Self::wvRequests() names the WV object that owns the object's requests. As in
// version 2, a completion is resolved from the OVERLAPPED itself; version 1 also reports a byte
// count, which ND requests do not have: written as a whole 64-bit 0.
template <class Self, class Interface, const IID& interfaceIid>
class OverlappedObject : public Object<Self, Interface, interfaceIid> {
 public:
  HRESULT STDMETHODCALLTYPE CancelOverlappedRequests() override {
    return CancelWvRequests(static_cast<Self*>(this)->wvRequests());
  }
  HRESULT STDMETHODCALLTYPE GetOverlappedResult(OVERLAPPED* pOverlapped,
                                                SIZE_T* pNumberOfBytesTransferred,
                                                BOOL bWait) override {
    if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_1;
    if (pNumberOfBytesTransferred != nullptr) *pNumberOfBytesTransferred = 0;
    return base::WaitOverlapped(pOverlapped, bWait != FALSE);
  }
};

// A hold on a version 2 object that `created` returned with its creation reference, which the
// hold replaces: the version 1 object that wraps it is then its only owner.
template <class T>
Ref<T> Adopt(T* created) {
  Ref<T> held(created);
  created->Release();
  return held;
}

}  // namespace ndwv::nd::v1
