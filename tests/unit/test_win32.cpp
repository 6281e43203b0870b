// The portable Windows runtime: events, completion ports, overlapped files and the completion
// helpers the layers use (base/overlapped.h).

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "base/overlapped.h"
#include "ndwv/ndstatus.h"
#include "ndwv/win32.h"

namespace {

using ndwv::base::BeginOverlapped;
using ndwv::base::CompleteOverlapped;
using ndwv::base::CreateOverlappedFile;
using ndwv::base::HandleRef;
using ndwv::base::ReleaseHandle;
using ndwv::base::RetainFile;
using ndwv::base::RetainHandle;
using ndwv::base::WaitOverlapped;
using ndwv::base::WakeBatch;

// Upper bound for anything that blocks in another thread; only reached if the code is broken.
constexpr auto kBound = std::chrono::seconds(10);
constexpr DWORD kBoundMs = 10'000;

HANDLE WithPortSuppressed(HANDLE event) {
  return reinterpret_cast<HANDLE>(reinterpret_cast<ULONG_PTR>(event) | 1);
}

HANDLE NewPort() { return CreateIoCompletionPort(INVALID_HANDLE_VALUE, nullptr, 0, 0); }

OVERLAPPED* const kNotSet = reinterpret_cast<OVERLAPPED*>(0x5A5A);

// ---- Events -------------------------------------------------------------------------------------

TEST(Win32Event, ManualResetStaysSignaledUntilReset) {
  HANDLE event = CreateEvent(nullptr, TRUE, FALSE, nullptr);
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_TIMEOUT);
  ASSERT_TRUE(SetEvent(event));
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
  EXPECT_EQ(WaitForSingleObject(event, INFINITE), WAIT_OBJECT_0);
  ASSERT_TRUE(ResetEvent(event));
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_TIMEOUT);
  EXPECT_TRUE(CloseHandle(event));
}

TEST(Win32Event, AutoResetReleasesOneWait) {
  HANDLE event = CreateEventA(nullptr, FALSE, TRUE, "ignored");
  ASSERT_NE(event, nullptr);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_TIMEOUT);
  ASSERT_TRUE(SetEvent(event));
  ASSERT_TRUE(SetEvent(event));  // signalling twice still releases one wait
  EXPECT_EQ(WaitForSingleObject(event, 5), WAIT_OBJECT_0);
  EXPECT_EQ(WaitForSingleObject(event, 5), WAIT_TIMEOUT);
  EXPECT_TRUE(CloseHandle(event));
}

TEST(Win32Event, WaitIsReleasedBySetFromAnotherThread) {
  HANDLE event = CreateEventW(nullptr, FALSE, FALSE, L"ignored");
  ASSERT_NE(event, nullptr);
  auto waiter = std::async(std::launch::async, [&] { return WaitForSingleObject(event, kBoundMs); });
  ASSERT_TRUE(SetEvent(event));
  EXPECT_EQ(waiter.get(), WAIT_OBJECT_0);
  EXPECT_TRUE(CloseHandle(event));
}

TEST(Win32Handles, BadHandlesFailWithInvalidHandle) {
  HANDLE port = NewPort();
  ASSERT_NE(port, nullptr);
  int notAHandle = 0;
  for (HANDLE bad : {HANDLE{nullptr}, INVALID_HANDLE_VALUE, HANDLE{&notAHandle}, port}) {
    SetLastError(ERROR_SUCCESS);
    EXPECT_FALSE(SetEvent(bad));
    EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);
    EXPECT_FALSE(ResetEvent(bad));
    EXPECT_EQ(WaitForSingleObject(bad, 0), WAIT_FAILED);
    EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);
  }
  for (HANDLE bad : {HANDLE{nullptr}, INVALID_HANDLE_VALUE, HANDLE{&notAHandle}}) {
    SetLastError(ERROR_SUCCESS);
    EXPECT_FALSE(CloseHandle(bad));
    EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);
  }

  HANDLE event = CreateEvent(nullptr, TRUE, FALSE, nullptr);
  OVERLAPPED* ov = kNotSet;
  EXPECT_FALSE(GetQueuedCompletionStatus(event, nullptr, nullptr, &ov, 0));
  EXPECT_EQ(ov, nullptr);
  EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);
  EXPECT_FALSE(PostQueuedCompletionStatus(event, 0, 0, nullptr));
  EXPECT_EQ(CreateIoCompletionPort(event, nullptr, 0, 0), nullptr);
  EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);

  EXPECT_TRUE(CloseHandle(event));
  EXPECT_FALSE(CloseHandle(event));  // already closed
  EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);
  EXPECT_FALSE(SetEvent(event));
  EXPECT_TRUE(CloseHandle(port));
}

