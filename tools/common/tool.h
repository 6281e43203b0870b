// What every ND example tool shares apart from ND objects (those are in nd_objects.h): the
// command line of nd-tools.md §7, banners, the result table, the timer, the CPU column, failure
// reporting, wait bounds and the size/iteration schedule.
#pragma once

#include <ndwv/win32.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ndtool {

// Exit codes. The original tools exit with a source line number on validation errors; a fixed
// code is easier to test. A value missing after -n/-q/-t/-l exits -1 as in the original, and so
// does a tool that needs an address and was given no argument at all (ndadapterinfo).
constexpr int kExitUsage = 1;          // bad option or address (after the usage text)
constexpr int kExitFailure = 2;        // an ND call or a completion failed, or a wait timed out
constexpr int kExitMissingValue = -1;  // -n/-q/-t/-l would take the address as its value
constexpr int kExitNoArguments = -1;   // a tool of ParseLocalOptions called without arguments

constexpr std::size_t kMaxTransfer = 4u << 20;        // largest size of the table: 4 MiB
constexpr std::uint64_t kIterBudget = 2097152000ull;  // iterations = min(MaxIter, budget / size)
constexpr std::size_t kWarmupSize = 40;
constexpr int kWarmupIterations = 1000;

// ---- command line ----------------------------------------------------------------------------

enum class RdmaOp { Write, Read };

struct ToolSpec {
  const char* name;           // "ndpingpong"; banners add ".exe" (nd-tools.md §7)
  std::uint16_t defaultPort;
  const char* usage;          // complete usage text, printed by -h and after validation errors
  bool takesRdmaOp;           // accepts -w/--write and -r/--read (ndrping)
  // Nonzero for a tool that counts connection cycles (ndconn): -n is the number of cycles, with
  // this default, instead of nSge; -b, -p and -q are not accepted.
  ULONG defaultCycles = 0;
  bool takesMemoryWait = false;  // accepts -m (the RDMA Write ping-pongs)
};

struct Options {
  bool server = false;
  bool blocking = false;  // -b: CQ Notify + wait; default -p: spin on GetResults
  bool memoryWait = false;  // -m: wait for data on memory alone, never polling the CQ meanwhile
  ULONG nSge = 1;
  ULONG queueDepth = 128;  // -q: parsed, used only by tools that pipeline
  RdmaOp op = RdmaOp::Write;
  ULONG cycles = 0;  // -n of a tool with ToolSpec::defaultCycles
  sockaddr_storage address{};  // the peer (client) or the address to listen on (server)
  ULONG addressLength = 0;
};

// Parses argv per nd-tools.md §7 (exact tokens, address last). On -h prints usage and exits 0;
// on a validation error prints the message and usage and exits; -l redirects stdout/stderr.
Options ParseOptions(int argc, char* argv[], const ToolSpec& spec);

// The command line of the tools that work on one local adapter and have no peer (ndmrlat,
// ndmrrate, ndcat, ndadapterinfo): `[-t|--threads N] [-l file] [-h] <ip>`, the address last.
// No argument at all prints the usage and exits kExitNoArguments; a bad address prints
// "Bad address." and the usage.
struct LocalToolSpec {
  const char* name;   // "ndmrlat", for the watchdog's message
  const char* usage;  // complete usage text
  bool takesThreads;  // accepts -t/--threads N (ndmrrate)
};

struct LocalOptions {
  ULONG threads = 1;
  sockaddr_storage address{};  // a local address of the adapter to use (its port is ignored)
  ULONG addressLength = 0;
};

LocalOptions ParseLocalOptions(int argc, char* argv[], const LocalToolSpec& spec);

// "a.b.c.d[:port]", "[v6addr]:port" or a bare IPv6 address; a missing port means defaultPort.
// False for anything else (the caller reports "Bad address.").
bool ParseAddress(const char* text, std::uint16_t defaultPort, sockaddr_storage* out, ULONG* len);
bool IsZeroAddress(const sockaddr* address);
// "a.b.c.d:port" / "[v6]:port" (port omitted when 0), for messages.
const char* FormatAddress(const sockaddr* address, char* buffer, std::size_t size);

// stdout to `path` (truncated), stderr appended to it; false if it cannot be opened.
bool RedirectOutput(const char* path);

[[noreturn]] void ExitWithUsage(const char* usage, int code);

// ---- output ----------------------------------------------------------------------------------

