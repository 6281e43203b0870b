// IWVConnectQueuePair: posting goes straight to the device QP on the caller's thread.
#include <arpa/inet.h>
#include <endian.h>

#include <cstring>

#include "wv/objects.h"

namespace ndwv::wv {

namespace {
constexpr DWORD kSendFlags = WV_SEND_FENCE | WV_SEND_SIGNALED | WV_SEND_SOLICITED | WV_SEND_INLINE;
static_assert(WV_SEND_FENCE == dev::kFence && WV_SEND_SIGNALED == dev::kSignaled &&
              WV_SEND_SOLICITED == dev::kSolicited && WV_SEND_INLINE == dev::kInline &&
              WV_SEND_INVALIDATE == dev::kInvalidate);

dev::QpState ToDevice(WV_QP_STATE state) { return dev::QpState(int(state)); }
}  // namespace

ConnectQueuePair::ConnectQueuePair(ProtectionDomain* pd, const WV_QP_CREATE& create,
                                   std::shared_ptr<dev::QueuePair> qp)
    : pd_(pd),
      send_cq_(create.pSendCq),
      recv_cq_(create.pReceiveCq),
      srq_(create.pSharedReceiveQueue),
      qp_(std::move(qp)) {}

ConnectQueuePair::~ConnectQueuePair() {
  // Released without a Disconnect: the connection ends and every request is flushed.
  qp_->Modify(dev::QpState::Error);
}

HRESULT ConnectQueuePair::CancelOverlappedRequests() { return WV_SUCCESS; }

HRESULT ConnectQueuePair::GetOverlappedResult(OVERLAPPED* overlapped, DWORD* bytes, BOOL wait) {
  return WaitResult(overlapped, bytes, wait);
}

HRESULT ConnectQueuePair::Query(WV_QP_ATTRIBUTES* attributes) {
  if (!attributes) return WV_INVALID_PARAMETER;
  const dev::QpCaps& caps = qp_->caps();
  *attributes = {};
  attributes->pSendCq = send_cq_.get();
  attributes->pReceiveCq = recv_cq_.get();
  attributes->pSharedReceiveQueue = srq_.get();
  attributes->SendDepth = caps.send_depth;
  attributes->SendSge = caps.send_sge;
  attributes->ReceiveDepth = caps.recv_depth;
  attributes->ReceiveSge = caps.recv_sge;
  attributes->MaxInlineSend = caps.max_inline;
  attributes->QpType = WvQpTypeRc;
  attributes->CurrentQpState = attributes->QpState = WV_QP_STATE(int(qp_->state()));
  attributes->Qpn = htonl(qp_->qpn());
  return WV_SUCCESS;
}

HRESULT ConnectQueuePair::Modify(WV_QP_ATTRIBUTES* attributes, DWORD options, OVERLAPPED*) {
  if (!attributes) return WV_INVALID_PARAMETER;
  if (!(options & WV_QP_ATTR_STATE)) return WV_SUCCESS;
  return qp_->Modify(ToDevice(attributes->QpState));
}

HRESULT ConnectQueuePair::PostReceive(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge) {
  if (num_sge > dev::kMaxSge) return WV_DATA_OVERRUN;
  dev::Sge sge[dev::kMaxSge];
  for (SIZE_T i = 0; i < num_sge; ++i)
    sge[i] = {reinterpret_cast<uint64_t>(sgl[i].pAddress), sgl[i].Length, sgl[i].Lkey};
  return qp_->PostReceive(wr_id, sge, uint32_t(num_sge));
}

HRESULT ConnectQueuePair::PostSend(WV_SEND_REQUEST*, WV_SEND_REQUEST**) { return WV_NOT_SUPPORTED; }

HRESULT ConnectQueuePair::Post(dev::WrOpcode opcode, UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags,
                               uint64_t remote_address, uint32_t rkey, uint32_t device_flags) {
  if (flags & ~kSendFlags) return WV_INVALID_PARAMETER;
  if (num_sge > dev::kMaxSge && !(flags & WV_SEND_INLINE)) return WV_DATA_OVERRUN;
  dev::SendWqe wqe;  // only the fields PostSend reads are set
  wqe.wr_id = wr_id;
  wqe.opcode = opcode;
  wqe.flags = flags | device_flags;
  wqe.num_sge = uint32_t(num_sge);
  wqe.length = 0;
  wqe.remote_addr = remote_address;
  wqe.rkey = rkey;
  if (num_sge > dev::kMaxSge) return WV_DATA_OVERRUN;
  for (SIZE_T i = 0; i < num_sge; ++i) {
    wqe.sge[i] = {reinterpret_cast<uint64_t>(sgl[i].pAddress), sgl[i].Length, sgl[i].Lkey};
    wqe.length += sgl[i].Length;
  }
  return qp_->PostSend(wqe);
}

HRESULT ConnectQueuePair::Send(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags, NET32 immediate) {
  // With Invalidate, the immediate word is the peer's R_Key to invalidate (ImmediateData proper
  // is not offered).
  if (!(flags & WV_SEND_INVALIDATE)) return Post(dev::WrOpcode::Send, wr_id, sgl, num_sge, flags, 0, 0);
  return Post(dev::WrOpcode::Send, wr_id, sgl, num_sge, flags & ~WV_SEND_INVALIDATE, 0, ntohl(immediate),
              dev::kInvalidate);
}

HRESULT ConnectQueuePair::Read(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags, NET64 address,
                               NET32 rkey) {
  if (flags & WV_SEND_INLINE) return WV_INVALID_PARAMETER;
  return Post(dev::WrOpcode::Read, wr_id, sgl, num_sge, flags, be64toh(address), ntohl(rkey));
}

HRESULT ConnectQueuePair::Write(UINT64 wr_id, WV_SGE* sgl, SIZE_T num_sge, DWORD flags, NET32,
                                NET64 address, NET32 rkey) {
  return Post(dev::WrOpcode::Write, wr_id, sgl, num_sge, flags, be64toh(address), ntohl(rkey));
}

HRESULT ConnectQueuePair::BindMemoryWindow(IWVMemoryWindow* mw, UINT64 wr_id, UINT32 lkey, DWORD access,
                                           DWORD flags, const VOID* buffer, SIZE_T length, NET32* rkey) {
  auto* window = dynamic_cast<MemoryWindow*>(mw);
  if (!window || !rkey) return WV_INVALID_PARAMETER;
  dev::QpState state = qp_->state();
  if (state != dev::QpState::Rts && state != dev::QpState::Sqd) return WV_CONNECTION_INVALID;
  // The new key is valid when the call returns; the request then completes in order.
  uint32_t key;
  dev::KeyCheck check = qp_->pd().BindWindow(window->window().get(), qp_->qpn(), lkey,
                                             reinterpret_cast<uint64_t>(buffer), length,
                                             access & (dev::kRemoteRead | dev::kRemoteWrite), &key);
  if (check != dev::KeyCheck::Ok) return WV_ACCESS_VIOLATION;
  *rkey = htonl(key);
  dev::SendWqe wqe;
  wqe.wr_id = wr_id;
  wqe.opcode = dev::WrOpcode::Bind;
  wqe.flags = flags & kSendFlags & ~WV_SEND_INLINE;
  wqe.num_sge = 0;
  wqe.length = 0;
  wqe.window = window->window();
  return qp_->PostSend(wqe);
}

HRESULT ConnectQueuePair::InvalidateMemoryWindow(IWVMemoryWindow* mw, UINT64 wr_id, DWORD flags) {
  auto* window = dynamic_cast<MemoryWindow*>(mw);
  if (!window) return WV_INVALID_PARAMETER;
  dev::QpState state = qp_->state();
  if (state != dev::QpState::Rts && state != dev::QpState::Sqd) return WV_CONNECTION_INVALID;
  dev::SendWqe wqe;
  wqe.wr_id = wr_id;
  wqe.opcode = dev::WrOpcode::Invalidate;
  wqe.flags = flags & kSendFlags & ~WV_SEND_INLINE;
  wqe.num_sge = 0;
  wqe.length = 0;
  wqe.window = window->window();
  return qp_->PostSend(wqe);  // which unbinds the window (dev::QueuePair::PostSend)
}

}  // namespace ndwv::wv
