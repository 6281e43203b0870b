// A thin layer over the ND2 SPI for the example tools, written only against the public headers as
// any ND application would be: references that Release themselves, an OVERLAPPED with a bounded
// wait, the adapter with its overlapped file, a CQ that is polled (-p) or armed and waited on
// (-b), memory registration, SGE lists, and the connection steps. Every wait has a bound
// (WaitTimeoutMs) so that a peer or a completion that never comes ends the tool with an error.
#pragma once

#include <ndwv/ndspi.h>
#include <ndwv/ndstatus.h>
#include <ndwv/ndsupport.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "tool.h"

namespace ndtool {

// Owns one reference to an ND interface.
template <class T>
class NdRef {
 public:
  NdRef() = default;
  NdRef(const NdRef&) = delete;
  NdRef& operator=(const NdRef&) = delete;
  NdRef(NdRef&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  NdRef& operator=(NdRef&& other) noexcept {
    if (this != &other) {
      Reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  ~NdRef() { Reset(); }

  void Reset() {
    if (p_) std::exchange(p_, nullptr)->Release();
  }
  // For creation calls: `adapter->CreateX(..., ref.Out())`.
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

// NdStartup for the lifetime of the object, NdCleanup after.
class NdLibrary {
 public:
  NdLibrary();
  ~NdLibrary();
  NdLibrary(const NdLibrary&) = delete;
  NdLibrary& operator=(const NdLibrary&) = delete;
};

// An OVERLAPPED with its own auto-reset event, used by one request at a time.
class Overlapped {
 public:
  Overlapped();
  ~Overlapped();
  Overlapped(const Overlapped&) = delete;
  Overlapped& operator=(const Overlapped&) = delete;

  // A cleared OVERLAPPED to pass to the next overlapped call. Without `portPacket` the event
  // handle carries bit 0, so that a completion port on the object's file gets no packet for it.
  OVERLAPPED* Prepare(bool portPacket = true);
  // Final status of the request just issued with Prepare(); `issued` is what the call returned.
  // After ND_PENDING waits for the event (bounded; on timeout the object's requests are
  // canceled and the tool fails) and then takes the result from GetOverlappedResult. `object`
  // is of either SPI version.
  HRESULT Complete(IND2Overlapped* object, HRESULT issued, const char* what,
                   std::uint32_t timeoutMs = WaitTimeoutMs());
  HRESULT Complete(INDOverlapped* object, HRESULT issued, const char* what,
                   std::uint32_t timeoutMs = WaitTimeoutMs());

 private:
  template <class Object>
  HRESULT Await(Object* object, HRESULT issued, const char* what, std::uint32_t timeoutMs);

  OVERLAPPED ov_{};
  HANDLE event_ = nullptr;
};

// One request of `object` (either version) through a fresh Overlapped: issues call(OVERLAPPED*)
// and returns the request's final status (Overlapped::Complete).
template <class Object, class Call>
HRESULT RunRequest(Object* object, const char* what, Call call) {
  Overlapped ov;
  return ov.Complete(object, call(ov.Prepare()), what);
}
// The same, for a request that must end in ND_SUCCESS exactly (else the tool fails, at `line`).
template <class Object, class Call>
void RequireSuccess(Object* object, const char* what, int line, Call call) {
  HRESULT hr = RunRequest(object, what, call);
  if (hr != ND_SUCCESS) Fail(what, hr, line);
}

// The next completion of a CQ of either version: spins on poll(&result), or (blocking) arms
// Notify(ND_CQ_NOTIFY_ANY) and waits for it; the tool fails if none comes within timeoutMs.
template <class Cq, class Result, class Poll>
Result NextCompletion(Cq* cq, Overlapped& notify, bool blocking, Poll poll, const char* what,
                      std::uint32_t timeoutMs) {
  NoteProgress();
  Result result{};
  if (!blocking) {
    SpinDeadline deadline(timeoutMs);
    while (!poll(&result))
      if (deadline.Expired()) FailTimeout(what, timeoutMs, __LINE__);
    return result;
  }
  // Arm, wait, reap: anything queued after the last empty poll satisfies the Notify.
  const std::uint64_t end = NowMicros() + std::uint64_t(timeoutMs) * 1000;
  while (!poll(&result)) {
    std::uint64_t now = NowMicros();
    if (now >= end) FailTimeout(what, timeoutMs, __LINE__);
    std::uint32_t leftMs = std::uint32_t((end - now + 999) / 1000);
    HRESULT hr = cq->Notify(ND_CQ_NOTIFY_ANY, notify.Prepare());
    hr = notify.Complete(cq, hr, what, leftMs);
    if (hr != ND_SUCCESS) Fail("Notify", hr, __LINE__);
  }
  return result;
}

// Splits [buffer, buffer + length) into 40-byte pieces over at most maxSge entries, the last
// entry taking the remainder (the ND tools' SGE pattern): entry(sge, address, bytes) fills each.
// Returns the entry count (0 for 0 bytes).
template <class Sge, class Entry>
ULONG SplitSgl(Sge* sgl, ULONG maxSge, void* buffer, std::size_t length, Entry entry) {
  constexpr std::size_t kPiece = 40;
  char* at = static_cast<char*>(buffer);
  ULONG count = 0;
  auto add = [&](std::size_t bytes) {
    entry(sgl[count++], at, bytes);
    at += bytes;
    length -= bytes;
  };
  while (length > kPiece && count + 1 < maxSge) add(kPiece);
  if (length > 0) add(length);
  return count;
}

// One adapter opened on a local address, its limits and the overlapped file its objects use.
// Declare it before the objects made from it so that they are released first.
class Adapter {
 public:
  Adapter() = default;
  ~Adapter();
  Adapter(const Adapter&) = delete;
  Adapter& operator=(const Adapter&) = delete;

  void Open(const sockaddr* localAddress, ULONG length);
  // Opens the adapter the OS would use to reach `server` (NdResolveAddress) and keeps that
  // source address with port 0 (an ephemeral port) for the connectors' Bind (Connect below).
  void OpenForPeer(const sockaddr* server, ULONG length);
  const sockaddr* peerSource() const { return reinterpret_cast<const sockaddr*>(&peerSource_); }
  ULONG peerSourceLength() const { return peerSourceLength_; }

  IND2Adapter* get() const { return adapter_.get(); }
  // The overlapped file every object of this adapter uses (to associate a completion port).
  HANDLE file() const { return file_; }
  const ND2_ADAPTER_INFO& info() const { return info_; }
  // Fails with "Adapter does not support in-order RDMA." unless IN_ORDER_DMA is advertised.
  void RequireInOrderDma() const;

  NdRef<IND2CompletionQueue> CreateCompletionQueue(ULONG depth);
  NdRef<IND2MemoryRegion> CreateMemoryRegion();
  NdRef<IND2MemoryWindow> CreateMemoryWindow();
  NdRef<IND2QueuePair> CreateQueuePair(IND2CompletionQueue* cq, ULONG receiveDepth,
                                       ULONG initiatorDepth, ULONG receiveSge, ULONG initiatorSge,
                                       ULONG inlineSize);
  NdRef<IND2Connector> CreateConnector();
  NdRef<IND2Listener> CreateListener();

 private:
  sockaddr_storage peerSource_{};  // OpenForPeer's source address, port 0
  ULONG peerSourceLength_ = 0;
  NdRef<IND2Adapter> adapter_;
  HANDLE file_ = nullptr;
  ND2_ADAPTER_INFO info_{};
};

// A CQ for one QP's sends and receives. Next() polls (spinning on GetResults) or, in blocking
// mode, arms the CQ with Notify(ND_CQ_NOTIFY_ANY) and waits for the notification.
class CompletionQueue {
 public:
  CompletionQueue(Adapter& adapter, ULONG depth, bool blocking);
  IND2CompletionQueue* get() const { return cq_.get(); }
  bool Poll(ND2_RESULT* result) { return cq_->GetResults(result, 1) == 1; }
  // The next completion, whatever its status; the tool fails if none comes within timeoutMs.
  ND2_RESULT Next(const char* what, std::uint32_t timeoutMs = WaitTimeoutMs());

 private:
  NdRef<IND2CompletionQueue> cq_;
  Overlapped notify_;
  bool blocking_;
};

// A completion port associated with an adapter's overlapped file: every request of that
// adapter's objects then completes to it, except those whose event has bit 0 set. Declare it
// after the Adapter (it is closed first).
class CompletionPort {
 public:
  CompletionPort(Adapter& adapter, ULONG_PTR key, DWORD concurrentThreads);
  ~CompletionPort();
  CompletionPort(const CompletionPort&) = delete;
  CompletionPort& operator=(const CompletionPort&) = delete;

  HANDLE get() const { return port_; }
  // Dequeues the next packet and returns its OVERLAPPED; a failed request's packet is returned
  // too (its status is in Internal). The tool fails if none comes within timeoutMs.
  OVERLAPPED* Next(const char* what, std::uint32_t timeoutMs = WaitTimeoutMs());
  // A packet already queued, or nullptr: no wait.
  OVERLAPPED* TryNext();

 private:
  HANDLE port_ = nullptr;
};

// One registration held by one MR object.
class MemoryRegion {
 public:
  explicit MemoryRegion(Adapter& adapter) : mr_(adapter.CreateMemoryRegion()) {}
  void Register(const void* buffer, std::size_t length, ULONG flags);
  void Deregister();
  IND2MemoryRegion* get() const { return mr_.get(); }
  UINT32 localToken() const { return mr_->GetLocalToken(); }

 private:
  NdRef<IND2MemoryRegion> mr_;
};

// SplitSgl's pieces as ND2_SGEs under `token`.
ULONG BuildSgl(ND2_SGE* sgl, ULONG maxSge, void* buffer, std::size_t length, UINT32 token);

// A client's connection attempts: attempt(leftMs) connects and waits at most leftMs for the
// outcome; a status the SPI lets a client retry (no listener yet, timeouts, routes coming up) is
// retried after 50 ms until the wait bound (WaitTimeoutMs); anything else fails the tool.
void RetryConnect(const char* what, const std::function<HRESULT(std::uint32_t leftMs)>& attempt);

// Client side, after adapter.OpenForPeer(server): creates a connector, binds it to the source
// address OpenForPeer chose and connects `qp` to the server. A refused or timed-out attempt is
// retried with a fresh connector until the wait bound, so that a client may start just before
// its server.
NdRef<IND2Connector> Connect(Adapter& adapter, IND2QueuePair* qp, const sockaddr* server, ULONG serverLength,
                             ULONG inboundReadLimit, ULONG outboundReadLimit,
                             const void* privateData = nullptr, ULONG privateDataLength = 0);
void CompleteConnect(IND2Connector* connector);

// The private data the peer gave its Connect or Accept (possibly padded by the transport),
// sized with the probe GetPrivateData(NULL, &0) -> ND_BUFFER_OVERFLOW. Empty if it sent none.
std::vector<char> GetPrivateData(IND2Connector* connector);

// Server side.
NdRef<IND2Listener> Listen(Adapter& adapter, const sockaddr* address, ULONG length);
NdRef<IND2Connector> GetConnectionRequest(Adapter& adapter, IND2Listener* listener);
void Accept(IND2Connector* connector, IND2QueuePair* qp, ULONG inboundReadLimit,
            ULONG outboundReadLimit, const void* privateData = nullptr, ULONG privateDataLength = 0);

// Tears the connection down and waits for it (flushes the QP).
void Disconnect(IND2Connector* connector);
// Waits until the peer disconnects (NotifyDisconnect), within the wait bound.
void WaitForPeerDisconnect(IND2Connector* connector);

// "<what>: unexpected completion (type t, status s, context c)" and exit.
[[noreturn]] void FailCompletion(const char* what, const ND2_RESULT& result, int line);

}  // namespace ndtool
