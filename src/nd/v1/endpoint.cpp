#include "nd/v1/endpoint.h"

#include <endian.h>

#include <algorithm>
#include <limits>
#include <mutex>

#include "nd/adapter.h"
#include "nd/address.h"
#include "nd/memory_window.h"
#include "nd/queue_pair.h"
#include "nd/sges.h"
#include "nd/v1/adapter.h"
#include "nd/v1/connector.h"
#include "nd/v1/memory_window.h"

namespace ndwv::nd::v1 {

namespace {

constexpr DWORD kSendFlags =
    ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE | ND_OP_FLAG_SEND_AND_SOLICIT_EVENT;
constexpr DWORD kRdmaFlags = ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE;
constexpr DWORD kBindFlags = kRdmaFlags | ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE;

// A request id is the request's ND_RESULT.
UINT64 WrId(ND_RESULT* result) { return reinterpret_cast<UINT64>(result); }

}  // namespace

Endpoint::Endpoint(Connector& connector, Ref<nd::QueuePair> qp, const Limits& limits)
    : adapter_(connector.adapter()),
      connector_(&connector),
      qp_(std::move(qp)),
      limits_(limits),
      autoInline_(std::min<SIZE_T>(limits.maxInline,
                                   adapter_->base().info().InlineRequestThreshold)) {}

Endpoint::~Endpoint() { connector_->EndpointGone(); }

HRESULT Endpoint::Flush() { return qp_->Flush(); }

bool Endpoint::Connected() const {
  WV_QP_ATTRIBUTES attributes{};
  return SUCCEEDED(qp_->wv()->Query(&attributes)) && attributes.QpState == WvQpStateRts;
}

HRESULT Endpoint::Convert(const ND_SGE* pSgl, SIZE_T nSge, Use use, WvSges* sgl,
                          DWORD* wvFlags) const {
  const ND_ADAPTER_INFO1& info = adapter_->info();
  bool inbound = use == Use::Receive;
  if (nSge > (inbound ? limits_.inboundSge : limits_.outboundSge)) return ND_DATA_OVERRUN;
  if (pSgl == nullptr && nSge != 0) return ND_INVALID_PARAMETER_2;
  if (!sgl->ok()) return ND_NO_MEMORY;
  SIZE_T maxLength = inbound ? info.MaxInboundLength : info.MaxOutboundLength;
  SIZE_T total = 0;
  bool unregistered = false;
  WV_SGE* out = sgl->data();
  for (SIZE_T i = 0; i < nSge; ++i) {
    // Lengths are 32 bits on the wire: never truncated (D8).
    if (pSgl[i].Length > std::numeric_limits<UINT32>::max()) return ND_BUFFER_OVERFLOW;
    total += pSgl[i].Length;
    if (total > maxLength) return ND_BUFFER_OVERFLOW;
    UINT32 lkey = 0;
    if (pSgl[i].hMr == nullptr) {
      unregistered = unregistered || pSgl[i].Length != 0;
    } else if (!adapter_->registrations().Lkey(pSgl[i].hMr, &lkey)) {
      return ND_ACCESS_VIOLATION;  // no such registration (made up, or deregistered)
    }
    out[i] = {pSgl[i].pAddr, UINT32(pSgl[i].Length), lkey};
  }
  // Bytes outside any registration can only be copied at post time, and only outbound ones that
  // fit the endpoint's inline room (nd1-spi.md §3.4, #19).
  bool outbound = use == Use::Outbound;
  if (unregistered && (!outbound || total > limits_.maxInline)) return ND_ACCESS_VIOLATION;
  if (outbound && (unregistered || total <= autoInline_)) *wvFlags |= WV_SEND_INLINE;
  return ND_SUCCESS;
}

HRESULT Endpoint::CheckPost(const ND_RESULT* pResult, DWORD flags, DWORD allowed,
                            int flagsArg) const {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  if (pResult == nullptr) return ND_INVALID_PARAMETER_1;
  if (flags & ~allowed) return InvalidParameter(flagsArg);
  return ND_SUCCESS;
}

HRESULT Endpoint::PostSend(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge, DWORD flags,
                           const NET32* invalidate) {
  DWORD wvFlags = WvSendFlags(flags);
  WvSges sgl(nSge);
  if (HRESULT hr = Convert(pSgl, nSge, Use::Outbound, &sgl, &wvFlags); FAILED(hr)) return hr;
  NET32 immediate = 0;
  if (invalidate != nullptr) {
    wvFlags |= WV_SEND_INVALIDATE;
    immediate = *invalidate;
  }
  return NdStatus(qp_->wv()->Send(WrId(pResult), sgl.data(), nSge, wvFlags, immediate));
}

HRESULT Endpoint::Send(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge, DWORD Flags) {
  if (HRESULT hr = CheckPost(pResult, Flags, kSendFlags, 4); FAILED(hr)) return hr;
  return PostSend(pResult, pSgl, nSge, Flags, nullptr);
}

HRESULT Endpoint::SendAndInvalidate(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                                    const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, DWORD Flags) {
  if (HRESULT hr = CheckPost(pResult, Flags, kSendFlags, 5); FAILED(hr)) return hr;
  if (pRemoteMwDescriptor == nullptr) return ND_INVALID_PARAMETER_4;
  NET32 token = pRemoteMwDescriptor->Token;  // network order, as the peer's Bind wrote it
  return PostSend(pResult, pSgl, nSge, Flags, &token);
}

HRESULT Endpoint::Receive(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge) {
  if (HRESULT hr = CheckPost(pResult, 0, 0, 0); FAILED(hr)) return hr;
  DWORD unused = 0;
  WvSges sgl(nSge);
  if (HRESULT hr = Convert(pSgl, nSge, Use::Receive, &sgl, &unused); FAILED(hr)) return hr;
  return NdStatus(qp_->wv()->PostReceive(WrId(pResult), sgl.data(), nSge));
}

HRESULT Endpoint::PostRdma(bool read, ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                           const ND_MW_DESCRIPTOR* remote, ULONGLONG offset, DWORD flags) {
  if (HRESULT hr = CheckPost(pResult, flags, kRdmaFlags, 6); FAILED(hr)) return hr;
  if (remote == nullptr) return ND_INVALID_PARAMETER_4;
  DWORD wvFlags = WvSendFlags(flags);
  WvSges sgl(nSge);
  if (HRESULT hr = Convert(pSgl, nSge, read ? Use::ReadSink : Use::Outbound, &sgl, &wvFlags);
      FAILED(hr))
    return hr;
  // The target is Base + Offset of the peer's window; the peer checks it against the window
  // (its range and rights are the peer's to enforce, whatever the descriptor claims).
  UINT64 address = htobe64(be64toh(remote->Base) + offset);
  IWVConnectQueuePair* wv = qp_->wv();
  return NdStatus(read ? wv->Read(WrId(pResult), sgl.data(), nSge, wvFlags, address, remote->Token)
                       : wv->Write(WrId(pResult), sgl.data(), nSge, wvFlags, 0, address,
                                   remote->Token));
}

HRESULT Endpoint::Read(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                       const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, ULONGLONG Offset, DWORD Flags) {
  return PostRdma(true, pResult, pSgl, nSge, pRemoteMwDescriptor, Offset, Flags);
}

HRESULT Endpoint::Write(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                        const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, ULONGLONG Offset,
                        DWORD Flags) {
  return PostRdma(false, pResult, pSgl, nSge, pRemoteMwDescriptor, Offset, Flags);
}

HRESULT Endpoint::Bind(ND_RESULT* pResult, ND_MR_HANDLE hMr, INDMemoryWindow* pMw,
                       const void* pBuffer, SIZE_T BufferSize, DWORD Flags,
                       ND_MW_DESCRIPTOR* pMwDescriptor) {
  if (HRESULT hr = CheckPost(pResult, Flags, kBindFlags, 6); FAILED(hr)) return hr;
  Registrations::Region region;
  {
    base::MutexLock lock(adapter_->registrations().mutex());
    if (!adapter_->registrations().Find(hMr, &region)) return ND_INVALID_HANDLE;
  }
  MemoryWindow* mw = adapter_->Mine<MemoryWindow>(pMw);
  if (mw == nullptr) return ND_INVALID_PARAMETER_3;
  // The window lies inside the region: its start, then its end (nd1-spi.md §2.7).
  auto start = reinterpret_cast<uint64_t>(pBuffer);
  if (start < region.address || start - region.address > region.length)
    return ND_INVALID_PARAMETER_4;
  if (BufferSize > region.length - (start - region.address)) return ND_INVALID_PARAMETER_5;
  if (!(Flags & (ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE))) return ND_INVALID_PARAMETER_6;
  if (pMwDescriptor == nullptr) return ND_INVALID_PARAMETER_7;

  DWORD access = 0;
  if (Flags & ND_OP_FLAG_ALLOW_READ) access |= WV_ACCESS_REMOTE_READ;
  if (Flags & ND_OP_FLAG_ALLOW_WRITE) access |= WV_ACCESS_REMOTE_WRITE;
  NET32 rkey = 0;
  HRESULT hr = qp_->wv()->BindMemoryWindow(mw->base().wv(), WrId(pResult), region.lkey, access,
                                           WvSendFlags(Flags), pBuffer, BufferSize, &rkey);
  if (FAILED(hr)) return NdStatus(hr);
  mw->base().SetRemoteToken(rkey);
  // Written now, in the byte order the peer gets it in: valid once the bind has executed, which
  // the send queue's order guarantees for every request posted after it (nd1-spi.md §2.7).
  pMwDescriptor->Base = htobe64(start);
  pMwDescriptor->Length = htobe64(BufferSize);
  pMwDescriptor->Token = rkey;  // WV keeps it in network order
  return NdStatus(hr);
}

HRESULT Endpoint::Invalidate(ND_RESULT* pResult, INDMemoryWindow* pMw, DWORD Flags) {
  if (HRESULT hr = CheckPost(pResult, Flags, kRdmaFlags, 3); FAILED(hr)) return hr;
  MemoryWindow* mw = adapter_->Mine<MemoryWindow>(pMw);
  if (mw == nullptr) return ND_INVALID_PARAMETER_2;
  return NdStatus(
      qp_->wv()->InvalidateMemoryWindow(mw->base().wv(), WrId(pResult), WvSendFlags(Flags)));
}

}  // namespace ndwv::nd::v1