// Windows ignores a handle's two low bits in every call: `hEvent | 1` (no completion packet) is
// still the event, to set, reset, wait on and close (ndmrlat closes its event that way).
TEST(Win32Handles, TagBitsAreIgnored) {
  auto tagged = [](HANDLE handle, ULONG_PTR bits) {
    return reinterpret_cast<HANDLE>(reinterpret_cast<ULONG_PTR>(handle) | bits);
  };
  for (ULONG_PTR bits : {ULONG_PTR{1}, ULONG_PTR{2}, ULONG_PTR{3}}) {
    HANDLE event = CreateEvent(nullptr, TRUE, FALSE, nullptr);
    ASSERT_NE(event, nullptr);
    HANDLE alias = tagged(event, bits);
    ASSERT_TRUE(SetEvent(alias));
    EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
    EXPECT_EQ(WaitForSingleObject(alias, 0), WAIT_OBJECT_0);
    ASSERT_TRUE(ResetEvent(alias));
    EXPECT_EQ(WaitForSingleObject(alias, 0), WAIT_TIMEOUT);
    EXPECT_TRUE(CloseHandle(alias));
    SetLastError(ERROR_SUCCESS);
    EXPECT_FALSE(SetEvent(event));  // closed through its alias
    EXPECT_EQ(GetLastError(), ERROR_INVALID_HANDLE);
    EXPECT_FALSE(CloseHandle(event));
  }

  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(tagged(file, 2), nullptr, 7, 0);
  ASSERT_NE(port, nullptr);
  ASSERT_TRUE(PostQueuedCompletionStatus(tagged(port, 3), 5, 9, nullptr));
  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* ov = kNotSet;
  EXPECT_TRUE(GetQueuedCompletionStatus(tagged(port, 1), &bytes, &key, &ov, 0));
  EXPECT_EQ(bytes, 5u);
  EXPECT_EQ(key, 9u);
  EXPECT_TRUE(CloseHandle(tagged(file, 1)));
  EXPECT_TRUE(CloseHandle(tagged(port, 2)));
}

TEST(Win32Handles, LastErrorIsPerThread) {
  SetLastError(ERROR_IO_PENDING);
  DWORD seenElsewhere = 1;
  std::thread([&] { seenElsewhere = GetLastError(); }).join();
  EXPECT_EQ(seenElsewhere, ERROR_SUCCESS);
  EXPECT_EQ(GetLastError(), ERROR_IO_PENDING);
}

// ---- Completion ports ---------------------------------------------------------------------------

