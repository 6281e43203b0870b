// The Windows types and calls that NetworkDirect's overlapped model needs, made portable so that
// ND application code compiles unchanged on Linux. Every type keeps its Windows width (LLP64):
// ULONG is 32 bits here although Linux `long` is 64.
#pragma once

#include <cstddef>
#include <cstdint>
#include <netinet/in.h>
#include <sys/socket.h>

// ---- Integer types ------------------------------------------------------------------------------

typedef int32_t HRESULT;
typedef int32_t NTSTATUS;
typedef int32_t LONG;
typedef int32_t INT;
typedef int32_t BOOL;
typedef uint32_t ULONG;
typedef uint32_t DWORD;
typedef uint32_t UINT;
typedef int64_t LONGLONG;
typedef uint64_t ULONGLONG;
typedef uint16_t USHORT;
typedef uint8_t BYTE;
typedef char CHAR;
typedef unsigned char UCHAR;
typedef int8_t INT8;
typedef int16_t INT16;
typedef int32_t INT32;
typedef int64_t INT64;
typedef uint8_t UINT8;
typedef uint16_t UINT16;
typedef uint32_t UINT32;
typedef uint64_t UINT64;
typedef size_t SIZE_T;
typedef uintptr_t ULONG_PTR;
typedef intptr_t LONG_PTR;
typedef ULONG_PTR KAFFINITY;
typedef void* PVOID;
typedef void* LPVOID;
typedef void* HANDLE;
typedef HANDLE* PHANDLE;
typedef ULONG* PULONG;
typedef DWORD* LPDWORD;

#ifndef VOID
#define VOID void
#endif
#ifndef TRUE
#define TRUE 1
#endif
#ifndef FALSE
#define FALSE 0
#endif

#define INVALID_HANDLE_VALUE ((HANDLE)(LONG_PTR)-1)

static_assert(sizeof(ULONG) == 4 && sizeof(LONG) == 4 && sizeof(DWORD) == 4 && sizeof(BOOL) == 4);
static_assert(sizeof(USHORT) == 2 && sizeof(ULONGLONG) == 8);
static_assert(sizeof(SIZE_T) == sizeof(void*) && sizeof(ULONG_PTR) == sizeof(void*));
static_assert(sizeof(KAFFINITY) == sizeof(void*) && sizeof(HANDLE) == sizeof(void*));

// ---- Status codes and their tests ---------------------------------------------------------------

#define S_OK ((HRESULT)0x00000000L)
#define S_FALSE ((HRESULT)0x00000001L)
#define E_NOTIMPL ((HRESULT)0x80004001L)
#define E_NOINTERFACE ((HRESULT)0x80004002L)
#define E_POINTER ((HRESULT)0x80004003L)
#define E_FAIL ((HRESULT)0x80004005L)
#define E_UNEXPECTED ((HRESULT)0x8000FFFFL)
#define E_OUTOFMEMORY ((HRESULT)0x8007000EL)
#define E_INVALIDARG ((HRESULT)0x80070057L)

#define FAILED(hr) (((HRESULT)(hr)) < 0)
#define SUCCEEDED(hr) (((HRESULT)(hr)) >= 0)
#define NT_SUCCESS(status) (((NTSTATUS)(status)) >= 0)

// Win32 error codes (GetLastError). WAIT_TIMEOUT doubles as a wait result.
#define ERROR_SUCCESS 0u
#define ERROR_INVALID_FUNCTION 1u
#define ERROR_INVALID_HANDLE 6u
#define ERROR_NOT_ENOUGH_MEMORY 8u
#define ERROR_CRC 23u
#define ERROR_GEN_FAILURE 31u
#define ERROR_SHARING_VIOLATION 32u
#define ERROR_NOT_SUPPORTED 50u
#define ERROR_NETNAME_DELETED 64u
#define ERROR_BAD_NET_NAME 67u
#define ERROR_INVALID_PARAMETER 87u
#define ERROR_SEM_TIMEOUT 121u
#define ERROR_BUSY 170u
#define ERROR_MORE_DATA 234u
#define WAIT_TIMEOUT 258u
#define ERROR_NO_MORE_ITEMS 259u
#define ERROR_ABANDONED_WAIT_0 735u
#define ERROR_OPERATION_ABORTED 995u
#define ERROR_IO_INCOMPLETE 996u
#define ERROR_IO_PENDING 997u
#define ERROR_NOACCESS 998u
#define ERROR_CONNECTION_REFUSED 1225u
#define ERROR_ADDRESS_ALREADY_ASSOCIATED 1227u
#define ERROR_CONNECTION_INVALID 1229u
#define ERROR_CONNECTION_ACTIVE 1230u
#define ERROR_NETWORK_UNREACHABLE 1231u
#define ERROR_HOST_UNREACHABLE 1232u
#define ERROR_CONNECTION_ABORTED 1236u
#define ERROR_NO_SYSTEM_RESOURCES 1450u
#define ERROR_DEVICE_REMOVED 1617u

