// The integration-test harness: ND programs in two processes on 127.0.0.1, through the public API.
//
// A test runs one side of a scenario in the test process and starts the other side as a *peer*:
// the test binary re-executed with --peer=<name> (registered with IT_PEER). The two processes
// share a line-based text channel (two pipes) for what ND itself cannot carry: the listening
// port, barriers, and verdicts after a connection was torn down. Both sides check with the same
// IT_* macros: in the test process a failed check throws and becomes a GoogleTest failure (the
// peer is then killed); in the peer it prints the message and exits non-zero, which the test
// reports together with the peer's output.
//
// Nothing waits without a bound: every wait helper takes a Deadline (10 s unless told) and fails
// when it expires; the test process also notices a peer that died and stops waiting at once; and
// a watchdog (alarm) ends a test process or a peer that still hangs somewhere.
#pragma once

#include <ndwv/ndspi.h>
#include <ndwv/ndstatus.h>
#include <ndwv/ndsupport.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ndit {

// ---- failures -----------------------------------------------------------------------------------

// "ND_CANCELED (0xC0000120)" for ND and NTSTATUS codes the tests meet, hex for anything else.
std::string StatusName(HRESULT hr);

class Failure : public std::runtime_error {
 public:
  Failure(const char* file, int line, const std::string& message)
      : std::runtime_error(message), file(file), line(line) {}
  const char* file;
  int line;
};

// Throws Failure in the test process; prints and _exit(1)s in a peer.
[[noreturn]] void Fail(const char* file, int line, const std::string& message);

// Single bytes print as numbers, not characters.
template <class T>
auto Printable(const T& value) {
  if constexpr (std::is_integral_v<T> && sizeof(T) == 1)
    return int(value);
  else
    return value;
}

template <class A, class B>
std::string Mismatch(const char* expectedText, const char* actualText, const A& expected,
                     const B& actual) {
  std::ostringstream out;
  out << actualText << " is " << Printable(actual) << ", expected " << Printable(expected) << " ("
      << expectedText << ")";
  return out.str();
}

