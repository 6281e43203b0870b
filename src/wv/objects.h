// The verbs objects: each a thin COM wrapper that turns calls into device requests. Slow-path
// calls go to the device's objects (the "IOCTL" seam); posting and polling go straight to the
// device's queues on the caller's thread.
#pragma once
#include <atomic>
#include <memory>

#include <ndwv/winverbs.h>

#include "base/overlapped.h"
#include "dev/cq.h"
#include "dev/device.h"
#include "dev/endpoint.h"
#include "dev/memory.h"
#include "dev/qp.h"
#include "dev/srq.h"
#include "wv/com.h"

namespace ndwv::wv {

// One overlapped request in flight: completes its OVERLAPPED to the object's file.
class OverlappedOp : public dev::AsyncOp {
 public:
  OverlappedOp(const base::HandleRef& file, OVERLAPPED* overlapped) : file_(file), request_(file.get(), overlapped) {}
  virtual ~OverlappedOp() = default;
  void Complete(int32_t status) override {
    request_.Complete(status);
    delete this;
  }

 private:
  base::HandleRef file_;  // held as long as its request (declared first: destroyed last)
  base::PendingOverlapped request_;
};

// Starts `op` through `start` (a device call returning WV_PENDING or an error): the verbs return
// convention for asynchronous calls.
template <typename Start>
HRESULT StartOverlapped(OverlappedOp* op, Start start) {
  int32_t status = start(op);
  if (status == WV_PENDING) return WV_IO_PENDING;
  delete op;  // refused: never started, the OVERLAPPED is the caller's again
  return status;
}

HRESULT WaitResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait);

// A file handle passed by the caller, retained; empty if it is not an overlapped file.
base::HandleRef RetainedFile(HANDLE file);

class Device;
class ProtectionDomain;

class CompletionQueue final : public Unknown<IWVCompletionQueue, IID_IWVOverlapped, IID_IWVCompletionQueue> {
 public:
  CompletionQueue(Device* device, base::HandleRef file, size_t entries);
  // A Notify still armed completes WV_CANCELLED, as when a handle with I/O pending is closed.
  ~CompletionQueue() override;
  HRESULT CancelOverlappedRequests() override;
  HRESULT GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) override;
  HRESULT Resize(SIZE_T* entries) override;
  HRESULT Peek(SIZE_T* count) override;
  HRESULT Notify(WV_CQ_NOTIFY_TYPE type, OVERLAPPED* overlapped) override;
  HRESULT BatchNotify(SIZE_T count, OVERLAPPED* overlapped) override;
  SIZE_T Poll(WV_COMPLETION completions[], SIZE_T entries) override;
  const std::shared_ptr<dev::CompletionQueue>& cq() const { return cq_; }

 private:
  ComRef<IWVDevice> device_;
  base::HandleRef file_;
  std::shared_ptr<dev::CompletionQueue> cq_;
};

class SharedReceiveQueue final
    : public Unknown<IWVSharedReceiveQueue, IID_IWVOverlapped, IID_IWVSharedReceiveQueue> {
 public:
  SharedReceiveQueue(ProtectionDomain* pd, base::HandleRef file, std::shared_ptr<dev::SharedReceiveQueue> srq);
  ~SharedReceiveQueue() override;  // as CompletionQueue's
  HRESULT CancelOverlappedRequests() override;
  HRESULT GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) override;
  HRESULT Query(SIZE_T* max_wr, SIZE_T* max_sge, SIZE_T* limit) override;
  HRESULT Modify(SIZE_T max_wr, SIZE_T limit) override;
  HRESULT PostReceive(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge) override;
  HRESULT Notify(OVERLAPPED* overlapped) override;
  const std::shared_ptr<dev::SharedReceiveQueue>& srq() const { return srq_; }

 private:
  ComRef<IWVProtectionDomain> pd_;
  base::HandleRef file_;
  std::shared_ptr<dev::SharedReceiveQueue> srq_;
};

class MemoryWindow final : public Unknown<IWVMemoryWindow, IID_IWVMemoryWindow> {
 public:
  MemoryWindow(ProtectionDomain* pd, std::shared_ptr<dev::MemoryWindow> window);
  ~MemoryWindow() override;
  HRESULT SetRemoteInvalidateId(UINT64 wr_id) override;
  const std::shared_ptr<dev::MemoryWindow>& window() const { return window_; }

