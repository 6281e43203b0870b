#include "nd/completion_queue.h"

#include "nd/adapter.h"

namespace ndwv::nd {

namespace {

ND2_REQUEST_TYPE RequestType(WV_WC_OPCODE opcode) {
  switch (opcode) {
    case WvSend: return Nd2RequestTypeSend;
    case WvRdmaWrite: return Nd2RequestTypeWrite;
    case WvRdmaRead: return Nd2RequestTypeRead;
    case WvBindWindow: return Nd2RequestTypeBind;
    case WvInvalidateWindow: return Nd2RequestTypeInvalidate;
    default: return Nd2RequestTypeReceive;  // WvReceive, WvReceiveRdmaWrite
  }
}

}  // namespace

HRESULT CompletionStatus(WV_WC_STATUS status) {
  switch (status) {
    case WvWcSuccess: return ND_SUCCESS;
    case WvWcFlushed: return ND_CANCELED;
    case WvWcLocalProtectionError:
    case WvWcRemoteAccessError:
    case WvWcMwBindError:
    case WvWcLocalAccessError: return ND_ACCESS_VIOLATION;
    case WvWcLocalLengthError: return ND_DATA_OVERRUN;  // our receive was too small
    case WvWcRnrRetryError:
    case WvWcTimeoutRetryError: return ND_IO_TIMEOUT;
    case WvWcRemoteInvalidRequest: return STATUS_DATA_ERROR;  // the peer's receive was too small
    case WvWcRemoteOpError: return ND_REMOTE_ERROR;
    case WvWcLocalOpError: return ND_INVALID_DEVICE_REQUEST;  // e.g. Invalidate of an unbound window
    default: return ND_INTERNAL_ERROR;  // BadResponse, Error
  }
}

ND2_RESULT ToNdResult(const WV_COMPLETION& completion) {
  ND2_RESULT result{};
  result.Status = CompletionStatus(completion.Status);
  result.BytesTransferred = completion.Length;
  result.QueuePairContext = completion.QpContext;
  result.RequestContext = reinterpret_cast<void*>(completion.WrId);
  result.RequestType = RequestType(completion.Opcode);
  return result;
}

HRESULT ReportNotifyAffinity(const Adapter& adapter, USHORT* pGroup, KAFFINITY* pAffinity) {
  if (pGroup == nullptr || pAffinity == nullptr) return ND_INVALID_PARAMETER;
  return NdStatus(adapter.device()->QueryNotifyAffinity(pGroup, pAffinity));
}

CompletionQueue::CompletionQueue(Adapter& adapter, base::HandleRef file,
                                 ComPtr<IWVCompletionQueue> cq)
    : adapter_(&adapter), file_(std::move(file)), cq_(std::move(cq)) {}

HRESULT CompletionQueue::GetNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) {
  return ReportNotifyAffinity(*adapter_, pGroup, pAffinity);
}

HRESULT CompletionQueue::Resize(ULONG queueDepth) {
  const ND2_ADAPTER_INFO& info = adapter_->info();
  if (!(info.AdapterFlags & ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED)) return ND_NOT_SUPPORTED;
  if (queueDepth == 0 || queueDepth > info.MaxCompletionQueueDepth) return ND_INVALID_PARAMETER;
  SIZE_T entries = queueDepth;
  return NdStatus(cq_->Resize(&entries));
}

HRESULT CompletionQueue::Notify(ULONG type, OVERLAPPED* pOverlapped) {
  WV_CQ_NOTIFY_TYPE wvType;
  switch (type) {
    case ND_CQ_NOTIFY_ERRORS: wvType = WvCqError; break;
    case ND_CQ_NOTIFY_ANY: wvType = WvCqNextCompletion; break;
    case ND_CQ_NOTIFY_SOLICITED: wvType = WvCqSolicited; break;
    default: return ND_INVALID_PARAMETER_1;
  }
  return NdStatus(cq_->Notify(wvType, pOverlapped));
}

ULONG CompletionQueue::GetResults(ND2_RESULT results[], ULONG nResults) {
  if (results == nullptr) return 0;  // nowhere to put them: none taken (the SPI names no error)
  return PollCompletions(cq_.get(), results, nResults,
                         [](const WV_COMPLETION& c) { return ToNdResult(c); });
}

}  // namespace ndwv::nd
