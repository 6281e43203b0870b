// ndinfo: the NetworkDirect addresses of this host, each adapter's ND2_ADAPTER_INFO (addresses
// with the same AdapterId are one adapter; field lines as ndadapterinfo prints them) and the
// NDWV_ settings with their defaults and meanings.
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <ndwv/ndwv.h>

#include "adapter_info.h"
#include "nd_objects.h"

using namespace ndtool;

namespace {

const char kUsage[] =
    "ndinfo [--env [--markdown]] [-l logFile] [-h] [<ip>]\n"
    "\n"
    "Lists the NetworkDirect addresses, then each adapter's ND2_ADAPTER_INFO (addresses with\n"
    "the same AdapterId are one adapter), the descriptor limit, then the NDWV_ environment\n"
    "settings.\n"
    "\n"
    "  --env           print only the NDWV_ settings: name, default, meaning\n"
    "  --markdown      with --env: the settings as the Markdown configuration reference\n"
    "                  (docs/configuration.md), independent of the environment\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>            only the adapter that owns this address (a.b.c.d or IPv6)\n";

// The limit no ND2_ADAPTER_INFO field reports: descriptors. Users otherwise meet it as a failed
// Connect or Accept at the 1025th connection.
void PrintDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  auto text = [](rlim_t value) {
    return value == RLIM_INFINITY ? std::string("unlimited") : std::to_string(value);
  };
  std::printf("Descriptors (RLIMIT_NOFILE): %s, hard limit %s. iWARP holds one socket per\n"
              "connection and per listener, and one more per explicit port bound (its claim);\n"
              "RoCE one per port: a listener's, a connector's bound to a given port, and the\n"
              "NDWV_ROCE_CONNECTOR_PORTS (64 by default) port-0 connectors on an address take\n"
              "in turn; one per peer port for the first 64 of a listener's, and of those\n"
              "connectors' ports together (flows); and one per address family, held for the\n"
              "process's life (UDP_GRO's kernel switch). When none is left, Bind returns\n"
              "ND_INSUFFICIENT_RESOURCES and an iWARP listener refuses incoming connections\n"
              "(counter accepts_refused).\n\n",
              text(limit.rlim_cur).c_str(), text(limit.rlim_max).c_str());
  // What a connection costs, stated up front (docs/user-guide.md, "What a connection costs").
  constexpr rlim_t kLibraryDescriptors = 16;  // engine, work pool, RoCE's GRO socket, a listener or two
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur > kLibraryDescriptors)
    std::printf("This limit allows about %llu iWARP connections per process (one descriptor\n"
                "each); RoCE connections take none beyond their ports'.\n",
                (unsigned long long)(limit.rlim_cur - kLibraryDescriptors));
  std::printf("A connection costs about 3.6 KiB of memory (RoCE: 4.3 KiB) with queues two\n"
              "deep; each entry of its queues adds 56 to 328 bytes (its SGEs, inline data),\n"
              "and iWARP one descriptor, and while idle: iWARP, a kernel keepalive and its\n"
              "answer every 2 s; RoCE, one zero-length Write and its\n"
              "ACK every NDWV_ROCE_KEEPALIVE_MS, or 2 ms per connection of the process if\n"
              "longer.\n\n");
}

// RoCE's UDP sockets ask for NDWV_ROCE_SOCKET_BUFFER (4 MiB) of receive buffer each: forced as
// root, else at most net.core.rmem_max, which Debian sets to 208 KiB. A port that many
// connections share drops what a burst beyond its buffer brings, and the senders resend it only
// after their ACK timeout: 10,000 one-message echoes to one listener took 2-3.5 s instead of 0.15
// while the connectors shared one port (with 64, taken in turn, 0.16-0.29 s).
void PrintSocketBuffers() {
  const char* setting = std::getenv("NDWV_ROCE_SOCKET_BUFFER");  // checked by the library
  const int asked = setting && *setting ? std::atoi(setting) : 4 << 20;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return;
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &asked, sizeof asked) != 0)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &asked, sizeof asked);
  int granted = 0;
  socklen_t length = sizeof granted;
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &granted, &length);
  close(fd);
  granted /= 2;  // the kernel reports twice what it grants the data (socket(7))
  std::printf("RoCE socket receive buffers: %d KiB of the %d asked for (as root: forced; else at\n"
              "most net.core.rmem_max).\n", granted / 1024, asked / 1024);
  if (granted < asked)
    std::printf("A port that many connections share (a listener's; one of a process's\n"
                "port-0 connectors) drops what a burst beyond this brings, resent after the\n"
                "senders' ACK timeout: for bursts on thousands of connections to one\n"
                "listener, raise it (sysctl -w net.core.rmem_max=%d). A connection also\n"
                "keeps fewer packets unacknowledged: what the buffer holds (48 of 4 KiB\n"
                "in 208 KiB, of 64).\n", asked);
  std::printf("\n");
}

void PrintSettings() {
  std::printf("Settings (NDWV_ environment variables):\n");
  std::fflush(stdout);
  ndwv_settings_describe(stdout);
  std::fflush(stdout);
}

