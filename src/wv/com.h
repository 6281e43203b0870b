// The COM boilerplate of every verbs object, written once: reference counting and
// QueryInterface over the IIDs an object answers to.
#pragma once
#include <atomic>

#include <ndwv/winverbs.h>

#include "base/fork.h"

namespace ndwv::wv {

template <typename Interface, const IID&... kIids>
class Unknown : public Interface {
 public:
  HRESULT QueryInterface(REFIID riid, LPVOID* object) override {
    if (!object) return E_POINTER;
    if (riid == IID_IUnknown || ((riid == kIids) || ...)) {
      *object = static_cast<Interface*>(this);
      AddRef();
      return S_OK;
    }
    *object = nullptr;
    return E_NOINTERFACE;
  }
  ULONG AddRef() override { return refs_.fetch_add(1, std::memory_order_relaxed) + 1; }
  ULONG Release() override {
    ULONG left = refs_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    // In a forked child, an object of the parent's stays: its destructor would reach the
    // device's threads, which did not follow the fork (base/fork.h).
    if (left == 0 && born_ == base::ForkGeneration()) delete this;
    return left;
  }

 protected:
  virtual ~Unknown() = default;

 private:
  std::atomic<ULONG> refs_{1};
  const uint32_t born_ = base::ForkGeneration();
};

// Holds one reference to a COM object.
template <typename T>
class ComRef {
 public:
  ComRef() = default;
  explicit ComRef(T* object) : object_(object) {
    if (object_) object_->AddRef();
  }
  ComRef(const ComRef&) = delete;
  ComRef& operator=(const ComRef&) = delete;
  ~ComRef() {
    if (object_) object_->Release();
  }
  T* get() const { return object_; }
  T* operator->() const { return object_; }

 private:
  T* object_ = nullptr;
};

}  // namespace ndwv::wv
