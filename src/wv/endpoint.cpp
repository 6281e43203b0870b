// IWVConnectEndpoint: connection requests become device CM requests. The endpoint remembers the
// QP given to Connect/Accept and hands both down in one Disconnect request.
#include <cstring>

#include "wv/objects.h"

namespace ndwv::wv {

namespace {

dev::ConnectParams ToDevice(const WV_CONNECT_PARAM* param) {
  dev::ConnectParams p;
  if (!param) return p;
  p.ird = param->ResponderResources;
  p.ord = param->InitiatorDepth;
  p.data_length = uint32_t(std::min<SIZE_T>(param->DataLength, sizeof p.data));
  memcpy(p.data, param->Data, p.data_length);
  return p;
}

// A Connect, Accept or CompleteConnect in flight. One that fails gives its QP back before the
// caller hears of it (nd2-spi: "on failure the QP is left as it was"), so another connector may
// connect it; its own connector keeps it for a retry (Claim again). With
// WV_EP_OPTION_RETRYABLE_TIMEOUT a timeout completes WV_TIMEOUT, "try again" (ND v1's rule).
class HandshakeOp final : public OverlappedOp {
 public:
  HandshakeOp(const base::HandleRef& file, OVERLAPPED* overlapped, bool retryable,
              std::shared_ptr<dev::QueuePair> qp, uint64_t claimant)
      : OverlappedOp(file, overlapped), retryable_(retryable), qp_(std::move(qp)), claimant_(claimant) {}
  void Complete(int32_t status) override {
    if (retryable_ && status == WV_IO_TIMEOUT) status = WV_TIMEOUT;
    if (qp_ && FAILED(status)) qp_->Unclaim(claimant_);
    OverlappedOp::Complete(status);
  }

 private:
  const bool retryable_;
  const std::shared_ptr<dev::QueuePair> qp_;  // null for CompleteConnect: its QP stays claimed
  const uint64_t claimant_;
};

// A QP's claimant for each endpoint: never 0, never used twice.
uint64_t NewClaimant() {
  static std::atomic<uint64_t> last{0};
  return last.fetch_add(1, std::memory_order_relaxed) + 1;
}

// One Disconnect in flight: the device's two-phase request and the OVERLAPPED it completes.
class DisconnectOp final : public OverlappedOp {
 public:
  DisconnectOp(const base::HandleRef& file, OVERLAPPED* overlapped, std::shared_ptr<dev::QueuePair> qp)
      : OverlappedOp(file, overlapped) {
    request.qp = std::move(qp);
    request.op = this;
  }
  dev::DisconnectRequest request;
};

}  // namespace

ConnectEndpoint::ConnectEndpoint(base::HandleRef file, std::shared_ptr<dev::ConnectEndpoint> endpoint)
    : file_(std::move(file)), endpoint_(std::move(endpoint)), claimant_(NewClaimant()) {}

ConnectEndpoint::~ConnectEndpoint() {
  endpoint_->Close();
  if (qp_) qp_->Unclaim(claimant_);
}

template <class Start>
HRESULT ConnectEndpoint::StartWithQueuePair(const std::shared_ptr<dev::QueuePair>& qp, Start start) {
  // A QP connects through one endpoint at a time (another's Connect or Accept with it is refused).
  if (!qp->Claim(claimant_)) return WV_CONNECTION_ACTIVE;
  std::shared_ptr<dev::QueuePair> previous;
  {
    base::MutexLock lock(qp_mutex_);
    previous = std::exchange(qp_, qp);
  }
  const HRESULT hr = start();
  if (SUCCEEDED(hr) || hr == WV_IO_PENDING) {
    if (previous && previous != qp) previous->Unclaim(claimant_);  // a retry with another QP frees the first
    return hr;
  }
  // Refused (this endpoint already connecting, say): it keeps the QP it had, and the one it was
  // given is left as it was (nd2-spi: on failure the QP is left as it was).
  {
    base::MutexLock lock(qp_mutex_);
    qp_ = previous;
  }
  if (previous != qp) qp->Unclaim(claimant_);
  return hr;
}

HRESULT ConnectEndpoint::CancelOverlappedRequests() {
  endpoint_->CancelRequests();
  return WV_SUCCESS;
}

HRESULT ConnectEndpoint::GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  return WaitResult(overlapped, bytes, wait);
}

HRESULT ConnectEndpoint::Modify(DWORD option, const VOID* data, SIZE_T length) {
  switch (option) {
    case WV_EP_OPTION_PROTOCOL:
      if (data == nullptr || length != sizeof(UINT8)) return WV_INVALID_PARAMETER;
      endpoint_->SetProtocol(*static_cast<const UINT8*>(data));
      return WV_SUCCESS;
    case WV_EP_OPTION_RETRYABLE_TIMEOUT:
      retryable_timeout_.store(true);
      return WV_SUCCESS;
    default:
      return WV_NOT_SUPPORTED;
  }
}

