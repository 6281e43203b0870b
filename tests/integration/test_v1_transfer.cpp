// NetworkDirect version 1 conformance, part 2 (nd1-spi.md §4, "#n"): results, notification,
// posting rules and data transfer between two processes, a version 1 client (this process)
// and a version 1 server (the peer). Every case asserts exact statuses, the ND_RESULT pointers
// given at post time, byte counts and bytes.
#include <endian.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "harness_v1.h"

namespace ndit {
namespace {

// A registered buffer.
struct V1Buffer {
  V1Buffer(V1Adapter& adapter, size_t size, uint8_t fill = 0)
      : bytes(size, fill), mr(adapter, bytes.data(), bytes.size()) {}
  uint8_t* data() { return bytes.data(); }
  ND_SGE Sge(size_t offset, size_t length) { return V1Sge(bytes.data() + offset, length, mr.handle()); }
  std::vector<uint8_t> bytes;
  V1Mr mr;
};

// Binds a window over `length` bytes of `buffer` at `offset` with `flags` and waits for the bind.
ND_MW_DESCRIPTOR BindWindow(V1Side& side, INDMemoryWindow* window, V1Buffer& buffer, size_t offset,
                            size_t length, DWORD flags) {
  ND_RESULT bind;
  ND_MW_DESCRIPTOR descriptor;
  IT_OK(side.endpoint->Bind(&bind, buffer.mr.handle(), window, buffer.data() + offset, length,
                            flags, &descriptor));
  V1ExpectResult(side.cq.get(), &bind, ND_SUCCESS, 0, "Bind");
  return descriptor;
}

Ref<INDMemoryWindow> NewWindow(V1Adapter& adapter, ND_RESULT* invalidated) {
  Ref<INDMemoryWindow> window;
  IT_OK(adapter->CreateMemoryWindow(invalidated, reinterpret_cast<INDMemoryWindow**>(window.Out())));
  return window;
}

// ---- #13, #18: the caller's ND_RESULTs, in order, with their byte counts ---------------------------

// The application's own request context with the ND_RESULT first, as MS-MPI builds them.
struct Request {
  ND_RESULT result;
  int tag;
};

constexpr size_t kResultSizes[] = {0, 1, 300, 70000};

IT_PEER(v1_results_server) {
  V1Adapter adapter;
  V1Buffer out(adapter, 70000);
  V1Buffer in(adapter, 256);
  V1Side server(adapter);
  ND_RESULT receive;  // for the client's Send of two SGEs
  V1Serve(parent, server, [&](V1Side& s) {
    ND_SGE sge = in.Sge(0, 256);
    IT_OK(s.endpoint->Receive(&receive, &sge, 1));
  });
  // Four messages of the sizes the client's receives expect, then its window for the RDMA.
  for (size_t i = 0; i < std::size(kResultSizes); ++i) {
    FillPattern(out.data(), kResultSizes[i], i);
    ND_RESULT send;
    ND_SGE sge = out.Sge(0, kResultSizes[i]);
    IT_OK(server.endpoint->Send(&send, kResultSizes[i] ? &sge : nullptr, kResultSizes[i] ? 1 : 0, 0));
    V1ExpectResult(server.cq.get(), &send, ND_SUCCESS, int64_t(kResultSizes[i]), "server send");
  }
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), out, 0, 4096,
                                    ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE));
  parent.Expect("rdma done");
  V1ExpectResult(server.cq.get(), &receive, ND_SUCCESS, 128, "the client's send of 2 SGEs");
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Results, TheCallersNdResultsInPostingOrderWithTheirByteCounts) {
  RunWithPeer("v1_results_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer in(adapter, 4 * 70000, 0xEE), out(adapter, 8192);
    V1Side client(adapter, {.separateCqs = true});
    ND_RESULT* none = nullptr;
    IT_CHECK_EQ(SIZE_T(0), client.cq->GetResults(&none, 1));  // empty: 0 at once
    IT_CHECK_EQ(SIZE_T(0), client.cq->GetResults(nullptr, 0));
    Request receives[std::size(kResultSizes)];
    V1ConnectTo(peer, client, [&](V1Side& s) {
      for (size_t i = 0; i < std::size(kResultSizes); ++i) {
        receives[i] = {{ND_PENDING, ~SIZE_T(0)}, int(i)};
        ND_SGE sge = in.Sge(i * 70000, 70000);
        IT_OK(s.endpoint->Receive(&receives[i].result, &sge, 1));
      }
    });
    // All arrived: reaped at once, in posting order, each into its own ND_RESULT.
    ND_RESULT* results[8] = {};
    SIZE_T got = 0;
    Deadline deadline;
    unsigned spins = 0;
    while (got < std::size(kResultSizes) && !deadline.Expired()) {
      got += client.inboundCq->GetResults(results + got, 8 - got);
      Pause(spins);
    }
    IT_CHECK_EQ(std::size(kResultSizes), got);
    for (size_t i = 0; i < got; ++i) {
      auto* request = reinterpret_cast<Request*>(results[i]);  // the context it is part of
      IT_CHECK(request == &receives[i] && request->tag == int(i));
      IT_CHECK_HR(ND_SUCCESS, request->result.Status);
      IT_CHECK_EQ(kResultSizes[i], request->result.BytesTransferred);
      CheckPattern(in.data() + i * 70000, kResultSizes[i], i, "message");
    }

    // Outbound: sends, a Read and a Write each report their SGE total; binds and invalidations 0.
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    Request send{{}, 10}, read{{}, 11}, write{{}, 12}, bind{{}, 13}, invalidate{{}, 14};
    ND_SGE two[2] = {out.Sge(0, 100), out.Sge(200, 28)};
    // The Read lands elsewhere: the Write below reads `two` while the Read's data may arrive.
    ND_SGE sink[2] = {out.Sge(1024, 100), out.Sge(1200, 28)};
    ND_RESULT invalidated;
    Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
    ND_MW_DESCRIPTOR mine;
    IT_OK(client.endpoint->Bind(&bind.result, out.mr.handle(), window.get(), out.data(), 512,
                                ND_OP_FLAG_ALLOW_READ, &mine));
    IT_OK(client.endpoint->Send(&send.result, two, 2, 0));
    IT_OK(client.endpoint->Read(&read.result, sink, 2, &remote, 16, 0));
    IT_OK(client.endpoint->Write(&write.result, two, 2, &remote, 1024, 0));
    IT_OK(client.endpoint->Invalidate(&invalidate.result, window.get(), 0));
    V1ExpectResult(client.cq.get(), &bind.result, ND_SUCCESS, 0, "bind");
    V1ExpectResult(client.cq.get(), &send.result, ND_SUCCESS, 128, "send of 2 SGEs");
    V1ExpectResult(client.cq.get(), &read.result, ND_SUCCESS, 128, "read of 2 SGEs");
    V1ExpectResult(client.cq.get(), &write.result, ND_SUCCESS, 128, "write of 2 SGEs");
    V1ExpectResult(client.cq.get(), &invalidate.result, ND_SUCCESS, 0, "invalidate");
    peer.Send("rdma done");
    V1ExpectNoResult(client.cq.get(), "nothing more");
    V1ClientTeardown(peer, client);
  });
}

