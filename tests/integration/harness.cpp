// The harness behind harness.h, and the test binary's main(): GoogleTest, or a peer when the
// command line says --peer=<name>.
#include "harness.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <ndwv/ndwv.h>

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ndit {

namespace {

bool g_inPeer = false;  // this process is a peer: failures exit instead of throwing

// The running peer, seen from the test process (0: none). Written by the test thread only;
// read by the alarm handler.
volatile pid_t g_peerPid = 0;
bool g_peerReaped = false;
int g_peerStatus = 0;
bool g_peerDied = false;  // this side stopped waiting because the peer failed

constexpr unsigned kTestBudgetSeconds = 90;  // whole test (test process)
constexpr unsigned kPeerBudgetSeconds = 80;  // whole peer run
constexpr int kPeerExitMs = 15000;           // a peer whose side is done must exit within this

void OnAlarm(int) {
  static const char message[] =
      "\nndwv integration: time budget exceeded (something hangs); aborting\n";
  ssize_t ignored = write(2, message, sizeof message - 1);
  (void)ignored;
  if (g_peerPid > 0) kill(g_peerPid, SIGKILL);
  _exit(3);
}

std::string DescribeExit(int status) {
  char text[64];
  if (WIFEXITED(status))
    std::snprintf(text, sizeof text, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    std::snprintf(text, sizeof text, "was killed by signal %d (%s)", WTERMSIG(status),
                  strsignal(WTERMSIG(status)));
  else
    std::snprintf(text, sizeof text, "ended with wait status 0x%x", status);
  return text;
}

bool PeerSucceeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Test process: fails at once if the peer has died with an error (rather than waiting for a
// deadline). A peer that exited 0 is fine: its side may simply be done.
void CheckPeer() {
  if (g_inPeer || g_peerPid <= 0 || g_peerReaped) return;
  int status = 0;
  if (waitpid(g_peerPid, &status, WNOHANG) != g_peerPid) return;
  g_peerReaped = true;
  g_peerStatus = status;
  if (!PeerSucceeded(status)) {
    g_peerDied = true;
    IT_FAIL("the peer " + DescribeExit(status));
  }
}

std::map<std::string, PeerFunction>& Registry() {
  static std::map<std::string, PeerFunction> registry;
  return registry;
}

std::string ReadAll(int fd) {
  std::string text;
  char chunk[4096];
  off_t offset = 0;
  for (;;) {
    ssize_t n = pread(fd, chunk, sizeof chunk, offset);
    if (n <= 0) break;
    text.append(chunk, size_t(n));
    offset += n;
  }
  return text;
}

}  // namespace

// ---- failures -----------------------------------------------------------------------------------

std::string StatusName(HRESULT hr) {
  static const std::pair<HRESULT, const char*> kNames[] = {
      {ND_SUCCESS, "ND_SUCCESS"},
      {ND_TIMEOUT, "ND_TIMEOUT"},
      {ND_PENDING, "ND_PENDING"},
      {ND_BUFFER_OVERFLOW, "ND_BUFFER_OVERFLOW"},
      {ND_DEVICE_BUSY, "ND_DEVICE_BUSY"},
      {ND_NO_MORE_ENTRIES, "ND_NO_MORE_ENTRIES"},
      {ND_UNSUCCESSFUL, "ND_UNSUCCESSFUL"},
      {ND_ACCESS_VIOLATION, "ND_ACCESS_VIOLATION"},
      {ND_INVALID_HANDLE, "ND_INVALID_HANDLE"},
      {ND_INVALID_PARAMETER, "ND_INVALID_PARAMETER"},
      {ND_INVALID_DEVICE_REQUEST, "ND_INVALID_DEVICE_REQUEST"},
      {ND_NO_MEMORY, "ND_NO_MEMORY"},
      {ND_INVALID_PARAMETER_MIX, "ND_INVALID_PARAMETER_MIX"},
      {ND_DATA_OVERRUN, "ND_DATA_OVERRUN"},
      {ND_SHARING_VIOLATION, "ND_SHARING_VIOLATION"},
      {ND_INSUFFICIENT_RESOURCES, "ND_INSUFFICIENT_RESOURCES"},
      {ND_DEVICE_NOT_READY, "ND_DEVICE_NOT_READY"},
      {ND_IO_TIMEOUT, "ND_IO_TIMEOUT"},
      {ND_NOT_SUPPORTED, "ND_NOT_SUPPORTED"},
      {ND_INTERNAL_ERROR, "ND_INTERNAL_ERROR"},
      {ND_INVALID_PARAMETER_1, "ND_INVALID_PARAMETER_1"},
      {ND_INVALID_PARAMETER_2, "ND_INVALID_PARAMETER_2"},
      {ND_INVALID_PARAMETER_3, "ND_INVALID_PARAMETER_3"},
      {ND_INVALID_PARAMETER_4, "ND_INVALID_PARAMETER_4"},
      {ND_INVALID_PARAMETER_5, "ND_INVALID_PARAMETER_5"},
      {ND_INVALID_PARAMETER_6, "ND_INVALID_PARAMETER_6"},
      {ND_INVALID_PARAMETER_7, "ND_INVALID_PARAMETER_7"},
      {ND_INVALID_PARAMETER_8, "ND_INVALID_PARAMETER_8"},
      {ND_INVALID_PARAMETER_9, "ND_INVALID_PARAMETER_9"},
      {ND_INVALID_PARAMETER_10, "ND_INVALID_PARAMETER_10"},
      {ND_CANCELED, "ND_CANCELED"},
      {ND_REMOTE_ERROR, "ND_REMOTE_ERROR"},
      {ND_INVALID_ADDRESS, "ND_INVALID_ADDRESS"},
      {ND_INVALID_DEVICE_STATE, "ND_INVALID_DEVICE_STATE"},
      {ND_INVALID_BUFFER_SIZE, "ND_INVALID_BUFFER_SIZE"},
      {ND_TOO_MANY_ADDRESSES, "ND_TOO_MANY_ADDRESSES"},
      {ND_ADDRESS_ALREADY_EXISTS, "ND_ADDRESS_ALREADY_EXISTS"},
      {ND_CONNECTION_REFUSED, "ND_CONNECTION_REFUSED"},
      {ND_CONNECTION_INVALID, "ND_CONNECTION_INVALID"},
      {ND_CONNECTION_ACTIVE, "ND_CONNECTION_ACTIVE"},
      {ND_NETWORK_UNREACHABLE, "ND_NETWORK_UNREACHABLE"},
      {ND_HOST_UNREACHABLE, "ND_HOST_UNREACHABLE"},
      {ND_CONNECTION_ABORTED, "ND_CONNECTION_ABORTED"},
      {ND_DEVICE_REMOVED, "ND_DEVICE_REMOVED"},
      {STATUS_ADDRESS_ALREADY_ASSOCIATED, "STATUS_ADDRESS_ALREADY_ASSOCIATED"},
      {STATUS_BAD_NETWORK_NAME, "STATUS_BAD_NETWORK_NAME"},
      {STATUS_CONNECTION_DISCONNECTED, "STATUS_CONNECTION_DISCONNECTED"},
      {STATUS_DATA_ERROR, "STATUS_DATA_ERROR"},
  };
  char hex[16];
  std::snprintf(hex, sizeof hex, "0x%08X", uint32_t(hr));
  for (const auto& [value, name] : kNames)
    if (value == hr) return std::string(name) + " (" + hex + ")";
  return hex;
}

void Fail(const char* file, int line, const std::string& message) {
  if (g_inPeer) {
    std::fprintf(stderr, "peer failure at %s:%d: %s\n", file, line, message.c_str());
    std::fflush(stderr);
    _exit(1);
  }
  throw Failure(file, line, message);
}

// ---- deadlines ----------------------------------------------------------------------------------

uint64_t NowMs() {
  using namespace std::chrono;
  return uint64_t(duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count());
}

void Pause(unsigned& spins) {
  ++spins;
  if (spins < 64) {
    sched_yield();  // the peer and the engine share two cores with us: never spin hard
    return;
  }
  if (spins % 16 == 0) CheckPeer();
  usleep(spins < 512 ? 50 : 200);
}

// ---- channel ------------------------------------------------------------------------------------

Channel::~Channel() {
  close(in_);
  close(out_);
}

void Channel::Send(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(out_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      CheckPeer();
      IT_FAIL("channel: the other side is gone (sending \"" + line + "\")");
    }
    done += size_t(n);
  }
}

std::string Channel::Receive(const char* what, int ms) {
  Deadline deadline(ms);
  for (;;) {
    size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    if (deadline.Expired())
      IT_FAIL(std::string("channel: nothing from the other side for ") + what + " within " +
              std::to_string(ms) + " ms");
    pollfd p{in_, POLLIN, 0};
    int ready = poll(&p, 1, std::min(deadline.LeftMs(), 100));
    if (ready < 0 && errno != EINTR) IT_FAIL("channel: poll failed");
    if (ready <= 0) {
      CheckPeer();
      continue;
    }
    char chunk[512];
    ssize_t n = read(in_, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (!g_inPeer && g_peerPid > 0) {
        // The peer closed its end: it exited. Give the reason if it failed.
        int status = 0;
        if (!g_peerReaped && waitpid(g_peerPid, &status, 0) == g_peerPid) {
          g_peerReaped = true;
          g_peerStatus = status;
        }
        if (g_peerReaped && !PeerSucceeded(g_peerStatus)) {
          g_peerDied = true;
          IT_FAIL("the peer " + DescribeExit(g_peerStatus));
        }
      }
      IT_FAIL(std::string("channel: the other side closed it while waiting for ") + what);
    }
    buffered_.append(chunk, size_t(n));
  }
}

void Channel::Expect(const std::string& line, int ms) {
  std::string got = Receive(line.c_str(), ms);
  if (got != line) IT_FAIL("channel: got \"" + got + "\", expected \"" + line + "\"");
}

void Channel::SendValue(const std::string& key, uint64_t value) {
  Send(key + " " + std::to_string(value));
}

uint64_t Channel::ReceiveValue(const std::string& key, int ms) {
  std::string got = Receive(key.c_str(), ms);
  if (got.compare(0, key.size() + 1, key + " ") != 0)
    IT_FAIL("channel: got \"" + got + "\", expected \"" + key + " <value>\"");
  return std::strtoull(got.c_str() + key.size() + 1, nullptr, 0);
}

void Channel::Barrier(const std::string& name, int ms) {
  Send("barrier " + name);
  Expect("barrier " + name, ms);
}

// ---- peers --------------------------------------------------------------------------------------

std::string PeerArgs::Get(const std::string& key, const std::string& otherwise) const {
  auto it = values_.find(key);
  return it == values_.end() ? otherwise : it->second;
}

uint64_t PeerArgs::GetNumber(const std::string& key, uint64_t otherwise) const {
  auto it = values_.find(key);
  return it == values_.end() ? otherwise : std::strtoull(it->second.c_str(), nullptr, 0);
}

PeerRegistration::PeerRegistration(const char* name, PeerFunction function) {
  Registry()[name] = function;
}

void RunWithPeer(const std::string& name, const std::map<std::string, std::string>& args,
                 const std::function<void(Channel& peer)>& body) {
  if (Registry().count(name) == 0) {
    ADD_FAILURE() << "no peer named " << name;
    return;
  }
  // The peer's stdout and stderr go to an unlinked temporary file, shown when something fails.
  char logPath[] = "/tmp/ndwv-integration-peer-XXXXXX";
  int logFd = mkostemp(logPath, O_CLOEXEC);
  ASSERT_GE(logFd, 0) << "mkostemp: " << std::strerror(errno);
  unlink(logPath);
  int toPeer[2], fromPeer[2];
  ASSERT_EQ(pipe2(toPeer, O_CLOEXEC), 0);
  ASSERT_EQ(pipe2(fromPeer, O_CLOEXEC), 0);

  std::vector<std::string> words = {"ndwv_integration_tests", "--peer=" + name,
                                    "--channel=" + std::to_string(toPeer[0]) + "," +
                                        std::to_string(fromPeer[1])};
  for (const auto& [key, value] : args)
    if (key.rfind("env:", 0) != 0) words.push_back("--arg:" + key + "=" + value);
  std::vector<std::string> environment;
  for (char** variable = environ; *variable != nullptr; ++variable) {
    std::string entry = *variable;
    std::string key = entry.substr(0, entry.find('='));
    if (args.count("env:" + key) == 0) environment.push_back(entry);
  }
  for (const auto& [key, value] : args)
    if (key.rfind("env:", 0) == 0) environment.push_back(key.substr(4) + "=" + value);
  std::vector<char*> argv, envp;
  for (std::string& word : words) argv.push_back(word.data());
  argv.push_back(nullptr);
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);

  int netns = -1;  // the peer's network namespace, entered between fork and exec
  if (args.count("netns")) {
    netns = open(("/var/run/netns/" + args.at("netns")).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(netns, 0) << "network namespace " << args.at("netns") << ": " << std::strerror(errno);
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT_GE(pid, 0) << "fork: " << std::strerror(errno);
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec: the parent has threads.
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
    if (getppid() != parent) _exit(98);
    dup2(logFd, 1);
    dup2(logFd, 2);
    fcntl(toPeer[0], F_SETFD, 0);
    fcntl(fromPeer[1], F_SETFD, 0);
    if (netns >= 0 && setns(netns, CLONE_NEWNET) != 0) _exit(97);
    execve("/proc/self/exe", argv.data(), envp.data());
    _exit(127);
  }
  close(toPeer[0]);
  close(fromPeer[1]);
  if (netns >= 0) close(netns);
  g_peerPid = pid;
  g_peerReaped = false;
  g_peerStatus = 0;
  g_peerDied = false;

  bool failed = false;
  {
    Channel channel(fromPeer[0], toPeer[1]);
    try {
      body(channel);
    } catch (const Failure& failure) {
      // A peer that died is reported once, below, with its output.
      if (!g_peerDied) ADD_FAILURE_AT(failure.file, failure.line) << failure.what();
      failed = true;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "exception: " << e.what();
      failed = true;
    }
  }  // closes our channel ends: a peer waiting on the channel sees EOF and fails

  bool killed = false;
  if (!g_peerReaped) {
    if (failed) {
      kill(pid, SIGKILL);
      killed = true;
    }
    Deadline deadline(kPeerExitMs);
    int status = 0;
    for (;;) {
      pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) break;
      if (deadline.Expired() && !killed) {
        ADD_FAILURE() << "the peer " << name << " did not exit within " << kPeerExitMs
                      << " ms after this side finished; killed";
        kill(pid, SIGKILL);
        killed = failed = true;
      }
      usleep(2000);
    }
    g_peerReaped = true;
    g_peerStatus = status;
  }
  std::string log = ReadAll(logFd);
  close(logFd);
  if (!killed && !PeerSucceeded(g_peerStatus)) {
    ADD_FAILURE() << "the peer " << name << " " << DescribeExit(g_peerStatus)
                  << "\n--- peer output ---\n"
                  << log << "--- end of peer output ---";
  } else if (failed && !log.empty()) {
    std::fprintf(stderr, "--- output of the peer %s (%s) ---\n%s--- end of peer output ---\n",
                 name.c_str(), killed ? "killed" : DescribeExit(g_peerStatus).c_str(),
                 log.c_str());
  }
  g_peerPid = 0;
}

void KillPeer() {
  if (g_peerPid <= 0 || g_peerReaped) return;
  kill(g_peerPid, SIGKILL);
  int status = 0;
  waitpid(g_peerPid, &status, 0);
  g_peerReaped = true;
  g_peerStatus = 0;  // as the test wanted
}

void RunLocal(const std::function<void()>& body) {
  try {
    body();
  } catch (const Failure& failure) {
    ADD_FAILURE_AT(failure.file, failure.line) << failure.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "exception: " << e.what();
  }
}

void PeerMain(int argc, char** argv) {
  g_inPeer = true;
  signal(SIGPIPE, SIG_IGN);
  signal(SIGALRM, OnAlarm);
  alarm(kPeerBudgetSeconds);
  std::string name;
  int readFd = -1, writeFd = -1;
  std::map<std::string, std::string> values;
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--peer=", 0) == 0) {
      name = word.substr(7);
    } else if (word.rfind("--channel=", 0) == 0) {
      std::sscanf(word.c_str() + 10, "%d,%d", &readFd, &writeFd);
    } else if (word.rfind("--arg:", 0) == 0) {
      size_t equals = word.find('=');
      values[word.substr(6, equals - 6)] = equals == std::string::npos ? "" : word.substr(equals + 1);
    }
  }
  auto it = Registry().find(name);
  if (it == Registry().end() || readFd < 0 || writeFd < 0) {
    std::fprintf(stderr, "peer: unknown peer \"%s\" or no channel\n", name.c_str());
    _exit(2);
  }
  HRESULT hr = NdStartup();
  if (FAILED(hr)) IT_FAIL("NdStartup returned " + StatusName(hr));
  {
    Channel parent(readFd, writeFd);
    it->second(parent, PeerArgs(values));
  }
  IT_OK(NdCleanup());
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(0);
}