void PrintBegin(const char* tool);  // "Beginning test: <tool>.exe"
void PrintEnd(const char* tool);    // "End of test: <tool>.exe"
// The adapter counters of this process (ndwv_counters_write "adapters"), after a blank line:
// lines of name=value, which never read as table rows.
void PrintCounters();
void PrintProcessors();             // "Using <n> processors. Sender Frequency is <f>", blank line
void PrintTableHeader();            // PrintProcessors(), then the column titles
void PrintTableRow(std::size_t size, std::uint64_t iterations, double latencyUs, double cpu,
                   double bytesPerSecond);

// ---- timing ----------------------------------------------------------------------------------

constexpr std::uint64_t kTimerFrequency = 1000000;  // ticks per second of NowMicros()
std::uint64_t NowMicros();
void SleepMs(unsigned milliseconds);
unsigned ProcessorCount();

// System-wide CPU use over an interval: (1 - idle/total) * 100 * processors, from /proc/stat.
class CpuMeter {
 public:
  void Start();
  double Stop() const;

 private:
  unsigned long long idle_ = 0, total_ = 0;
};

// Round timing: call Start() before the first operation, Stop() after the last.
struct RoundTimer {
  void Start() {
    cpu.Start();
    begin = NowMicros();
  }
  void Stop() {
    elapsedUs = double(NowMicros() - begin);
    cpuPercent = cpu.Stop();
    if (elapsedUs <= 0) elapsedUs = 1;  // keep rates finite on a coarse clock
  }
  CpuMeter cpu;
  std::uint64_t begin = 0;
  double elapsedUs = 0, cpuPercent = 0;
};

// ---- failures and bounds ---------------------------------------------------------------------

// "<what> failed: %08x  Line: <n>" and exit kExitFailure. Output is flushed and the process ends
// with _exit so that a wedged peer or device thread can never keep a failed tool alive.
[[noreturn]] void Fail(const char* what, HRESULT hr, int line);
// A failure that has no HRESULT: prints "<message>  Line: <n>" and exits kExitFailure.
[[noreturn]] void FailMessage(const char* message, int line);
// Prints `message` as it is and exits kExitFailure (messages the spec gives verbatim).
[[noreturn]] void FailPlain(const char* message);
// A wait that ran out: reported as ND_IO_TIMEOUT with the bound and how to change it.
[[noreturn]] void FailTimeout(const char* what, std::uint32_t timeoutMs, int line);

inline void Check(HRESULT hr, const char* what, int line) {
  if (FAILED(hr)) Fail(what, hr, line);
}
#define ND_CHECK(expr, what) ::ndtool::Check((expr), (what), __LINE__)

// Bound on every single wait (connection, completion, pong): NDWV_TOOL_TIMEOUT_MS, default 30 s.
std::uint32_t WaitTimeoutMs();
// Bound on a passive side's wait for the end of a whole one-sided run (the ndrping server sees
// nothing until the client's terminate): NDWV_TOOL_RUN_TIMEOUT_MS, default 15 min.
std::uint32_t RunTimeoutMs();

// Backstop for hangs the tool's own bounds cannot see: a call into the library that never
// returns. Every wait loop calls NoteProgress(); a watchdog thread (started by ParseOptions) ends
// the tool if the count stands still for WaitTimeoutMs() + 10 s.
void NoteProgress();
void StartWatchdog(const char* tool);

// Tells when a spin loop has run past its bound without reading the clock on every spin.
class SpinDeadline {
 public:
  explicit SpinDeadline(std::uint32_t timeoutMs) : timeoutMs_(timeoutMs) {}
  bool Expired() {
    if ((++spins_ & 1023u) != 0) return false;
    NoteProgress();
    std::uint64_t now = NowMicros();
    if (deadline_ == 0) deadline_ = now + std::uint64_t(timeoutMs_) * 1000;
    return now > deadline_;
  }
  std::uint32_t timeoutMs() const { return timeoutMs_; }

 private:
  std::uint32_t timeoutMs_;
  std::uint32_t spins_ = 0;
  std::uint64_t deadline_ = 0;
};

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// ---- test schedule ---------------------------------------------------------------------------

struct Round {
  std::size_t size;
  std::uint64_t iterations;
};

// Sizes 1 B .. 4 MiB doubling, iterations min(maxIterations, 2 097 152 000 / size), restricted by
// NDWV_BENCH_SIZES (comma list, K/M suffixes allowed) and NDWV_BENCH_ITERS (cap). A bad value
// ends the tool with a message (exit kExitUsage).
std::vector<Round> TestSchedule(std::uint64_t maxIterations);
// The parts of that schedule, for tools whose iteration counts follow other rules (ndmrlat,
// ndmrrate): the sizes (NDWV_BENCH_SIZES or 1 B .. 4 MiB) and min(maxIterations, NDWV_BENCH_ITERS).
std::vector<std::size_t> TestSizes();
std::uint64_t IterationCap(std::uint64_t maxIterations);