// ---- #14: Notify ----------------------------------------------------------------------------------

IT_PEER(v1_notify_server) {
  V1Adapter adapter;
  V1Buffer out(adapter, 64);
  V1Side server(adapter);
  V1Serve(parent, server);
  ND_RESULT send;
  ND_SGE sge = out.Sge(0, 8);
  for (const char* step : {"plain", "plain2", "solicited", "last"}) {
    parent.Expect(std::string("send ") + step);
    DWORD flags = std::string(step) == "solicited" ? ND_OP_FLAG_SEND_AND_SOLICIT_EVENT : 0;
    IT_OK(server.endpoint->Send(&send, &sge, 1, flags));
    V1ExpectResult(server.cq.get(), &send, ND_SUCCESS, 8, "send");
  }
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Cq, NotifyAnySolicitedErrorsAndCancel) {
  RunWithPeer("v1_notify_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer in(adapter, 4 * 64);
    V1Side client(adapter);
    ND_RESULT receives[4];
    V1ConnectTo(peer, client, [&](V1Side& s) {
      for (int i = 0; i < 4; ++i) {
        ND_SGE sge = in.Sge(size_t(i) * 64, 64);
        IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
      }
    });
    INDCompletionQueue* cq = client.cq.get();
    // ANY on an empty CQ pends, and fires on the next completion.
    Ov any, solicited, errors;
    HRESULT hrAny = cq->Notify(ND_CQ_NOTIFY_ANY, any.Prepare(cq));
    IT_CHECK_HR(ND_PENDING, hrAny);
    peer.Send("send plain");
    IT_OK(any.Finish(hrAny, "Notify(ANY)"));
    V1ExpectResult(cq, &receives[0], ND_SUCCESS, 8, "plain message");
    // SOLICITED: not for an unflagged message, for a flagged one.
    HRESULT hrSolicited = cq->Notify(ND_CQ_NOTIFY_SOLICITED, solicited.Prepare(cq));
    IT_CHECK_HR(ND_PENDING, hrSolicited);
    peer.Send("send plain2");
    V1ExpectResult(cq, &receives[1], ND_SUCCESS, 8, "second plain message");
    SIZE_T bytes;
    IT_CHECK_HR(ND_PENDING, cq->GetOverlappedResult(solicited.get(), &bytes, FALSE));
    peer.Send("send solicited");
    IT_OK(solicited.Finish(hrSolicited, "Notify(SOLICITED)"));
    V1ExpectResult(cq, &receives[2], ND_SUCCESS, 8, "solicited message");
    // ERRORS: a normal completion later, still pending; a cancel completes it.
    HRESULT hrErrors = cq->Notify(ND_CQ_NOTIFY_ERRORS, errors.Prepare(cq));
    IT_CHECK_HR(ND_PENDING, hrErrors);
    peer.Send("send last");
    V1ExpectResult(cq, &receives[3], ND_SUCCESS, 8, "last message");
    IT_CHECK_HR(ND_PENDING, cq->GetOverlappedResult(errors.get(), &bytes, FALSE));
    IT_OK(cq->CancelOverlappedRequests());
    IT_CHECK_HR(ND_CANCELED, errors.Finish(hrErrors, "Notify(ERRORS) canceled"));
    V1ClientTeardown(peer, client);
  });
}

// ---- #15, #16, #19, #20: posting rules --------------------------------------------------------------

