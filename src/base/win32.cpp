// The portable Windows runtime behind ndwv/win32.h (events, completion ports, overlapped files)
// and the overlapped-completion helpers of base/overlapped.h.
//
// A HANDLE points to a reference-counted HandleObject. Every handle the application holds is
// also recorded in a table, and each API call looks its handle up there before using it, so a
// NULL, INVALID_HANDLE_VALUE, stale or foreign value is rejected instead of dereferenced. The
// library's layers hold extra references (RetainFile) and use their handles directly.

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <new>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/mutex.h"
#include "base/overlapped.h"
#include "ndwv/ndstatus.h"
#include "ndwv/win32.h"

namespace ndwv::base {
namespace {

using Clock = std::chrono::steady_clock;

enum class HandleKind { kEvent, kPort, kFile };

class HandleObject {
 public:
  explicit HandleObject(HandleKind kind) : kind_(kind) {}
  virtual ~HandleObject() = default;
  HandleObject(const HandleObject&) = delete;
  HandleObject& operator=(const HandleObject&) = delete;

  HandleKind kind() const { return kind_; }
  void Retain() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Release() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // The application closed its handle; references held elsewhere keep the object alive.
  virtual void OnClosed() {}

 private:
  const HandleKind kind_;
  std::atomic<uint32_t> refs_{1};  // the creator's
};

// Wake-ups held until the end of this thread's WakeBatch: the condition, the sleepers its signal
// counted, and the object that owns it, retained until then (null: a wait bucket, never freed).
struct HeldWake {
  CondVar* condition;
  int count;
  HandleObject* owner;
};
thread_local bool t_holding_wakes = false;
thread_local std::vector<HeldWake> t_held_wakes;

// Wakes `count` sleepers of `condition` (owned by `owner`), now or when the thread's WakeBatch ends.
void WakeSleepers(CondVar& condition, int count, HandleObject* owner) {
  if (count <= 0) return;
  if (t_holding_wakes) {
    try {
      t_held_wakes.push_back({&condition, count, owner});
      if (owner) owner->Retain();
      return;
    } catch (const std::bad_alloc&) {  // no room to hold it: woken now
    }
  }
  condition.Wake(count);
}

class Event final : public HandleObject {
 public:
  static constexpr HandleKind kKind = HandleKind::kEvent;
  Event(bool manualReset, bool signaled)
      : HandleObject(kKind), manualReset_(manualReset), signaled_(signaled) {}

  void Set() {
    int wake;
    {
      MutexLock lock(mutex_);
      signaled_ = true;
      wake = manualReset_ ? changed_.SignalAll(mutex_) : changed_.SignalOne(mutex_);
    }
    WakeSleepers(changed_, wake, this);
  }

  void Reset() {
    MutexLock lock(mutex_);
    signaled_ = false;
  }

  DWORD Wait(DWORD milliseconds) {
    MutexLock lock(mutex_);
    const auto deadline = Clock::now() + std::chrono::milliseconds(milliseconds);
    while (!signaled_) {
      if (milliseconds == INFINITE) changed_.Wait(mutex_);
      else if (!changed_.WaitUntil(mutex_, deadline) && !signaled_) return WAIT_TIMEOUT;
    }
    if (!manualReset_) signaled_ = false;  // an auto-reset event releases one waiter
    return WAIT_OBJECT_0;
  }

 private:
  const bool manualReset_;
  Mutex mutex_{"Event::mutex_"};
  CondVar changed_;
  bool signaled_ NDWV_GUARDED_BY(mutex_);
};

struct Packet {
  OVERLAPPED* overlapped;
  ULONG_PTR key;
  ULONG_PTR bytes;
  HRESULT status;
};

class Port final : public HandleObject {
 public:
  static constexpr HandleKind kKind = HandleKind::kPort;
  Port() : HandleObject(kKind) {}

  void Enqueue(const Packet& packet) {
    int wake;
    {
      MutexLock lock(mutex_);
      if (closed_) return;  // nobody can dequeue it any more
      packets_.push_back(packet);
      wake = ready_.SignalOne(mutex_);
    }
    WakeSleepers(ready_, wake, this);
  }

