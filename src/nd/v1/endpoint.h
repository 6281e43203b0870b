// INDEndpoint: a version 2 queue pair made by a connector (CreateEndpoint), with the SGE counts
// and read limits it was made with. Posting checks each request against them and turns version
// 1's SGEs (SIZE_T lengths, registrations named by ND_MR_HANDLE, NULL for inline bytes) into WV
// SGEs; the request's ND_RESULT* is its WV request id, which the CQ hands back.
#pragma once

#include "nd/v1/object.h"

namespace ndwv::nd {
class QueuePair;
class WvSges;
}

namespace ndwv::nd::v1 {

class Adapter;
class Connector;

class Endpoint final : public Object<Endpoint, INDEndpoint, IID_INDEndpoint> {
 public:
  // What CreateEndpoint fixed: SGE counts, read limits, and the inline bytes the QP granted.
  struct Limits {
    SIZE_T inboundSge = 0, outboundSge = 0;
    SIZE_T inboundReadLimit = 0, outboundReadLimit = 0;
    SIZE_T maxInline = 0;
  };

  Endpoint(Connector& connector, Ref<nd::QueuePair> qp, const Limits& limits);
  ~Endpoint() override;

  Adapter* adapter() const { return adapter_.get(); }
  Connector* connector() const { return connector_.get(); }
  nd::QueuePair& base() const { return *qp_; }
  const Limits& limits() const { return limits_; }
  // Whether the queue pair carries a connection (ready to send).
  bool Connected() const;

  // INDEndpoint
  HRESULT STDMETHODCALLTYPE Flush() override;
  void STDMETHODCALLTYPE StartRequestBatch() override {}
  void STDMETHODCALLTYPE SubmitRequestBatch() override {}
  HRESULT STDMETHODCALLTYPE Send(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                                 DWORD Flags) override;
  HRESULT STDMETHODCALLTYPE SendAndInvalidate(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                                              const ND_MW_DESCRIPTOR* pRemoteMwDescriptor,
                                              DWORD Flags) override;
  HRESULT STDMETHODCALLTYPE Receive(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge) override;
  HRESULT STDMETHODCALLTYPE Bind(ND_RESULT* pResult, ND_MR_HANDLE hMr, INDMemoryWindow* pMw,
                                 const void* pBuffer, SIZE_T BufferSize, DWORD Flags,
                                 ND_MW_DESCRIPTOR* pMwDescriptor) override;
  HRESULT STDMETHODCALLTYPE Invalidate(ND_RESULT* pResult, INDMemoryWindow* pMw,
                                       DWORD Flags) override;
  HRESULT STDMETHODCALLTYPE Read(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                                 const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, ULONGLONG Offset,
                                 DWORD Flags) override;
  HRESULT STDMETHODCALLTYPE Write(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                                  const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, ULONGLONG Offset,
                                  DWORD Flags) override;

 private:
  // What a list of SGEs is for. Outbound data (Send, Write) may be copied at post time
  // (inline); a Receive's buffers and a Read's sinks must be registered. A Read is an outbound
  // request: the outbound limits apply to its SGEs.
  enum class Use { Outbound, Receive, ReadSink };
  // Checks pSgl against the endpoint and converts it into `sgl`; *wvFlags gains WV_SEND_INLINE
  // when the bytes go inline.
  HRESULT Convert(const ND_SGE* pSgl, SIZE_T nSge, Use use, WvSges* sgl, DWORD* wvFlags) const;
  // The checks every outbound post shares before its own: ND_DEVICE_REMOVED, the ND_RESULT, the
  // flags (argument `flagsArg`, `allowed` bits).
  HRESULT CheckPost(const ND_RESULT* pResult, DWORD flags, DWORD allowed, int flagsArg) const;
  // Send and SendAndInvalidate (invalidate: the peer's R_Key to invalidate, else nullptr).
  HRESULT PostSend(ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge, DWORD flags,
                   const NET32* invalidate);
  // Read and Write.
  HRESULT PostRdma(bool read, ND_RESULT* pResult, const ND_SGE* pSgl, SIZE_T nSge,
                   const ND_MW_DESCRIPTOR* remote, ULONGLONG offset, DWORD flags);

  const Ref<Adapter> adapter_;
  const Ref<Connector> connector_;
  const Ref<nd::QueuePair> qp_;
  const Limits limits_;
  // Sends and Writes up to this many bytes go inline even from registered memory.
  const SIZE_T autoInline_;
};

}  // namespace ndwv::nd::v1