IT_PEER(v1_posting_server) {
  V1Adapter adapter;
  V1Buffer in(adapter, 8 * 256, 0xEE);
  V1Side server(adapter);
  ND_RESULT receives[8];
  V1Serve(parent, server, [&](V1Side& s) {
    IT_OK(s.endpoint->Receive(&receives[0], nullptr, 0));  // for the zero-byte send
    for (int i = 1; i < 8; ++i) {
      ND_SGE sge = in.Sge(size_t(i) * 256, 256);
      IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
    }
  });
  V1ExpectResult(server.cq.get(), &receives[0], ND_SUCCESS, 0, "zero-byte send");
  // Inline sends from memory that was not registered, overwritten as soon as posted.
  V1ExpectResult(server.cq.get(), &receives[1], ND_SUCCESS, 48, "inline send");
  CheckPattern(in.data() + 256, 48, 41, "inline send's bytes");
  V1ExpectResult(server.cq.get(), &receives[2], ND_SUCCESS, int64_t(server.maxInline),
                 "inline send of the endpoint's whole inline room");
  CheckPattern(in.data() + 512, server.maxInline, 42, "largest inline send");
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), in, 1024, 1024,
                                    ND_OP_FLAG_ALLOW_WRITE | ND_OP_FLAG_ALLOW_READ));
  parent.Expect("written");
  CheckPlacedByPeer([&] { CheckPattern(in.data() + 1024 + 8, 32, 43, "inline write's bytes"); });
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Post, ReceivesBeforeTheConnectionLimitsInlineAndZeroBytes) {
  RunWithPeer("v1_posting_server", [](Channel& peer) {
    V1Adapter adapter;
    const ND_ADAPTER_INFO& info = adapter.info();
    V1Buffer buffer(adapter, 4096);
    V1Side client(adapter, {.depth = 1, .sge = 2});
    client.CreateEndpoint();
    INDEndpoint* ep = client.endpoint.get();
    ND_RESULT r[8];
    ND_SGE sge = buffer.Sge(0, 64);
    // #15: a Receive may be posted before the connection; nothing outbound may.
    IT_OK(ep->Receive(&r[0], &sge, 1));
    ND_MW_DESCRIPTOR remote = {0, htobe64(64), 0};
    ND_RESULT invalidated;
    Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
    ND_MW_DESCRIPTOR descriptor;
    IT_CHECK_HR(ND_CONNECTION_INVALID, ep->Send(&r[1], &sge, 1, 0));
    IT_CHECK_HR(ND_CONNECTION_INVALID, ep->Read(&r[1], &sge, 1, &remote, 0, 0));
    IT_CHECK_HR(ND_CONNECTION_INVALID, ep->Write(&r[1], &sge, 1, &remote, 0, 0));
    IT_CHECK_HR(ND_CONNECTION_INVALID, ep->Bind(&r[1], buffer.mr.handle(), window.get(),
                                                buffer.data(), 64, ND_OP_FLAG_ALLOW_READ, &descriptor));
    IT_CHECK_HR(ND_CONNECTION_INVALID, ep->Invalidate(&r[1], window.get(), 0));
    // #16: past the queue depth, too many SGEs, lengths that do not fit.
    IT_CHECK_HR(ND_NO_MORE_ENTRIES, ep->Receive(&r[1], &sge, 1));
    ND_SGE three[3] = {sge, sge, sge};
    IT_CHECK_HR(ND_DATA_OVERRUN, ep->Receive(&r[1], three, 3));
    IT_CHECK_HR(ND_DATA_OVERRUN, ep->Send(&r[1], three, 3, 0));
    IT_CHECK_HR(ND_DATA_OVERRUN, ep->Send(&r[1], three, std::numeric_limits<SIZE_T>::max(), 0));
    ND_SGE huge = V1Sge(buffer.data(), SIZE_T(1) << 32, buffer.mr.handle());
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, ep->Send(&r[1], &huge, 1, 0));
    ND_SGE big[2] = {V1Sge(buffer.data(), info.MaxOutboundLength, buffer.mr.handle()),
                     V1Sge(buffer.data(), 1, buffer.mr.handle())};
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, ep->Send(&r[1], big, 2, 0));
    IT_CHECK_HR(ND_BUFFER_OVERFLOW, ep->Write(&r[1], big, 2, &remote, 0, 0));
    // Argument checks: the ND_RESULT, an SGE list missing, unknown flags, a made-up handle.
    IT_CHECK_HR(ND_INVALID_PARAMETER_1, ep->Receive(nullptr, &sge, 1));
    IT_CHECK_HR(ND_INVALID_PARAMETER_2, ep->Send(&r[1], nullptr, 1, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_4, ep->Send(&r[1], &sge, 1, 0x20));  // INLINE is version 2's
    IT_CHECK_HR(ND_INVALID_PARAMETER_6,
                ep->Read(&r[1], &sge, 1, &remote, 0, ND_OP_FLAG_SEND_AND_SOLICIT_EVENT));
    IT_CHECK_HR(ND_INVALID_PARAMETER_4, ep->Read(&r[1], &sge, 1, nullptr, 0, 0));
    ND_SGE madeUp = V1Sge(buffer.data(), 64, reinterpret_cast<ND_MR_HANDLE>(uintptr_t(0x1234567)));
    IT_CHECK_HR(ND_ACCESS_VIOLATION, ep->Send(&r[1], &madeUp, 1, 0));
    // #19: unregistered bytes beyond the endpoint's inline room, or as a receive's buffer or a
    // Read's sink, are refused at once.
    std::vector<uint8_t> plain(client.maxInline + 1);
    ND_SGE tooLong = V1Sge(plain.data(), plain.size(), nullptr);
    IT_CHECK_HR(ND_ACCESS_VIOLATION, ep->Send(&r[1], &tooLong, 1, 0));
    ND_SGE unregistered = V1Sge(plain.data(), 16, nullptr);
    IT_CHECK_HR(ND_ACCESS_VIOLATION, ep->Read(&r[1], &unregistered, 1, &remote, 0, 0));
    V1ExpectNoResult(client.cq.get(), "refused posts", 50);

    V1ConnectTo(peer, client);
    // #20: a zero-byte Send (no SGE list at all).
    IT_OK(ep->Send(&r[2], nullptr, 0, 0));
    V1ExpectResult(client.cq.get(), &r[2], ND_SUCCESS, 0, "zero-byte send");
    // #19: inline sends from unregistered memory, reused at once.
    uint8_t stack[48];
    FillPattern(stack, sizeof stack, 41);
    ND_SGE inlineSges[2] = {V1Sge(stack, 20, nullptr), V1Sge(stack + 20, 28, nullptr)};
    IT_OK(ep->Send(&r[3], inlineSges, 2, 0));
    std::memset(stack, 0, sizeof stack);
    V1ExpectResult(client.cq.get(), &r[3], ND_SUCCESS, 48, "inline send");
    FillPattern(plain.data(), client.maxInline, 42);
    ND_SGE whole = V1Sge(plain.data(), client.maxInline, nullptr);
    IT_OK(ep->Send(&r[4], &whole, 1, 0));
    std::fill(plain.begin(), plain.end(), 0);
    V1ExpectResult(client.cq.get(), &r[4], ND_SUCCESS, int64_t(client.maxInline), "largest inline send");
    // An inline Write likewise; zero-byte Read and Write need no window at all.
    ND_MW_DESCRIPTOR window1 = ReceiveDescriptor(peer);
    FillPattern(stack, 32, 43);
    ND_SGE inlineWrite = V1Sge(stack, 32, nullptr);
    IT_OK(ep->Write(&r[5], &inlineWrite, 1, &window1, 8, 0));
    std::memset(stack, 0, sizeof stack);
    V1ExpectResult(client.cq.get(), &r[5], ND_SUCCESS, 32, "inline write");
    ND_MW_DESCRIPTOR nothing = {};
    IT_OK(ep->Write(&r[6], nullptr, 0, &nothing, 0, 0));
    V1ExpectResult(client.cq.get(), &r[6], ND_SUCCESS, 0, "zero-byte write");
    IT_OK(ep->Read(&r[7], nullptr, 0, &nothing, 0, 0));
    V1ExpectResult(client.cq.get(), &r[7], ND_SUCCESS, 0, "zero-byte read");
    peer.Send("written");
    V1ClientTeardown(peer, client);
    V1ExpectResult(client.cq.get(), &r[0], ND_CANCELED, 0, "the receive nothing came for");
  });
}

