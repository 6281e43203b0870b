// The Windows platform calls of windows_shim.h, on Linux (see there).
#include "windows_shim.h"

#include <netdb.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <cstdarg>
#include <fstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

namespace {

// A wide string as the locale's multibyte text (UTF-8 under a UTF-8 locale, else ASCII).
std::string Narrow(const wchar_t* text) {
  std::string out;
  std::mbstate_t state{};
  char bytes[MB_LEN_MAX];
  for (; *text; ++text) {
    size_t n = std::wcrtomb(bytes, *text, &state);
    if (n == size_t(-1)) out += '?';
    else out.append(bytes, n);
  }
  return out;
}

std::wstring Widen(const char* text) {
  std::wstring out;
  std::mbstate_t state{};
  const char* end = text + std::strlen(text);
  while (text < end) {
    wchar_t c;
    size_t n = std::mbrtowc(&c, text, size_t(end - text), &state);
    if (n == size_t(-1) || n == size_t(-2)) {
      c = wchar_t(static_cast<unsigned char>(*text));  // not valid in the locale: byte for byte
      n = 1;
      state = {};
    }
    out += c;
    text += n ? n : 1;
  }
  return out;
}

}  // namespace

// The entry point: Windows hands a UNICODE program its arguments as wide strings.
int main(int argc, char* argv[]) {
  std::setlocale(LC_CTYPE, "");
  // Line by line, also into a file: a program killed at its timeout still shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::vector<std::wstring> wide;
  for (int i = 0; i < argc; ++i) wide.push_back(Widen(argv[i]));
  std::vector<wchar_t*> pointers;
  for (std::wstring& argument : wide) pointers.push_back(argument.data());
  pointers.push_back(nullptr);
  return wmain(argc, pointers.data());
}

namespace {

// A Microsoft printf format (narrow or wide) as glibc's narrow printf takes it: the size prefixes
// I64 (ll), I32 (none) and I (z: SIZE_T); in a wide format, %s and %c take wide arguments (%ls,
// %lc) and %S and %C narrow ones (%s, %c). Flags, width, precision and other modifiers pass.
template <class Char>
std::string GlibcFormat(const Char* format) {
  constexpr bool wide = std::is_same_v<Char, wchar_t>;
  auto text = [](Char c) {
    if constexpr (wide) {
      wchar_t one[2] = {c, 0};
      return Narrow(one);
    } else {
      return std::string(1, c);
    }
  };
  std::string out;
  for (const Char* p = format; *p; ++p) {
    out += text(*p);
    if (*p != Char('%')) continue;
    for (++p; *p; ++p) {
      if (*p == Char('I')) {
        if (p[1] == Char('6') && p[2] == Char('4')) out += "ll", p += 2;
        else if (p[1] == Char('3') && p[2] == Char('2')) p += 2;
        else out += 'z';
        continue;
      }
      if (!std::strchr("-+ #0123456789.*hlLqjzt", char(*p))) break;
      out += char(*p);
    }
    if (!*p) break;
    if (wide && *p == Char('s')) out += "ls";
    else if (wide && *p == Char('c')) out += "lc";
    else if (wide && *p == Char('S')) out += 's';
    else if (wide && *p == Char('C')) out += 'c';
    else out += text(*p);
  }
  return out;
}

}  // namespace

template <class Char>
int ShimPrintf(const Char* format, ...) {
  std::string glibc = GlibcFormat(format);
  va_list arguments;
  va_start(arguments, format);
  int written = std::vprintf(glibc.c_str(), arguments);
  va_end(arguments);
  return written;
}
template int ShimPrintf(const char* format, ...);
template int ShimPrintf(const wchar_t* format, ...);

FILE* _tfreopen(const wchar_t* path, const wchar_t* mode, FILE* stream) {
  return std::freopen(Narrow(path).c_str(), Narrow(mode).c_str(), stream);
}

int _fcloseall() {
  // The C runtime's streams other than the standard ones; the programs open none.
  std::fflush(nullptr);
  return 0;
}

// ---- Memory ------------------------------------------------------------------------------------

HANDLE GetProcessHeap() {
  static int heap;  // any non-NULL value names "the" heap
  return &heap;
}

