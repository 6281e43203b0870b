// The Windows platform calls that Microsoft's NetworkDirect SDK programs (src/examples and
// src/unittests of github.com/microsoft/NetworkDirect) use and that ndwv does not provide: what a
// user porting those programs to Linux writes once, beside their unmodified sources. ndwv's own
// headers (<ndspi.h>, <ndsupport.h>, <ndstatus.h> and the Win32 subset in <ndwv/win32.h>: types,
// events, completion ports, GetLastError, QueryPerformanceCounter, Sleep) supply the rest.
//
// The programs are built as Windows builds them, with UNICODE: TCHAR is wchar_t and _tmain is
// wmain, which the shim's main() calls with the arguments widened. Listed in
// docs/user-guide.md, "Porting an ND program from Windows".
#pragma once

#include <arpa/inet.h>
#include <strings.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <type_traits>

#include <ndwv/ndstatus.h>
#include <ndwv/win32.h>

// ---- Compiler dialect: calling conventions, annotations ------------------------------------------

#define __cdecl
#define __stdcall
#define WINAPI
#define CALLBACK
#define __callback
#define __declspec(attributes)
#define __fallthrough [[fallthrough]]
#define UNREFERENCED_PARAMETER(p) ((void)(p))

// Source annotations (SAL) that the programs use: documentation only.
#define _In_
#define _In_opt_
#define _Inout_
#define _Inout_opt_
#define _Out_
#define _Out_opt_
#define _Deref_out_
#define _Analysis_noreturn_
#define _In_bytecount_(size)
#define _Out_bytecap_(size)
#define _Out_opt_bytecap_post_bytecount_(capacity, count)

// ---- Types and macros -----------------------------------------------------------------------------

typedef wchar_t WCHAR;
typedef wchar_t TCHAR;
typedef const wchar_t* LPCWSTR;
typedef wchar_t* LPWSTR;
typedef unsigned short WORD;
typedef INT* LPINT;
typedef DWORD(WINAPI* LPTHREAD_START_ROUTINE)(LPVOID parameter);

#define _T(text) L##text
#define TEXT(text) L##text
#define MAKEWORD(low, high) ((WORD)(((BYTE)(low)) | ((WORD)((BYTE)(high))) << 8))
#define RtlZeroMemory(destination, length) std::memset((destination), 0, (length))
#define ZeroMemory RtlZeroMemory
#define CONTAINING_RECORD(address, type, field) \
  (reinterpret_cast<type*>(reinterpret_cast<char*>(address) - offsetof(type, field)))
#define _countof(array) (sizeof(array) / sizeof((array)[0]))

// Windows' min and max macros, as functions (a macro would break the C++ library's headers).
template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <class A, class B>
constexpr std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

// NTSTATUS values (<ntstatus.h>) that ndwv's <ndstatus.h> does not already define.
#ifndef STATUS_BUFFER_OVERFLOW
#define STATUS_BUFFER_OVERFLOW ((NTSTATUS)0x80000005L)
#endif
#ifndef STATUS_DATA_OVERRUN
#define STATUS_DATA_OVERRUN ((NTSTATUS)0xC000003CL)
#endif
#ifndef STATUS_CONNECTION_REFUSED
#define STATUS_CONNECTION_REFUSED ((NTSTATUS)0xC0000236L)
#endif
#ifndef STATUS_PENDING
#define STATUS_PENDING ((NTSTATUS)0x00000103L)
#endif

// ---- Entry point and wide-character C runtime --------------------------------------------------

// The program's entry point; the shim's main() widens argv and calls it.
#define _tmain wmain
int wmain(int argc, wchar_t* argv[]);

#define _tcsicmp wcscasecmp
#define _wcsicmp wcscasecmp
inline long _ttol(const wchar_t* text) { return std::wcstol(text, nullptr, 10); }
// Case-insensitive compare of at most `count` characters.
#define _tcsnicmp wcsncasecmp

template <size_t N>
int wcscpy_s(wchar_t (&destination)[N], const wchar_t* source) {
  if (std::wcslen(source) >= N) return ERANGE;
  std::wcscpy(destination, source);
  return 0;
}

// printf and wprintf with Microsoft's format: the size prefixes %I64d, %I32u and %Id (SIZE_T);
// in wprintf, %s and %c take wide arguments, %S and %C narrow ones. Both write through the
// byte-oriented stdout: a C library stream takes one orientation, so a real wprintf after a
// printf would print nothing.
template <class Char>
int ShimPrintf(const Char* format, ...);
#define printf ShimPrintf
#define wprintf ShimPrintf

FILE* _tfreopen(const wchar_t* path, const wchar_t* mode, FILE* stream);
int _fcloseall();

// ---- Memory -----------------------------------------------------------------------------------------

#define HEAP_ZERO_MEMORY 0x00000008
HANDLE GetProcessHeap();
LPVOID HeapAlloc(HANDLE heap, DWORD flags, SIZE_T bytes);
BOOL HeapFree(HANDLE heap, DWORD flags, LPVOID memory);

// ---- Threads and atomics ----------------------------------------------------------------------

// A thread's handle is an ndwv manual-reset event that the thread sets when its routine returns:
// WaitForSingleObject and CloseHandle take it as they take any event.
HANDLE CreateThread(void* attributes, SIZE_T stackSize, LPTHREAD_START_ROUTINE routine, LPVOID parameter,
                    DWORD flags, LPDWORD threadId);

// On Windows `long` is LONG (32 bits) and the programs mix the two; here `long` is 64 bits, so
// the atomics take whatever integer the program names.
template <class T>
T InterlockedIncrement(T volatile* value) {
  return __atomic_add_fetch(value, 1, __ATOMIC_SEQ_CST);
}
template <class T>
T InterlockedDecrement(T volatile* value) {
  return __atomic_sub_fetch(value, 1, __ATOMIC_SEQ_CST);
}
template <class T, class U, class V>
T InterlockedCompareExchange(T volatile* destination, U exchange, V comparand) {
  T found = T(comparand);
  __atomic_compare_exchange_n(destination, &found, T(exchange), false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return found;  // `exchange` went in if this equals the comparand
}
template <class T, class U>
T InterlockedExchangeAdd64(T volatile* addend, U value) {
  static_assert(sizeof(T) == 8);
  return __atomic_fetch_add(addend, T(value), __ATOMIC_SEQ_CST);
}

// ---- System information ----------------------------------------------------------------------

struct SYSTEM_INFO {
  DWORD dwNumberOfProcessors;
  DWORD dwPageSize;
};
void GetSystemInfo(SYSTEM_INFO* info);

// 100-nanosecond units, as Windows counts CPU time.
struct FILETIME {
  DWORD dwLowDateTime;
  DWORD dwHighDateTime;
};
// Host-wide CPU time since boot, summed over processors: idle, kernel (which includes idle, as
// on Windows) and user.
BOOL GetSystemTimes(FILETIME* idle, FILETIME* kernel, FILETIME* user);

// ---- Winsock ----------------------------------------------------------------------------------------

struct WSADATA {
  WORD wVersion;
  WORD wHighVersion;
};
int WSAStartup(WORD version, WSADATA* data);
int WSACleanup();
// "a.b.c.d[:port]" or "[v6][:port]" (or a bare IPv6 address) into a sockaddr of `family`.
// 0 on success, SOCKET_ERROR otherwise.
#define SOCKET_ERROR (-1)
INT WSAStringToAddressW(LPWSTR text, INT family, void* protocolInfo, sockaddr* address, LPINT length);
#define WSAStringToAddress WSAStringToAddressW
