// The Windows types and calls that NetworkDirect's overlapped model needs, made portable so that
// ND application code compiles unchanged on Linux. Every type keeps its Windows width (LLP64):
// ULONG is 32 bits here although Linux `long` is 64.
//
// C and C++ both, as on Windows: COM interfaces are declared with the interface macros
// (DECLARE_INTERFACE_, STDMETHOD, THIS_, PURE), which give a C++ class with virtual methods or,
// in C, a struct whose first member `lpVtbl` points at a table of function pointers laid out as
// the C++ vtable is. GUID arguments are references in C++ (REFIID) and pointers in C. Windows'
// `interface` keyword macro is left out: on Linux it would rename every identifier `interface`
// in the program and in the system headers included after this one.
#pragma once

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#ifndef __cplusplus
#include <string.h>  // memcmp, for IsEqualGUID
#endif

// ---- Language glue ------------------------------------------------------------------------------

#ifdef __cplusplus
#define NDWV_EXTERN_C_BEGIN extern "C" {
#define NDWV_EXTERN_C_END }
#define NDWV_INLINE inline
#define NDWV_STATIC_ASSERT(condition) static_assert(condition, #condition)
#ifndef EXTERN_C
#define EXTERN_C extern "C"
#endif
#else
#define NDWV_EXTERN_C_BEGIN
#define NDWV_EXTERN_C_END
#define NDWV_INLINE static inline
#define NDWV_STATIC_ASSERT(condition) _Static_assert(condition, #condition)
#ifndef EXTERN_C
#define EXTERN_C extern
#endif
#endif

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

// A distinct pointer type per kind of handle (ND_MR_HANDLE, ...), as Windows declares them.
#ifndef DECLARE_HANDLE
#define DECLARE_HANDLE(name) \
  struct name##__ {          \
    int unused;              \
  };                         \
  typedef struct name##__* name
#endif

NDWV_STATIC_ASSERT(sizeof(ULONG) == 4 && sizeof(LONG) == 4 && sizeof(DWORD) == 4);
NDWV_STATIC_ASSERT(sizeof(BOOL) == 4 && sizeof(USHORT) == 2 && sizeof(ULONGLONG) == 8);
NDWV_STATIC_ASSERT(sizeof(SIZE_T) == sizeof(void*) && sizeof(ULONG_PTR) == sizeof(void*));
NDWV_STATIC_ASSERT(sizeof(KAFFINITY) == sizeof(void*) && sizeof(HANDLE) == sizeof(void*));

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
#define CLASS_E_NOAGGREGATION ((HRESULT)0x80040110L)
#define CLASS_E_CLASSNOTAVAILABLE ((HRESULT)0x80040111L)

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

// ---- GUIDs --------------------------------------------------------------------------------------

typedef struct _GUID {
  uint32_t Data1;
  uint16_t Data2;
  uint16_t Data3;
  uint8_t Data4[8];
} GUID;
typedef GUID IID;
typedef GUID CLSID;
NDWV_STATIC_ASSERT(sizeof(GUID) == 16);

// Defines a GUID constant in every translation unit that includes the definition, so that no
// INITGUID dance is needed: a compile-time constant in C++, a static const in C. ndwv's headers
// use this name; DEFINE_GUID, Windows' name, is offered to applications unless they have one.
#ifdef __cplusplus
#define NDWV_DEFINE_GUID(name, l, w1, w2, b1, b2, b3, b4, b5, b6, b7, b8) \
  inline constexpr GUID name = {l, w1, w2, {b1, b2, b3, b4, b5, b6, b7, b8}}
#else
#define NDWV_DEFINE_GUID(name, l, w1, w2, b1, b2, b3, b4, b5, b6, b7, b8) \
  static const GUID name __attribute__((unused)) = {l, w1, w2, {b1, b2, b3, b4, b5, b6, b7, b8}}
#endif
#ifndef DEFINE_GUID
#define DEFINE_GUID NDWV_DEFINE_GUID
#endif

#ifdef __cplusplus
typedef const GUID& REFGUID;
typedef const IID& REFIID;
typedef const CLSID& REFCLSID;

inline constexpr bool operator==(const GUID& a, const GUID& b) {
  if (a.Data1 != b.Data1 || a.Data2 != b.Data2 || a.Data3 != b.Data3) return false;
  for (int i = 0; i < 8; ++i) {
    if (a.Data4[i] != b.Data4[i]) return false;
  }
  return true;
}
inline constexpr bool IsEqualGUID(REFGUID a, REFGUID b) { return a == b; }
inline constexpr bool IsEqualIID(REFIID a, REFIID b) { return a == b; }
inline constexpr bool IsEqualCLSID(REFCLSID a, REFCLSID b) { return a == b; }
#else
typedef const GUID* REFGUID;
typedef const IID* REFIID;
typedef const CLSID* REFCLSID;