// ---- ND objects ---------------------------------------------------------------------------------

Ov::Ov() {
  event_ = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  if (event_ == nullptr) IT_FAIL("CreateEvent failed");
}

Ov::~Ov() {
  if (issued_ && (object_ != nullptr || v1Object_ != nullptr) && !HasOverlappedIoCompleted(&ov_)) {
    // A failure left the request running: cancel it so that nothing writes here later.
    Cancel();
    for (int i = 0; i < 40 && !HasOverlappedIoCompleted(&ov_); ++i) WaitForSingleObject(event_, 50);
  }
  CloseHandle(event_);
}

OVERLAPPED* Ov::Prepare(IND2Overlapped* object) {
  ov_ = OVERLAPPED{};
  ov_.hEvent = event_;
  object_ = object;
  v1Object_ = nullptr;
  issued_ = true;
  return &ov_;
}

OVERLAPPED* Ov::Prepare(INDOverlapped* object) {
  OVERLAPPED* ov = Prepare(static_cast<IND2Overlapped*>(nullptr));
  v1Object_ = object;
  return ov;
}

HRESULT Ov::Result() {
  if (object_ != nullptr) return object_->GetOverlappedResult(&ov_, FALSE);
  SIZE_T bytes = ~SIZE_T(0);
  HRESULT hr = v1Object_->GetOverlappedResult(&ov_, &bytes, FALSE);
  // Version 1 reports a byte count, which ND requests do not have: the whole 64 bits are 0.
  if (bytes != 0) IT_FAIL("INDOverlapped::GetOverlappedResult left the byte count " + std::to_string(bytes));
  return hr;
}