 private:
  ComRef<IWVProtectionDomain> pd_;
  std::shared_ptr<dev::MemoryWindow> window_;
};

class ConnectQueuePair final
    : public Unknown<IWVConnectQueuePair, IID_IWVOverlapped, IID_IWVQueuePair, IID_IWVConnectQueuePair> {
 public:
  ConnectQueuePair(ProtectionDomain* pd, const WV_QP_CREATE& create, std::shared_ptr<dev::QueuePair> qp);
  ~ConnectQueuePair() override;
  HRESULT CancelOverlappedRequests() override;
  HRESULT GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) override;
  HRESULT Query(WV_QP_ATTRIBUTES* attributes) override;
  HRESULT Modify(WV_QP_ATTRIBUTES* attributes, DWORD options, OVERLAPPED* overlapped) override;
  HRESULT PostReceive(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge) override;
  HRESULT PostSend(WV_SEND_REQUEST* send, WV_SEND_REQUEST** failed) override;
  HRESULT Send(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags, NET32 immediate) override;
  HRESULT Read(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags, NET64 address, NET32 rkey) override;
  HRESULT Write(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags, NET32 immediate, NET64 address,
                NET32 rkey) override;
  HRESULT CompareExchange(UINT64, WV_SGE*, DWORD, NET64, NET64, NET64, NET32) override { return WV_NOT_SUPPORTED; }
  HRESULT FetchAdd(UINT64, WV_SGE*, DWORD, NET64, NET64, NET32) override { return WV_NOT_SUPPORTED; }
  HRESULT BindMemoryWindow(IWVMemoryWindow* mw, UINT64 wr_id, UINT32 lkey, DWORD access, DWORD flags,
                           const VOID* buffer, SIZE_T length, NET32* rkey) override;
  HRESULT InvalidateMemoryWindow(IWVMemoryWindow* mw, UINT64 wr_id, DWORD flags) override;
  const std::shared_ptr<dev::QueuePair>& qp() const { return qp_; }

 private:
  // device_flags: dev::SendFlag bits beyond the WV_SEND_* ones the caller may give (kInvalidate).
  HRESULT Post(dev::WrOpcode opcode, UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags,
               uint64_t remote_address, uint32_t rkey, uint32_t device_flags = 0);
  ComRef<IWVProtectionDomain> pd_;
  ComRef<IWVCompletionQueue> send_cq_, recv_cq_;
  ComRef<IWVSharedReceiveQueue> srq_;
  std::shared_ptr<dev::QueuePair> qp_;
};

class ProtectionDomain final
    : public Unknown<IWVProtectionDomain, IID_IWVOverlapped, IID_IWVProtectionDomain> {
 public:
  explicit ProtectionDomain(Device* device);
  HRESULT CancelOverlappedRequests() override { return WV_SUCCESS; }
  HRESULT GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) override;
  HRESULT CreateSharedReceiveQueue(HANDLE file, SIZE_T max_wr, SIZE_T max_sge, SIZE_T limit,
                                   IWVSharedReceiveQueue** srq) override;
  HRESULT CreateConnectQueuePair(WV_QP_CREATE* create, IWVConnectQueuePair** qp) override;
  HRESULT RegisterMemory(const VOID* buffer, SIZE_T length, DWORD access, OVERLAPPED* overlapped,
                         WV_MEMORY_KEYS* keys) override;
  HRESULT DeregisterMemory(UINT32 lkey, OVERLAPPED* overlapped) override;
  HRESULT AllocateMemoryWindow(IWVMemoryWindow** mw) override;
  const std::shared_ptr<dev::ProtectionDomain>& pd() const { return pd_; }
  Device* device() const;

 private:
  ComRef<IWVDevice> device_;
  std::shared_ptr<dev::ProtectionDomain> pd_;
};