OverlappedOp* ConnectEndpoint::NewHandshakeOp(OVERLAPPED* overlapped, std::shared_ptr<dev::QueuePair> qp) {
  return new HandshakeOp(file_, overlapped, retryable_timeout_.load(), std::move(qp), claimant_);
}

HRESULT ConnectEndpoint::BindAddress(const sockaddr* address) {
  if (!address) return WV_INVALID_PARAMETER;
  socklen_t length = address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  return endpoint_->Bind(address, length);
}

HRESULT ConnectEndpoint::Listen(SIZE_T backlog) { return endpoint_->Listen(int(std::min<SIZE_T>(backlog, 1 << 16))); }

HRESULT ConnectEndpoint::Reject(const VOID* data, SIZE_T length) { return endpoint_->Reject(data, length); }

HRESULT ConnectEndpoint::GetRequest(IWVConnectEndpoint* endpoint, OVERLAPPED* overlapped) {
  auto* target = dynamic_cast<ConnectEndpoint*>(endpoint);
  if (!target || !overlapped) return WV_INVALID_PARAMETER;
  return StartOverlapped(new OverlappedOp(file_, overlapped),
                         [&](OverlappedOp* op) { return endpoint_->GetRequest(target->endpoint_, op); });
}

HRESULT ConnectEndpoint::Connect(IWVConnectQueuePair* qp, const sockaddr* address, WV_CONNECT_PARAM* param,
                                 OVERLAPPED* overlapped) {
  auto* pair = dynamic_cast<ConnectQueuePair*>(qp);
  if (!pair || !address || !overlapped) return WV_INVALID_PARAMETER;
  socklen_t length = address->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  return StartWithQueuePair(pair->qp(), [&] {
    return StartOverlapped(NewHandshakeOp(overlapped, pair->qp()), [&](OverlappedOp* op) {
      return endpoint_->Connect(pair->qp(), address, length, ToDevice(param), op);
    });
  });
}

HRESULT ConnectEndpoint::Accept(IWVConnectQueuePair* qp, WV_CONNECT_PARAM* param, OVERLAPPED* overlapped) {
  if (!overlapped) return WV_INVALID_PARAMETER;
  std::shared_ptr<dev::QueuePair> device_qp;
  auto start = [&] {
    return StartOverlapped(NewHandshakeOp(overlapped, device_qp),
                           [&](OverlappedOp* op) { return endpoint_->Accept(device_qp, ToDevice(param), op); });
  };
  if (!qp) return start();  // the active side's CompleteConnect
  auto* pair = dynamic_cast<ConnectQueuePair*>(qp);
  if (!pair) return WV_INVALID_PARAMETER;
  device_qp = pair->qp();
  return StartWithQueuePair(device_qp, start);
}

HRESULT ConnectEndpoint::Disconnect(OVERLAPPED* overlapped) {
  if (!overlapped) return WV_INVALID_PARAMETER;
  std::shared_ptr<dev::QueuePair> qp;
  {
    base::MutexLock lock(qp_mutex_);
    qp = qp_;
  }
  // A QP given back by a failed Connect or Accept is flushed only while no other endpoint took it.
  if (qp && !qp->Claim(claimant_)) qp = nullptr;
  auto* op = new DisconnectOp(file_, overlapped, std::move(qp));
  int32_t status = endpoint_->Disconnect(&op->request);
  if (status == WV_PENDING) return WV_IO_PENDING;
  delete op;
  return status;
}

HRESULT ConnectEndpoint::NotifyDisconnect(OVERLAPPED* overlapped) {
  if (!overlapped) return WV_INVALID_PARAMETER;
  return StartOverlapped(new OverlappedOp(file_, overlapped),
                         [&](OverlappedOp* op) { return endpoint_->NotifyDisconnect(op); });
}

HRESULT ConnectEndpoint::Query(WV_CONNECT_ATTRIBUTES* attributes) {
  if (!attributes) return WV_INVALID_PARAMETER;
  dev::ConnectionInfo info;
  int32_t status = endpoint_->Query(&info);
  if (status != WV_SUCCESS) return status;
  *attributes = {};
  memcpy(&attributes->LocalAddress, &info.local, sizeof attributes->LocalAddress);
  memcpy(&attributes->PeerAddress, &info.peer, sizeof attributes->PeerAddress);
  attributes->PeerParamReceived = info.peer_heard;
  attributes->Param.DataLength = info.peer_params.data_length;
  attributes->Param.ResponderResources = info.peer_params.ird;
  attributes->Param.InitiatorDepth = info.peer_params.ord;
  memcpy(attributes->Param.Data, info.peer_params.data, info.peer_params.data_length);
  return WV_SUCCESS;
}

}  // namespace ndwv::wv
