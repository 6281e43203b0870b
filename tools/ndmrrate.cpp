// ndmrrate: registration throughput with threads (nd-tools.md §8). N threads share one adapter
// whose overlapped file is associated with a completion port. Per size each thread creates and
// registers `iterations` MRs over its own 4 MiB buffer (all held at once), taking one port packet
// per registration, then deregisters them all the same way. The row gives the wall time of each
// phase divided by the registrations of all threads, and the CPU use of the phase.
//
// A packet may belong to another thread's request (the port is shared); unlike the original,
// which asked its own current MR about it, the result is taken from the request's owner.
#include <barrier>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kMaxIterations = 10000;
constexpr std::size_t kBufferSize = kMaxTransfer;
constexpr ULONG_PTR kPortKey = 0x1000;

const char kUsage[] =
    "ndmrrate [-t|--threads N] [-l logFile] [-h] <ip>\n"
    "\n"
    "Memory registration throughput: N threads each register and then deregister up to\n"
    "10 000 MRs of 1 B to 4 MiB, completions through one completion port; per size the\n"
    "microseconds per registration and deregistration (phase time / registrations of all\n"
    "threads) and the CPU use.\n"
    "\n"
    "  -t, --threads N number of threads (default 1)\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>            a local address of the adapter: a.b.c.d or [ipv6], last\n"
    "\n"
    "Environment:\n"
    "  NDWV_BENCH_SIZES=a,b,...  run only these sizes (bytes, K/M suffix, each 1..4M)\n"
    "  NDWV_BENCH_ITERS=n        at most n iterations per size\n"
    "  NDWV_TOOL_TIMEOUT_MS=ms   bound on every wait for a completion; default 30000\n";

const LocalToolSpec kSpec{"ndmrrate", kUsage, true};

// 10 000 per size while 4 MiB / size > 5, else (4 MiB / size) * 2000, capped by NDWV_BENCH_ITERS.
std::uint64_t IterationsFor(std::size_t size, std::uint64_t cap) {
  std::uint64_t ratio = kMaxTransfer / size;
  std::uint64_t iterations = ratio > 5 ? kMaxIterations : ratio * 2000;
  return iterations < cap ? iterations : cap;
}

// One registration request: the OVERLAPPED first, so that a port packet leads to its owner.
struct Request {
  OVERLAPPED ov{};
  NdRef<IND2MemoryRegion> mr;
};

Request* OwnerOf(OVERLAPPED* ov) { return reinterpret_cast<Request*>(ov); }

// What the threads share; the barrier's completion step (run by the last thread to arrive)
// takes the times, and after the deregistration phase prints the row.
struct Shared {
  Shared(Adapter& adapter, CompletionPort& port, ULONG threads, std::vector<Round> rounds)
      : adapter(adapter), port(port), threads(threads), rounds(std::move(rounds)) {}

  void PhaseDone() noexcept {
    std::uint64_t now = NowMicros();
    double cpuPercent = cpu.Stop();
    cpu.Start();
    switch (phase) {
      case 0:  // everyone ready: the registrations start
        break;
      case 1:
        registerUs = double(now - start);
        registerCpu = cpuPercent;
        break;
      case 2: {
        const Round& round = rounds[roundIndex];
        double n = double(round.iterations) * threads;
        std::printf("%9zul%9llul%9.2f%7.2f%9.2f%7.2f\n", round.size,
                    (unsigned long long)round.iterations, registerUs / n, registerCpu,
                    double(now - start) / n, cpuPercent);
        std::fflush(stdout);
        ++roundIndex;
        break;
      }
    }
    phase = (phase + 1) % 3;
    start = NowMicros();
  }

  Adapter& adapter;
  CompletionPort& port;
  const ULONG threads;
  const std::vector<Round> rounds;
  CpuMeter cpu;
  int phase = 0;
  std::size_t roundIndex = 0;
  std::uint64_t start = 0;
  double registerUs = 0, registerCpu = 0;
};

// Takes one packet from the port and checks its request's result with the request's own MR.
void ReapOne(Shared& shared, const char* what) {
  OVERLAPPED* ov = shared.port.Next(what);
  Request* request = OwnerOf(ov);
  HRESULT hr = request->mr->GetOverlappedResult(ov, FALSE);
  ND_CHECK(hr, what);
}

void Worker(Shared& shared, std::barrier<void (*)() noexcept>& barrier) {
  auto buffer = std::make_unique<char[]>(kBufferSize);
  std::vector<Request> requests(kMaxIterations);
  for (const Round& round : shared.rounds) {
    barrier.arrive_and_wait();
    for (std::uint64_t i = 0; i < round.iterations; ++i) {
      Request& request = requests[i];
      request.mr = shared.adapter.CreateMemoryRegion();
      request.ov = OVERLAPPED{};  // hEvent NULL: the completion goes to the port
      HRESULT hr = request.mr->Register(buffer.get(), round.size, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &request.ov);
      if (hr != ND_PENDING) ND_CHECK(hr, "IND2MemoryRegion::Register");
      // Even a request done at once is reaped from the port (the packet is queued regardless).
      ReapOne(shared, "IND2MemoryRegion::Register");
    }
    barrier.arrive_and_wait();
    for (std::uint64_t i = 0; i < round.iterations; ++i) {
      Request& request = requests[i];
      request.ov = OVERLAPPED{};
      HRESULT hr = request.mr->Deregister(&request.ov);
      if (hr != ND_PENDING) ND_CHECK(hr, "IND2MemoryRegion::Deregister");
      ReapOne(shared, "IND2MemoryRegion::Deregister");
    }
    barrier.arrive_and_wait();
    for (std::uint64_t i = 0; i < round.iterations; ++i) requests[i].mr.Reset();
  }
}

Shared* g_shared = nullptr;  // for the barrier's completion step, which takes no argument

}  // namespace

int main(int argc, char* argv[]) {
  LocalOptions o = ParseLocalOptions(argc, argv, kSpec);
  std::uint64_t cap = IterationCap(kMaxIterations);
  std::vector<Round> rounds;
  for (std::size_t size : TestSizes()) rounds.push_back({size, IterationsFor(size, cap)});

  PrintBegin(kSpec.name);
  std::printf("Running test with %u threads\n", o.threads);
  {
    NdLibrary nd;
    Adapter adapter;
    adapter.Open(reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
    CompletionPort port(adapter, kPortKey, o.threads);
    Shared shared(adapter, port, o.threads, rounds);
    g_shared = &shared;

    PrintProcessors();
    std::printf("%18s%16s%16s\n", "", "Register", "Deregister");
    std::printf("%9s%9s%9s%7s%9s%7s\n", "Size", "Iter", "usec", "CPU", "usec", "CPU");
    std::fflush(stdout);

    std::barrier<void (*)() noexcept> barrier(std::ptrdiff_t(o.threads), [] () noexcept { g_shared->PhaseDone(); });
    std::vector<std::thread> threads;
    for (ULONG t = 0; t < o.threads; ++t) threads.emplace_back(Worker, std::ref(shared), std::ref(barrier));
    for (std::thread& t : threads) t.join();
  }
  PrintCounters();
  PrintEnd(kSpec.name);
  return 0;
}