#define INFINITE 0xFFFFFFFFu
#define WAIT_OBJECT_0 0x00000000u
#define WAIT_FAILED 0xFFFFFFFFu

// ---- GUIDs and IUnknown -------------------------------------------------------------------------

struct GUID {
  uint32_t Data1;
  uint16_t Data2;
  uint16_t Data3;
  uint8_t Data4[8];
};
typedef GUID IID;
typedef const GUID& REFGUID;
typedef const GUID& REFIID;

static_assert(sizeof(GUID) == 16);

inline constexpr bool operator==(const GUID& a, const GUID& b) {
  if (a.Data1 != b.Data1 || a.Data2 != b.Data2 || a.Data3 != b.Data3) return false;
  for (int i = 0; i < 8; ++i) {
    if (a.Data4[i] != b.Data4[i]) return false;
  }
  return true;
}
inline constexpr bool IsEqualGUID(REFGUID a, REFGUID b) { return a == b; }
inline constexpr bool IsEqualIID(REFIID a, REFIID b) { return a == b; }

inline constexpr IID IID_IUnknown = {0x00000000, 0x0000, 0x0000,
                                     {0xC0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x46}};

// No calling conventions on Linux; the macros exist so that Windows-style declarations compile.
#define STDMETHODCALLTYPE
#define STDMETHODIMP HRESULT STDMETHODCALLTYPE
#define STDMETHODIMP_(type) type STDMETHODCALLTYPE
#define STDMETHOD(method) virtual HRESULT STDMETHODCALLTYPE method
#define STDMETHOD_(type, method) virtual type STDMETHODCALLTYPE method

struct IUnknown {
  virtual HRESULT STDMETHODCALLTYPE QueryInterface(REFIID riid, void** ppvObject) = 0;
  virtual ULONG STDMETHODCALLTYPE AddRef() = 0;
  virtual ULONG STDMETHODCALLTYPE Release() = 0;

 protected:
  // Objects die through Release(); a virtual destructor would also add vtable slots.
  ~IUnknown() = default;
};

// ---- OVERLAPPED, LARGE_INTEGER ------------------------------------------------------------------

// Windows exposes Offset/OffsetHigh and LowPart/HighPart through anonymous structs, which ISO C++
// lacks; GCC and Clang accept them, so only the pedantic warning is silenced.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"

// Internal holds the request's status (ND_PENDING while it runs), InternalHigh its byte count.
struct OVERLAPPED {
  ULONG_PTR Internal;
  ULONG_PTR InternalHigh;
  union {
    struct {
      DWORD Offset;
      DWORD OffsetHigh;
    };
    PVOID Pointer;
  };
  HANDLE hEvent;
};
typedef OVERLAPPED* LPOVERLAPPED;

union LARGE_INTEGER {
  struct {
    DWORD LowPart;
    LONG HighPart;
  };
  struct {
    DWORD LowPart;
    LONG HighPart;
  } u;
  LONGLONG QuadPart;
};

#pragma GCC diagnostic pop

static_assert(sizeof(OVERLAPPED) == 32);
static_assert(offsetof(OVERLAPPED, Internal) == 0);
static_assert(offsetof(OVERLAPPED, InternalHigh) == 8);
static_assert(offsetof(OVERLAPPED, Offset) == 16);
static_assert(offsetof(OVERLAPPED, OffsetHigh) == 20);
static_assert(offsetof(OVERLAPPED, Pointer) == 16);
static_assert(offsetof(OVERLAPPED, hEvent) == 24);
static_assert(sizeof(LARGE_INTEGER) == 8);

// Status 0x103 is STATUS_PENDING (= ND_PENDING).
#define HasOverlappedIoCompleted(lpOverlapped) (((DWORD)(lpOverlapped)->Internal) != 0x00000103u)