LPVOID HeapAlloc(HANDLE /*heap*/, DWORD flags, SIZE_T bytes) {
  return (flags & HEAP_ZERO_MEMORY) ? std::calloc(1, bytes ? bytes : 1) : std::malloc(bytes ? bytes : 1);
}

BOOL HeapFree(HANDLE /*heap*/, DWORD /*flags*/, LPVOID memory) {
  std::free(memory);
  return TRUE;
}

// ---- Threads -----------------------------------------------------------------------------------

HANDLE CreateThread(void* /*attributes*/, SIZE_T /*stackSize*/, LPTHREAD_START_ROUTINE routine, LPVOID parameter,
                    DWORD /*flags*/, LPDWORD threadId) {
  HANDLE done = CreateEvent(nullptr, TRUE, FALSE, nullptr);
  if (done == nullptr) return nullptr;
  try {
    std::thread([routine, parameter, done] {
      routine(parameter);
      SetEvent(done);  // fails harmlessly if the program closed the handle already
    }).detach();
  } catch (const std::system_error&) {
    CloseHandle(done);
    SetLastError(ERROR_NOT_ENOUGH_MEMORY);
    return nullptr;
  }
  if (threadId != nullptr) *threadId = 0;
  return done;
}

// ---- System information ------------------------------------------------------------------------

void GetSystemInfo(SYSTEM_INFO* info) {
  *info = {};
  long processors = sysconf(_SC_NPROCESSORS_ONLN);
  info->dwNumberOfProcessors = DWORD(processors > 0 ? processors : 1);
  info->dwPageSize = DWORD(sysconf(_SC_PAGESIZE));
}

BOOL GetSystemTimes(FILETIME* idle, FILETIME* kernel, FILETIME* user) {
  // /proc/stat's first line: user nice system idle iowait irq softirq steal ..., in clock ticks.
  std::ifstream stat("/proc/stat");
  std::string cpu;
  uint64_t t[8] = {};
  stat >> cpu;
  for (uint64_t& value : t) stat >> value;
  if (!stat || cpu != "cpu") {
    SetLastError(ERROR_NOT_SUPPORTED);
    return FALSE;
  }
  const uint64_t to100ns = 10'000'000 / uint64_t(sysconf(_SC_CLK_TCK));
  uint64_t idleTicks = t[3] + t[4];
  auto put = [&](FILETIME* out, uint64_t ticks) {
    if (out == nullptr) return;
    uint64_t value = ticks * to100ns;
    out->dwLowDateTime = DWORD(value);
    out->dwHighDateTime = DWORD(value >> 32);
  };
  put(idle, idleTicks);
  put(kernel, idleTicks + t[2] + t[5] + t[6] + t[7]);
  put(user, t[0] + t[1]);
  return TRUE;
}

// ---- Winsock -----------------------------------------------------------------------------------

int WSAStartup(WORD version, WSADATA* data) {
  if (data != nullptr) data->wVersion = data->wHighVersion = version;
  return 0;
}

int WSACleanup() { return 0; }

INT WSAStringToAddressW(LPWSTR text, INT family, void* /*protocolInfo*/, sockaddr* address, LPINT length) {
  if (text == nullptr || address == nullptr || length == nullptr) return SOCKET_ERROR;
  std::string s = Narrow(text), host = s, port;
  if (family == AF_INET) {
    size_t colon = s.rfind(':');
    if (colon != std::string::npos) host = s.substr(0, colon), port = s.substr(colon + 1);
  } else if (!s.empty() && s[0] == '[') {
    size_t close = s.find(']');
    if (close == std::string::npos) return SOCKET_ERROR;
    host = s.substr(1, close - 1);
    if (close + 1 < s.size() && s[close + 1] == ':') port = s.substr(close + 2);
  }
  // Numeric only, as Winsock's parser: no name is looked up.
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), port.empty() ? "0" : port.c_str(), &hints, &found) != 0) return SOCKET_ERROR;
  bool fits = found->ai_addrlen <= socklen_t(*length);
  if (fits) {
    std::memcpy(address, found->ai_addr, found->ai_addrlen);
    *length = INT(found->ai_addrlen);
  }
  freeaddrinfo(found);
  return fits ? 0 : SOCKET_ERROR;
}