#define IsEqualGUID(rguid1, rguid2) (!memcmp((rguid1), (rguid2), sizeof(GUID)))
#define IsEqualIID(riid1, riid2) IsEqualGUID(riid1, riid2)
#define IsEqualCLSID(rclsid1, rclsid2) IsEqualGUID(rclsid1, rclsid2)
#endif

// ---- Interface declarations ---------------------------------------------------------------------
// No calling conventions on Linux: one ABI serves C and C++ callers alike.

#define STDMETHODCALLTYPE
#define STDMETHODIMP HRESULT STDMETHODCALLTYPE
#define STDMETHODIMP_(type) type STDMETHODCALLTYPE

#ifdef __cplusplus
#define STDMETHOD(method) virtual HRESULT STDMETHODCALLTYPE method
#define STDMETHOD_(type, method) virtual type STDMETHODCALLTYPE method
#define PURE = 0
#define THIS_
#define THIS void
#define DECLARE_INTERFACE(iface) struct iface
#define DECLARE_INTERFACE_(iface, baseiface) struct iface : public baseiface
// Objects die through Release(); an interface pointer is never deleted. (The destructor is not
// virtual: that would add vtable slots.)
// (Written without a semicolon after it: in C it is nothing at all.)
#define NDWV_DESTROYED_BY_RELEASE(iface) \
 protected:                              \
  ~iface() = default;
#else
#define STDMETHOD(method) HRESULT(STDMETHODCALLTYPE* method)
#define STDMETHOD_(type, method) type(STDMETHODCALLTYPE* method)
#define PURE
#define THIS_ INTERFACE* This,
#define THIS INTERFACE* This
#define DECLARE_INTERFACE(iface)                   \
  typedef struct iface {                           \
    const struct iface##Vtbl* lpVtbl;              \
  } iface;                                         \
  typedef const struct iface##Vtbl iface##Vtbl;    \
  struct iface##Vtbl
#define DECLARE_INTERFACE_(iface, baseiface) DECLARE_INTERFACE(iface)
#define NDWV_DESTROYED_BY_RELEASE(iface)
#endif
#define IFACEMETHOD(method) STDMETHOD(method)
#define IFACEMETHOD_(type, method) STDMETHOD_(type, method)

// Every interface repeats the methods of its bases, as Windows' headers do, so that the C
// vtable lists them all; in C++ the repetitions are overrides and add no slot.
#define NDWV_IUNKNOWN_METHODS                                        \
  IFACEMETHOD(QueryInterface)(THIS_ REFIID riid, void** ppvObject) PURE; \
  IFACEMETHOD_(ULONG, AddRef)(THIS) PURE;                            \
  IFACEMETHOD_(ULONG, Release)(THIS) PURE

// ---- IUnknown, IClassFactory --------------------------------------------------------------------

NDWV_DEFINE_GUID(IID_IUnknown, 0x00000000, 0x0000, 0x0000, 0xC0, 0x00, 0x00, 0x00, 0x00, 0x00,
                 0x00, 0x46);

#undef INTERFACE
#define INTERFACE IUnknown
DECLARE_INTERFACE(IUnknown) {
  NDWV_IUNKNOWN_METHODS;

  NDWV_DESTROYED_BY_RELEASE(IUnknown)
};
typedef IUnknown* LPUNKNOWN;

// What a provider library's DllGetClassObject hands out for IID_IClassFactory (ND v1).
NDWV_DEFINE_GUID(IID_IClassFactory, 0x00000001, 0x0000, 0x0000, 0xC0, 0x00, 0x00, 0x00, 0x00,
                 0x00, 0x00, 0x46);

#undef INTERFACE
#define INTERFACE IClassFactory
DECLARE_INTERFACE_(IClassFactory, IUnknown) {
  NDWV_IUNKNOWN_METHODS;

  STDMETHOD(CreateInstance)(THIS_ IUnknown* pUnkOuter, REFIID riid, void** ppvObject) PURE;
  STDMETHOD(LockServer)(THIS_ BOOL fLock) PURE;

  NDWV_DESTROYED_BY_RELEASE(IClassFactory)
};
#undef INTERFACE

// ---- OVERLAPPED, LARGE_INTEGER ------------------------------------------------------------------

// Windows exposes Offset/OffsetHigh and LowPart/HighPart through anonymous structs, which ISO
// C11 has and ISO C++ lacks; GCC and Clang accept them in C++, so only the pedantic warning is
// silenced.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"