TEST(Win32Port, PostedPacketsDequeueInOrder) {
  HANDLE port = NewPort();
  ASSERT_NE(port, nullptr);
  OVERLAPPED first{}, second{};
  ASSERT_TRUE(PostQueuedCompletionStatus(port, 1, 11, &first));
  ASSERT_TRUE(PostQueuedCompletionStatus(port, 2, 22, &second));
  ASSERT_TRUE(PostQueuedCompletionStatus(port, 3, 33, nullptr));

  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* ov = nullptr;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, 0));
  EXPECT_EQ(bytes, 1u);
  EXPECT_EQ(key, 11u);
  EXPECT_EQ(ov, &first);
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, INFINITE));
  EXPECT_EQ(bytes, 2u);
  EXPECT_EQ(key, 22u);
  EXPECT_EQ(ov, &second);
  ov = kNotSet;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, 0));  // NULL OVERLAPPED: TRUE
  EXPECT_EQ(bytes, 3u);
  EXPECT_EQ(key, 33u);
  EXPECT_EQ(ov, nullptr);
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Win32Port, TimeoutReturnsFalseWithNullOverlapped) {
  HANDLE port = NewPort();
  ASSERT_NE(port, nullptr);
  for (DWORD ms : {0u, 5u}) {
    OVERLAPPED* ov = kNotSet;
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    SetLastError(ERROR_SUCCESS);
    EXPECT_FALSE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, ms));
    EXPECT_EQ(ov, nullptr);
    EXPECT_EQ(GetLastError(), WAIT_TIMEOUT);
  }
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Win32Port, WaitIsReleasedByPostFromAnotherThread) {
  HANDLE port = NewPort();
  ASSERT_NE(port, nullptr);
  auto waiter = std::async(std::launch::async, [&] {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* ov = kNotSet;
    BOOL ok = GetQueuedCompletionStatus(port, &bytes, &key, &ov, kBoundMs);
    return ok && ov == nullptr && key == 7 && bytes == 0;
  });
  ASSERT_TRUE(PostQueuedCompletionStatus(port, 0, 7, nullptr));
  EXPECT_TRUE(waiter.get());
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Win32Port, ClosingThePortReleasesItsWaiter) {
  HANDLE port = NewPort();
  ASSERT_NE(port, nullptr);
  auto waiter = std::async(std::launch::async, [&] {
    OVERLAPPED* ov = kNotSet;
    BOOL ok = GetQueuedCompletionStatus(port, nullptr, nullptr, &ov, kBoundMs);
    // Whether the close came before or during the wait decides which error is reported.
    DWORD error = GetLastError();
    return !ok && ov == nullptr &&
           (error == ERROR_ABANDONED_WAIT_0 || error == ERROR_INVALID_HANDLE);
  });
  EXPECT_TRUE(CloseHandle(port));
  EXPECT_TRUE(waiter.get());
}

// ---- Overlapped files and completions -----------------------------------------------------------

TEST(Overlapped, SuccessIsDequeuedAsTrueWithTheAssociationKey) {
  HANDLE file = CreateOverlappedFile();
  ASSERT_NE(file, nullptr);
  HANDLE port = CreateIoCompletionPort(file, nullptr, 42, 0);
  ASSERT_NE(port, nullptr);

  OVERLAPPED request{};
  BeginOverlapped(&request);
  EXPECT_EQ(static_cast<HRESULT>(request.Internal), ND_PENDING);
  EXPECT_FALSE(HasOverlappedIoCompleted(&request));
  EXPECT_EQ(WaitOverlapped(&request, false), ND_PENDING);

  SetLastError(ERROR_IO_PENDING);
  CompleteOverlapped(file, &request, ND_SUCCESS, 64);
  EXPECT_EQ(GetLastError(), ERROR_IO_PENDING);  // completing leaves the thread's error alone
  EXPECT_TRUE(HasOverlappedIoCompleted(&request));
  EXPECT_EQ(request.InternalHigh, 64u);

  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* ov = nullptr;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, 0));
  EXPECT_EQ(ov, &request);
  EXPECT_EQ(key, 42u);
  EXPECT_EQ(bytes, 64u);
  EXPECT_EQ(WaitOverlapped(&request, false), ND_SUCCESS);
  EXPECT_EQ(WaitOverlapped(&request, true), ND_SUCCESS);

  EXPECT_TRUE(CloseHandle(file));
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Overlapped, SuccessClassStatusesDequeueAsTrue) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(file, nullptr, 0, 0);
  ASSERT_NE(port, nullptr);
  OVERLAPPED request{};
  BeginOverlapped(&request);
  CompleteOverlapped(file, &request, ND_TIMEOUT);
  OVERLAPPED* ov = nullptr;
  DWORD bytes = 1;
  ULONG_PTR key = 1;
  EXPECT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, 0));
  EXPECT_EQ(ov, &request);
  EXPECT_EQ(WaitOverlapped(&request, false), ND_TIMEOUT);
  EXPECT_TRUE(CloseHandle(file));
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Overlapped, FailureIsDequeuedAsFalseWithTheOverlapped) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(file, nullptr, 0, 0);
  ASSERT_NE(port, nullptr);

  struct Case {
    HRESULT status;
    DWORD error;
  };
  for (Case c : {Case{ND_CANCELED, ERROR_OPERATION_ABORTED},
                 Case{ND_CONNECTION_REFUSED, ERROR_CONNECTION_REFUSED},
                 Case{ND_BUFFER_OVERFLOW, ERROR_MORE_DATA}}) {
    OVERLAPPED request{};
    BeginOverlapped(&request);
    CompleteOverlapped(file, &request, c.status);
    OVERLAPPED* ov = nullptr;
    DWORD bytes = 1;
    ULONG_PTR key = 1;
    EXPECT_FALSE(GetQueuedCompletionStatus(port, &bytes, &key, &ov, 0));
    EXPECT_EQ(ov, &request);
    EXPECT_EQ(GetLastError(), c.error);
    EXPECT_EQ(static_cast<HRESULT>(ov->Internal), c.status);
    EXPECT_EQ(ov->Internal, static_cast<ULONG_PTR>(c.status));  // sign-extended
    EXPECT_EQ(WaitOverlapped(ov, false), c.status);
  }
  EXPECT_TRUE(CloseHandle(file));
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Overlapped, EventIsSignalledAndBitZeroSuppressesThePacket) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(file, nullptr, 0, 0);
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  ASSERT_NE(port, nullptr);
  ASSERT_NE(event, nullptr);

  OVERLAPPED suppressed{};
  suppressed.hEvent = WithPortSuppressed(event);
  BeginOverlapped(&suppressed);
  CompleteOverlapped(file, &suppressed, ND_SUCCESS);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
  OVERLAPPED* ov = kNotSet;
  EXPECT_FALSE(GetQueuedCompletionStatus(port, nullptr, nullptr, &ov, 0));
  EXPECT_EQ(GetLastError(), WAIT_TIMEOUT);
  EXPECT_EQ(ov, nullptr);
  EXPECT_EQ(suppressed.hEvent, WithPortSuppressed(event));  // the application's value is kept

  OVERLAPPED both{};
  both.hEvent = event;
  BeginOverlapped(&both);
  CompleteOverlapped(file, &both, ND_SUCCESS);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
  EXPECT_TRUE(GetQueuedCompletionStatus(port, nullptr, nullptr, &ov, 0));
  EXPECT_EQ(ov, &both);

  EXPECT_TRUE(CloseHandle(event));
  EXPECT_TRUE(CloseHandle(file));
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Overlapped, BeginResetsTheEvent) {
  HANDLE event = CreateEvent(nullptr, TRUE, TRUE, nullptr);
  OVERLAPPED request{};
  request.hEvent = event;
  BeginOverlapped(&request);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_TIMEOUT);
  CompleteOverlapped(nullptr, &request, ND_SUCCESS);  // no file: event and status only
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
  EXPECT_EQ(WaitOverlapped(&request, false), ND_SUCCESS);
  EXPECT_TRUE(CloseHandle(event));
}

