// fork() without exec (docs/user-guide.md, "fork"): the child holds none of ndwv's descriptors and
// has no device; the parent's connection, registrations and ports stay its own.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"

using namespace ndit;

namespace {

constexpr size_t kSize = 4096;
constexpr uint8_t kFill = 0xEE;
void* const kServerQp = Ctx(0x5E);
void* const kClientQp = Ctx(0xC1);

// How many of this process's descriptors are sockets.
int CountSockets() {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int sockets = 0;
  while (dirent* entry = readdir(dir)) {
    char path[64], target[64];
    std::snprintf(path, sizeof path, "/proc/self/fd/%s", entry->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n > 0 && std::strncmp(target, "socket:", 7) == 0) ++sockets;
  }
  closedir(dir);
  return sockets;
}

// A child forked from the test process. It looks at what it inherited, reports one line, then
// waits (at most 20 s) for the word to exit, so that anything it holds is held while the parent
// goes on. It leaves with _exit: none of the test's destructors run twice. Killed and reaped if
// the test fails first.
class ForkedChild {
 public:
  explicit ForkedChild(IND2Listener* inherited) {
    IT_CHECK(pipe2(report_, O_CLOEXEC) == 0 && pipe2(release_, O_CLOEXEC) == 0);
    pid_ = fork();
    IT_CHECK(pid_ >= 0);
    if (pid_ == 0) Run(inherited);
    close(report_[1]);
    close(release_[0]);
  }
  ~ForkedChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    close(report_[0]);
    close(release_[1]);
  }

  std::string Report() {
    pollfd p{report_[0], POLLIN, 0};
    IT_CHECK_MSG(poll(&p, 1, kWaitMs) == 1, "the child's report");
    char line[128] = {};
    IT_CHECK(read(report_[0], line, sizeof line - 1) > 0);
    return line;
  }

  // Lets the child exit and checks that it exited 0.
  void Release() {
    IT_CHECK(write(release_[1], "x", 1) == 1);
    int status = 0;
    Deadline deadline;
    unsigned spins = 0;
    pid_t done;
    while ((done = waitpid(pid_, &status, WNOHANG)) == 0 && !deadline.Expired()) Pause(spins);
    IT_CHECK_MSG(done == pid_, "the child did not exit");
    pid_ = -1;
    IT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }

 private:
  [[noreturn]] void Run(IND2Listener* inherited) {
    int sockets = CountSockets();
    SIZE_T size = 0;  // asked with no buffer: ND_SUCCESS and 0 only when no address is served
    HRESULT list = NdQueryAddressList(0, nullptr, &size);
    sockaddr_in loopback = Loopback(0);
    void* adapter = nullptr;
    HRESULT open = NdOpenAdapter(IID_IND2Adapter, reinterpret_cast<sockaddr*>(&loopback),
                                 sizeof loopback, &adapter);
    ULONG left = inherited->Release();  // the parent's object: left alone, must not hang
    char line[128];
    int n = std::snprintf(line, sizeof line, "sockets %d list 0x%08x size %zu open 0x%08x left %u\n",
                          sockets, unsigned(list), size_t(size), unsigned(open),
                          unsigned(left));
    if (write(report_[1], line, size_t(n)) != n) _exit(2);
    pollfd p{release_[0], POLLIN, 0};
    poll(&p, 1, 20000);
    _exit(0);
  }

  int report_[2] = {-1, -1}, release_[2] = {-1, -1};
  pid_t pid_ = -1;
};

// A registered buffer in two halves: receives land in the inbox, sends leave from the outbox.
struct Mailbox {
  explicit Mailbox(Adapter& adapter)
      : bytes(2 * kSize, kFill), mr(adapter, bytes.data(), bytes.size(), kSinkFlags) {}
  ND2_SGE Inbox() { return {bytes.data(), ULONG(kSize), mr.token()}; }
  ND2_SGE Outbox() { return {bytes.data() + kSize, ULONG(kSize), mr.token()}; }
  std::vector<uint8_t> bytes;
  Mr mr;
};

void PostReceive(Endpoint& e, Mailbox& m) {
  ND2_SGE sge = m.Inbox();
  std::memset(sge.Buffer, kFill, kSize);
  IT_OK(e.qp->Receive(Ctx(0x100), &sge, 1));
}

void Send(Endpoint& e, Mailbox& m, uint64_t seed) {
  ND2_SGE sge = m.Outbox();
  FillPattern(static_cast<uint8_t*>(sge.Buffer), kSize, seed);
  IT_OK(e.qp->Send(Ctx(0x200), &sge, 1, 0));
  ExpectCompletion(e.cq.get(), {ND_SUCCESS, Nd2RequestTypeSend, Ctx(0x200), e.qpContext}, "send");
}

void Receive(Endpoint& e, Mailbox& m, uint64_t seed) {
  ExpectCompletion(e.receiveCq,
                   {ND_SUCCESS, Nd2RequestTypeReceive, Ctx(0x100), e.qpContext, int64_t(kSize)},
                   "receive");
  CheckPattern(m.bytes.data(), kSize, seed, "receive");
}

}  // namespace

IT_PEER(fork_client) {
  Adapter adapter;
  Mailbox m(adapter);
  Endpoint client(adapter, kClientQp, {.separateCqs = true});
  ConnectTo(parent, client);
  for (uint64_t seed : {700, 702}) {
    parent.Barrier("round");
    PostReceive(client, m);
    Send(client, m, seed);
    Receive(client, m, seed + 1);
  }
  ClientTeardown(parent, client);
}

// The test process serves; after a first round trip it forks a child that stays alive, without
// exec, until the end. The child must hold no socket, see no device and leave the parent's objects
// alone; the parent's connection goes on byte-exact (its registration is its own), and once it
// is closed the listener's port can be bound again at once (iWARP) or after the IB CM's
// time-wait (RoCE): no copy of a socket in the child keeps it.
TEST(IntegrationFork, AChildWithoutExecHoldsNothingOfTheParents) {
  RunWithPeer("fork_client", [](Channel& peer) {
    Adapter adapter;
    Mailbox m(adapter);
    sockaddr_in local{};
    std::optional<ForkedChild> child;
    {
      Endpoint server(adapter, kServerQp, {.separateCqs = true});
      PostReceive(server, m);
      Serve(peer, server);
      ULONG size = sizeof local;
      IT_OK(server.listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&local), &size));

      peer.Barrier("round");
      Receive(server, m, 700);
      PostReceive(server, m);
      Send(server, m, 701);

      child.emplace(server.listener.get());
      char expected[128];
      std::snprintf(expected, sizeof expected, "sockets 0 list 0x%08x size 0 open 0x%08x left 0\n",
                    unsigned(ND_SUCCESS), unsigned(ND_INVALID_ADDRESS));
      IT_CHECK_EQ(std::string(expected), child->Report());

      peer.Barrier("round");
      Receive(server, m, 702);
      Send(server, m, 703);
      ServerTeardown(peer, server);
    }  // the listener, connector and QP released
    Ref<IND2Listener> again = adapter.CreateListener();
    Deadline deadline;
    unsigned spins = 0;
    HRESULT hr;
    while ((hr = again->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local)) ==
               ND_SHARING_VIOLATION &&
           TransportIsRoce() && !deadline.Expired())
      Pause(spins);
    IT_OK(hr);
    IT_OK(again->Listen(4));
    child->Release();
  });
}