#define IT_FAIL(message) ::ndit::Fail(__FILE__, __LINE__, (message))
#define IT_CHECK(cond)                                                  \
  do {                                                                  \
    if (!(cond)) ::ndit::Fail(__FILE__, __LINE__, "check failed: " #cond); \
  } while (0)
#define IT_CHECK_MSG(cond, message)                                                           \
  do {                                                                                        \
    if (!(cond)) ::ndit::Fail(__FILE__, __LINE__, std::string("check failed: " #cond ": ") + (message)); \
  } while (0)
#define IT_CHECK_EQ(expected, actual)                                                         \
  do {                                                                                        \
    const auto& it_e_ = (expected);                                                           \
    const auto& it_a_ = (actual);                                                             \
    if (!(it_e_ == it_a_))                                                                    \
      ::ndit::Fail(__FILE__, __LINE__, ::ndit::Mismatch(#expected, #actual, it_e_, it_a_));   \
  } while (0)
// HRESULTs, printed by name.
#define IT_CHECK_HR(expected, actual)                                                   \
  do {                                                                                  \
    HRESULT it_e_ = (expected);                                                         \
    HRESULT it_a_ = (actual);                                                           \
    if (it_e_ != it_a_)                                                                 \
      ::ndit::Fail(__FILE__, __LINE__,                                                  \
                   std::string(#actual " returned ") + ::ndit::StatusName(it_a_) +      \
                       ", expected " + ::ndit::StatusName(it_e_));                      \
  } while (0)
#define IT_OK(expr) IT_CHECK_HR(ND_SUCCESS, (expr))

// ---- deadlines ----------------------------------------------------------------------------------

constexpr int kWaitMs = 10000;  // the bound of every single wait

uint64_t NowMs();

class Deadline {
 public:
  explicit Deadline(int ms = kWaitMs) : end_(NowMs() + uint64_t(ms)) {}
  bool Expired() const { return NowMs() >= end_; }
  int LeftMs() const { return Expired() ? 0 : int(end_ - NowMs()); }

 private:
  uint64_t end_;
};

// Backs off between two polls (yield, then short sleeps) and, in the test process, fails at once
// if the peer has died. `spins` counts the polls of one wait.
void Pause(unsigned& spins);

// ---- the channel between the two processes ------------------------------------------------------

class Channel {
 public:
  Channel(int readFd, int writeFd) : in_(readFd), out_(writeFd) {}
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void Send(const std::string& line);
  std::string Receive(const char* what, int ms = kWaitMs);
  // Receives one line and fails unless it is `line`.
  void Expect(const std::string& line, int ms = kWaitMs);
  // "key value" lines.
  void SendValue(const std::string& key, uint64_t value);
  uint64_t ReceiveValue(const std::string& key, int ms = kWaitMs);
  // Both sides call it with the same name: returns once the other side got there too.
  void Barrier(const std::string& name, int ms = kWaitMs);

 private:
  int in_, out_;
  std::string buffered_;
};

// ---- peers --------------------------------------------------------------------------------------

class PeerArgs {
 public:
  explicit PeerArgs(std::map<std::string, std::string> values) : values_(std::move(values)) {}
  std::string Get(const std::string& key, const std::string& otherwise = "") const;
  uint64_t GetNumber(const std::string& key, uint64_t otherwise = 0) const;

 private:
  std::map<std::string, std::string> values_;
};

using PeerFunction = void (*)(Channel& parent, const PeerArgs& args);

struct PeerRegistration {
  PeerRegistration(const char* name, PeerFunction function);
};

// Defines the peer side of a scenario: IT_PEER(name) { ... uses `parent` and `args` ... }
#define IT_PEER(name)                                                               \
  static void ItPeer_##name(::ndit::Channel& parent, const ::ndit::PeerArgs& args); \
  static ::ndit::PeerRegistration itPeerRegistration_##name(#name, &ItPeer_##name); \
  static void ItPeer_##name([[maybe_unused]] ::ndit::Channel& parent,               \
                            [[maybe_unused]] const ::ndit::PeerArgs& args)

// Starts the peer `name` with key=value arguments, runs `body` (this process's side) with the
// channel to it, and checks that the peer exits 0. Arguments named "env:VARIABLE" are set in
// the peer's environment instead (e.g. {"env:NDWV_MPA_CRC", "0"}); "netns" runs the peer in
// that network namespace (ip netns). Any failure on either side fails the test;
// a failing side never leaves the other waiting (the peer is killed, the body stops waiting).
void RunWithPeer(const std::string& name, const std::map<std::string, std::string>& args,
                 const std::function<void(Channel& peer)>& body);
inline void RunWithPeer(const std::string& name, const std::function<void(Channel& peer)>& body) {
  RunWithPeer(name, {}, body);
}

// Runs a single-process check with the same failure handling as RunWithPeer.
void RunLocal(const std::function<void()>& body);
// Kills the running peer with SIGKILL (a fault the test injects: not reported as a failure) and
// reaps it.
void KillPeer();

// Used by main(): runs the peer named on the command line and exits.
[[noreturn]] void PeerMain(int argc, char** argv);

// ---- ND objects ---------------------------------------------------------------------------------

// Owns one reference to an ND interface.
template <class T>
class Ref {
 public:
  Ref() = default;
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  Ref(Ref&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  Ref& operator=(Ref&& other) noexcept {
    if (this != &other) {
      Reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  ~Ref() { Reset(); }

  // Releases and returns the count Release() reported (0 if empty).
  ULONG Reset() { return p_ ? std::exchange(p_, nullptr)->Release() : 0; }
  void** Out() {
    Reset();
    return reinterpret_cast<void**>(&p_);
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  T* p_ = nullptr;
};

// An OVERLAPPED with an auto-reset event, for one request at a time.
class Ov {
 public:
  Ov();
  ~Ov();  // cancels a request still running on it (failure paths)
  Ov(const Ov&) = delete;
  Ov& operator=(const Ov&) = delete;

  // A cleared OVERLAPPED for the next call on `object` (of version 2 or version 1).
  OVERLAPPED* Prepare(IND2Overlapped* object);
  OVERLAPPED* Prepare(INDOverlapped* object);
  // The final status of the request issued with Prepare(): `issued` if it was not ND_PENDING,
  // else waits (bounded) for the event and asks GetOverlappedResult. Fails on timeout (after
  // canceling the object's requests).
  HRESULT Finish(HRESULT issued, const char* what, int ms = kWaitMs);
  // Whether the request issued with Prepare() has completed (HasOverlappedIoCompleted).
  bool Completed() const { return HasOverlappedIoCompleted(&ov_); }
  OVERLAPPED* get() { return &ov_; }

 private:
  HRESULT Result();  // GetOverlappedResult(FALSE) of the object's version
  void Cancel();

  OVERLAPPED ov_{};
  HANDLE event_ = nullptr;
  IND2Overlapped* object_ = nullptr;
  INDOverlapped* v1Object_ = nullptr;
  bool issued_ = false;
};

sockaddr_in Loopback(uint16_t port);
uint16_t PortOf(const sockaddr_in& address);
// 127.0.0.1:port's TCP sockets, as /proc/net/tcp lists them: each one's state (hex: 01
// ESTABLISHED, 05 FIN_WAIT2, 06 TIME_WAIT, 0A LISTEN, ...) and its peer's port.
struct TcpSocket {
  int state;
  uint16_t remote_port;
};
std::vector<TcpSocket> TcpSocketsOn(uint16_t port);

// The ND adapter on 127.0.0.1, its limits and its overlapped file.
class Adapter {
 public:
  Adapter();
  ~Adapter();
  Adapter(const Adapter&) = delete;
  Adapter& operator=(const Adapter&) = delete;

  IND2Adapter* get() const { return adapter_.get(); }
  IND2Adapter* operator->() const { return adapter_.get(); }
  HANDLE file() const { return file_; }
  const ND2_ADAPTER_INFO& info() const { return info_; }

  Ref<IND2CompletionQueue> CreateCq(ULONG depth);
  Ref<IND2QueuePair> CreateQp(IND2CompletionQueue* cq, void* context, ULONG receiveDepth,
                              ULONG initiatorDepth, ULONG receiveSge = 4, ULONG initiatorSge = 4,
                              ULONG inlineSize = 0);
  Ref<IND2Connector> CreateConnector();
  Ref<IND2Listener> CreateListener();
  Ref<IND2MemoryRegion> CreateMr();

 private:
  Ref<IND2Adapter> adapter_;
  HANDLE file_ = nullptr;
  ND2_ADAPTER_INFO info_{};
};

// One registration, deregistered (and waited for) on destruction.
class Mr {
 public:
  Mr(Adapter& adapter, const void* buffer, size_t length, ULONG flags);
  ~Mr();
  Mr(const Mr&) = delete;
  Mr& operator=(const Mr&) = delete;
  IND2MemoryRegion* get() const { return mr_.get(); }
  UINT32 token() const { return mr_->GetLocalToken(); }
  UINT32 remoteToken() const { return mr_->GetRemoteToken(); }

 private:
  Ref<IND2MemoryRegion> mr_;
};

// Mr flags for the usual roles.
constexpr ULONG kSourceFlags = 0;
constexpr ULONG kSinkFlags = ND_MR_FLAG_ALLOW_LOCAL_WRITE;
constexpr ULONG kReadSinkFlags = ND_MR_FLAG_ALLOW_LOCAL_WRITE | ND_MR_FLAG_RDMA_READ_SINK;
constexpr ULONG kTargetFlags = ND_MR_FLAG_ALLOW_REMOTE_READ | ND_MR_FLAG_ALLOW_REMOTE_WRITE;

// ---- completions --------------------------------------------------------------------------------

// The next completion of `cq`, whatever its status; fails if none comes in time.
ND2_RESULT NextCompletion(IND2CompletionQueue* cq, const char* what, int ms = kWaitMs);

// What a completion must look like. Unset fields are not checked.
struct Expected {
  HRESULT status = ND_SUCCESS;
  ND2_REQUEST_TYPE type = Nd2RequestTypeSend;
  void* requestContext = nullptr;
  void* qpContext = nullptr;
  int64_t bytes = -1;  // checked when >= 0 (receives)
};
// Waits for the next completion and checks it against `e`; returns it.
ND2_RESULT ExpectCompletion(IND2CompletionQueue* cq, const Expected& e, const char* what,
                            int ms = kWaitMs);
// Nothing more arrives on `cq` within `ms` (a bounded look, not a timing assertion).
void ExpectNoCompletion(IND2CompletionQueue* cq, const char* what, int ms = 200);
std::string Describe(const ND2_RESULT& result);

// Request contexts that read well in messages: Ctx(0x100 + i).
inline void* Ctx(uintptr_t value) { return reinterpret_cast<void*>(value); }

// ---- connections --------------------------------------------------------------------------------

// One endpoint of a connection: a CQ, a QP and, once connected, the connector. The server side
// also keeps its listener. Receives complete on `receiveCq`: the same CQ unless separateCqs.
struct Shape {
  ULONG depth = 64;  // both queues
  ULONG sge = 4;     // both queues, as declared at creation
  ULONG inlineSize = 0;
  ULONG cqDepth = 1024;
  bool separateCqs = false;
};
struct Endpoint {
  Endpoint(Adapter& adapter, void* qpContext, const Shape& shape = {});
  Adapter& adapter;
  void* qpContext;
  Ref<IND2CompletionQueue> cq;
  Ref<IND2CompletionQueue> ownReceiveCq;
  IND2CompletionQueue* receiveCq;
  Ref<IND2QueuePair> qp;
  Ref<IND2Listener> listener;
  Ref<IND2Connector> connector;
};

// Binds a listener to 127.0.0.1:0, listens and returns the port chosen.
uint16_t StartListening(Adapter& adapter, Ref<IND2Listener>& listener);
// Waits for the next connection request; the returned connector holds it.
Ref<IND2Connector> GetConnectionRequest(Adapter& adapter, IND2Listener* listener);
// Issues Accept and returns its final status.
HRESULT Accept(IND2Connector* connector, IND2QueuePair* qp, ULONG inbound, ULONG outbound,
               const void* data = nullptr, ULONG length = 0);
// Issues Connect to 127.0.0.1:port and returns its final status.
HRESULT Connect(IND2Connector* connector, IND2QueuePair* qp, uint16_t port, ULONG inbound,
                ULONG outbound, const void* data = nullptr, ULONG length = 0);
void CompleteConnect(IND2Connector* connector);
// Issues Disconnect and returns its final status.
HRESULT Disconnect(IND2Connector* connector);

// The usual establishment, over the channel: the server listens, tells the client its port, and
// accepts; the client connects, completes, and returns once the server's Accept has completed
// ("accepted" on the channel), so that nothing the client does next can race the establishment
// (that race has its own test). Post receives on the QPs before calling these.
void Serve(Channel& channel, Endpoint& server, ULONG inbound = 4, ULONG outbound = 4);
void ConnectTo(Channel& channel, Endpoint& client, ULONG inbound = 4, ULONG outbound = 4);
// The usual end: the client disconnects, then tells the server, which disconnects too (after the
// peer is gone, which must also succeed).
void ClientTeardown(Channel& channel, Endpoint& client);
void ServerTeardown(Channel& channel, Endpoint& server);

// ---- buffers ------------------------------------------------------------------------------------

// Byte `index` of the test pattern `seed`: every message carries its own pattern.
inline uint8_t PatternByte(uint64_t seed, uint64_t index) {
  uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xC2B2AE3D27D4EB4Full + seed);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return uint8_t(x);
}
void FillPattern(uint8_t* data, size_t length, uint64_t seed);

// The transport this process's ndwv serves adapters with (NDWV_TRANSPORTS, read at NdStartup):
// RoCE's IB CM messages carry private data in fixed-size fields with no length, so a peer's data
// is reported padded with zeros to MaxCallerData/MaxCalleeData (the SPI allows it).
bool TransportIsRoce();
// The iWARP adapter's total of counter `name` (docs/counters.md) in this process.
uint64_t AdapterCounter(const char* name, const char* transport = "iWARP");  // or "RoCEv2"
// Whether a Send completes only once the peer took it: always on RoCE (its ACK), on iWARP with
// NDWV_IWARP_CONFIRM=all; otherwise an iWARP Send completes when handed to TCP, as on an RNIC.
bool SendsConfirmed();
// Fails with the first differing offset unless data == pattern(seed).
void CheckPattern(const uint8_t* data, size_t length, uint64_t seed, const char* what);
// Fails unless every byte is `value`.
void CheckFilled(const uint8_t* data, size_t length, uint8_t value, const char* what);
// Runs `check`, which reads memory the other process's RDMA Writes placed here, once that process
// said through the channel that those Writes, or a later request of its own, were answered (the
// device answers a connection's requests in order, after placing them). That order runs through
// the other process, which ThreadSanitizer cannot follow: tests/tsan.supp lets through its
// reports from inside this function, and only from there.
void CheckPlacedByPeer(const std::function<void()>& check);

// A scatter/gather layout of `total` bytes in a larger buffer: `pieces` SGEs of uneven lengths
// (fewer when total is tiny), separated by `gap` untouched bytes, starting at `start`.
struct Layout {
  std::vector<size_t> offsets, lengths;
  size_t end = 0;  // first byte after the last piece
  ULONG count() const { return ULONG(lengths.size()); }
};
Layout MakeLayout(size_t total, size_t start, int pieces, size_t gap, int variant);
// The SGEs of `layout` in `buffer` under `token`, written to `sges`; returns the count.
ULONG BuildSges(ND2_SGE* sges, const Layout& layout, uint8_t* buffer, UINT32 token);
// Copies the bytes of `layout` in `buffer` into one contiguous string.
std::vector<uint8_t> Gather(const Layout& layout, const uint8_t* buffer);
// Writes pattern(seed) across the pieces of `layout`, in order.
void ScatterPattern(const Layout& layout, uint8_t* buffer, uint64_t seed);
// Checks a receive into `layout`: its first `received` bytes are pattern(seed), and the rest of
// the pieces and the gaps between them still hold `fill`.
void CheckReceived(const Layout& layout, const uint8_t* buffer, size_t received, uint64_t seed,
                   uint8_t fill, const char* what);

// What a side sends its peer so that it can Read and Write its memory.
struct RemoteBuffer {
  uint64_t address;
  uint64_t length;
  uint32_t token;
  uint32_t reserved;
};
static_assert(sizeof(RemoteBuffer) == 24);

// Sends `buffer` to the peer in a Send (request context `context`) and waits for its completion
// on `e.cq`. A receive the peer may fill before that Send is confirmed needs a CQ of its own
// (separateCqs): the send and receive queues' completions have no order on one CQ.
void SendRemoteBuffer(Endpoint& e, const RemoteBuffer& buffer, void* context,
                      bool peer_may_end_first = false);
// Waits for the receive `context` (posted into `inbox`) to bring a RemoteBuffer, and returns it.
RemoteBuffer ReceiveRemoteBuffer(Endpoint& e, const uint8_t* inbox, void* context);

}  // namespace ndit