void Ov::Cancel() {
  if (object_ != nullptr) object_->CancelOverlappedRequests();
  if (v1Object_ != nullptr) v1Object_->CancelOverlappedRequests();
}

HRESULT Ov::Finish(HRESULT issued, const char* what, int ms) {
  if (issued != ND_PENDING) {
    issued_ = false;  // done inline, or refused: no notification follows
    return issued;
  }
  Deadline deadline(ms);
  for (;;) {
    DWORD wait = WaitForSingleObject(event_, DWORD(std::min(deadline.LeftMs(), 50)));
    if (wait == WAIT_FAILED) IT_FAIL("WaitForSingleObject failed");
    HRESULT hr = Result();
    if (hr != ND_PENDING) {
      issued_ = false;
      return hr;
    }
    if (deadline.Expired()) {
      Cancel();
      HRESULT after = Result();
      for (int i = 0; i < 40 && after == ND_PENDING; ++i) {
        WaitForSingleObject(event_, 50);
        after = Result();
      }
      if (after != ND_PENDING) issued_ = false;
      IT_FAIL(std::string(what) + " did not complete within " + std::to_string(ms) +
              " ms (canceled: " + StatusName(after) + ")");
    }
    CheckPeer();
  }
}

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return address;
}

uint16_t PortOf(const sockaddr_in& address) { return ntohs(address.sin_port); }

