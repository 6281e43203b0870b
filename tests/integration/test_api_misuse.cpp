// Misuse of the API that needs no peer: limits beyond the adapter's, requests on objects that are
// not connected, degenerate registrations, a second Bind or Listen.
#include <sys/mman.h>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

TEST(IntegrationApiMisuse, CreateQueuePairBeyondTheAdapterLimits) {
  RunLocal([] {
    Adapter adapter;
    const ND2_ADAPTER_INFO& info = adapter.info();
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(64);
    auto create = [&](ULONG rq, ULONG iq, ULONG rsge, ULONG isge, ULONG inlineSize) {
      Ref<IND2QueuePair> qp;
      HRESULT hr = adapter->CreateQueuePair(IID_IND2QueuePair, cq.get(), cq.get(), nullptr, rq, iq,
                                            rsge, isge, inlineSize, qp.Out());
      IT_CHECK_EQ(SUCCEEDED(hr), bool(qp));
      return hr;
    };
    IT_CHECK_HR(ND_INVALID_PARAMETER_5, create(info.MaxReceiveQueueDepth + 1, 1, 1, 1, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_6, create(1, info.MaxInitiatorQueueDepth + 1, 1, 1, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_7, create(1, 1, info.MaxReceiveSge + 1, 1, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_8, create(1, 1, 1, info.MaxInitiatorSge + 1, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_9, create(1, 1, 1, 1, info.MaxInlineDataSize + 1));
    // Exactly the maxima is fine.
    IT_OK(create(info.MaxReceiveQueueDepth, info.MaxInitiatorQueueDepth, info.MaxReceiveSge,
                 info.MaxInitiatorSge, info.MaxInlineDataSize));
    // A CQ from nowhere is argument 2 or 3.
    Ref<IND2QueuePair> qp;
    IT_CHECK_HR(ND_INVALID_PARAMETER_2,
                adapter->CreateQueuePair(IID_IND2QueuePair, nullptr, cq.get(), nullptr, 1, 1, 1, 1,
                                         0, qp.Out()));
    IT_CHECK_HR(ND_INVALID_PARAMETER_3,
                adapter->CreateQueuePair(IID_IND2QueuePair, cq.get(), nullptr, nullptr, 1, 1, 1, 1,
                                         0, qp.Out()));
  });
}

TEST(IntegrationApiMisuse, CreateCompletionQueueDepth) {
  RunLocal([] {
    Adapter adapter;
    ULONG max = adapter.info().MaxCompletionQueueDepth;
    Ref<IND2CompletionQueue> cq;
    IT_CHECK_HR(ND_INVALID_PARAMETER_3,
                adapter->CreateCompletionQueue(IID_IND2CompletionQueue, adapter.file(), max + 1, 0,
                                               0, cq.Out()));
    IT_CHECK_HR(ND_INVALID_PARAMETER_3,
                adapter->CreateCompletionQueue(IID_IND2CompletionQueue, adapter.file(), 0, 0, 0,
                                               cq.Out()));
    IT_OK(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, adapter.file(), max, 0, 0,
                                         cq.Out()));  // exactly the maximum, as the tools do
  });
}

TEST(IntegrationApiMisuse, RequestsOnAnUnconnectedQueuePair) {
  RunLocal([] {
    Adapter adapter;
    std::vector<uint8_t> buffer(256);
    Mr mr(adapter, buffer.data(), buffer.size(), kReadSinkFlags);
    Endpoint e(adapter, Ctx(0x0C));
    ND2_SGE sge = {buffer.data(), 64, mr.token()};
    IT_CHECK_HR(ND_CONNECTION_INVALID, e.qp->Send(Ctx(1), &sge, 1, 0));
    IT_CHECK_HR(ND_CONNECTION_INVALID, e.qp->Send(Ctx(2), nullptr, 0, 0));
    IT_CHECK_HR(ND_CONNECTION_INVALID,
                e.qp->Write(Ctx(3), &sge, 1, reinterpret_cast<uint64_t>(buffer.data()), 1, 0));
    IT_CHECK_HR(ND_CONNECTION_INVALID,
                e.qp->Read(Ctx(4), &sge, 1, reinterpret_cast<uint64_t>(buffer.data()), 1, 0));
    ExpectNoCompletion(e.cq.get(), "refused posts", 20);
    // Receives may be posted before connecting; Flush cancels them at once.
    IT_OK(e.qp->Receive(Ctx(5), &sge, 1));
    IT_OK(e.qp->Receive(Ctx(6), nullptr, 0));
    IT_OK(e.qp->Flush());
    ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(5), Ctx(0x0C), -1},
                     "flushed receive");
    ExpectCompletion(e.cq.get(), {ND_CANCELED, Nd2RequestTypeReceive, Ctx(6), Ctx(0x0C), -1},
                     "flushed receive");
    ExpectNoCompletion(e.cq.get(), "after the flush", 20);
    // A connector that never connected has nothing to report or tear down.
    Ref<IND2Connector> connector = adapter.CreateConnector();
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->GetReadLimits(nullptr, nullptr));
    Ov ov;
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->Disconnect(ov.Prepare(connector.get())));
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->NotifyDisconnect(ov.Prepare(connector.get())));
    IT_CHECK_HR(ND_CONNECTION_INVALID, connector->CompleteConnect(ov.Prepare(connector.get())));
  });
}

