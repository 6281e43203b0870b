// ndmrlat: memory registration latency (nd-tools.md §8). One MR object registers and deregisters
// a 4 MiB buffer's first `size` bytes, 10 000 times per size, timing how long each call takes to
// return ("call") and to complete ("total"). Pass 1 ("Event Driven") takes each completion from
// the OVERLAPPED's event (bit 0 set: no completion-port packet); pass 2 ("IOCP") from the
// completion port the adapter's overlapped file is associated with. A call that returns
// ND_SUCCESS at once counts as completed (the original assumed ND_PENDING).
#include <cstdio>
#include <memory>
#include <vector>

#include "nd_objects.h"

using namespace ndtool;

namespace {

constexpr std::uint64_t kIterations = 10000;
constexpr std::size_t kBufferSize = kMaxTransfer;
constexpr ULONG_PTR kPortKey = 0x1000;

const char kUsage[] =
    "ndmrlat [-l logFile] [-h] <ip>\n"
    "\n"
    "Memory registration latency: Register and Deregister of 1 B to 4 MiB, 10 000 times per\n"
    "size, the time to return (call) and to complete (total) in microseconds; completions\n"
    "first from the OVERLAPPED's event, then from a completion port.\n"
    "\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>            a local address of the adapter: a.b.c.d or [ipv6], last\n"
    "\n"
    "Environment:\n"
    "  NDWV_BENCH_SIZES=a,b,...  run only these sizes (bytes, K/M suffix, each 1..4M)\n"
    "  NDWV_BENCH_ITERS=n        at most n iterations per size\n"
    "  NDWV_TOOL_TIMEOUT_MS=ms   bound on every wait for a completion; default 30000\n";

const LocalToolSpec kSpec{"ndmrlat", kUsage, false};

enum class Pass { EventDriven, Iocp };

// Microseconds from the call to its return and to its completion, summed over a size's loop.
struct Times {
  double call = 0, total = 0;
};

class Bench {
 public:
  Bench(Adapter& adapter, CompletionPort& port)
      : port_(port), mr_(adapter.CreateMemoryRegion()), buffer_(std::make_unique<char[]>(kBufferSize)) {}

  // One Register and one Deregister of `size` bytes, completions taken the way `pass` says.
  void Cycle(Pass pass, std::size_t size, Times* registerTimes, Times* deregisterTimes) {
    std::uint64_t start = NowMicros();
    HRESULT hr = mr_->Register(buffer_.get(), size, ND_MR_FLAG_ALLOW_LOCAL_WRITE, Prepare(pass));
    Finish(pass, start, hr, "IND2MemoryRegion::Register", registerTimes);
    start = NowMicros();
    hr = mr_->Deregister(Prepare(pass));
    Finish(pass, start, hr, "IND2MemoryRegion::Deregister", deregisterTimes);
  }

 private:
  OVERLAPPED* Prepare(Pass pass) {
    if (pass == Pass::EventDriven) return event_.Prepare(/*portPacket=*/false);
    ov_ = OVERLAPPED{};  // hEvent NULL: the completion goes to the port
    return &ov_;
  }

  void Finish(Pass pass, std::uint64_t start, HRESULT hr, const char* what, Times* times) {
    const std::uint64_t returned = NowMicros();
    if (pass == Pass::EventDriven) {
      hr = event_.Complete(mr_.get(), hr, what);
    } else if (hr == ND_PENDING) {
      OVERLAPPED* ov = port_.Next(what);
      if (ov != &ov_) FailMessage("The completion port returned another request's OVERLAPPED", __LINE__);
      hr = mr_->GetOverlappedResult(&ov_, FALSE);
    } else if (SUCCEEDED(hr)) {
      // Done at once. Windows may still queue a packet for it: take it if it is there.
      OVERLAPPED* ov = port_.TryNext();
      if (ov && ov != &ov_) FailMessage("The completion port returned another request's OVERLAPPED", __LINE__);
    }
    ND_CHECK(hr, what);
    const std::uint64_t completed = NowMicros();
    times->call += double(returned - start);
    times->total += double(completed - start);
  }

  CompletionPort& port_;
  NdRef<IND2MemoryRegion> mr_;
  std::unique_ptr<char[]> buffer_;
  Overlapped event_;
  OVERLAPPED ov_{};
};

void PrintPassHeader(const char* title) {
  std::printf("%s\n", title);
  std::printf("%9s%18s%18s%7s\n", "", "Register (usec)", "Deregister (usec)", "CPU");
  std::printf("%9s%9s%9s%9s%9s\n", "Size", "call", "total", "call", "total");
  std::fflush(stdout);
}

void RunPass(Bench& bench, Pass pass, const std::vector<std::size_t>& sizes, std::uint64_t iterations) {
  PrintPassHeader(pass == Pass::EventDriven ? " Event Driven:" : " IOCP:");
  for (std::size_t size : sizes) {
    Times reg, dereg;
    CpuMeter cpu;
    cpu.Start();
    for (std::uint64_t i = 0; i < iterations; ++i) bench.Cycle(pass, size, &reg, &dereg);
    double cpuPercent = cpu.Stop();
    double n = double(iterations);
    std::printf("%9zu%9.2f%9.2f%9.2f%9.2f%7.2f\n", size, reg.call / n, reg.total / n, dereg.call / n,
                dereg.total / n, cpuPercent);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  LocalOptions o = ParseLocalOptions(argc, argv, kSpec);
  std::vector<std::size_t> sizes = TestSizes();
  std::uint64_t iterations = IterationCap(kIterations);
  PrintBegin(kSpec.name);
  {
    NdLibrary nd;
    Adapter adapter;
    adapter.Open(reinterpret_cast<const sockaddr*>(&o.address), o.addressLength);
    CompletionPort port(adapter, kPortKey, 0);
    Bench bench(adapter, port);

    PrintProcessors();
    RunPass(bench, Pass::EventDriven, sizes, iterations);
    std::printf("\n");
    RunPass(bench, Pass::Iocp, sizes, iterations);
  }
  PrintCounters();
  PrintEnd(kSpec.name);
  return 0;
}