std::vector<TcpSocket> TcpSocketsOn(uint16_t port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  std::vector<TcpSocket> sockets;
  char wanted[16];
  std::snprintf(wanted, sizeof wanted, "0100007F:%04X", port);
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    fields >> slot >> local >> remote >> state;
    if (local != wanted) continue;
    const size_t colon = remote.find(':');  // "ADDRESS:PORT", both hexadecimal
    sockets.push_back({std::stoi(state, nullptr, 16),
                       uint16_t(colon == std::string::npos ? 0 : std::stoi(remote.substr(colon + 1), nullptr, 16))});
  }
  return sockets;
}

Adapter::Adapter() {
  sockaddr_in address = Loopback(0);
  IT_OK(NdOpenAdapter(IID_IND2Adapter, reinterpret_cast<sockaddr*>(&address), sizeof address,
                      adapter_.Out()));
  info_.InfoVersion = ND_VERSION_2;
  ULONG size = sizeof info_;
  IT_OK(adapter_->Query(&info_, &size));
  IT_OK(adapter_->CreateOverlappedFile(&file_));
}

Adapter::~Adapter() {
  if (file_ != nullptr) CloseHandle(file_);
  adapter_.Reset();
}

Ref<IND2CompletionQueue> Adapter::CreateCq(ULONG depth) {
  Ref<IND2CompletionQueue> cq;
  IT_OK(adapter_->CreateCompletionQueue(IID_IND2CompletionQueue, file_, depth, 0, 0, cq.Out()));
  return cq;
}