TEST(IntegrationApiMisuse, DegenerateRegistrations) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2MemoryRegion> mr = adapter.CreateMr();
    // Either at once or as the request's final status.
    Ov ov;
    HRESULT hr = mr->Register(nullptr, 0, kSinkFlags, ov.Prepare(mr.get()));
    IT_CHECK_HR(ND_INVALID_PARAMETER, ov.Finish(hr, "Register(NULL, 0)"));
    uint8_t byte = 0;
    hr = mr->Register(&byte, 0, kSinkFlags, ov.Prepare(mr.get()));
    IT_CHECK_HR(ND_INVALID_BUFFER_SIZE, ov.Finish(hr, "Register(p, 0)"));
    // Memory not mapped: refused at once, no completion follows (nd2-spi: an error means the
    // request never started).
    void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    IT_CHECK(page != MAP_FAILED);
    munmap(page, 4096);
    OVERLAPPED unmapped{};
    IT_CHECK_HR(ND_ACCESS_VIOLATION, mr->Register(page, 4096, kSinkFlags, &unmapped));
    // The MR object is still usable.
    hr = mr->Register(&byte, 1, kSinkFlags, ov.Prepare(mr.get()));
    IT_OK(ov.Finish(hr, "Register(p, 1)"));
    hr = mr->Deregister(ov.Prepare(mr.get()));
    IT_OK(ov.Finish(hr, "Deregister"));
  });
}

TEST(IntegrationApiMisuse, SecondBindAndSecondListen) {
  RunLocal([] {
    Adapter adapter;
    sockaddr_in any = Loopback(0);
    Ref<IND2Connector> connector = adapter.CreateConnector();
    IT_OK(connector->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));
    IT_CHECK_HR(STATUS_ADDRESS_ALREADY_ASSOCIATED,
                connector->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));

    Ref<IND2Listener> listener = adapter.CreateListener();
    sockaddr_in address{};
    ULONG size = sizeof address;
    IT_OK(listener->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));
    IT_CHECK_HR(ND_INVALID_DEVICE_STATE,
                listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&address), &size));
    IT_CHECK_HR(STATUS_ADDRESS_ALREADY_ASSOCIATED,
                listener->Bind(reinterpret_cast<sockaddr*>(&any), sizeof any));
    IT_OK(listener->Listen(0));
    HRESULT again = listener->Listen(0);
    IT_CHECK_MSG(FAILED(again), "a second Listen returned " + StatusName(again));

    // Another listener on the same address and port: the port is taken.
    size = sizeof address;
    IT_OK(listener->GetLocalAddress(reinterpret_cast<sockaddr*>(&address), &size));
    Ref<IND2Listener> other = adapter.CreateListener();
    IT_CHECK_HR(ND_SHARING_VIOLATION,
                other->Bind(reinterpret_cast<sockaddr*>(&address), sizeof address));
  });
}

TEST(IntegrationApiMisuse, ConnectToTheUnspecifiedAddress) {
  RunLocal([] {
    Adapter adapter;
    Endpoint e(adapter, Ctx(0x0C));
    Ref<IND2Connector> connector = adapter.CreateConnector();
    sockaddr_in local = Loopback(0);
    IT_OK(connector->Bind(reinterpret_cast<sockaddr*>(&local), sizeof local));
    sockaddr_in nowhere = Loopback(4791);
    nowhere.sin_addr.s_addr = htonl(INADDR_ANY);
    Ov ov;
    HRESULT hr = connector->Connect(e.qp.get(), reinterpret_cast<sockaddr*>(&nowhere),
                                    sizeof nowhere, 0, 0, nullptr, 0, ov.Prepare(connector.get()));
    IT_CHECK_HR(STATUS_BAD_NETWORK_NAME, ov.Finish(hr, "Connect to 0.0.0.0"));
  });
}

}  // namespace
}  // namespace ndit