TEST(Overlapped, PortCanBeAssociatedAfterRequestsStarted) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = NewPort();
  ASSERT_NE(file, nullptr);
  ASSERT_NE(port, nullptr);

  OVERLAPPED early{};
  BeginOverlapped(&early);
  CompleteOverlapped(file, &early, ND_SUCCESS);  // no port yet: nowhere to go
  EXPECT_EQ(WaitOverlapped(&early, false), ND_SUCCESS);

  OVERLAPPED late{};
  BeginOverlapped(&late);  // started before the association, completes after it
  ASSERT_EQ(CreateIoCompletionPort(file, port, 9, 0), port);

  OVERLAPPED* ov = kNotSet;
  EXPECT_FALSE(GetQueuedCompletionStatus(port, nullptr, nullptr, &ov, 0));
  EXPECT_EQ(GetLastError(), WAIT_TIMEOUT);

  CompleteOverlapped(file, &late, ND_SUCCESS);
  ULONG_PTR key = 0;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, nullptr, &key, &ov, 0));
  EXPECT_EQ(ov, &late);
  EXPECT_EQ(key, 9u);

  EXPECT_TRUE(CloseHandle(file));
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Overlapped, AFileIsAssociatedOnlyOnce) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(file, nullptr, 1, 0);
  HANDLE other = NewPort();
  ASSERT_NE(port, nullptr);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(CreateIoCompletionPort(file, other, 2, 0), nullptr);
  EXPECT_EQ(GetLastError(), ERROR_INVALID_PARAMETER);
  EXPECT_EQ(CreateIoCompletionPort(file, nullptr, 2, 0), nullptr);
  EXPECT_EQ(CreateIoCompletionPort(INVALID_HANDLE_VALUE, port, 0, 0), nullptr);

  OVERLAPPED request{};
  BeginOverlapped(&request);
  CompleteOverlapped(file, &request, ND_SUCCESS);
  ULONG_PTR key = 0;
  OVERLAPPED* ov = nullptr;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, nullptr, &key, &ov, 0));
  EXPECT_EQ(key, 1u);
  EXPECT_FALSE(GetQueuedCompletionStatus(other, nullptr, nullptr, &ov, 0));

  EXPECT_TRUE(CloseHandle(file));
  EXPECT_TRUE(CloseHandle(port));
  EXPECT_TRUE(CloseHandle(other));
}