// #16 (outbound): an initiator queue of one request is full while its request runs.
IT_PEER(v1_outbound_full_server) {
  V1Adapter adapter;
  V1Buffer target(adapter, 4 << 20);
  V1Side server(adapter);
  V1Serve(parent, server);
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), target, 0, target.bytes.size(),
                                    ND_OP_FLAG_ALLOW_WRITE));
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Post, AFullInitiatorQueueRefusesThenTakesAgain) {
  RunWithPeer("v1_outbound_full_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer source(adapter, 4 << 20);
    V1Side client(adapter, {.depth = 1});
    V1ConnectTo(peer, client);
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    ND_SGE all = source.Sge(0, source.bytes.size()), one = source.Sge(0, 1);
    // A 4 MiB Write is in flight for a while; the post right behind it finds the queue full
    // (tried a few times, in case the first Write was done by then).
    bool refused = false;
    for (int attempt = 0; attempt < 20 && !refused; ++attempt) {
      ND_RESULT write, next;
      IT_OK(client.endpoint->Write(&write, &all, 1, &remote, 0, 0));
      HRESULT hr = client.endpoint->Write(&next, &one, 1, &remote, 0, 0);
      IT_CHECK_MSG(hr == ND_SUCCESS || hr == ND_NO_MORE_ENTRIES, StatusName(hr));
      refused = hr == ND_NO_MORE_ENTRIES;
      V1ExpectResult(client.cq.get(), &write, ND_SUCCESS, int64_t(all.Length), "4 MiB write");
      if (!refused) V1ExpectResult(client.cq.get(), &next, ND_SUCCESS, 1, "the write behind it");
    }
    IT_CHECK_MSG(refused, "the queue of one was never full");
    ND_RESULT after;
    IT_OK(client.endpoint->Write(&after, &one, 1, &remote, 0, 0));  // usable again
    V1ExpectResult(client.cq.get(), &after, ND_SUCCESS, 1, "a write after the refusal");
    V1ClientTeardown(peer, client);
  });
}

// ---- #17: SILENT_SUCCESS ------------------------------------------------------------------------------