// The IP of an address, without its port (list entries and the command line compare by IP).
std::string IpOf(const sockaddr* address) {
  sockaddr_storage copy{};
  std::memcpy(&copy, address, address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
  if (copy.ss_family == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&copy)->sin6_port = 0;
  else
    reinterpret_cast<sockaddr_in*>(&copy)->sin_port = 0;
  char text[INET6_ADDRSTRLEN + 8];
  return FormatAddress(reinterpret_cast<sockaddr*>(&copy), text, sizeof text);
}

// The provider's address list (sized by the ND_BUFFER_OVERFLOW probe, retried if it grew).
std::vector<std::string> QueryAddresses(std::vector<std::vector<char>>* sockaddrs) {
  std::unique_ptr<char[]> storage;
  SIZE_T size = 0;
  HRESULT hr;
  for (;;) {
    hr = NdQueryAddressList(0, reinterpret_cast<SOCKET_ADDRESS_LIST*>(storage.get()), &size);
    if (hr != ND_BUFFER_OVERFLOW) break;
    storage = std::make_unique<char[]>(size);
  }
  ND_CHECK(hr, "NdQueryAddressList");
  std::vector<std::string> names;
  if (!storage || size == 0) return names;
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(storage.get());
  for (INT i = 0; i < list->iAddressCount; ++i) {
    const SOCKET_ADDRESS& a = list->Address[i];
    names.push_back(IpOf(a.lpSockaddr));
    const char* bytes = reinterpret_cast<const char*>(a.lpSockaddr);
    sockaddrs->emplace_back(bytes, bytes + a.iSockaddrLength);
  }
  return names;
}

struct AdapterEntry {
  UINT64 id;
  ND2_ADAPTER_INFO info;
  std::string addresses;
};

int ListAdapters(const std::string& only) {
  NdLibrary nd;
  std::vector<std::vector<char>> sockaddrs;
  std::vector<std::string> names = QueryAddresses(&sockaddrs);
  std::printf("Addresses:\n");
  if (names.empty()) std::printf("    (none)\n");
  for (const std::string& name : names) std::printf("    %s\n", name.c_str());
  std::printf("\n");

  int rc = 0;
  std::vector<AdapterEntry> adapters;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (!only.empty() && names[i] != only) continue;
    const auto* address = reinterpret_cast<const sockaddr*>(sockaddrs[i].data());
    NdRef<IND2Adapter> adapter;
    HRESULT hr = NdOpenAdapter(IID_IND2Adapter, address, sockaddrs[i].size(), adapter.Out());
    ND2_ADAPTER_INFO info{};
    info.InfoVersion = ND_VERSION_2;
    ULONG size = sizeof info;
    if (SUCCEEDED(hr)) hr = adapter->Query(&info, &size);
    if (FAILED(hr)) {  // report and go on with the other addresses
      std::printf("%s: opening or querying the adapter failed: %08x\n\n", names[i].c_str(), unsigned(hr));
      rc = kExitFailure;
      continue;
    }
    AdapterEntry* entry = nullptr;
    for (AdapterEntry& e : adapters)
      if (e.id == info.AdapterId) entry = &e;
    if (entry) {
      entry->addresses += ", " + names[i];
    } else {
      adapters.push_back({info.AdapterId, info, names[i]});
    }
  }
  if (!only.empty() && adapters.empty() && rc == 0) {
    std::printf("%s is not a NetworkDirect address of this host.\n", only.c_str());
    rc = kExitFailure;
  }
  for (const AdapterEntry& e : adapters) {
    std::printf("Adapter 0x%08llx (%s):\n", (unsigned long long)e.id, e.addresses.c_str());
    const char* transport = ndwv_adapter_transport(e.id);
    std::printf("Transport: %s\n", transport ? transport : "?");
    PrintAdapterInfo(e.info);
    std::printf("\n");
  }
  return rc;
}

}  // namespace

int main(int argc, char* argv[]) {
  bool envOnly = false;
  bool markdown = false;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const char* arg = argv[i];
    if (!std::strcmp(arg, "-h") || !std::strcmp(arg, "--help")) {
      ExitWithUsage(kUsage, 0);
    } else if (!std::strcmp(arg, "--env")) {
      envOnly = true;
    } else if (!std::strcmp(arg, "--markdown")) {
      markdown = true;
    } else if (!std::strcmp(arg, "-l") || !std::strcmp(arg, "-L") || !std::strcmp(arg, "--logFile")) {
      if (i + 1 >= argc) ExitWithUsage(kUsage, kExitMissingValue);
      if (!RedirectOutput(argv[++i])) {
        std::fprintf(stderr, "Cannot open log file %s\n", argv[i]);
        return kExitUsage;
      }
    } else if (i == argc - 1 && arg[0] != '-') {
      sockaddr_storage address;
      ULONG length;
      if (!ParseAddress(arg, 0, &address, &length)) {
        std::printf("Bad address.\n\n");
        ExitWithUsage(kUsage, kExitUsage);
      }
      only = IpOf(reinterpret_cast<sockaddr*>(&address));
    } else {
      std::printf("Unknown option: %s\n\n", arg);
      ExitWithUsage(kUsage, kExitUsage);
    }
  }
  if (markdown) {
    if (!envOnly) {
      std::printf("--markdown goes with --env.\n\n");
      ExitWithUsage(kUsage, kExitUsage);
    }
    ndwv_settings_describe_markdown(stdout);
    return std::fflush(stdout) == 0 && !std::ferror(stdout) ? 0 : kExitFailure;
  }
  StartWatchdog("ndinfo");
  int rc = envOnly ? 0 : ListAdapters(only);
  if (!envOnly) {
    PrintDescriptorLimit();
    PrintSocketBuffers();
  }
  PrintSettings();
  return rc;
}