TEST(Overlapped, FilesSharingAPortKeepTheirOwnKeys) {
  HANDLE port = NewPort();
  HANDLE a = CreateOverlappedFile();
  HANDLE b = CreateOverlappedFile();
  ASSERT_EQ(CreateIoCompletionPort(a, port, 100, 0), port);
  ASSERT_EQ(CreateIoCompletionPort(b, port, 200, 0), port);

  OVERLAPPED ra{}, rb{};
  BeginOverlapped(&ra);
  BeginOverlapped(&rb);
  CompleteOverlapped(b, &rb, ND_SUCCESS);
  CompleteOverlapped(a, &ra, ND_SUCCESS);
  ULONG_PTR key = 0;
  OVERLAPPED* ov = nullptr;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, nullptr, &key, &ov, 0));
  EXPECT_EQ(ov, &rb);
  EXPECT_EQ(key, 200u);
  ASSERT_TRUE(GetQueuedCompletionStatus(port, nullptr, &key, &ov, 0));
  EXPECT_EQ(ov, &ra);
  EXPECT_EQ(key, 100u);

  EXPECT_TRUE(CloseHandle(a));
  EXPECT_TRUE(CloseHandle(b));
  EXPECT_TRUE(CloseHandle(port));
}

TEST(Overlapped, BlockingWaitIsReleasedByACompletionFromAnotherThread) {
  HANDLE file = CreateOverlappedFile();
  OVERLAPPED request{};  // no event: WaitOverlapped must not need one
  BeginOverlapped(&request);
  auto waiter = std::async(std::launch::async, [&] { return WaitOverlapped(&request, true); });
  std::thread completer([&] { CompleteOverlapped(file, &request, ND_CANCELED); });
  bool released = waiter.wait_for(kBound) == std::future_status::ready;
  completer.join();
  ASSERT_TRUE(released);
  EXPECT_EQ(waiter.get(), ND_CANCELED);
  EXPECT_TRUE(CloseHandle(file));
}

// The engine completes its batches of requests inside a WakeBatch: their sleepers wake when it
// ends (the outermost, when batches nest), every one of them, whatever each waits on: a
// completion port, an event, the request itself.
TEST(Overlapped, AWakeBatchReleasesEveryWaiterOfItsCompletionsWhenItEnds) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(file, nullptr, 7, 0);
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  ASSERT_TRUE(file && port && event);
  OVERLAPPED to_port{}, to_event{}, waited{};
  to_event.hEvent = WithPortSuppressed(event);
  for (OVERLAPPED* request : {&to_port, &to_event, &waited}) BeginOverlapped(request);
  auto port_waiter = std::async(std::launch::async, [&] {
    DWORD bytes = 0;
    ULONG_PTR key = 0;
    OVERLAPPED* ov = nullptr;
    return GetQueuedCompletionStatus(port, &bytes, &key, &ov, kBoundMs) && ov == &to_port && key == 7 && bytes == 8;
  });
  auto event_waiter = std::async(std::launch::async, [&] { return WaitForSingleObject(event, kBoundMs); });
  auto request_waiter = std::async(std::launch::async, [&] { return WaitOverlapped(&waited, true); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // asleep by now, most likely
  {
    WakeBatch outer;
    {
      WakeBatch inner;
      CompleteOverlapped(file, &to_port, ND_SUCCESS, 8);
      CompleteOverlapped(nullptr, &to_event, ND_SUCCESS);
      CompleteOverlapped(nullptr, &waited, ND_CANCELED);
    }
  }
  ASSERT_EQ(port_waiter.wait_for(kBound), std::future_status::ready);
  ASSERT_EQ(event_waiter.wait_for(kBound), std::future_status::ready);
  ASSERT_EQ(request_waiter.wait_for(kBound), std::future_status::ready);
  EXPECT_TRUE(port_waiter.get());
  EXPECT_EQ(event_waiter.get(), WAIT_OBJECT_0);
  EXPECT_EQ(request_waiter.get(), ND_CANCELED);
  for (HANDLE handle : {file, port, event}) EXPECT_TRUE(CloseHandle(handle));
}

TEST(Overlapped, ManyWaitersOnManyRequests) {
  constexpr int kRequests = 64;  // more than the wait buckets, so buckets are shared
  std::vector<OVERLAPPED> requests(kRequests);
  std::vector<std::future<HRESULT>> waiters;
  for (auto& request : requests) {
    BeginOverlapped(&request);
    waiters.push_back(
        std::async(std::launch::async, [&request] { return WaitOverlapped(&request, true); }));
  }
  for (int i = 0; i < kRequests; ++i) {
    CompleteOverlapped(nullptr, &requests[i], i % 2 == 0 ? ND_SUCCESS : ND_CANCELED, i);
  }
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_EQ(waiters[i].wait_for(kBound), std::future_status::ready);
    EXPECT_EQ(waiters[i].get(), i % 2 == 0 ? ND_SUCCESS : ND_CANCELED);
  }
}