IT_PEER(v1_silent_server) {
  V1Adapter adapter;
  V1Buffer in(adapter, 2 * 64);
  V1Side server(adapter);
  ND_RESULT receives[2];
  V1Serve(parent, server, [&](V1Side& s) {
    for (int i = 0; i < 2; ++i) {
      ND_SGE sge = in.Sge(size_t(i) * 64, 64);
      IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
    }
  });
  V1ExpectResult(server.cq.get(), &receives[0], ND_SUCCESS, 16, "the silent send's message");
  V1ExpectResult(server.cq.get(), &receives[1], ND_SUCCESS, 16, "the signalled send's message");
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), in, 0, 64, ND_OP_FLAG_ALLOW_READ));
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Post, SilentSuccessLeavesOutOnlySuccess) {
  RunWithPeer("v1_silent_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer buffer(adapter, 256);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    ND_RESULT silent = {ND_PENDING, 77}, signalled;
    ND_SGE sge = buffer.Sge(0, 16);
    IT_OK(client.endpoint->Send(&silent, &sge, 1, ND_OP_FLAG_SILENT_SUCCESS));
    IT_OK(client.endpoint->Send(&signalled, &sge, 1, 0));
    V1ExpectResult(client.cq.get(), &signalled, ND_SUCCESS, 16, "the signalled send");
    V1ExpectNoResult(client.cq.get(), "the silent send");
    IT_CHECK(silent.Status == ND_PENDING && silent.BytesTransferred == 77);  // never written
    // A silent request that fails reports: a Write into a read-only window.
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    ND_RESULT write;
    IT_OK(client.endpoint->Write(&write, &sge, 1, &remote, 0, ND_OP_FLAG_SILENT_SUCCESS));
    V1ExpectResult(client.cq.get(), &write, ND_REMOTE_ERROR, 0, "a silent write refused by the peer");
    V1ClientTeardown(peer, client);
  });
}

// ---- #21: READ_FENCE ----------------------------------------------------------------------------------

constexpr size_t kFenceSize = 512 * 1024;

IT_PEER(v1_fence_server) {
  V1Adapter adapter;
  V1Buffer source(adapter, kFenceSize), in(adapter, kFenceSize, 0xEE);
  FillPattern(source.data(), kFenceSize, 77);
  V1Side server(adapter);
  ND_RESULT receive;
  V1Serve(parent, server, [&](V1Side& s) {
    ND_SGE sge = in.Sge(0, kFenceSize);
    IT_OK(s.endpoint->Receive(&receive, &sge, 1));
  });
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), source, 0, kFenceSize, ND_OP_FLAG_ALLOW_READ));
  V1ExpectResult(server.cq.get(), &receive, ND_SUCCESS, int64_t(kFenceSize), "the fenced send");
  CheckPattern(in.data(), kFenceSize, 77, "what the fenced Send carried");
  V1ServerTeardown(parent, server);
}

// The Send goes out of the buffer the Read fills: fenced, it carries what the Read brought.
TEST(ConformanceV1Transfer, AReadFencedSendCarriesTheReadsData) {
  RunWithPeer("v1_fence_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer local(adapter, kFenceSize);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    ND_RESULT read, send;
    ND_SGE sge = local.Sge(0, kFenceSize);
    IT_OK(client.endpoint->Read(&read, &sge, 1, &remote, 0, 0));
    IT_OK(client.endpoint->Send(&send, &sge, 1, ND_OP_FLAG_READ_FENCE));
    V1ExpectResult(client.cq.get(), &read, ND_SUCCESS, int64_t(kFenceSize), "read");
    V1ExpectResult(client.cq.get(), &send, ND_SUCCESS, int64_t(kFenceSize), "fenced send");
    V1ClientTeardown(peer, client);
  });
}

// ---- #22, #23: a receive too small, and none at all ------------------------------------------------