// Internal holds the request's status (ND_PENDING while it runs), InternalHigh its byte count.
typedef struct _OVERLAPPED {
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
} OVERLAPPED, *LPOVERLAPPED;

typedef union _LARGE_INTEGER {
  struct {
    DWORD LowPart;
    LONG HighPart;
  };
  struct {
    DWORD LowPart;
    LONG HighPart;
  } u;
  LONGLONG QuadPart;
} LARGE_INTEGER;

#pragma GCC diagnostic pop

NDWV_STATIC_ASSERT(sizeof(OVERLAPPED) == 32);
NDWV_STATIC_ASSERT(offsetof(OVERLAPPED, Internal) == 0);
NDWV_STATIC_ASSERT(offsetof(OVERLAPPED, InternalHigh) == 8);
NDWV_STATIC_ASSERT(offsetof(OVERLAPPED, Offset) == 16);
NDWV_STATIC_ASSERT(offsetof(OVERLAPPED, OffsetHigh) == 20);
NDWV_STATIC_ASSERT(offsetof(OVERLAPPED, Pointer) == 16);
NDWV_STATIC_ASSERT(offsetof(OVERLAPPED, hEvent) == 24);
NDWV_STATIC_ASSERT(sizeof(LARGE_INTEGER) == 8);

// Status 0x103 is STATUS_PENDING (= ND_PENDING). An atomic load with acquire order (gcc's and
// clang's builtin, for C and C++ alike): the request completes on another thread, which stores
// Internal last, and a caller that sees it complete then reads what was written before it.
#define HasOverlappedIoCompleted(lpOverlapped) \
  (((DWORD)__atomic_load_n(&(lpOverlapped)->Internal, __ATOMIC_ACQUIRE)) != 0x00000103u)

// ---- Socket addresses ---------------------------------------------------------------------------

typedef USHORT ADDRESS_FAMILY;
typedef struct sockaddr SOCKADDR;
typedef struct sockaddr* LPSOCKADDR;
typedef struct sockaddr_in SOCKADDR_IN;
typedef struct sockaddr_in6 SOCKADDR_IN6;

typedef union _SOCKADDR_INET {
  struct sockaddr_in Ipv4;
  struct sockaddr_in6 Ipv6;
  ADDRESS_FAMILY si_family;
} SOCKADDR_INET;

typedef struct _SOCKET_ADDRESS {
  LPSOCKADDR lpSockaddr;
  INT iSockaddrLength;
} SOCKET_ADDRESS, *PSOCKET_ADDRESS, *LPSOCKET_ADDRESS;

// Variable length: iAddressCount entries follow in place of Address[1].
typedef struct _SOCKET_ADDRESS_LIST {
  INT iAddressCount;
  SOCKET_ADDRESS Address[1];
} SOCKET_ADDRESS_LIST, *PSOCKET_ADDRESS_LIST, *LPSOCKET_ADDRESS_LIST;

NDWV_STATIC_ASSERT(sizeof(SOCKET_ADDRESS) == 16);
NDWV_STATIC_ASSERT(offsetof(SOCKET_ADDRESS, lpSockaddr) == 0);
NDWV_STATIC_ASSERT(offsetof(SOCKET_ADDRESS, iSockaddrLength) == 8);
NDWV_STATIC_ASSERT(offsetof(SOCKET_ADDRESS_LIST, Address) == 8);
NDWV_STATIC_ASSERT(sizeof(struct sockaddr_in) == 16 && sizeof(struct sockaddr_in6) == 28);

// ---- Calls --------------------------------------------------------------------------------------
// C linkage, so that C programs (and dlsym) find them by their Windows names. Failures return
// FALSE / NULL / WAIT_FAILED and set the calling thread's last error. Handles are validated:
// NULL, INVALID_HANDLE_VALUE, closed or wrong-kind handles give ERROR_INVALID_HANDLE.

NDWV_EXTERN_C_BEGIN

DWORD GetLastError(void);
void SetLastError(DWORD error);

BOOL CloseHandle(HANDLE handle);

// Events. `attributes` and `name` are accepted and ignored (every event is anonymous).
HANDLE CreateEvent(void* attributes, BOOL manualReset, BOOL initialState, const char* name);
NDWV_INLINE HANDLE CreateEventA(void* attributes, BOOL manualReset, BOOL initialState,
                                const char* name) {
  return CreateEvent(attributes, manualReset, initialState, name);
}
NDWV_INLINE HANDLE CreateEventW(void* attributes, BOOL manualReset, BOOL initialState,
                                const wchar_t* name) {
  (void)name;
  return CreateEvent(attributes, manualReset, initialState, NULL);
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

NDWV_EXTERN_C_END
