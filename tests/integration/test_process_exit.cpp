// A program that calls exit() while other threads of it still call into ndwv (Microsoft's ndconn
// does, from a completion thread, with its other threads busy connecting). exit() runs the
// static destructors and the atexit handlers before the process ends, and meanwhile those threads,
// and ndwv's own, go on: nothing of the library may have been destroyed under them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

// Calls into the library in a loop (objects made and released, the address list) until the
// process ends; nothing it gets back is checked: during exit only surviving is.
void CallInForever(IND2Adapter* adapter, HANDLE file, std::atomic<bool>* started) {
  for (;;) {
    IND2Connector* connector = nullptr;
    if (SUCCEEDED(adapter->CreateConnector(IID_IND2Connector, file, reinterpret_cast<void**>(&connector))))
      connector->Release();
    IND2CompletionQueue* cq = nullptr;
    if (SUCCEEDED(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 16, 0, 0,
                                                 reinterpret_cast<void**>(&cq))))
      cq->Release();
    char addresses[1024];
    SIZE_T size = sizeof addresses;
    (void)NdQueryAddressList(0, reinterpret_cast<SOCKET_ADDRESS_LIST*>(addresses), &size);
    started->store(true);
  }
}

// Exits with a thread calling in. The exit report of the counters (NDWV_COUNTERS=exit) goes to
// a FIFO that the test opens only a while later: the exit stops there, after the static
// destructors ran (the report's handler is registered when the devices are first listed, so
// it runs after theirs), for as long as the test holds it.
IT_PEER(exits_while_a_thread_calls_in) {
  Adapter adapter;
  std::atomic<bool> started{false};
  std::thread(CallInForever, adapter.get(), adapter.file(), &started).detach();
  Deadline deadline;
  while (!started.load()) IT_CHECK_MSG(!deadline.Expired(), "the calling thread's first round");
  parent.Send("exiting");
  std::fflush(nullptr);
  std::exit(0);
}

TEST(ProcessExit, ThreadsStillCallingInWhileTheProcessExitsFindTheLibraryWhole) {
  char dir[] = "/tmp/ndwv-exit-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/counters";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string report;
  RunWithPeer("exits_while_a_thread_calls_in",
              {{"env:NDWV_COUNTERS", "exit"}, {"env:NDWV_COUNTERS_FILE", fifo}},
              [&](Channel& peer) {
    peer.Expect("exiting");
    usleep(300 * 1000);  // the exit waits in the report's open, the thread calls in meanwhile
    int fd = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    IT_CHECK(fd >= 0);
    // Until the report's writer closes the FIFO (end of file: a read of 0 once it was read
    // from; before the writer opens it a read is 0 too), within a bound. A peer that crashed
    // fails the test at once (Pause).
    Deadline deadline;
    unsigned spins = 0;
    for (bool written = false;;) {
      IT_CHECK_MSG(!deadline.Expired(), "the end of the exit report");
      char buffer[4096];
      ssize_t n = read(fd, buffer, sizeof buffer);
      if (n > 0) {
        report.append(buffer, size_t(n));
        written = true;
      } else if (n == 0 && written) {
        break;
      } else {
        Pause(spins);
      }
    }
    close(fd);
  });
  unlink(fifo.c_str());
  rmdir(dir);
  // The exit went on to its end (the peer exited 0, checked by RunWithPeer) and wrote its report.
  EXPECT_NE(report.find("ndwv counters"), std::string::npos) << report;
}

// ---- exiting with connections busy --------------------------------------------------------------

constexpr int kBusyConnections = 16;
constexpr int kSendsInFlight = 4;  // per connection; the receiver keeps 4 times as many posted
constexpr ULONG kMessage = 64;

// Keeps kSendsInFlight Sends posted on every connection and reaps their completions, until the
// process ends. Nothing it gets back is checked (while the process exits only surviving is); the
// receiver checks what arrives.
void SendForever(std::vector<std::unique_ptr<Endpoint>>* connections, const uint8_t* message, UINT32 token) {
  std::vector<int> inFlight(connections->size(), 0);
  for (;;) {
    for (size_t i = 0; i < connections->size(); ++i) {
      Endpoint& e = *(*connections)[i];
      ND2_RESULT results[kSendsInFlight];
      inFlight[i] -= int(e.cq->GetResults(results, kSendsInFlight));
      for (; inFlight[i] < kSendsInFlight; ++inFlight[i]) {
        ND2_SGE sge = {const_cast<uint8_t*>(message), kMessage, token};
        if (FAILED(e.qp->Send(nullptr, &sge, 1, 0))) break;
      }
    }
  }
}