TEST(Overlapped, ClosedFileStillDeliversCompletions) {
  HANDLE file = CreateOverlappedFile();
  HANDLE port = CreateIoCompletionPort(file, nullptr, 5, 0);
  ASSERT_NE(port, nullptr);
  ASSERT_TRUE(RetainFile(file));  // what a CQ or connector created on the file does
  HandleRef held = HandleRef::Adopt(file);

  OVERLAPPED request{};
  BeginOverlapped(&request);
  EXPECT_TRUE(CloseHandle(file));
  EXPECT_FALSE(CloseHandle(file));
  EXPECT_FALSE(RetainFile(file));  // closed for the application...
  EXPECT_EQ(CreateIoCompletionPort(file, port, 0, 0), nullptr);

  CompleteOverlapped(held.get(), &request, ND_CANCELED);  // ...but not for the library
  OVERLAPPED* ov = nullptr;
  ULONG_PTR key = 0;
  EXPECT_FALSE(GetQueuedCompletionStatus(port, nullptr, &key, &ov, 0));
  EXPECT_EQ(ov, &request);
  EXPECT_EQ(key, 5u);
  EXPECT_EQ(GetLastError(), ERROR_OPERATION_ABORTED);

  // The port goes away first now; completing to its file must still be harmless.
  EXPECT_TRUE(CloseHandle(port));
  BeginOverlapped(&request);
  CompleteOverlapped(held.get(), &request, ND_SUCCESS);
  EXPECT_EQ(WaitOverlapped(&request, false), ND_SUCCESS);
}

TEST(Overlapped, RetainFileAcceptsOnlyOpenFiles) {
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  HANDLE port = NewPort();
  int notAHandle = 0;
  for (HANDLE bad : {HANDLE{nullptr}, INVALID_HANDLE_VALUE, HANDLE{&notAHandle}, event, port}) {
    EXPECT_FALSE(RetainFile(bad));
  }
  HANDLE file = CreateOverlappedFile();
  ASSERT_TRUE(RetainFile(file));
  RetainHandle(file);
  EXPECT_TRUE(CloseHandle(file));
  ReleaseHandle(file);
  {
    HandleRef last = HandleRef::Adopt(file);
    HandleRef copy = last;  // copies take their own reference
    EXPECT_EQ(copy.get(), file);
  }
  EXPECT_TRUE(CloseHandle(event));
  EXPECT_TRUE(CloseHandle(port));
}

// ---- Clock --------------------------------------------------------------------------------------

TEST(Win32Clock, PerformanceCounterIsMonotonicWithFineResolution) {
  LARGE_INTEGER frequency{};
  ASSERT_TRUE(QueryPerformanceFrequency(&frequency));
  EXPECT_GE(frequency.QuadPart, 1'000'000);
  LARGE_INTEGER previous{};
  ASSERT_TRUE(QueryPerformanceCounter(&previous));
  for (int i = 0; i < 1000; ++i) {
    LARGE_INTEGER now{};
    ASSERT_TRUE(QueryPerformanceCounter(&now));
    ASSERT_GE(now.QuadPart, previous.QuadPart);
    previous = now;
  }
  EXPECT_FALSE(QueryPerformanceCounter(nullptr));
}

}  // namespace
