// Completing overlapped requests the way Windows does, for the library's layers.
//
// A request's life: BeginOverlapped() before it starts (Internal = ND_PENDING), then exactly one
// CompleteOverlapped() with the final status. Completion publishes the status in the OVERLAPPED,
// signals its event, queues a packet to the completion port associated with the request's
// overlapped file and wakes WaitOverlapped() callers. After that the OVERLAPPED belongs to the
// application again and is never touched.
//
// A request that may outlive the call that started it is a PendingOverlapped: closing its
// overlapped file completes it ND_CANCELED, as Windows cancels a file's I/O at its close, and
// what completes it later writes nothing. Programs count on that: Microsoft's SDK harness starts
// a Disconnect, releases everything, closes the file and frees the OVERLAPPED at once.
#pragma once

#include <utility>

#include "ndwv/win32.h"

namespace ndwv::base {

class File;

// A new overlapped file handle (the result of IND2Adapter::CreateOverlappedFile), owned by the
// caller until CloseHandle. NULL if out of memory.
HANDLE CreateOverlappedFile();

// For a handle the application passed in: if it is an open overlapped file, takes a reference
// to it and returns true; otherwise (NULL, closed, another kind) returns false.
bool RetainFile(HANDLE file);
// One more reference to a handle the caller already holds a reference to. NULL is ignored.
void RetainHandle(HANDLE handle);
// Drops a reference taken by RetainFile or RetainHandle. NULL is ignored.
void ReleaseHandle(HANDLE handle);

// Marks the request as running (Internal = ND_PENDING, InternalHigh = 0) and, as Windows does
// when an I/O starts, resets the OVERLAPPED's event.
void BeginOverlapped(OVERLAPPED* ov);

// Finishes the request: Internal = status, InternalHigh = bytes; signals hEvent (its tag bits
// ignored); queues a packet to the port associated with `file` unless hEvent's bit 0 is set or no
// port is associated (yet); wakes WaitOverlapped. `file` may be NULL (no port) and must be held
// (RetainFile) by the caller. Does not change the thread's last error.
void CompleteOverlapped(HANDLE file, OVERLAPPED* ov, HRESULT status, ULONG_PTR bytes = 0);

// A request in flight through an overlapped file (see above): begun by the constructor,
// completed once, by Complete or by the file's close, whichever comes first. One destroyed
// without completing (refused before it started) just leaves the file's list. `file` may be NULL
// (no file, nothing to cancel) and must be held (RetainFile) while this lives.
class PendingOverlapped {
 public:
  PendingOverlapped(HANDLE file, OVERLAPPED* ov);
  ~PendingOverlapped();
  PendingOverlapped(const PendingOverlapped&) = delete;
  PendingOverlapped& operator=(const PendingOverlapped&) = delete;

  void Complete(HRESULT status, ULONG_PTR bytes = 0);

 private:
  friend class File;  // win32.cpp: the overlapped file, which keeps its requests in a list
  enum class State { Running, Listed, CancelledByClose };
  HANDLE file_;
  OVERLAPPED* ov_;
  State state_ = State::Running;  // under the file's lock while it is listed
  PendingOverlapped* prev_ = nullptr;
  PendingOverlapped* next_ = nullptr;
};

// The request's status: its final status, or ND_PENDING if it is running and !wait. With wait,
// blocks until it completes (no event needed).
HRESULT WaitOverlapped(OVERLAPPED* ov, bool wait);

// While one lives on a thread, the sleepers its completions release (WaitOverlapped callers,
// event and completion-port waiters) are woken when it ends, not at each completion: a waiter
// with several completions in a batch wakes once and finds them all, instead of waking, taking
// one and sleeping again while the batch goes on. For the engine's batches of socket events.
class WakeBatch {
 public:
  WakeBatch();
  ~WakeBatch();  // the wakes held meanwhile
  WakeBatch(const WakeBatch&) = delete;
  WakeBatch& operator=(const WakeBatch&) = delete;

 private:
  bool outermost_;  // a batch inside another adds to the outer one's
};

// Owns one reference to a handle object.
class HandleRef {
 public:
  HandleRef() = default;
  // Takes over a reference the caller already holds (e.g. from RetainFile).
  static HandleRef Adopt(HANDLE handle) { return HandleRef(handle); }

  HandleRef(const HandleRef& other) : handle_(other.handle_) { RetainHandle(handle_); }
  HandleRef(HandleRef&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  HandleRef& operator=(HandleRef other) noexcept {
    std::swap(handle_, other.handle_);
    return *this;
  }
  ~HandleRef() { ReleaseHandle(handle_); }

  HANDLE get() const { return handle_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  explicit HandleRef(HANDLE handle) : handle_(handle) {}
  HANDLE handle_ = nullptr;
};

}  // namespace ndwv::base