IT_PEER(v1_small_receive_server) {
  V1Adapter adapter;
  V1Buffer in(adapter, 2 * 64);
  V1Side server(adapter);
  ND_RESULT small, next;
  V1Serve(parent, server, [&](V1Side& s) {
    ND_SGE sge = in.Sge(0, 16);
    IT_OK(s.endpoint->Receive(&small, &sge, 1));
    sge = in.Sge(64, 64);
    IT_OK(s.endpoint->Receive(&next, &sge, 1));
  });
  // The receiver's length error (ND_LOCAL_LENGTH); the connection is over, so the next receive
  // is flushed.
  V1ExpectResult(server.cq.get(), &small, ND_LOCAL_LENGTH, 0, "the receive that was too small");
  V1ExpectResult(server.cq.get(), &next, ND_CANCELED, 0, "the next receive");
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

// The client of the refused-send cases: connected with one receive posted, it sends 64 bytes and
// gives the Send's status to `check`; the connection is then over, so its receive is flushed.
void SendThePeerCannotTake(Channel& peer, const char* what,
                           const std::function<void(HRESULT)>& check) {
  V1Adapter adapter;
  V1Buffer buffer(adapter, 256);
  V1Side client(adapter);
  ND_RESULT receive;
  V1ConnectTo(peer, client, [&](V1Side& s) {
    ND_SGE sge = buffer.Sge(128, 64);
    IT_OK(s.endpoint->Receive(&receive, &sge, 1));
  });
  ND_RESULT send;
  ND_SGE sge = buffer.Sge(0, 64);
  IT_OK(client.endpoint->Send(&send, &sge, 1, 0));
  IT_CHECK(V1NextResult(client.cq.get(), what) == &send);
  check(send.Status);
  V1ExpectResult(client.cq.get(), &receive, ND_CANCELED, 0, "the client's receive, connection over");
  peer.Send("client done");
  V1Disconnect(client.connector.get());
}

TEST(ConformanceV1Transfer, AMessageLargerThanTheReceiveFailsBothSides) {
  RunWithPeer("v1_small_receive_server", [](Channel& peer) {
    SendThePeerCannotTake(peer, "the send to a receive too small", [](HRESULT status) {
      // Where Sends complete once the peer took them, the peer's refusal is this Send's status;
      // an iWARP Send handed to TCP has completed already, and the refusal ends the connection.
      bool refused = status == ND_REMOTE_ERROR || status == ND_BUFFER_OVERFLOW;
      IT_CHECK_MSG(refused || (!SendsConfirmed() && status == ND_SUCCESS), StatusName(status));
    });
  });
}

IT_PEER(v1_no_receive_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  V1Serve(parent, server);  // and not a single receive posted
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

TEST(ConformanceV1Transfer, ASendWithNoReceiveTimesOut) {
  RunWithPeer("v1_no_receive_server", [](Channel& peer) {
    SendThePeerCannotTake(peer, "the send nobody had a receive for", [](HRESULT status) {
      // Version 1's status for a receiver not ready past the retries is ND_TIMEOUT (not v2's
      // ND_IO_TIMEOUT); an unconfirmed iWARP Send completed when handed to TCP.
      IT_CHECK_MSG(status == ND_TIMEOUT || (!SendsConfirmed() && status == ND_SUCCESS),
                   StatusName(status));
    });
  });
}

// ---- #11, #24: RDMA through a descriptor, and what it does not reach -----------------------------

constexpr size_t kRegion = 64 * 1024;
constexpr size_t kWindowStart = 4096, kWindowLength = 8192;

enum class Violation {
  WriteBeyondTheWindow,
  ReadBeyondTheWindow,
  WriteToAReadOnlyWindow,
  ReadFromAWriteOnlyWindow,
  TokenOfAnotherBind,  // a generation of the window's key no Bind gave
  TheRegionsOwnKey,    // the registration's key: version 1 grants it nothing
};

IT_PEER(v1_window_server) {
  V1Adapter adapter;
  V1Buffer region(adapter, kRegion, 0x5A);  // a new adapter's first registration
  FillPattern(region.data() + kWindowStart, kWindowLength, 9);
  V1Side server(adapter);
  V1Serve(parent, server);
  auto violation = Violation(args.GetNumber("violation"));
  DWORD flags = ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE;
  if (violation == Violation::WriteToAReadOnlyWindow) flags = ND_OP_FLAG_ALLOW_READ;
  if (violation == Violation::ReadFromAWriteOnlyWindow) flags = ND_OP_FLAG_ALLOW_WRITE;
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), region, kWindowStart, kWindowLength, flags));
  parent.Expect("client done");
  // The client's write landed at Base + Offset (when the window is writable), and nothing
  // anywhere else.
  std::vector<uint8_t> expected(kWindowLength);
  FillPattern(expected.data(), kWindowLength, 9);
  if (flags & ND_OP_FLAG_ALLOW_WRITE) FillPattern(expected.data() + 100, 200, 31);
  CheckPlacedByPeer([&] {
    IT_CHECK(std::memcmp(region.data() + kWindowStart, expected.data(), kWindowLength) == 0);
    CheckFilled(region.data(), kWindowStart, 0x5A, "before the window");
    CheckFilled(region.data() + kWindowStart + kWindowLength, kRegion - kWindowStart - kWindowLength,
                0x5A, "after the window");
  });
  V1Disconnect(server.connector.get());
}

class ConformanceV1Rdma : public ::testing::TestWithParam<Violation> {};

// #24: data lands at Base + Offset, a Read brings back what is there; then the violation: access
// beyond the window's Length, against its rights, or through a key no Bind gave (#11, a bare
// registration grants the peer nothing) fails ND_REMOTE_ERROR at the initiator and leaves the
// target's memory as it was.
TEST_P(ConformanceV1Rdma, InsideTheWindowOnlyWithItsRights) {
  Violation violation = GetParam();
  RunWithPeer("v1_window_server", {{"violation", std::to_string(int(violation))}}, [&](Channel& peer) {
    V1Adapter adapter;
    V1Buffer local(adapter, kWindowLength + 4096);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    IT_CHECK_EQ(uint64_t(kWindowLength), be64toh(remote.Length));
    bool readable = violation != Violation::ReadFromAWriteOnlyWindow;
    bool writable = violation != Violation::WriteToAReadOnlyWindow;
    ND_RESULT r;
    if (readable) {  // a Read at an offset
      ND_SGE sge = local.Sge(0, 300);
      IT_OK(client.endpoint->Read(&r, &sge, 1, &remote, 50, 0));
      V1ExpectResult(client.cq.get(), &r, ND_SUCCESS, 300, "read at offset 50");
      std::vector<uint8_t> expected(kWindowLength);
      FillPattern(expected.data(), kWindowLength, 9);
      IT_CHECK(std::memcmp(local.data(), expected.data() + 50, 300) == 0);
    }
    if (writable) {  // a Write at an offset
      FillPattern(local.data(), 200, 31);
      ND_SGE sge = local.Sge(0, 200);
      IT_OK(client.endpoint->Write(&r, &sge, 1, &remote, 100, 0));
      V1ExpectResult(client.cq.get(), &r, ND_SUCCESS, 200, "write at offset 100");
    }
    // The rest of the window as the server checks it: its pattern beyond offset 300.
    ND_MW_DESCRIPTOR bad = remote;
    ND_SGE sge = local.Sge(0, 64);
    bool read = false;
    uint64_t offset = 0;
    switch (violation) {
      case Violation::WriteBeyondTheWindow: offset = kWindowLength - 32; break;
      case Violation::ReadBeyondTheWindow: offset = kWindowLength - 32, read = true; break;
      case Violation::WriteToAReadOnlyWindow: break;
      case Violation::ReadFromAWriteOnlyWindow: read = true; break;
      case Violation::TokenOfAnotherBind: bad.Token ^= htonl(0x1); break;
      case Violation::TheRegionsOwnKey:
        // dev/memory.h: a key is slot << 8 | generation; a new adapter's first registration has
        // slot 1, generation 1. Whatever the layout, it is no key a Bind gave.
        bad.Token = htonl(0x101), read = true;
        break;
    }
    if (violation == Violation::TheRegionsOwnKey || violation == Violation::TokenOfAnotherBind)
      bad.Base = htobe64(be64toh(remote.Base) - kWindowStart);  // the region's start
    std::vector<uint8_t> before(local.bytes);
    HRESULT hr = read ? client.endpoint->Read(&r, &sge, 1, &bad, offset, 0)
                      : client.endpoint->Write(&r, &sge, 1, &bad, offset, 0);
    IT_OK(hr);
    V1ExpectResult(client.cq.get(), &r, ND_REMOTE_ERROR, 0, "the access the window does not allow");
    if (read) IT_CHECK(local.bytes == before);  // nothing came back
    peer.Send("client done");
    V1Disconnect(client.connector.get());
  });
}

