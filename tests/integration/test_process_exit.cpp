// A program that calls exit() while other threads of it still call into ndwv (Microsoft's ndconn
// does, from a completion thread, with its other threads busy connecting). exit() runs the
// static destructors and the atexit handlers before the process ends, and meanwhile those threads,
// and ndwv's own, go on: nothing of the library may have been destroyed under them.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
constexpr int kWritesInFlight = 4;  // per connection
constexpr ULONG kWrite = 4096;      // each connection writes its own kWrite bytes of the target

// Keeps kWritesInFlight RDMA Writes posted on every connection and reaps their completions,
// counting the successful ones, until the process ends (Writes: a receiver that falls behind
// stops nothing, where Sends on iWARP would outrun its receives). Nothing else is checked: while
// the process exits only surviving is.
void WriteForever(std::vector<std::unique_ptr<Endpoint>>* connections, uint8_t* data, UINT32 token,
                  uint64_t target, UINT32 targetToken, std::atomic<uint64_t>* written) {
  std::vector<int> inFlight(connections->size(), 0);
  for (;;) {
    for (size_t i = 0; i < connections->size(); ++i) {
      Endpoint& e = *(*connections)[i];
      ND2_RESULT r;
      while (e.cq->GetResults(&r, 1) == 1) {
        --inFlight[i];
        if (r.Status == ND_SUCCESS) written->fetch_add(1);
      }
      ND2_SGE sge = {data, kWrite, token};
      for (; inFlight[i] < kWritesInFlight && SUCCEEDED(e.qp->Write(nullptr, &sge, 1, target + i * kWrite, targetToken, 0));
           ++inFlight[i]) {}
    }
  }
}

// Connects kBusyConnections times, writes on all of them from a thread, and exits (as ndconn's
// server does, from main) while that thread and the library's are busy with them; the exit
// report of the counters is written meanwhile.
IT_PEER(exits_with_connections_busy) {
  // Locals: std::exit does not unwind, so they stay while the writing thread uses them.
  Adapter adapter;
  const uint16_t port = uint16_t(parent.ReceiveValue("port"));
  const uint64_t target = parent.ReceiveValue("target");
  const UINT32 targetToken = UINT32(parent.ReceiveValue("token"));
  uint8_t data[kWrite];
  FillPattern(data, sizeof data, 7);
  Mr mr(adapter, data, sizeof data, kSourceFlags);
  std::vector<std::unique_ptr<Endpoint>> connections;
  for (int i = 0; i < kBusyConnections; ++i) {
    connections.push_back(std::make_unique<Endpoint>(adapter, Ctx(0xC0 + i), Shape{.depth = kWritesInFlight}));
    Endpoint& e = *connections.back();
    e.connector = adapter.CreateConnector();
    IT_OK(Connect(e.connector.get(), e.qp.get(), port, 0, 0));
    CompleteConnect(e.connector.get());
  }
  std::atomic<uint64_t> written{0};
  std::thread(WriteForever, &connections, data, mr.token(), target, targetToken, &written).detach();
  unsigned spins = 0;
  for (Deadline deadline; written.load() < uint64_t(kBusyConnections) * kWritesInFlight; Pause(spins))
    IT_CHECK_MSG(!deadline.Expired(), "Writes on the connections before the exit");
  parent.Send("busy");
  parent.Expect("exit");
  std::fflush(nullptr);
  std::exit(0);
}

// A process that exits with connections busy (RDMA Writes in flight from another thread, the
// engine placing and acknowledging them) exits cleanly, and each of its connections ends at its
// peer: NotifyDisconnect completes, and Disconnect afterwards succeeds. (On RoCE the exit tells
// the peer, Port::CloseAllAtExit; on iWARP the kernel closes the sockets.) The data is not
// checked: a Write cut by the exit may be placed in part.
TEST(ProcessExit, AProcessExitingWithConnectionsBusyEndsEachAtItsPeer) {
  RunWithPeer("exits_with_connections_busy", {{"env:NDWV_COUNTERS", "exit"}, {"env:NDWV_COUNTERS_FILE", "/dev/null"}},
              [](Channel& peer) {
    Adapter adapter;
    std::vector<uint8_t> target(size_t(kBusyConnections) * kWrite);
    Mr targetMr(adapter, target.data(), target.size(), kTargetFlags);
    Ref<IND2Listener> listener;
    peer.SendValue("port", StartListening(adapter, listener));
    peer.SendValue("target", reinterpret_cast<uint64_t>(target.data()));
    peer.SendValue("token", targetMr.remoteToken());
    std::vector<std::unique_ptr<Endpoint>> connections;
    std::vector<std::unique_ptr<Ov>> ended;  // after connections: each Ov goes before its connector
    std::vector<HRESULT> notifyIssued;
    for (int i = 0; i < kBusyConnections; ++i) {
      connections.push_back(std::make_unique<Endpoint>(adapter, Ctx(0x5E0 + i), Shape{.depth = 1}));
      Endpoint& e = *connections.back();
      e.connector = GetConnectionRequest(adapter, listener.get());
      IT_OK(Accept(e.connector.get(), e.qp.get(), 0, 0));
      ended.push_back(std::make_unique<Ov>());
      notifyIssued.push_back(e.connector->NotifyDisconnect(ended.back()->Prepare(e.connector.get())));
      IT_CHECK_HR(ND_PENDING, notifyIssued.back());
    }
    peer.Expect("busy");
    peer.Send("exit");
    for (int i = 0; i < kBusyConnections; ++i) {
      IT_OK(ended[i]->Finish(notifyIssued[i], "NotifyDisconnect after the peer's exit"));
      IT_OK(Disconnect(connections[i]->connector.get()));
    }
  });
}

}  // namespace
}  // namespace ndit