// ---- Socket addresses ---------------------------------------------------------------------------

typedef USHORT ADDRESS_FAMILY;
typedef sockaddr SOCKADDR;
typedef sockaddr* LPSOCKADDR;
typedef sockaddr_in SOCKADDR_IN;
typedef sockaddr_in6 SOCKADDR_IN6;

union SOCKADDR_INET {
  sockaddr_in Ipv4;
  sockaddr_in6 Ipv6;
  ADDRESS_FAMILY si_family;
};

struct SOCKET_ADDRESS {
  LPSOCKADDR lpSockaddr;
  INT iSockaddrLength;
};
typedef SOCKET_ADDRESS* PSOCKET_ADDRESS;
typedef SOCKET_ADDRESS* LPSOCKET_ADDRESS;

// Variable length: iAddressCount entries follow in place of Address[1].
struct SOCKET_ADDRESS_LIST {
  INT iAddressCount;
  SOCKET_ADDRESS Address[1];
};
typedef SOCKET_ADDRESS_LIST* PSOCKET_ADDRESS_LIST;
typedef SOCKET_ADDRESS_LIST* LPSOCKET_ADDRESS_LIST;

static_assert(sizeof(SOCKET_ADDRESS) == 16);
static_assert(offsetof(SOCKET_ADDRESS, lpSockaddr) == 0);
static_assert(offsetof(SOCKET_ADDRESS, iSockaddrLength) == 8);
static_assert(offsetof(SOCKET_ADDRESS_LIST, Address) == 8);
static_assert(sizeof(sockaddr_in) == 16 && sizeof(sockaddr_in6) == 28);

// ---- Calls --------------------------------------------------------------------------------------
// Failures return FALSE / NULL / WAIT_FAILED and set the calling thread's last error. Handles
// are validated: NULL, INVALID_HANDLE_VALUE, closed or wrong-kind handles give
// ERROR_INVALID_HANDLE.

DWORD GetLastError();
void SetLastError(DWORD error);

BOOL CloseHandle(HANDLE handle);

// Events. `attributes` and `name` are accepted and ignored (every event is anonymous).
HANDLE CreateEvent(void* attributes, BOOL manualReset, BOOL initialState, const char* name);
inline HANDLE CreateEventA(void* attributes, BOOL manualReset, BOOL initialState,
                           const char* name) {
  return CreateEvent(attributes, manualReset, initialState, name);
}
inline HANDLE CreateEventW(void* attributes, BOOL manualReset, BOOL initialState,
                           const wchar_t* /*name*/) {
  return CreateEvent(attributes, manualReset, initialState, nullptr);
}
BOOL SetEvent(HANDLE event);
BOOL ResetEvent(HANDLE event);
// Waits on an event: WAIT_OBJECT_0, WAIT_TIMEOUT or WAIT_FAILED. `milliseconds` may be INFINITE.
DWORD WaitForSingleObject(HANDLE event, DWORD milliseconds);

// I/O completion ports. CreateIoCompletionPort(INVALID_HANDLE_VALUE, NULL, 0, 0) creates a port;
// with an overlapped file handle it associates the file with `existingPort` (or with a new port
// when that is NULL) under `completionKey`. A file is associated at most once.
HANDLE CreateIoCompletionPort(HANDLE file, HANDLE existingPort, ULONG_PTR completionKey,
                              DWORD concurrentThreads);
// TRUE: a packet with a success status (NT_SUCCESS) or a posted packet. FALSE with *overlapped
// set: a packet whose status failed (the status is in (*overlapped)->Internal, GetLastError has a
// Win32 equivalent). FALSE with *overlapped NULL: timeout (WAIT_TIMEOUT), bad handle, or the port
// was closed while waiting (ERROR_ABANDONED_WAIT_0).
BOOL GetQueuedCompletionStatus(HANDLE port, DWORD* bytesTransferred, ULONG_PTR* completionKey,
                               OVERLAPPED** overlapped, DWORD milliseconds);
BOOL PostQueuedCompletionStatus(HANDLE port, DWORD bytesTransferred, ULONG_PTR completionKey,
                                OVERLAPPED* overlapped);

// A monotonic clock with nanosecond ticks.
BOOL QueryPerformanceCounter(LARGE_INTEGER* count);
BOOL QueryPerformanceFrequency(LARGE_INTEGER* frequency);

void Sleep(DWORD milliseconds);