  // ERROR_SUCCESS with *packet filled, WAIT_TIMEOUT, or ERROR_ABANDONED_WAIT_0 if the port was
  // closed meanwhile.
  DWORD Dequeue(DWORD milliseconds, Packet* packet) {
    MutexLock lock(mutex_);
    const auto deadline = Clock::now() + std::chrono::milliseconds(milliseconds);
    while (!closed_ && packets_.empty()) {
      if (milliseconds == INFINITE) ready_.Wait(mutex_);
      else if (!ready_.WaitUntil(mutex_, deadline) && !closed_ && packets_.empty()) return WAIT_TIMEOUT;
    }
    if (closed_) return ERROR_ABANDONED_WAIT_0;
    *packet = packets_.front();
    packets_.pop_front();
    return ERROR_SUCCESS;
  }

  void OnClosed() override {
    int wake;
    {
      MutexLock lock(mutex_);
      closed_ = true;
      packets_.clear();
      wake = ready_.SignalAll(mutex_);
    }
    ready_.Wake(wake);
  }

 private:
  Mutex mutex_{"Port::mutex_"};
  CondVar ready_;
  std::deque<Packet> packets_ NDWV_GUARDED_BY(mutex_);
  bool closed_ NDWV_GUARDED_BY(mutex_) = false;
};

}  // namespace

// An overlapped file: the completion port it is associated with, and its requests in flight
// (PendingOverlapped), which its close completes (overlapped.h).
class File final : public HandleObject {
 public:
  static constexpr HandleKind kKind = HandleKind::kFile;
  File() : HandleObject(kKind) {}
  ~File() override {
    if (Port* port = port_.load(std::memory_order_relaxed)) port->Release();
  }

  // A file is associated with at most one port, once.
  bool Associate(Port* port, ULONG_PTR key) {
    std::lock_guard lock(associateMutex_);
    if (port_.load(std::memory_order_relaxed) != nullptr) return false;
    port->Retain();
    key_ = key;
    port_.store(port, std::memory_order_release);  // publishes key_
    return true;
  }

  // The associated port (NULL if none yet) and its key; valid while the file is.
  Port* port(ULONG_PTR* key) const {
    Port* port = port_.load(std::memory_order_acquire);
    if (port != nullptr) *key = key_;
    return port;
  }

  // A request begins: listed until it completes, unless the file is closed already.
  void Begin(PendingOverlapped* request);
  // The request's completion: published under the lock, which the close waits for, unless the
  // close completed it already.
  void Complete(PendingOverlapped* request, HRESULT status, ULONG_PTR bytes);
  // Leaves the list without completing (a request refused before it started).
  void Forget(PendingOverlapped* request);
  // The application closed its handle: every request listed completes ND_CANCELED now.
  void OnClosed() override;

 private:
  void Unlink(PendingOverlapped* request) NDWV_REQUIRES(requests_mutex_);

  std::mutex associateMutex_;
  std::atomic<Port*> port_{nullptr};
  ULONG_PTR key_ = 0;
  Mutex requests_mutex_{"File::requests_mutex_"};
  PendingOverlapped* requests_ NDWV_GUARDED_BY(requests_mutex_) = nullptr;
  bool closed_ NDWV_GUARDED_BY(requests_mutex_) = false;
};

namespace {

// A handle without its two low bits, which Windows ignores in every call (an OVERLAPPED's
// `hEvent | 1` is still the event). Objects are at least 4-byte aligned: the bits are never theirs.
HandleObject* Untagged(HANDLE handle) {
  return reinterpret_cast<HandleObject*>(reinterpret_cast<ULONG_PTR>(handle) & ~ULONG_PTR{3});
}

// The handles the application holds. Leaked on purpose so that handles closed from static
// destructors after ours have run still work.
class HandleTable {
 public:
  static HandleTable& Get() {
    static HandleTable* table = new HandleTable;
    return *table;
  }

  // Publishes a new object's creator reference as a handle; NULL (object freed) if out of memory.
  HANDLE Insert(HandleObject* object) {
    try {
      std::lock_guard lock(mutex_);
      open_.insert(object);
    } catch (const std::bad_alloc&) {
      object->Release();
      return nullptr;
    }
    return object;
  }

  // The open handle's object with a reference taken, or NULL if `handle` (tag bits ignored) is
  // not an open handle of type T.
  template <class T>
  T* Acquire(HANDLE handle) {
    if (handle == nullptr || handle == INVALID_HANDLE_VALUE) return nullptr;
    HandleObject* object = Untagged(handle);
    std::lock_guard lock(mutex_);
    if (!open_.contains(object) || object->kind() != T::kKind) return nullptr;
    object->Retain();
    return static_cast<T*>(object);
  }

