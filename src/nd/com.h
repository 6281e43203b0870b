// The COM plumbing every ND object shares, written once: reference counting, QueryInterface,
// smart pointers, and the safe downcast from an application-supplied IUnknown* to our own class.
//
// Reference counts. The SPI lets applications see the value AddRef/Release return, and tests
// depend on it (releasing a connector after a completed Connect must return exactly 0). So an
// object counts its *clients* (AddRef/Release) apart from its *holds*: references the library
// itself keeps, e.g. a queue pair on its completion queues or every object on its adapter.
// Clients collectively own one hold; the object is destroyed when the last hold goes.
#pragma once

#include <ndwv/ndspi.h>
#include <ndwv/winverbs.h>

#include <atomic>
#include <new>
#include <type_traits>
#include <utility>

#include "base/fork.h"
#include "base/overlapped.h"

namespace ndwv::nd {

// ---- Owning pointer to a COM interface (WV objects): AddRef/Release -----------------------------

template <class I>
class ComPtr {
 public:
  ComPtr() = default;
  ComPtr(std::nullptr_t) {}
  // Shares a pointer the caller keeps its own reference to.
  explicit ComPtr(I* p) : p_(p) {
    if (p_) p_->AddRef();
  }
  ComPtr(const ComPtr& o) : ComPtr(o.p_) {}
  ComPtr(ComPtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ComPtr& operator=(ComPtr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~ComPtr() {
    if (p_) p_->Release();
  }

  // For out-parameters (`Create(..., x.put())`): the callee's reference becomes ours.
  I** put() {
    *this = nullptr;
    return &p_;
  }
  I* get() const { return p_; }
  I* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  I* p_ = nullptr;
};

// ---- Client references and holds ----------------------------------------------------------------

// Objects of the provider alive in the process, of either version (DllCanUnloadNow).
inline std::atomic<size_t> liveObjects{0};

class Shared {
 public:
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  void Hold() noexcept { holds_.fetch_add(1, std::memory_order_relaxed); }
  void Unhold() noexcept {
    // In a forked child, an object of the parent's stays: its destructor would reach the
    // device's threads, which did not follow the fork (base/fork.h).
    if (holds_.fetch_sub(1, std::memory_order_acq_rel) == 1 && born_ == base::ForkGeneration())
      Destroy();
  }

 protected:
  Shared() { liveObjects.fetch_add(1, std::memory_order_relaxed); }
  virtual ~Shared() { liveObjects.fetch_sub(1, std::memory_order_release); }
  virtual void Destroy() noexcept = 0;
  // The application released its last reference; the library's holds may keep the object.
  virtual void Abandoned() noexcept {}

  ULONG AddClient() noexcept { return clients_.fetch_add(1, std::memory_order_relaxed) + 1; }
  ULONG ReleaseClient() noexcept {
    ULONG left = clients_.fetch_sub(1, std::memory_order_acq_rel) - 1;
    if (left == 0) {
      Abandoned();
      Unhold();  // the hold all clients shared
    }
    return left;
  }

 private:
  std::atomic<ULONG> clients_{1};  // the creator's reference
  std::atomic<ULONG> holds_{1};    // the one owned by the clients
  const uint32_t born_ = base::ForkGeneration();
};

// A hold on one of our objects (the library's internal reference).
template <class T>
class Ref {
 public:
  Ref() = default;
  explicit Ref(T* p) : p_(p) {
    if (p_) p_->Hold();
  }
  Ref(const Ref& o) : Ref(o.p_) {}
  Ref(Ref&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Ref& operator=(Ref o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~Ref() {
    if (p_) p_->Unhold();
  }

  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

// ---- QueryInterface -----------------------------------------------------------------------------

// Which SPI version an implementation serves. It tells implementations apart where the SPI
// gives two interfaces one IID (IND2MemoryWindow and INDMemoryWindow).
enum class Version : uint32_t { V2 = 0x6e647776 /* "ndwv" */, V1 = 0x6e647631 /* "ndv1" */ };

// Asking an object for DowncastIid(iid, version) means "are you this library's implementation of
// the interface iid?". The IID is the public one with its first field scrambled: no other code
// uses it, so a foreign object answers E_NOINTERFACE. The answer is a plain pointer, not a
// reference.
constexpr IID DowncastIid(const IID& iid, Version version) {
  IID scrambled = iid;
  scrambled.Data1 ^= uint32_t(version);
  return scrambled;
}

// `p` as our T, or nullptr if it is NULL or not a T of this library.
template <class T>
T* Downcast(IUnknown* p) {
  void* object = nullptr;
  if (p == nullptr || p->QueryInterface(T::kDowncastIid, &object) != S_OK) return nullptr;
  return static_cast<T*>(object);
}

// The base of every ND object: implements IUnknown for `Interface`, whose IID is `interfaceIid`
// (and IND2Overlapped or INDOverlapped, when Interface derives from it), on behalf of the
// concrete class `Self`.
template <class Self, class Interface, const IID& interfaceIid, Version version = Version::V2>
class Object : public Interface, public Shared {
 public:
  static constexpr IID kDowncastIid = DowncastIid(interfaceIid, version);

  HRESULT STDMETHODCALLTYPE QueryInterface(REFIID iid, void** ppv) override {
    if (ppv == nullptr) return E_POINTER;
    if (iid == kDowncastIid) {
      *ppv = static_cast<Self*>(this);
      return S_OK;
    }
    if (iid == IID_IUnknown || iid == interfaceIid ||
        (std::is_base_of_v<IND2Overlapped, Interface> && iid == IID_IND2Overlapped) ||
        (std::is_base_of_v<INDOverlapped, Interface> && iid == IID_INDOverlapped)) {
      *ppv = static_cast<Interface*>(this);
      AddClient();
      return S_OK;
    }
    *ppv = nullptr;
    return E_NOINTERFACE;
  }
  ULONG STDMETHODCALLTYPE AddRef() override { return AddClient(); }
  ULONG STDMETHODCALLTYPE Release() override { return ReleaseClient(); }

 private:
  void Destroy() noexcept override { delete static_cast<Self*>(this); }
};

// The status an ND caller sees for a WV status: the codes are shared, except that WV's
// asynchronous calls say "pending" with the Win32-flavoured WV_IO_PENDING.
inline HRESULT NdStatus(HRESULT wv) { return wv == WV_IO_PENDING ? ND_PENDING : wv; }

// CancelOverlappedRequests of an object whose requests `requests` owns (nullptr: none can be
// outstanding).
inline HRESULT CancelWvRequests(IWVOverlapped* requests) {
  return requests ? NdStatus(requests->CancelOverlappedRequests()) : ND_SUCCESS;
}

// IND2Overlapped for objects whose overlapped requests are WV requests: Self::wvRequests() names
// the WV object that owns them (nullptr when none can be outstanding). Completions are resolved
// from the OVERLAPPED itself, so any object of the adapter can report on any request (ndmrrate).
template <class Self, class Interface, const IID& interfaceIid>
class OverlappedObject : public Object<Self, Interface, interfaceIid> {
 public:
  HRESULT STDMETHODCALLTYPE CancelOverlappedRequests() override {
    return CancelWvRequests(static_cast<Self*>(this)->wvRequests());
  }
  HRESULT STDMETHODCALLTYPE GetOverlappedResult(OVERLAPPED* ov, BOOL wait) override {
    return base::WaitOverlapped(ov, wait != FALSE);
  }
};

// Hands a new object (holding its creation reference) to the caller as the interface `iid`
// names; the creation reference is dropped, so a wrong iid destroys the object again.
template <class T>
HRESULT Publish(T* object, REFIID iid, void** ppv) {
  HRESULT hr = object->QueryInterface(iid, ppv);
  object->Release();
  return hr;
}

}  // namespace ndwv::nd