// The measured part of a client: the table header, then per round `run(size, iterations)`
// timed, and its row. `transfers` is how many messages an iteration moves (2 for a ping-pong,
// whose latency column is half a round trip).
template <class Run>
void MeasureRounds(const std::vector<Round>& rounds, int transfers, Run run) {
  PrintTableHeader();
  for (const Round& round : rounds) {
    RoundTimer timer;
    timer.Start();
    run(round.size, round.iterations);
    timer.Stop();
    double iterations = double(round.iterations);
    PrintTableRow(round.size, round.iterations, timer.elapsedUs / iterations / transfers,
                  timer.cpuPercent,
                  transfers * double(round.size) * iterations / (timer.elapsedUs / 1e6));
  }
}

// main() of the measuring tools (ndping, ndpingpong, ndrping, ndrpingpong): the options, then the
// server or the client side over TestSchedule(maxIterations) between the begin and end lines,
// with the counters after the table. Returns the side's exit status.
using ToolSide = int (*)(const Options& options, const std::vector<Round>& rounds);
int RunMeasuringTool(int argc, char* argv[], const ToolSpec& spec, std::uint64_t maxIterations,
                     ToolSide server, ToolSide client);

// Usage text lines shared by the measuring tools: the options every one has (the side, the
// completion wait, the log file, the address and its default port), and the whole option list
// of each tool that exists for both versions (ndpingpong and nd1pingpong, ...), which take the
// same options.
#define NDTOOL_SIDE_USAGE                                                                     \
  "  -s              server: listen on ip:port\n"                                              \
  "  -c              client: connect to ip:port\n"
#define NDTOOL_WAIT_USAGE(blockingNote)                                                       \
  "  -b              blocking: wait for completions (CQ Notify)" blockingNote "\n"            \
  "  -p              polling: spin on the CQ (default)\n"
#define NDTOOL_ADDRESS_USAGE(port)                                                            \
  "  -l, --logFile f write stdout (and append stderr) to file f\n"                            \
  "  -h, --help      this text\n"                                                             \
  "  <ip>[:port]     a.b.c.d[:port] or [ipv6][:port], last; default port " #port "\n"
#define NDTOOL_PINGPONG_OPTIONS                                                               \
  NDTOOL_SIDE_USAGE NDTOOL_WAIT_USAGE("")                                                     \
  "  -n nSge         SGEs per request (default 1)\n"                                          \
  "  -q N            accepted and ignored\n" NDTOOL_ADDRESS_USAGE(54325)
#define NDTOOL_RPING_OPTIONS                                                                  \
  NDTOOL_SIDE_USAGE NDTOOL_WAIT_USAGE("")                                                     \
  "  -w, --write     RDMA Write (default)\n"                                                  \
  "  -r, --read      RDMA Read; give both sides the same operation\n"                         \
  "  -n nSge         SGEs per operation (default 1; capped by the adapter)\n"                 \
  "  -q N            accepted and ignored\n" NDTOOL_ADDRESS_USAGE(54326)
#define NDTOOL_RPINGPONG_OPTIONS                                                              \
  NDTOOL_SIDE_USAGE NDTOOL_WAIT_USAGE("; data is still polled")                               \
  "  -m              memory: spin on the last byte alone, never polling the CQ while waiting\n"  \
  "                  (as Microsoft's ndrpingpong and MPI eager protocols); the write is\n"      \
  "                  reaped once the byte arrived\n"                                           \
  "  -n nSge         SGEs per RDMA Write (default 1)\n"                                       \
  "  -q N            accepted and ignored\n" NDTOOL_ADDRESS_USAGE(54327)                      \
  "\n"                                                                                        \
  "Both sides run the same schedule, so NDWV_BENCH_SIZES and NDWV_BENCH_ITERS must match.\n"

// Usage text lines shared by the benchmark tools (environment variables).
#define NDTOOL_ENV_USAGE                                                                      \
  "Environment:\n"                                                                            \
  "  NDWV_BENCH_SIZES=a,b,...  run only these sizes (bytes, K/M suffix, each 1..4M)\n"        \
  "                            (set the same on both sides)\n"                                 \
  "  NDWV_BENCH_ITERS=n        at most n iterations per size\n"                               \
  "  NDWV_TOOL_TIMEOUT_MS=ms   bound on every wait (connection, completion); default 30000\n"

}  // namespace ndtool