Ref<IND2QueuePair> Adapter::CreateQp(IND2CompletionQueue* cq, void* context, ULONG receiveDepth,
                                     ULONG initiatorDepth, ULONG receiveSge, ULONG initiatorSge,
                                     ULONG inlineSize) {
  Ref<IND2QueuePair> qp;
  IT_OK(adapter_->CreateQueuePair(IID_IND2QueuePair, cq, cq, context, receiveDepth, initiatorDepth,
                                  receiveSge, initiatorSge, inlineSize, qp.Out()));
  return qp;
}

Ref<IND2Connector> Adapter::CreateConnector() {
  Ref<IND2Connector> connector;
  IT_OK(adapter_->CreateConnector(IID_IND2Connector, file_, connector.Out()));
  return connector;
}

Ref<IND2Listener> Adapter::CreateListener() {
  Ref<IND2Listener> listener;
  IT_OK(adapter_->CreateListener(IID_IND2Listener, file_, listener.Out()));
  return listener;
}

Ref<IND2MemoryRegion> Adapter::CreateMr() {
  Ref<IND2MemoryRegion> mr;
  IT_OK(adapter_->CreateMemoryRegion(IID_IND2MemoryRegion, file_, mr.Out()));
  return mr;
}

Mr::Mr(Adapter& adapter, const void* buffer, size_t length, ULONG flags) : mr_(adapter.CreateMr()) {
  Ov ov;
  HRESULT hr = mr_->Register(buffer, length, flags, ov.Prepare(mr_.get()));
  IT_OK(ov.Finish(hr, "IND2MemoryRegion::Register"));
}

Mr::~Mr() {
  // No failure may escape a destructor: a plain bounded wait.
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  OVERLAPPED ov{};
  ov.hEvent = event;
  HRESULT hr = mr_->Deregister(&ov);
  for (int i = 0; hr == ND_PENDING && i < 100; ++i) {
    WaitForSingleObject(event, 50);
    hr = mr_->GetOverlappedResult(&ov, FALSE);
  }
  if (hr != ND_SUCCESS)
    std::fprintf(stderr, "warning: Deregister ended with %s\n", StatusName(hr).c_str());
  if (event != nullptr) CloseHandle(event);
}

// ---- completions --------------------------------------------------------------------------------

