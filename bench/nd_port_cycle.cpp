// nd_port_cycle: what a connection's local port costs to take and give back, one at a time — the
// pattern of a client that connects, works, disconnects and releases, then connects again. Each
// cycle is CreateConnector, Bind to 127.0.0.1 port 0 and Release, on the transport that
// NDWV_TRANSPORTS names; the reference, in the same run, is a plain socket of that transport's
// kind (TCP for iWARP, UDP for RoCE) opened, bound and closed. Printed: microseconds per cycle,
// wall and CPU, and the ratio to the reference.
//
// Also printed, as facts about the machine: a UDP socket with UDP_GRO opened, bound and closed,
// before ndwv's cycles and after them. UDP_GRO switches a machine-wide kernel static key whenever
// the first such socket opens or the last closes (bench/README.md, "A port taken and given
// back"): "before" costs about what plain UDP does when some other socket holds the key during
// the run; "after" shows whether ndwv holds it.
//
//   NDWV_TRANSPORTS=roce nd_port_cycle [cycles]     (default 2000)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ndwv/ndsupport.h>
#include <ndwv/ndwv.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

namespace {

struct Cost {
  double wall_us, cpu_us;
};

double CpuSeconds() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return double(r.ru_utime.tv_sec + r.ru_stime.tv_sec) + double(r.ru_utime.tv_usec + r.ru_stime.tv_usec) * 1e-6;
}

Cost Measure(int cycles, const std::function<bool()>& cycle) {
  const double cpu = CpuSeconds();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < cycles; ++i) {
    if (!cycle()) {
      std::fprintf(stderr, "nd_port_cycle: cycle %d failed\n", i);
      std::exit(1);
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {wall / cycles * 1e6, (CpuSeconds() - cpu) / cycles * 1e6};
}

sockaddr_in Loopback() {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

bool PlainCycle(int type, bool gro) {
  int fd = socket(AF_INET, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  int one = 1;
  bool ok = !gro || setsockopt(fd, SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
  sockaddr_in address = Loopback();
  ok = ok && bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  close(fd);
  return ok;
}

void Print(const char* what, const Cost& cost, const Cost* reference) {
  std::printf("  %-44s %9.1f us wall %9.1f us CPU", what, cost.wall_us, cost.cpu_us);
  if (reference) std::printf("   ratio %6.2f", cost.wall_us / reference->wall_us);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int cycles = argc > 1 ? std::atoi(argv[1]) : 2000;
  if (cycles <= 0) {
    std::fprintf(stderr, "usage: NDWV_TRANSPORTS=iwarp|roce nd_port_cycle [cycles]\n");
    return 2;
  }
  const char* transports = std::getenv("NDWV_TRANSPORTS");
  const bool roce = transports && std::strncmp(transports, "roce", 4) == 0;
  if (FAILED(NdStartup())) return 1;
  sockaddr_in address = Loopback();
  IND2Adapter* adapter = nullptr;
  HANDLE file = nullptr;
  if (FAILED(NdOpenAdapter(IID_IND2Adapter, reinterpret_cast<sockaddr*>(&address), sizeof address,
                           reinterpret_cast<void**>(&adapter))) ||
      FAILED(adapter->CreateOverlappedFile(&file))) {
    std::fprintf(stderr, "nd_port_cycle: no adapter on 127.0.0.1\n");
    return 1;
  }
  auto nd_cycle = [&] {
    IND2Connector* connector = nullptr;
    if (FAILED(adapter->CreateConnector(IID_IND2Connector, file, reinterpret_cast<void**>(&connector)))) return false;
    HRESULT hr = connector->Bind(reinterpret_cast<sockaddr*>(&address), sizeof address);
    connector->Release();
    return SUCCEEDED(hr);
  };
  std::printf("nd_port_cycle: %d cycles each, one at a time, 127.0.0.1 port 0\n", cycles);
  auto gro_cycle = [] { return PlainCycle(SOCK_DGRAM, true); };
  // Before any port of ndwv's: whether something else on the machine holds the key.
  const Cost gro_before = Measure(cycles, gro_cycle);
  const Cost reference = Measure(cycles, [&] { return PlainCycle(roce ? SOCK_DGRAM : SOCK_STREAM, false); });
  const Cost nd = Measure(cycles, nd_cycle);
  const Cost gro_after = Measure(cycles, gro_cycle);
  Print(roce ? "UDP socket, bind, close (reference)" : "TCP socket, bind, close (reference)", reference, nullptr);
  Print(roce ? "RoCE CreateConnector, Bind, Release" : "iWARP CreateConnector, Bind, Release", nd, &reference);
  Print("UDP socket with UDP_GRO, bind, close, before", gro_before, nullptr);
  Print("... after ndwv's cycles", gro_after, nullptr);
  CloseHandle(file);
  adapter->Release();
  NdCleanup();
  return 0;
}