class Device final : public Unknown<IWVDevice, IID_IWVOverlapped, IID_IWVDevice> {
 public:
  explicit Device(dev::Device* device) : device_(device) {}
  HRESULT CancelOverlappedRequests() override { return WV_SUCCESS; }
  HRESULT GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) override;
  HRESULT Query(WV_DEVICE_ATTRIBUTES* attributes) override;
  HRESULT QueryPort(UINT8 port, WV_PORT_ATTRIBUTES* attributes) override;
  HRESULT CreateCompletionQueue(HANDLE file, SIZE_T* entries, IWVCompletionQueue** cq) override;
  HRESULT AllocateProtectionDomain(IWVProtectionDomain** pd) override;
  HRESULT QueryNotifyAffinity(USHORT* group, KAFFINITY* affinity) override;
  dev::Device* device() const { return device_; }
  static HRESULT Describe(dev::Device* device, WV_DEVICE_ATTRIBUTES* attributes);

 private:
  dev::Device* device_;
};

class ConnectEndpoint final
    : public Unknown<IWVConnectEndpoint, IID_IWVOverlapped, IID_IWVEndpoint, IID_IWVConnectEndpoint> {
 public:
  ConnectEndpoint(base::HandleRef file, std::shared_ptr<dev::ConnectEndpoint> endpoint);
  ~ConnectEndpoint() override;
  HRESULT CancelOverlappedRequests() override;
  HRESULT GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) override;
  HRESULT Modify(DWORD option, const VOID* data, SIZE_T length) override;
  HRESULT BindAddress(const sockaddr* address) override;
  HRESULT Listen(SIZE_T backlog) override;
  HRESULT Reject(const VOID* data, SIZE_T length) override;
  HRESULT GetRequest(IWVConnectEndpoint* endpoint, OVERLAPPED* overlapped) override;
  HRESULT Connect(IWVConnectQueuePair* qp, const sockaddr* address, WV_CONNECT_PARAM* param,
                  OVERLAPPED* overlapped) override;
  HRESULT Accept(IWVConnectQueuePair* qp, WV_CONNECT_PARAM* param, OVERLAPPED* overlapped) override;
  HRESULT Disconnect(OVERLAPPED* overlapped) override;
  HRESULT NotifyDisconnect(OVERLAPPED* overlapped) override;
  HRESULT Query(WV_CONNECT_ATTRIBUTES* attributes) override;
  const std::shared_ptr<dev::ConnectEndpoint>& endpoint() const { return endpoint_; }

 private:
  // Runs start() (a Connect or Accept) with `qp` claimed for this endpoint: WV_CONNECTION_ACTIVE
  // if another endpoint has it; `qp` is this endpoint's from then on unless start() was refused.
  template <class Start>
  HRESULT StartWithQueuePair(const std::shared_ptr<dev::QueuePair>& qp, Start start);
  // The request of a Connect or Accept with `qp` (CompleteConnect: null); see HandshakeOp.
  OverlappedOp* NewHandshakeOp(OVERLAPPED* overlapped, std::shared_ptr<dev::QueuePair> qp);

  base::HandleRef file_;
  std::shared_ptr<dev::ConnectEndpoint> endpoint_;
  std::atomic<bool> retryable_timeout_{false};
  const uint64_t claimant_;  // this endpoint, to the QPs it claims (dev::QueuePair::Claim)
  base::Mutex qp_mutex_{"wv::ConnectEndpoint::qp_mutex_"};
  // Given to Connect/Accept; Disconnect carries it down.
  std::shared_ptr<dev::QueuePair> qp_ NDWV_GUARDED_BY(qp_mutex_);
};

class Provider final : public Unknown<IWVProvider, IID_IWVProvider> {
 public:
  Provider();
  ~Provider() override;
  HANDLE GetFileHandle() override { return file_; }
  HRESULT QueryDeviceList(NET64* guids, SIZE_T* size) override;
  HRESULT QueryDevice(NET64 guid, WV_DEVICE_ATTRIBUTES* attributes) override;
  HRESULT TranslateAddress(const sockaddr* address, WV_DEVICE_ADDRESS* device_address) override;
  HRESULT OpenDevice(NET64 guid, IWVDevice** device) override;
  HRESULT CreateConnectEndpoint(HANDLE file, IWVConnectEndpoint** endpoint) override;

 private:
  HANDLE file_;
};

}  // namespace ndwv::wv