static const char* TypeName(ND2_REQUEST_TYPE type) {
  switch (type) {
    case Nd2RequestTypeReceive: return "Receive";
    case Nd2RequestTypeSend: return "Send";
    case Nd2RequestTypeBind: return "Bind";
    case Nd2RequestTypeInvalidate: return "Invalidate";
    case Nd2RequestTypeRead: return "Read";
    case Nd2RequestTypeWrite: return "Write";
  }
  return "?";
}

std::string Describe(const ND2_RESULT& r) {
  char text[200];
  std::snprintf(text, sizeof text, "{%s, type %s, request %p, qp %p, bytes %u}",
                StatusName(r.Status).c_str(), TypeName(r.RequestType), r.RequestContext,
                r.QueuePairContext, r.BytesTransferred);
  return text;
}

ND2_RESULT NextCompletion(IND2CompletionQueue* cq, const char* what, int ms) {
  Deadline deadline(ms);
  unsigned spins = 0;
  ND2_RESULT result{};
  for (;;) {
    if (cq->GetResults(&result, 1) == 1) return result;
    if (deadline.Expired())
      IT_FAIL(std::string("no completion for ") + what + " within " + std::to_string(ms) + " ms");
    Pause(spins);
  }
}

ND2_RESULT ExpectCompletion(IND2CompletionQueue* cq, const Expected& e, const char* what, int ms) {
  ND2_RESULT r = NextCompletion(cq, what, ms);
  bool ok = r.Status == e.status && r.RequestType == e.type &&
            (e.requestContext == nullptr || r.RequestContext == e.requestContext) &&
            (e.qpContext == nullptr || r.QueuePairContext == e.qpContext) &&
            (e.bytes < 0 || int64_t(r.BytesTransferred) == e.bytes);
  if (!ok) {
    char expected[200];
    std::snprintf(expected, sizeof expected, "{%s, type %s, request %p, qp %p, bytes %lld}",
                  StatusName(e.status).c_str(), TypeName(e.type), e.requestContext, e.qpContext,
                  (long long)e.bytes);
    IT_FAIL(std::string(what) + ": completion " + Describe(r) + ", expected " + expected);
  }
  return r;
}

void ExpectNoCompletion(IND2CompletionQueue* cq, const char* what, int ms) {
  Deadline deadline(ms);
  unsigned spins = 0;
  ND2_RESULT result{};
  while (!deadline.Expired()) {
    if (cq->GetResults(&result, 1) == 1)
      IT_FAIL(std::string(what) + ": unexpected completion " + Describe(result));
    Pause(spins);
  }
}

// ---- connections --------------------------------------------------------------------------------

Endpoint::Endpoint(Adapter& adapter, void* qpContext, const Shape& shape)
    : adapter(adapter), qpContext(qpContext), cq(adapter.CreateCq(shape.cqDepth)) {
  if (shape.separateCqs) ownReceiveCq = adapter.CreateCq(shape.cqDepth);
  receiveCq = shape.separateCqs ? ownReceiveCq.get() : cq.get();
  IT_OK(adapter->CreateQueuePair(IID_IND2QueuePair, receiveCq, cq.get(), qpContext, shape.depth,
                                 shape.depth, shape.sge, shape.sge, shape.inlineSize, qp.Out()));
}

uint16_t StartListening(Adapter& adapter, Ref<IND2Listener>& listener) {
  listener = adapter.CreateListener();
  sockaddr_in any = Loopback(0);
  IT_OK(listener->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));
  IT_OK(listener->Listen(0));
  sockaddr_in bound{};
  ULONG length = sizeof bound;
  IT_OK(listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&bound), &length));
  IT_CHECK_EQ(ULONG(sizeof(sockaddr_in)), length);
  IT_CHECK(PortOf(bound) != 0);
  return PortOf(bound);
}

Ref<IND2Connector> GetConnectionRequest(Adapter& adapter, IND2Listener* listener) {
  Ref<IND2Connector> connector = adapter.CreateConnector();
  Ov ov;
  HRESULT hr = listener->GetConnectionRequest(connector.get(), ov.Prepare(listener));
  IT_OK(ov.Finish(hr, "IND2Listener::GetConnectionRequest"));
  return connector;
}

HRESULT Accept(IND2Connector* connector, IND2QueuePair* qp, ULONG inbound, ULONG outbound,
               const void* data, ULONG length) {
  Ov ov;
  HRESULT hr = connector->Accept(qp, inbound, outbound, data, length, ov.Prepare(connector));
  return ov.Finish(hr, "IND2Connector::Accept");
}