std::string ViolationName(const ::testing::TestParamInfo<Violation>& info) {
  static const char* const names[] = {"WriteBeyondTheWindow",   "ReadBeyondTheWindow",
                                      "WriteToAReadOnlyWindow", "ReadFromAWriteOnlyWindow",
                                      "TokenOfAnotherBind",     "TheRegionsOwnKey"};
  return names[int(info.param)];
}

INSTANTIATE_TEST_SUITE_P(ConformanceV1, ConformanceV1Rdma,
                         ::testing::Values(Violation::WriteBeyondTheWindow,
                                           Violation::ReadBeyondTheWindow,
                                           Violation::WriteToAReadOnlyWindow,
                                           Violation::ReadFromAWriteOnlyWindow,
                                           Violation::TokenOfAnotherBind,
                                           Violation::TheRegionsOwnKey),
                         ViolationName);

// ---- #25: Reads beyond the outbound read limit --------------------------------------------------

IT_PEER(v1_reads_server) {
  V1Adapter adapter;
  V1Buffer source(adapter, 16 * 4096);
  FillPattern(source.data(), source.bytes.size(), 55);
  V1Side server(adapter, {.inboundReadLimit = 8});
  V1Serve(parent, server);
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, BindWindow(server, window.get(), source, 0, source.bytes.size(),
                                    ND_OP_FLAG_ALLOW_READ));
  V1ServerTeardown(parent, server);
}

TEST(ConformanceV1Transfer, ReadsBeyondTheOutboundReadLimitWaitAndComplete) {
  RunWithPeer("v1_reads_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer local(adapter, 16 * 4096);
    V1Side client(adapter, {.outboundReadLimit = 1});
    V1ConnectTo(peer, client);
    SIZE_T inbound = 0, outbound = 0;
    IT_OK(client.connector->GetConnectionData(&inbound, &outbound, nullptr, nullptr));
    IT_CHECK(outbound <= adapter.info().MaxOutboundReadLimit &&
             inbound <= adapter.info().MaxInboundReadLimit);
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    ND_RESULT reads[16];
    for (size_t i = 0; i < 16; ++i) {
      ND_SGE sge = local.Sge(i * 4096, 4096);
      IT_OK(client.endpoint->Read(&reads[i], &sge, 1, &remote, i * 4096, 0));  // none refused
    }
    for (size_t i = 0; i < 16; ++i) V1ExpectResult(client.cq.get(), &reads[i], ND_SUCCESS, 4096, "read");
    CheckPattern(local.data(), local.bytes.size(), 55, "what the reads brought");
    V1ClientTeardown(peer, client);
  });
}

// ---- #38, #43: Flush, and an endpoint released with requests outstanding ----------------------------

