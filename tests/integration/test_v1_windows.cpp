// NetworkDirect version 1 conformance, part 3 (nd1-spi.md §4, "#n"): memory windows. The server
// (the peer) owns the memory and binds windows over it; the client (this process) reads and
// writes through the descriptors it is sent, and invalidates them with SendAndInvalidate. Every
// window is a real type-2 window of the device: its token is its own, it reaches exactly its
// range with exactly its rights through one connection, and it stops working when unbound.
#include <arpa/inet.h>
#include <endian.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "harness_v1.h"

namespace ndit {
namespace {

constexpr size_t kRegion = 16 * 1024;

struct Memory {
  Memory(V1Adapter& adapter, size_t size) : bytes(size), mr(adapter, bytes.data(), bytes.size()) {}
  uint8_t* data() { return bytes.data(); }
  std::vector<uint8_t> bytes;
  V1Mr mr;
};

Ref<INDMemoryWindow> NewWindow(V1Adapter& adapter, ND_RESULT* invalidated) {
  Ref<INDMemoryWindow> window;
  IT_OK(adapter->CreateMemoryWindow(invalidated, reinterpret_cast<INDMemoryWindow**>(window.Out())));
  return window;
}

ND_MW_DESCRIPTOR Bind(V1Side& side, INDMemoryWindow* window, Memory& memory, size_t offset,
                      size_t length, DWORD flags) {
  ND_RESULT bind = {ND_PENDING, 99};
  ND_MW_DESCRIPTOR descriptor;
  IT_OK(side.endpoint->Bind(&bind, memory.mr.handle(), window, memory.data() + offset, length,
                            flags, &descriptor));
  V1ExpectResult(side.cq.get(), &bind, ND_SUCCESS, 0, "Bind");
  return descriptor;
}

void Invalidate(V1Side& side, INDMemoryWindow* window, HRESULT expected) {
  ND_RESULT result;
  IT_OK(side.endpoint->Invalidate(&result, window, 0));
  V1ExpectResult(side.cq.get(), &result, expected, 0, "Invalidate");
}

// A client's Read of `length` bytes at `offset` through `remote`; returns its status.
HRESULT ReadThrough(V1Side& client, Memory& local, const ND_MW_DESCRIPTOR& remote, size_t offset,
                    size_t length) {
  ND_RESULT read;
  ND_SGE sge = V1Sge(local.data(), length, local.mr.handle());
  IT_OK(client.endpoint->Read(&read, &sge, 1, &remote, offset, 0));
  IT_CHECK(V1NextResult(client.cq.get(), "a read through a window") == &read);
  return read.Status;
}

HRESULT WriteThrough(V1Side& client, Memory& local, const ND_MW_DESCRIPTOR& remote, size_t offset,
                     size_t length) {
  ND_RESULT write;
  ND_SGE sge = V1Sge(local.data(), length, local.mr.handle());
  IT_OK(client.endpoint->Write(&write, &sge, 1, &remote, offset, 0));
  IT_CHECK(V1NextResult(client.cq.get(), "a write through a window") == &write);
  return write.Status;
}

// ---- #26, #27, #10: Bind, the descriptor, independent windows, deregistration ---------------------

IT_PEER(v1_bind_server) {
  V1Adapter adapter;
  Memory memory(adapter, kRegion);
  FillPattern(memory.data(), kRegion, 3);
  V1Side server(adapter);
  V1Serve(parent, server);
  ND_RESULT inv1, inv2;
  Ref<INDMemoryWindow> readable = NewWindow(adapter, &inv1), writable = NewWindow(adapter, &inv2);
  ND_RESULT r;
  ND_MW_DESCRIPTOR d;
  INDEndpoint* ep = server.endpoint.get();
  const DWORD rw = ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE;
  // #26: the range must lie inside the registration (start: argument 4, end: 5); a right must be
  // given (6); the descriptor is written (7).
  IT_CHECK_HR(ND_INVALID_PARAMETER_4,
              ep->Bind(&r, memory.mr.handle(), readable.get(), memory.data() - 1, 16, rw, &d));
  IT_CHECK_HR(ND_INVALID_PARAMETER_4, ep->Bind(&r, memory.mr.handle(), readable.get(),
                                               memory.data() + kRegion + 1, 0, rw, &d));
  IT_CHECK_HR(ND_INVALID_PARAMETER_5,
              ep->Bind(&r, memory.mr.handle(), readable.get(), memory.data() + 8, kRegion, rw, &d));
  IT_CHECK_HR(ND_INVALID_PARAMETER_6,
              ep->Bind(&r, memory.mr.handle(), readable.get(), memory.data(), 16, 0, &d));
  IT_CHECK_HR(ND_INVALID_PARAMETER_6, ep->Bind(&r, memory.mr.handle(), readable.get(),
                                               memory.data(), 16, ND_OP_FLAG_SEND_AND_SOLICIT_EVENT, &d));
  IT_CHECK_HR(ND_INVALID_PARAMETER_7,
              ep->Bind(&r, memory.mr.handle(), readable.get(), memory.data(), 16, rw, nullptr));
  IT_CHECK_HR(ND_INVALID_HANDLE, ep->Bind(&r, nullptr, readable.get(), memory.data(), 16, rw, &d));
  V1ExpectNoResult(server.cq.get(), "refused binds", 50);

  // Two windows over overlapping parts of one region, with different rights; the descriptor is
  // there as soon as Bind returns, in network byte order, 20 packed bytes.
  ND_RESULT bind1, bind2;
  ND_MW_DESCRIPTOR d1, d2;
  std::memset(&d1, 0, sizeof d1);
  IT_OK(ep->Bind(&bind1, memory.mr.handle(), readable.get(), memory.data() + 1024, 2048,
                 ND_OP_FLAG_ALLOW_READ, &d1));
  IT_CHECK_EQ(reinterpret_cast<uint64_t>(memory.data() + 1024), be64toh(d1.Base));
  IT_CHECK_EQ(uint64_t(2048), be64toh(d1.Length));
  IT_OK(ep->Bind(&bind2, memory.mr.handle(), writable.get(), memory.data() + 2048, 4096,
                 ND_OP_FLAG_ALLOW_WRITE, &d2));
  IT_CHECK(d1.Token != d2.Token);
  V1ExpectResult(server.cq.get(), &bind1, ND_SUCCESS, 0, "first bind");
  V1ExpectResult(server.cq.get(), &bind2, ND_SUCCESS, 0, "second bind");
  SendDescriptor(parent, d1);
  SendDescriptor(parent, d2);
  parent.Expect("accessed");
  // #10: a region with windows bound cannot be deregistered; once they are gone, it can.
  IT_CHECK_HR(ND_DEVICE_BUSY, V1Deregister(adapter.get(), memory.mr.handle()));
  Invalidate(server, readable.get(), ND_SUCCESS);
  IT_CHECK_HR(ND_DEVICE_BUSY, V1Deregister(adapter.get(), memory.mr.handle()));
  IT_CHECK_EQ(0u, writable.Reset());  // releasing a bound window unbinds it
  std::vector<uint8_t> expected(kRegion);
  FillPattern(expected.data(), kRegion, 3);
  FillPattern(expected.data() + 2048 + 100, 500, 44);  // the client's write
  IT_CHECK(memory.bytes == expected);
  parent.Send("checked");
  V1ServerTeardown(parent, server);
  IT_OK(memory.mr.Deregister());
}

TEST(ConformanceV1Windows, BindRangesRightsAndIndependentWindows) {
  RunWithPeer("v1_bind_server", [](Channel& peer) {
    V1Adapter adapter;
    Memory local(adapter, 8192);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    ND_MW_DESCRIPTOR readable = ReceiveDescriptor(peer), writable = ReceiveDescriptor(peer);
    IT_OK(ReadThrough(client, local, readable, 0, 2048));
    std::vector<uint8_t> region(kRegion);
    FillPattern(region.data(), kRegion, 3);
    IT_CHECK(std::memcmp(local.data(), region.data() + 1024, 2048) == 0);
    FillPattern(local.data(), 500, 44);
    IT_OK(WriteThrough(client, local, writable, 100, 500));
    peer.Send("accessed");
    peer.Expect("checked");
    V1ClientTeardown(peer, client);
  });
}

// ---- #28: Invalidate, rebinding ----------------------------------------------------------------------

IT_PEER(v1_invalidate_server) {
  V1Adapter adapter;
  Memory memory(adapter, kRegion);
  FillPattern(memory.data(), kRegion, 5);
  V1Side server(adapter);
  V1Serve(parent, server);
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  ND_MW_DESCRIPTOR first = Bind(server, window.get(), memory, 0, 4096, ND_OP_FLAG_ALLOW_READ);
  SendDescriptor(parent, first);
  parent.Expect("read 1");
  Invalidate(server, window.get(), ND_SUCCESS);
  // Bound again, elsewhere: a new token.
  ND_MW_DESCRIPTOR second = Bind(server, window.get(), memory, 8192, 4096, ND_OP_FLAG_ALLOW_READ);
  IT_CHECK(second.Token != first.Token);
  SendDescriptor(parent, second);
  parent.Expect("read 2");
  Invalidate(server, window.get(), ND_SUCCESS);
  parent.Send("invalidated");
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

TEST(ConformanceV1Windows, InvalidateEndsTheDescriptorAndARebindGivesANewOne) {
  RunWithPeer("v1_invalidate_server", [](Channel& peer) {
    V1Adapter adapter;
    Memory local(adapter, 4096);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    std::vector<uint8_t> region(kRegion);
    FillPattern(region.data(), kRegion, 5);
    ND_MW_DESCRIPTOR first = ReceiveDescriptor(peer);
    IT_OK(ReadThrough(client, local, first, 0, 4096));
    IT_CHECK(std::memcmp(local.data(), region.data(), 4096) == 0);
    peer.Send("read 1");
    ND_MW_DESCRIPTOR second = ReceiveDescriptor(peer);
    IT_OK(ReadThrough(client, local, second, 0, 4096));
    IT_CHECK(std::memcmp(local.data(), region.data() + 8192, 4096) == 0);
    peer.Send("read 2");
    peer.Expect("invalidated");
    // The old descriptor is refused by the peer, which ends the connection.
    IT_CHECK_HR(ND_REMOTE_ERROR, ReadThrough(client, local, second, 0, 16));
    peer.Send("client done");
    V1Disconnect(client.connector.get());
  });
}

IT_PEER(v1_unbound_server) {
  V1Adapter adapter;
  V1Side server(adapter);
  V1Serve(parent, server);
  ND_RESULT invalidated;
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  // Never bound: the request fails in its turn (and, as any failed request, ends the connection).
  Invalidate(server, window.get(), ND_INVALIDATION_ERROR);
  IT_CHECK_HR(ND_INVALIDATION_ERROR, ND_INVALID_DEVICE_REQUEST);  // the version 1 name
  parent.Send("done");
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

TEST(ConformanceV1Windows, InvalidateOfAnUnboundWindowFails) {
  RunWithPeer("v1_unbound_server", [](Channel& peer) {
    V1Adapter adapter;
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    peer.Expect("done");
    peer.Send("client done");
    V1Disconnect(client.connector.get());
  });
}

// ---- #29: SendAndInvalidate ---------------------------------------------------------------------------

IT_PEER(v1_send_and_invalidate_server) {
  V1Adapter adapter;
  Memory memory(adapter, kRegion), in(adapter, 2 * 64);
  V1Side server(adapter, {.separateCqs = true});
  ND_RESULT receives[2];
  V1Serve(parent, server, [&](V1Side& s) {
    for (int i = 0; i < 2; ++i) {
      ND_SGE sge = V1Sge(in.data() + i * 64, 64, in.mr.handle());
      IT_OK(s.endpoint->Receive(&receives[i], &sge, 1));
    }
  });
  ND_RESULT invalidated = {ND_PENDING, 77}, other = {ND_PENDING, 77};
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  Ref<INDMemoryWindow> spare = NewWindow(adapter, &other);
  SendDescriptor(parent, Bind(server, window.get(), memory, 0, 4096, ND_OP_FLAG_ALLOW_READ));
  Bind(server, spare.get(), memory, 4096, 64, ND_OP_FLAG_ALLOW_READ);  // untouched by it
  // The peer's SendAndInvalidate: the window's own result first, on the inbound CQ, then the
  // message's receive.
  V1ExpectResult(server.inboundCq, &invalidated, ND_SUCCESS, 0, "the remote invalidation");
  V1ExpectResult(server.inboundCq, &receives[0], ND_SUCCESS, 10, "the message that invalidated it");
  CheckPattern(in.data(), 10, 12, "its bytes");
  IT_CHECK(other.Status == ND_PENDING);
  // Unbound now, and so is the spare window once released: the region is free.
  IT_CHECK_EQ(0u, spare.Reset());
  IT_OK(memory.mr.Deregister());
  parent.Send("invalidated");
  // Then a SendAndInvalidate that names no window of this connection: the receive fails.
  V1ExpectResult(server.inboundCq, &receives[1], ND_INVALIDATION_ERROR, 0,
                 "a receive whose message names no window");
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

TEST(ConformanceV1Windows, SendAndInvalidateUnbindsThePeersWindow) {
  RunWithPeer("v1_send_and_invalidate_server", [](Channel& peer) {
    V1Adapter adapter;
    Memory local(adapter, 4096);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    ND_RESULT send;
    FillPattern(local.data(), 10, 12);
    ND_SGE sge = V1Sge(local.data(), 10, local.mr.handle());
    IT_CHECK_HR(ND_INVALID_PARAMETER_4, client.endpoint->SendAndInvalidate(&send, &sge, 1, nullptr, 0));
    IT_CHECK_HR(ND_INVALID_PARAMETER_5,
                client.endpoint->SendAndInvalidate(&send, &sge, 1, &remote, ND_OP_FLAG_ALLOW_READ));
    IT_OK(client.endpoint->SendAndInvalidate(&send, &sge, 1, &remote, 0));
    V1ExpectResult(client.cq.get(), &send, ND_SUCCESS, 10, "SendAndInvalidate");
    peer.Expect("invalidated");
    // The same descriptor again: it names no window any more.
    IT_OK(client.endpoint->SendAndInvalidate(&send, &sge, 1, &remote, 0));
    IT_CHECK(V1NextResult(client.cq.get(), "SendAndInvalidate of a dead descriptor") == &send);
    IT_CHECK_MSG(send.Status == ND_REMOTE_ERROR || (!SendsConfirmed() && send.Status == ND_SUCCESS),
                 StatusName(send.Status));
    peer.Send("client done");
    V1Disconnect(client.connector.get());
  });
}

// The owner's Invalidate and the peer's SendAndInvalidate of one window at once: exactly one of
// them unbinds it, the other fails.
IT_PEER(v1_invalidate_race_server) {
  V1Adapter adapter;
  Memory memory(adapter, 4096), in(adapter, 64);
  V1Side server(adapter, {.separateCqs = true});
  ND_RESULT receive;
  V1Serve(parent, server, [&](V1Side& s) {
    ND_SGE sge = V1Sge(in.data(), 64, in.mr.handle());
    IT_OK(s.endpoint->Receive(&receive, &sge, 1));
  });
  ND_RESULT invalidated = {ND_PENDING, 0};
  Ref<INDMemoryWindow> window = NewWindow(adapter, &invalidated);
  SendDescriptor(parent, Bind(server, window.get(), memory, 0, 4096, ND_OP_FLAG_ALLOW_READ));
  parent.Expect("go");
  ND_RESULT local;
  IT_OK(server.endpoint->Invalidate(&local, window.get(), 0));
  IT_CHECK(V1NextResult(server.cq.get(), "the owner's Invalidate") == &local);
  // The receive arrives either way: after the owner's invalidation it fails (its descriptor
  // names no window any more); before it, the window's result reports the peer's.
  ND_RESULT* first = V1NextResult(server.inboundCq, "the peer's SendAndInvalidate");
  bool remoteWon = first == &invalidated;
  if (remoteWon) {
    IT_CHECK_HR(ND_SUCCESS, invalidated.Status);
    V1ExpectResult(server.inboundCq, &receive, ND_SUCCESS, 8, "its message");
    IT_CHECK_HR(ND_INVALIDATION_ERROR, local.Status);
  } else {
    IT_CHECK(first == &receive);
    IT_CHECK_HR(ND_INVALIDATION_ERROR, receive.Status);
    IT_CHECK_HR(ND_SUCCESS, local.Status);
    IT_CHECK(invalidated.Status == ND_PENDING);
  }
  parent.Send("server done");
  parent.Expect("client done");
  V1Disconnect(server.connector.get());
}

TEST(ConformanceV1Windows, LocalAndRemoteInvalidationRaceOneWins) {
  RunWithPeer("v1_invalidate_race_server", [](Channel& peer) {
    V1Adapter adapter;
    Memory local(adapter, 64);
    V1Side client(adapter);
    V1ConnectTo(peer, client);
    ND_MW_DESCRIPTOR remote = ReceiveDescriptor(peer);
    ND_RESULT send;
    ND_SGE sge = V1Sge(local.data(), 8, local.mr.handle());
    peer.Send("go");
    IT_OK(client.endpoint->SendAndInvalidate(&send, &sge, 1, &remote, 0));
    IT_CHECK(V1NextResult(client.cq.get(), "SendAndInvalidate") == &send);
    // An unconfirmed iWARP Send is done once in TCP: the connection stays until the server has
    // posted its Invalidate and seen both outcomes.
    peer.Expect("server done");
    peer.Send("client done");
    V1Disconnect(client.connector.get());
  });
}

}  // namespace
}  // namespace ndit