// Connects kBusyConnections times, sends on all of them from a thread, and exits (as ndconn's
// server does, from main) while that thread and the library's are busy with them; the exit
// report of the counters is written meanwhile.
IT_PEER(exits_with_connections_busy) {
  // Locals: std::exit does not unwind, so they stay while the sending thread uses them.
  Adapter adapter;
  const uint16_t port = uint16_t(parent.ReceiveValue("port"));
  uint8_t message[kMessage];
  FillPattern(message, sizeof message, 7);
  Mr mr(adapter, message, sizeof message, kSourceFlags);
  std::vector<std::unique_ptr<Endpoint>> connections;
  for (int i = 0; i < kBusyConnections; ++i) {
    auto e = std::make_unique<Endpoint>(adapter, Ctx(0xC0 + i), Shape{.depth = 2 * kSendsInFlight});
    e->connector = adapter.CreateConnector();
    IT_OK(Connect(e->connector.get(), e->qp.get(), port, 0, 0));
    CompleteConnect(e->connector.get());
    connections.push_back(std::move(e));
  }
  std::thread(SendForever, &connections, message, mr.token()).detach();
  parent.Expect("exit");
  std::fflush(nullptr);
  std::exit(0);
}

// A process that exits with connections busy (Sends in flight from another thread, the engine
// placing and acknowledging them) exits cleanly, and each of its connections ends at its peer
// at once: NotifyDisconnect completes, every message that arrived is whole, and every receive
// left is flushed. (On RoCE the exit tells the peer, CloseAllAtExit; on iWARP the kernel closes
// the sockets.)
TEST(ProcessExit, AProcessExitingWithConnectionsBusyEndsEachAtItsPeer) {
  RunWithPeer("exits_with_connections_busy", {{"env:NDWV_COUNTERS", "exit"}, {"env:NDWV_COUNTERS_FILE", "/dev/null"}},
              [](Channel& peer) {
    Adapter adapter;
    constexpr int kPosted = 4 * kSendsInFlight;
    std::vector<uint8_t> inbox(size_t(kBusyConnections) * kPosted * kMessage);
    Mr mr(adapter, inbox.data(), inbox.size(), kSinkFlags);
    auto post = [&](Endpoint& e, int connection, int slot) {
      ND2_SGE sge = {inbox.data() + (size_t(connection) * kPosted + slot) * kMessage, kMessage, mr.token()};
      IT_OK(e.qp->Receive(Ctx(uintptr_t(slot)), &sge, 1));
    };
    Ref<IND2Listener> listener;
    peer.SendValue("port", StartListening(adapter, listener));
    std::vector<std::unique_ptr<Endpoint>> connections;
    std::vector<std::unique_ptr<Ov>> ended;
    std::vector<HRESULT> notifyIssued;
    for (int i = 0; i < kBusyConnections; ++i) {
      auto e = std::make_unique<Endpoint>(adapter, Ctx(0x5E0 + i), Shape{.depth = kPosted});
      for (int slot = 0; slot < kPosted; ++slot) post(*e, i, slot);
      e->connector = GetConnectionRequest(adapter, listener.get());
      IT_OK(Accept(e->connector.get(), e->qp.get(), 0, 0));
      ended.push_back(std::make_unique<Ov>());
      notifyIssued.push_back(e->connector->NotifyDisconnect(ended.back()->Prepare(e->connector.get())));
      IT_CHECK_HR(ND_PENDING, notifyIssued.back());
      connections.push_back(std::move(e));
    }
    // Reaps and reposts receives, counting the messages of each connection; each must be whole.
    std::vector<uint64_t> arrived(kBusyConnections, 0);
    auto reap = [&](bool repost) {
      for (int i = 0; i < kBusyConnections; ++i) {
        ND2_RESULT r;
        while (connections[i]->cq->GetResults(&r, 1) == 1) {
          if (r.Status == ND_CANCELED) continue;
          IT_CHECK_MSG(r.Status == ND_SUCCESS && r.BytesTransferred == kMessage, "a receive: " + Describe(r));
          const int slot = int(reinterpret_cast<uintptr_t>(r.RequestContext));
          CheckPattern(inbox.data() + (size_t(i) * kPosted + slot) * kMessage, kMessage, 7, "a message");
          ++arrived[i];
          if (repost) post(*connections[i], i, slot);
        }
      }
    };
    for (Deadline deadline; *std::min_element(arrived.begin(), arrived.end()) < uint64_t(kPosted);) {
      IT_CHECK_MSG(!deadline.Expired(), "messages on every connection before the exit");
      reap(true);
    }
    peer.Send("exit");
    std::vector<bool> done(kBusyConnections, false);
    for (Deadline deadline;;) {
      reap(true);
      int left = 0;
      for (int i = 0; i < kBusyConnections; ++i) {
        if (!done[i] && ended[i]->Completed()) {
          IT_OK(ended[i]->Finish(notifyIssued[i], "NotifyDisconnect after the peer's exit"));
          done[i] = true;
        }
        left += !done[i];
      }
      if (left == 0) break;
      IT_CHECK_MSG(!deadline.Expired(), std::to_string(left) + " connections did not end with the peer's exit");
    }
    for (auto& e : connections) IT_OK(Disconnect(e->connector.get()));
    reap(false);  // what arrived last, then the flushed receives
  });
}

}  // namespace
}  // namespace ndit