IT_PEER(v1_flush_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  V1Serve(parent, server);
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

TEST(ConformanceV1Transfer, FlushCancelsOnlyItsEndpointsRequestsEachOnce) {
  RunWithPeer("v1_flush_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Buffer buffer(adapter, 8 * 64);
    V1Side client(adapter);
    // Another endpoint on the same CQ, never connected, with receives of its own.
    V1Side other(adapter);
    other.cq.Reset();
    other.cq = adapter.CreateCq(8);  // unused: the endpoint below uses the client's CQ
    Ref<INDConnector> otherConnector = adapter.CreateConnector();
    Ref<INDEndpoint> otherEndpoint;
    IT_OK(otherConnector->CreateEndpoint(client.cq.get(), client.cq.get(), 4, 4, 1, 1, 0, 0, nullptr,
                                         reinterpret_cast<INDEndpoint**>(otherEndpoint.Out())));
    ND_RESULT mine[4], theirs[2];
    V1ConnectTo(peer, client, [&](V1Side& s) {
      for (int i = 0; i < 4; ++i) {
        ND_SGE sge = buffer.Sge(size_t(i) * 64, 64);
        IT_OK(s.endpoint->Receive(&mine[i], &sge, 1));
      }
    });
    for (int i = 0; i < 2; ++i) {
      ND_SGE sge = buffer.Sge(size_t(4 + i) * 64, 64);
      IT_OK(otherEndpoint->Receive(&theirs[i], &sge, 1));
    }
    IT_OK(client.endpoint->Flush());
    for (int i = 0; i < 4; ++i) V1ExpectResult(client.cq.get(), &mine[i], ND_CANCELED, 0, "flushed receive");
    V1ExpectNoResult(client.cq.get(), "the other endpoint's receives");
    // After the flush, a new request is flushed too, once.
    ND_RESULT late;
    ND_SGE sge = buffer.Sge(0, 8);
    IT_OK(client.endpoint->Send(&late, &sge, 1, 0));
    V1ExpectResult(client.cq.get(), &late, ND_CANCELED, 0, "a send after the flush");
    V1ExpectNoResult(client.cq.get(), "each request once");

    // #43: releasing an endpoint with requests outstanding: they come back afterwards, and a
    // result once returned is never written again.
    IT_CHECK_EQ(0u, otherEndpoint.Reset());
    IT_CHECK_EQ(0u, otherConnector.Reset());
    ND_RESULT* results[4] = {};
    SIZE_T got = 0;
    Deadline deadline;
    unsigned spins = 0;
    while (got < 2 && !deadline.Expired()) {
      got += client.cq->GetResults(results + got, 4 - got);
      Pause(spins);
    }
    IT_CHECK_EQ(SIZE_T(2), got);
    IT_CHECK(results[0] == &theirs[0] && results[1] == &theirs[1]);
    IT_CHECK(theirs[0].Status == ND_CANCELED && theirs[1].Status == ND_CANCELED);
    theirs[0] = {0x12345678, 99};
    V1ExpectNoResult(client.cq.get(), "nothing after the released endpoint's requests", 100);
    IT_CHECK(theirs[0].Status == 0x12345678 && theirs[0].BytesTransferred == 99);
    peer.Send("client done");
    V1Disconnect(client.connector.get());
  });
}

// ---- #44: threads -----------------------------------------------------------------------------------

constexpr int kPosters = 4, kPerPoster = 64;

IT_PEER(v1_threads_server) {
  V1Adapter adapter;
  constexpr int kMessages = kPosters * kPerPoster;
  V1Buffer in(adapter, kMessages * 8);
  V1Side server(adapter, {.depth = kMessages});
  std::vector<ND_RESULT> receives(kMessages);
  V1Serve(parent, server, [&](V1Side& s) {
    for (int i = 0; i < kMessages; ++i) {
      ND_SGE sge = in.Sge(size_t(i) * 8, 8);
      IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
    }
  });
  // Every message exactly once, whatever the interleaving: (poster, sequence) pairs.
  std::set<std::pair<uint32_t, uint32_t>> seen;
  for (int i = 0; i < kMessages; ++i) {
    V1ExpectResult(server.cq.get(), &receives[i], ND_SUCCESS, 8, "a message of the posting threads");
    uint32_t pair[2];
    std::memcpy(pair, in.data() + size_t(i) * 8, 8);
    IT_CHECK(pair[0] < kPosters && pair[1] < kPerPoster);
    IT_CHECK(seen.insert({pair[0], pair[1]}).second);
  }
  V1ServerTeardown(parent, server);
}

// Several threads post on one endpoint (inside request batches) while two others reap the one
// CQ: every ND_RESULT comes back once, none lost or doubled, every message arrives once.
TEST(ConformanceV1Transfer, ThreadsPostAndPollOneEndpoint) {
  RunWithPeer("v1_threads_server", [](Channel& peer) {
    V1Adapter adapter;
    constexpr int kMessages = kPosters * kPerPoster;
    V1Buffer out(adapter, kMessages * 8);
    V1Side client(adapter, {.depth = kMessages});
    V1ConnectTo(peer, client);
    std::vector<ND_RESULT> sends(kMessages);
    std::atomic<int> reaped{0};
    std::vector<std::atomic<int>> seen(kMessages);
    std::atomic<bool> wrong{false};
    auto poster = [&](uint32_t id) {
      for (uint32_t n = 0; n < kPerPoster; ++n) {
        int index = int(id) * kPerPoster + int(n);
        uint32_t pair[2] = {id, n};
        std::memcpy(out.data() + size_t(index) * 8, pair, 8);
        ND_SGE sge = out.Sge(size_t(index) * 8, 8);
        client.endpoint->StartRequestBatch();
        if (client.endpoint->Send(&sends[index], &sge, 1, 0) != ND_SUCCESS) wrong = true;
        client.endpoint->SubmitRequestBatch();
      }
    };
    auto reaper = [&] {
      Deadline deadline;
      while (reaped.load() < kMessages && !deadline.Expired()) {
        ND_RESULT* results[8];
        SIZE_T n = client.cq->GetResults(results, 8);
        for (SIZE_T i = 0; i < n; ++i) {
          ptrdiff_t index = results[i] - sends.data();
          if (index < 0 || index >= kMessages || results[i]->Status != ND_SUCCESS) wrong = true;
          else seen[size_t(index)]++;
        }
        reaped += int(n);
      }
    };
    std::vector<std::thread> threads;
    for (uint32_t id = 0; id < kPosters; ++id) threads.emplace_back(poster, id);
    threads.emplace_back(reaper);
    threads.emplace_back(reaper);
    for (std::thread& t : threads) t.join();
    IT_CHECK(!wrong.load());
    IT_CHECK_EQ(kMessages, reaped.load());
    for (int i = 0; i < kMessages; ++i) IT_CHECK_EQ(1, seen[size_t(i)].load());
    V1ClientTeardown(peer, client);
  });
}

}  // namespace
}  // namespace ndit