  // Forgets the handle (tag bits ignored) and hands its creator reference to the caller; NULL if
  // it was not open.
  HandleObject* Remove(HANDLE handle) {
    HandleObject* object = Untagged(handle);
    std::lock_guard lock(mutex_);
    return open_.erase(object) != 0 ? object : nullptr;
  }

 private:
  std::mutex mutex_;
  std::unordered_set<HandleObject*> open_;
};

// A counted reference for the duration of one call.
template <class T>
class Held {
 public:
  explicit Held(T* object) : object_(object) {}
  static Held Lookup(HANDLE handle) { return Held(HandleTable::Get().Acquire<T>(handle)); }
  Held(Held&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  Held& operator=(Held&& other) noexcept {
    std::swap(object_, other.object_);
    return *this;
  }
  ~Held() {
    if (object_ != nullptr) object_->Release();
  }
  T* operator->() const { return object_; }
  T* get() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  T* object_;
};

thread_local DWORD lastError = ERROR_SUCCESS;

// BOOL-returning failure with the thread's last error set.
BOOL Fail(DWORD error) {
  lastError = error;
  return FALSE;
}

// What GetLastError reports for a failed completion packet.
DWORD Win32ErrorFromStatus(HRESULT status) {
  switch (status) {
    case ND_CANCELED: return ERROR_OPERATION_ABORTED;
    case ND_BUFFER_OVERFLOW: return ERROR_MORE_DATA;
    case ND_DEVICE_BUSY: return ERROR_BUSY;
    case ND_NO_MORE_ENTRIES: return ERROR_NO_MORE_ITEMS;
    case ND_UNSUCCESSFUL: return ERROR_GEN_FAILURE;
    case ND_ACCESS_VIOLATION: return ERROR_NOACCESS;
    case ND_INVALID_HANDLE: return ERROR_INVALID_HANDLE;
    case ND_INVALID_DEVICE_REQUEST: return ERROR_INVALID_FUNCTION;
    case ND_NO_MEMORY: return ERROR_NOT_ENOUGH_MEMORY;
    case ND_SHARING_VIOLATION: return ERROR_SHARING_VIOLATION;
    case ND_INSUFFICIENT_RESOURCES: return ERROR_NO_SYSTEM_RESOURCES;
    case ND_IO_TIMEOUT: return ERROR_SEM_TIMEOUT;
    case ND_NOT_SUPPORTED: return ERROR_NOT_SUPPORTED;
    case ND_CONNECTION_REFUSED: return ERROR_CONNECTION_REFUSED;
    case ND_CONNECTION_INVALID: return ERROR_CONNECTION_INVALID;
    case ND_CONNECTION_ACTIVE: return ERROR_CONNECTION_ACTIVE;
    case ND_NETWORK_UNREACHABLE: return ERROR_NETWORK_UNREACHABLE;
    case ND_HOST_UNREACHABLE: return ERROR_HOST_UNREACHABLE;
    case ND_CONNECTION_ABORTED: return ERROR_CONNECTION_ABORTED;
    case ND_DEVICE_REMOVED: return ERROR_DEVICE_REMOVED;
    case STATUS_ADDRESS_ALREADY_ASSOCIATED: return ERROR_ADDRESS_ALREADY_ASSOCIATED;
    case STATUS_BAD_NETWORK_NAME: return ERROR_BAD_NET_NAME;
    case STATUS_CONNECTION_DISCONNECTED: return ERROR_NETNAME_DELETED;
    case STATUS_DATA_ERROR: return ERROR_CRC;
    default: break;
  }
  if (status == ND_INVALID_PARAMETER || status == ND_INVALID_PARAMETER_MIX ||
      (status >= ND_INVALID_PARAMETER_1 && status <= ND_INVALID_PARAMETER_10)) {
    return ERROR_INVALID_PARAMETER;
  }
  return ERROR_GEN_FAILURE;
}

// Internal keeps the status sign-extended, so that both `(HRESULT)ov.Internal == ND_CANCELED`
// and `ov.Internal == ND_CANCELED` hold.
ULONG_PTR EncodeStatus(HRESULT status) {
  return static_cast<ULONG_PTR>(static_cast<LONG_PTR>(status));
}
HRESULT DecodeStatus(ULONG_PTR internal) {
  return static_cast<HRESULT>(static_cast<uint32_t>(internal));
}

// Threads blocked in WaitOverlapped, spread over a few buckets by OVERLAPPED address. A
// completer only touches a bucket when someone waits in it, and never dereferences the
// OVERLAPPED after publishing its status (the application may reuse it at once).
struct alignas(64) WaitBucket {
  Mutex mutex{"WaitBucket::mutex"};
  CondVar completed;
  std::atomic<uint32_t> waiters{0};
};
constexpr size_t kWaitBuckets = 16;

WaitBucket& BucketFor(const OVERLAPPED* ov) {
  static WaitBucket* buckets = new WaitBucket[kWaitBuckets];  // leaked: see HandleTable
  return buckets[(reinterpret_cast<uintptr_t>(ov) / alignof(OVERLAPPED)) % kWaitBuckets];
}

std::atomic_ref<ULONG_PTR> InternalOf(OVERLAPPED* ov) { return std::atomic_ref(ov->Internal); }

// Split hEvent: bit 0 asks for no completion-port packet; the event is the handle (the event
// lookup ignores the tag bits).
bool SkipsPort(HANDLE hEvent) { return (reinterpret_cast<ULONG_PTR>(hEvent) & 1) != 0; }

}  // namespace

HANDLE CreateOverlappedFile() {
  auto* file = new (std::nothrow) File;
  return file != nullptr ? HandleTable::Get().Insert(file) : nullptr;
}

bool RetainFile(HANDLE file) {
  // The reference taken by the lookup becomes the caller's.
  return HandleTable::Get().Acquire<File>(file) != nullptr;
}

void RetainHandle(HANDLE handle) {
  if (handle != nullptr) static_cast<HandleObject*>(handle)->Retain();
}

void ReleaseHandle(HANDLE handle) {
  if (handle != nullptr) static_cast<HandleObject*>(handle)->Release();
}

void BeginOverlapped(OVERLAPPED* ov) {
  if (auto event = Held<Event>::Lookup(ov->hEvent)) event->Reset();
  std::atomic_ref(ov->InternalHigh).store(0, std::memory_order_relaxed);
  InternalOf(ov).store(EncodeStatus(ND_PENDING), std::memory_order_release);
}

namespace {

// The file behind a request's handle, if it is one.
File* FileOf(HANDLE handle) {
  auto* object = static_cast<HandleObject*>(handle);
  return object != nullptr && object->kind() == HandleKind::kFile ? static_cast<File*>(object) : nullptr;
}

}  // namespace

void CompleteOverlapped(HANDLE file, OVERLAPPED* ov, HRESULT status, ULONG_PTR bytes) {
  // Everything needed from the OVERLAPPED is read before the status is published.
  const HANDLE hEvent = ov->hEvent;
  Port* port = nullptr;
  ULONG_PTR key = 0;
  if (File* f = FileOf(file); f != nullptr && !SkipsPort(hEvent)) port = f->port(&key);

  std::atomic_ref(ov->InternalHigh).store(bytes, std::memory_order_relaxed);
  // seq_cst pairs with the waiter count below (a waiter registers, then re-reads Internal).
  InternalOf(ov).store(EncodeStatus(status), std::memory_order_seq_cst);

  WaitBucket& bucket = BucketFor(ov);
  if (bucket.waiters.load(std::memory_order_seq_cst) != 0) {
    // Taking the lock orders this wake-up after a waiter's check of Internal.
    int wake;
    {
      MutexLock lock(bucket.mutex);
      wake = bucket.completed.SignalAll(bucket.mutex);
    }
    WakeSleepers(bucket.completed, wake, nullptr);
  }
  if (auto event = Held<Event>::Lookup(hEvent)) event->Set();
  if (port != nullptr) port->Enqueue(Packet{ov, key, bytes, status});
}

void File::Begin(PendingOverlapped* request) {
  MutexLock lock(requests_mutex_);
  if (closed_) return;  // nothing will cancel it: its completion is published as it comes
  request->state_ = PendingOverlapped::State::Listed;
  request->next_ = requests_;
  if (requests_) requests_->prev_ = request;
  requests_ = request;
}

void File::Unlink(PendingOverlapped* request) {
  if (request->prev_) request->prev_->next_ = request->next_;
  else requests_ = request->next_;
  if (request->next_) request->next_->prev_ = request->prev_;
  request->prev_ = request->next_ = nullptr;
}

void File::Complete(PendingOverlapped* request, HRESULT status, ULONG_PTR bytes) {
  MutexLock lock(requests_mutex_);
  switch (request->state_) {
    case PendingOverlapped::State::Listed: Unlink(request); break;
    case PendingOverlapped::State::CancelledByClose: return;  // its OVERLAPPED may be gone
    case PendingOverlapped::State::Running: break;            // begun after the close
  }
  request->state_ = PendingOverlapped::State::Running;
  CompleteOverlapped(this, request->ov_, status, bytes);
}

void File::Forget(PendingOverlapped* request) {
  MutexLock lock(requests_mutex_);
  if (request->state_ == PendingOverlapped::State::Listed) Unlink(request);
  request->state_ = PendingOverlapped::State::Running;
}

void File::OnClosed() {
  // Under the lock throughout: a completion under way finishes first, and none writes after.
  MutexLock lock(requests_mutex_);
  closed_ = true;
  while (PendingOverlapped* request = requests_) {
    Unlink(request);
    request->state_ = PendingOverlapped::State::CancelledByClose;
    CompleteOverlapped(this, request->ov_, ND_CANCELED);
  }
}

PendingOverlapped::PendingOverlapped(HANDLE file, OVERLAPPED* ov) : file_(file), ov_(ov) {
  BeginOverlapped(ov);
  if (File* f = FileOf(file)) f->Begin(this);
}

PendingOverlapped::~PendingOverlapped() {
  if (File* f = FileOf(file_)) f->Forget(this);
}

void PendingOverlapped::Complete(HRESULT status, ULONG_PTR bytes) {
  if (File* f = FileOf(file_)) f->Complete(this, status, bytes);
  else CompleteOverlapped(file_, ov_, status, bytes);
}

WakeBatch::WakeBatch() : outermost_(!t_holding_wakes) { t_holding_wakes = true; }

WakeBatch::~WakeBatch() {
  if (!outermost_) return;
  t_holding_wakes = false;
  for (const HeldWake& held : t_held_wakes) {
    held.condition->Wake(held.count);
    if (held.owner) held.owner->Release();
  }
  t_held_wakes.clear();  // keeps its capacity for the next batch
}

HRESULT WaitOverlapped(OVERLAPPED* ov, bool wait) {
  ULONG_PTR internal = InternalOf(ov).load(std::memory_order_acquire);
  if (internal != EncodeStatus(ND_PENDING) || !wait) return DecodeStatus(internal);

  WaitBucket& bucket = BucketFor(ov);
  bucket.waiters.fetch_add(1, std::memory_order_seq_cst);
  {
    MutexLock lock(bucket.mutex);
    while ((internal = InternalOf(ov).load(std::memory_order_seq_cst)) ==
           EncodeStatus(ND_PENDING)) {
      bucket.completed.Wait(bucket.mutex);
    }
  }
  bucket.waiters.fetch_sub(1, std::memory_order_relaxed);
  return DecodeStatus(internal);
}

}  // namespace ndwv::base

// ---- The Win32 calls ----------------------------------------------------------------------------

using ndwv::base::Event;
using ndwv::base::Fail;
using ndwv::base::File;
using ndwv::base::HandleTable;
using ndwv::base::Held;
using ndwv::base::Packet;
using ndwv::base::Port;

DWORD GetLastError() { return ndwv::base::lastError; }

void SetLastError(DWORD error) { ndwv::base::lastError = error; }

BOOL CloseHandle(HANDLE handle) {
  if (handle == nullptr || handle == INVALID_HANDLE_VALUE) return Fail(ERROR_INVALID_HANDLE);
  auto* object = HandleTable::Get().Remove(handle);
  if (object == nullptr) return Fail(ERROR_INVALID_HANDLE);
  object->OnClosed();
  object->Release();
  return TRUE;
}

HANDLE CreateEvent(void* /*attributes*/, BOOL manualReset, BOOL initialState,
                   const char* /*name*/) {
  auto* event = new (std::nothrow) Event(manualReset != FALSE, initialState != FALSE);
  HANDLE handle = event != nullptr ? HandleTable::Get().Insert(event) : nullptr;
  if (handle == nullptr) SetLastError(ERROR_NOT_ENOUGH_MEMORY);
  return handle;
}

BOOL SetEvent(HANDLE handle) {
  auto event = Held<Event>::Lookup(handle);
  if (!event) return Fail(ERROR_INVALID_HANDLE);
  event->Set();
  return TRUE;
}

BOOL ResetEvent(HANDLE handle) {
  auto event = Held<Event>::Lookup(handle);
  if (!event) return Fail(ERROR_INVALID_HANDLE);
  event->Reset();
  return TRUE;
}

DWORD WaitForSingleObject(HANDLE handle, DWORD milliseconds) {
  auto event = Held<Event>::Lookup(handle);
  if (!event) {
    SetLastError(ERROR_INVALID_HANDLE);
    return WAIT_FAILED;
  }
  return event->Wait(milliseconds);
}

HANDLE CreateIoCompletionPort(HANDLE file, HANDLE existingPort, ULONG_PTR completionKey,
                              DWORD /*concurrentThreads*/) {
  if (file == INVALID_HANDLE_VALUE && existingPort != nullptr) {
    SetLastError(ERROR_INVALID_PARAMETER);
    return nullptr;
  }
  Held<File> target(nullptr);
  if (file != INVALID_HANDLE_VALUE) {
    target = Held<File>::Lookup(file);
    if (!target) {
      SetLastError(ERROR_INVALID_HANDLE);
      return nullptr;
    }
  }

  HANDLE portHandle = existingPort;
  Held<Port> port(nullptr);
  if (existingPort != nullptr) {
    port = Held<Port>::Lookup(existingPort);
    if (!port) {
      SetLastError(ERROR_INVALID_HANDLE);
      return nullptr;
    }
  } else {
    auto* created = new (std::nothrow) Port;
    if (created == nullptr) {
      SetLastError(ERROR_NOT_ENOUGH_MEMORY);
      return nullptr;
    }
    created->Retain();  // for `port`, independent of the handle published next
    port = Held<Port>(created);
    portHandle = HandleTable::Get().Insert(created);
    if (portHandle == nullptr) {
      SetLastError(ERROR_NOT_ENOUGH_MEMORY);
      return nullptr;
    }
  }

  if (target && !target->Associate(port.get(), completionKey)) {
    if (existingPort == nullptr) CloseHandle(portHandle);
    SetLastError(ERROR_INVALID_PARAMETER);  // already associated
    return nullptr;
  }
  return portHandle;
}

BOOL GetQueuedCompletionStatus(HANDLE portHandle, DWORD* bytesTransferred,
                               ULONG_PTR* completionKey, OVERLAPPED** overlapped,
                               DWORD milliseconds) {
  if (overlapped != nullptr) *overlapped = nullptr;
  auto port = Held<Port>::Lookup(portHandle);
  if (!port) return Fail(ERROR_INVALID_HANDLE);

  Packet packet;
  if (DWORD error = port->Dequeue(milliseconds, &packet); error != ERROR_SUCCESS) {
    return Fail(error);
  }
  if (bytesTransferred != nullptr) *bytesTransferred = static_cast<DWORD>(packet.bytes);
  if (completionKey != nullptr) *completionKey = packet.key;
  if (overlapped != nullptr) *overlapped = packet.overlapped;
  if (!NT_SUCCESS(packet.status)) return Fail(ndwv::base::Win32ErrorFromStatus(packet.status));
  return TRUE;
}

BOOL PostQueuedCompletionStatus(HANDLE portHandle, DWORD bytesTransferred,
                                ULONG_PTR completionKey, OVERLAPPED* overlapped) {
  auto port = Held<Port>::Lookup(portHandle);
  if (!port) return Fail(ERROR_INVALID_HANDLE);
  port->Enqueue(Packet{overlapped, completionKey, bytesTransferred, ND_SUCCESS});
  return TRUE;
}

BOOL QueryPerformanceCounter(LARGE_INTEGER* count) {
  if (count == nullptr) return Fail(ERROR_INVALID_PARAMETER);
  count->QuadPart = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count();
  return TRUE;
}

BOOL QueryPerformanceFrequency(LARGE_INTEGER* frequency) {
  if (frequency == nullptr) return Fail(ERROR_INVALID_PARAMETER);
  frequency->QuadPart = 1'000'000'000;
  return TRUE;
}

void Sleep(DWORD milliseconds) {
  if (milliseconds == 0) {
    std::this_thread::yield();
    return;
  }
  if (milliseconds == INFINITE) {
    for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(milliseconds));
}