HRESULT Connect(IND2Connector* connector, IND2QueuePair* qp, uint16_t port, ULONG inbound,
                ULONG outbound, const void* data, ULONG length) {
  sockaddr_in local = Loopback(0);
  IT_OK(connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
  sockaddr_in server = Loopback(port);
  Ov ov;
  HRESULT hr = connector->Connect(qp, reinterpret_cast<sockaddr*>(&server), sizeof server, inbound,
                                  outbound, data, length, ov.Prepare(connector));
  return ov.Finish(hr, "IND2Connector::Connect");
}

void CompleteConnect(IND2Connector* connector) {
  Ov ov;
  HRESULT hr = connector->CompleteConnect(ov.Prepare(connector));
  IT_OK(ov.Finish(hr, "IND2Connector::CompleteConnect"));
}

HRESULT Disconnect(IND2Connector* connector) {
  Ov ov;
  HRESULT hr = connector->Disconnect(ov.Prepare(connector));
  return ov.Finish(hr, "IND2Connector::Disconnect");
}

void Serve(Channel& channel, Endpoint& server, ULONG inbound, ULONG outbound) {
  uint16_t port = StartListening(server.adapter, server.listener);
  channel.SendValue("port", port);
  server.connector = GetConnectionRequest(server.adapter, server.listener.get());
  IT_OK(Accept(server.connector.get(), server.qp.get(), inbound, outbound));
  channel.Send("accepted");
}

void ConnectTo(Channel& channel, Endpoint& client, ULONG inbound, ULONG outbound) {
  uint16_t port = uint16_t(channel.ReceiveValue("port"));
  client.connector = client.adapter.CreateConnector();
  IT_OK(Connect(client.connector.get(), client.qp.get(), port, inbound, outbound));
  CompleteConnect(client.connector.get());
  channel.Expect("accepted");
}

void ClientTeardown(Channel& channel, Endpoint& client) {
  IT_OK(Disconnect(client.connector.get()));
  channel.Send("client disconnected");
}

void ServerTeardown(Channel& channel, Endpoint& server) {
  channel.Expect("client disconnected");
  IT_OK(Disconnect(server.connector.get()));
}

void SendRemoteBuffer(Endpoint& e, const RemoteBuffer& buffer, void* context, bool peer_may_end_first) {
  RemoteBuffer message = buffer;
  Mr mr(e.adapter, &message, sizeof message, kSourceFlags);
  ND2_SGE sge = {&message, ULONG(sizeof message), mr.token()};
  IT_OK(e.qp->Send(context, &sge, 1, 0));
  ND2_RESULT r = NextCompletion(e.cq.get(), "send of the buffer description", kWaitMs);
  // A Send completes when the peer confirms it was placed. A peer that acts on the message at
  // once and ends the connection (an access violation) may do so before that confirmation: the
  // Send is then flushed with the rest, as any request outstanding when a connection ends.
  bool ok = r.Status == ND_SUCCESS || (peer_may_end_first && r.Status == ND_CANCELED);
  if (!ok || r.RequestType != Nd2RequestTypeSend || r.RequestContext != context)
    IT_FAIL("send of the buffer description: completion " + Describe(r));
}

RemoteBuffer ReceiveRemoteBuffer(Endpoint& e, const uint8_t* inbox, void* context) {
  ExpectCompletion(e.receiveCq, {ND_SUCCESS, Nd2RequestTypeReceive, context, e.qpContext,
                                 int64_t(sizeof(RemoteBuffer))},
                   "receive of the buffer description");
  RemoteBuffer buffer;
  std::memcpy(&buffer, inbox, sizeof buffer);
  return buffer;
}

// ---- buffers ------------------------------------------------------------------------------------

bool TransportIsRoce() {
  const char* value = std::getenv("NDWV_TRANSPORTS");
  return value && std::string(value).rfind("roce", 0) == 0;
}

bool SendsConfirmed() {
  const char* confirm = std::getenv("NDWV_IWARP_CONFIRM");
  return TransportIsRoce() || (confirm && std::string(confirm) == "all");
}

void FillPattern(uint8_t* data, size_t length, uint64_t seed) {
  for (size_t i = 0; i < length; ++i) data[i] = PatternByte(seed, i);
}

void CheckPlacedByPeer(const std::function<void()>& check) { check(); }

void CheckPattern(const uint8_t* data, size_t length, uint64_t seed, const char* what) {
  for (size_t i = 0; i < length; ++i) {
    if (data[i] != PatternByte(seed, i)) {
      size_t bad = 0;
      for (size_t j = i; j < length; ++j) bad += data[j] != PatternByte(seed, j);
      IT_FAIL(std::string(what) + ": " + std::to_string(bad) + " of " + std::to_string(length) +
              " bytes differ, the first at offset " + std::to_string(i) + " (got " +
              std::to_string(data[i]) + ", expected " + std::to_string(PatternByte(seed, i)) + ")");
    }
  }
}

void CheckFilled(const uint8_t* data, size_t length, uint8_t value, const char* what) {
  for (size_t i = 0; i < length; ++i)
    if (data[i] != value)
      IT_FAIL(std::string(what) + ": byte at offset " + std::to_string(i) + " is " +
              std::to_string(data[i]) + ", expected untouched " + std::to_string(value));
}

Layout MakeLayout(size_t total, size_t start, int pieces, size_t gap, int variant) {
  Layout layout;
  size_t count = std::min<size_t>(size_t(pieces), total);
  // Uneven weights 1, 3, 5, ... rotated by the variant; every piece gets at least one byte.
  std::vector<size_t> weights;
  size_t sum = 0;
  for (size_t k = 0; k < count; ++k) {
    weights.push_back(((k + size_t(variant)) % count) * 2 + 1);
    sum += weights.back();
  }
  size_t spread = total - count, used = 0, at = start;
  for (size_t k = 0; k < count; ++k) {
    size_t length = 1 + (k + 1 == count ? spread - used : spread * weights[k] / sum);
    used += length - 1;
    layout.offsets.push_back(at);
    layout.lengths.push_back(length);
    at += length + gap;
  }
  layout.end = count ? layout.offsets.back() + layout.lengths.back() : start;
  return layout;
}

ULONG BuildSges(ND2_SGE* sges, const Layout& layout, uint8_t* buffer, UINT32 token) {
  for (ULONG i = 0; i < layout.count(); ++i)
    sges[i] = {buffer + layout.offsets[i], ULONG(layout.lengths[i]), token};
  return layout.count();
}

std::vector<uint8_t> Gather(const Layout& layout, const uint8_t* buffer) {
  std::vector<uint8_t> out;
  for (ULONG i = 0; i < layout.count(); ++i)
    out.insert(out.end(), buffer + layout.offsets[i],
               buffer + layout.offsets[i] + layout.lengths[i]);
  return out;
}

void ScatterPattern(const Layout& layout, uint8_t* buffer, uint64_t seed) {
  uint64_t index = 0;
  for (ULONG i = 0; i < layout.count(); ++i)
    for (size_t k = 0; k < layout.lengths[i]; ++k)
      buffer[layout.offsets[i] + k] = PatternByte(seed, index++);
}

void CheckReceived(const Layout& layout, const uint8_t* buffer, size_t received, uint64_t seed,
                   uint8_t fill, const char* what) {
  std::vector<uint8_t> data = Gather(layout, buffer);
  IT_CHECK_MSG(received <= data.size(), what);
  CheckPattern(data.data(), received, seed, what);
  CheckFilled(data.data() + received, data.size() - received, fill,
              (std::string(what) + " (receive capacity beyond the message)").c_str());
  for (ULONG i = 0; i + 1 < layout.count(); ++i) {
    size_t gapStart = layout.offsets[i] + layout.lengths[i];
    CheckFilled(buffer + gapStart, layout.offsets[i + 1] - gapStart, fill,
                (std::string(what) + " (gap between SGEs)").c_str());
  }
}

uint64_t AdapterCounter(const char* name, const char* transport) {
  std::vector<ndwv_counter_row> rows(ndwv_counters_snapshot(nullptr, 0) + 8);
  rows.resize(ndwv_counters_snapshot(rows.data(), rows.size()));
  for (const ndwv_counter_row& row : rows)
    if (row.qpn == 0 && std::strcmp(row.transport, transport) == 0) return ndwv_counter_value(&row, name);
  IT_FAIL(std::string("no ") + transport + " adapter row in the counters");
}

}  // namespace ndit

// ---- main ---------------------------------------------------------------------------------------

namespace {

// NdStartup once for the test process.
class NdEnvironment : public ::testing::Environment {
 public:
  void SetUp() override { ASSERT_EQ(NdStartup(), ND_SUCCESS); }
  void TearDown() override { EXPECT_EQ(NdCleanup(), ND_SUCCESS); }
};

// Bounds every test: a hang anywhere ends the process with a message instead of blocking ctest.
class Watchdog : public ::testing::EmptyTestEventListener {
  void OnTestStart(const ::testing::TestInfo&) override { alarm(ndit::kTestBudgetSeconds); }
  void OnTestEnd(const ::testing::TestInfo&) override { alarm(0); }
};

}  // namespace

int main(int argc, char** argv) {
  // iWARP's dead-peer budget here is 5 s, not the default 10 s (meant for thousands of
  // connections: src/dev/iwarp/endpoint.cpp, KeepaliveIdleSeconds): the fault tests wait for it
  // within the bound of a single wait (kWaitMs). Set before the library reads its settings, and
  // inherited by the peers; a value in the environment wins.
  setenv("NDWV_IWARP_TIMEOUT_MS", "5000", 0);
  // The library's info lines (a connection that timed out, and what its side had received) go
  // with a failing test's output, the peer's too: a failure seen once in CI then says more than
  // its status. A passing run of the whole binary writes a few dozen.
  setenv("NDWV_LOG_LEVEL", "info", 0);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--peer=", 7) == 0) ndit::PeerMain(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  signal(SIGALRM, ndit::OnAlarm);
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new NdEnvironment);
  ::testing::UnitTest::GetInstance()->listeners().Append(new Watchdog);
  return RUN_ALL_TESTS();
}
