// The NetworkDirect v2 service provider interface: interfaces, IIDs, structures and constants.
// Methods are declared in the SPI's vtable order; sizes and offsets match the 64-bit Windows
// layout (checked below).
#pragma once

#include "ndwv/ndstatus.h"
#include "ndwv/win32.h"

// ---- Versions -----------------------------------------------------------------------------------

#define ND_VERSION_1 0x1
#define ND_VERSION_2 0x20000
#ifndef NDVER
#define NDVER ND_VERSION_2
#endif

// ---- ND2_ADAPTER_INFO.AdapterFlags --------------------------------------------------------------

#define ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED 0x00000001
#define ND_ADAPTER_FLAG_CQ_INTERRUPT_MODERATION_SUPPORTED 0x00000004
#define ND_ADAPTER_FLAG_MULTI_ENGINE_SUPPORTED 0x00000008
#define ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED 0x00000100
#define ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED 0x00010000

// ---- IND2CompletionQueue::Notify types ----------------------------------------------------------

#define ND_CQ_NOTIFY_ERRORS 0
#define ND_CQ_NOTIFY_ANY 1
#define ND_CQ_NOTIFY_SOLICITED 2

// ---- IND2MemoryRegion::Register flags (remote access implies local access) ----------------------

#define ND_MR_FLAG_ALLOW_LOCAL_WRITE 0x00000001
#define ND_MR_FLAG_ALLOW_REMOTE_READ 0x00000002
#define ND_MR_FLAG_ALLOW_REMOTE_WRITE 0x00000005
#define ND_MR_FLAG_RDMA_READ_SINK 0x00000008
#define ND_MR_FLAG_DO_NOT_SECURE_VM 0x80000000

// ---- Queue pair operation flags -----------------------------------------------------------------

#define ND_OP_FLAG_SILENT_SUCCESS 0x00000001
#define ND_OP_FLAG_READ_FENCE 0x00000002
#define ND_OP_FLAG_SEND_AND_SOLICIT_EVENT 0x00000004
#define ND_OP_FLAG_ALLOW_READ 0x00000008
#define ND_OP_FLAG_ALLOW_WRITE 0x00000010
#define ND_OP_FLAG_INLINE 0x00000020

// ---- NdQueryAddressList flags -------------------------------------------------------------------

#define ND_QUERY_EXCLUDE_EMULATOR_ADDRESSES 0x00000001
#define ND_QUERY_EXCLUDE_NDv1_ADDRESSES 0x00000002
#define ND_QUERY_EXCLUDE_NDv2_ADDRESSES 0x00000004

// ---- Structures ---------------------------------------------------------------------------------

enum ND2_REQUEST_TYPE {
  Nd2RequestTypeReceive,
  Nd2RequestTypeSend,
  Nd2RequestTypeBind,
  Nd2RequestTypeInvalidate,
  Nd2RequestTypeRead,
  Nd2RequestTypeWrite
};

struct ND2_ADAPTER_INFO {
  ULONG InfoVersion;
  UINT16 VendorId;
  UINT16 DeviceId;
  UINT64 AdapterId;
  SIZE_T MaxRegistrationSize;
  SIZE_T MaxWindowSize;
  ULONG MaxInitiatorSge;
  ULONG MaxReceiveSge;
  ULONG MaxReadSge;
  ULONG MaxTransferLength;
  ULONG MaxInlineDataSize;
  ULONG MaxInboundReadLimit;
  ULONG MaxOutboundReadLimit;
  ULONG MaxReceiveQueueDepth;
  ULONG MaxInitiatorQueueDepth;
  ULONG MaxSharedReceiveQueueDepth;
  ULONG MaxCompletionQueueDepth;
  ULONG InlineRequestThreshold;
  ULONG LargeRequestThreshold;
  ULONG MaxCallerData;
  ULONG MaxCalleeData;
  ULONG AdapterFlags;
};

// ND2_ADAPTER_INFO as a 32-bit caller sees it: the two sizes are ULONG (clamped to 0xFFFFFFFF).
struct ND2_ADAPTER_INFO32 {
  ULONG InfoVersion;
  UINT16 VendorId;
  UINT16 DeviceId;
  UINT64 AdapterId;
  ULONG MaxRegistrationSize;
  ULONG MaxWindowSize;
  ULONG MaxInitiatorSge;
  ULONG MaxReceiveSge;
  ULONG MaxReadSge;
  ULONG MaxTransferLength;
  ULONG MaxInlineDataSize;
  ULONG MaxInboundReadLimit;
  ULONG MaxOutboundReadLimit;
  ULONG MaxReceiveQueueDepth;
  ULONG MaxInitiatorQueueDepth;
  ULONG MaxSharedReceiveQueueDepth;
  ULONG MaxCompletionQueueDepth;
  ULONG InlineRequestThreshold;
  ULONG LargeRequestThreshold;
  ULONG MaxCallerData;
  ULONG MaxCalleeData;
  ULONG AdapterFlags;
};

struct ND2_RESULT {
  HRESULT Status;
  ULONG BytesTransferred;  // meaningful for receives only
  void* QueuePairContext;  // the context given when the queue pair was created
  void* RequestContext;    // the context given with the request
  ND2_REQUEST_TYPE RequestType;
};

struct ND2_SGE {
  void* Buffer;
  ULONG BufferLength;
  UINT32 MemoryRegionToken;
};

static_assert(sizeof(ND2_REQUEST_TYPE) == 4);

static_assert(sizeof(ND2_ADAPTER_INFO) == 96);
static_assert(offsetof(ND2_ADAPTER_INFO, InfoVersion) == 0);
static_assert(offsetof(ND2_ADAPTER_INFO, VendorId) == 4);
static_assert(offsetof(ND2_ADAPTER_INFO, DeviceId) == 6);
static_assert(offsetof(ND2_ADAPTER_INFO, AdapterId) == 8);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxRegistrationSize) == 16);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxWindowSize) == 24);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxInitiatorSge) == 32);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxReceiveSge) == 36);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxReadSge) == 40);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxTransferLength) == 44);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxInlineDataSize) == 48);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxInboundReadLimit) == 52);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxOutboundReadLimit) == 56);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxReceiveQueueDepth) == 60);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxInitiatorQueueDepth) == 64);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxSharedReceiveQueueDepth) == 68);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxCompletionQueueDepth) == 72);
static_assert(offsetof(ND2_ADAPTER_INFO, InlineRequestThreshold) == 76);
static_assert(offsetof(ND2_ADAPTER_INFO, LargeRequestThreshold) == 80);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxCallerData) == 84);
static_assert(offsetof(ND2_ADAPTER_INFO, MaxCalleeData) == 88);
static_assert(offsetof(ND2_ADAPTER_INFO, AdapterFlags) == 92);

static_assert(sizeof(ND2_ADAPTER_INFO32) == 88);
static_assert(offsetof(ND2_ADAPTER_INFO32, MaxRegistrationSize) == 16);
static_assert(offsetof(ND2_ADAPTER_INFO32, MaxWindowSize) == 20);
static_assert(offsetof(ND2_ADAPTER_INFO32, MaxInitiatorSge) == 24);
static_assert(offsetof(ND2_ADAPTER_INFO32, AdapterFlags) == 84);

static_assert(sizeof(ND2_RESULT) == 32);
static_assert(offsetof(ND2_RESULT, Status) == 0);
static_assert(offsetof(ND2_RESULT, BytesTransferred) == 4);
static_assert(offsetof(ND2_RESULT, QueuePairContext) == 8);
static_assert(offsetof(ND2_RESULT, RequestContext) == 16);
static_assert(offsetof(ND2_RESULT, RequestType) == 24);

static_assert(sizeof(ND2_SGE) == 16);
static_assert(offsetof(ND2_SGE, Buffer) == 0);
static_assert(offsetof(ND2_SGE, BufferLength) == 8);
static_assert(offsetof(ND2_SGE, MemoryRegionToken) == 12);

// ---- Interface IDs ------------------------------------------------------------------------------

inline constexpr IID IID_IND2Overlapped = {
    0xABF72719, 0xB016, 0x4A40, {0xA6, 0xF7, 0x62, 0x27, 0x91, 0xA7, 0x04, 0x4C}};
inline constexpr IID IID_IND2CompletionQueue = {
    0x20CC445E, 0x64A0, 0x4CBB, {0xAA, 0x75, 0xF6, 0xA7, 0x25, 0x1F, 0xDA, 0x9E}};
inline constexpr IID IID_IND2SharedReceiveQueue = {
    0xAABD67DC, 0x459A, 0x4DB1, {0x82, 0x6B, 0x56, 0xCF, 0xCC, 0x27, 0x88, 0x83}};
inline constexpr IID IID_IND2MemoryWindow = {
    0x070FE1F5, 0x0AB5, 0x4361, {0x88, 0xDB, 0x97, 0x4B, 0xA7, 0x04, 0xD4, 0xB9}};
inline constexpr IID IID_IND2MemoryRegion = {
    0x55DFEA2F, 0xBC56, 0x4982, {0x8A, 0x45, 0x03, 0x01, 0xBE, 0x46, 0xC4, 0x13}};
inline constexpr IID IID_IND2QueuePair = {
    0xEEF2F332, 0xB75D, 0x4063, {0xBC, 0xE3, 0x3A, 0x0B, 0xAD, 0x2D, 0x02, 0xCE}};
inline constexpr IID IID_IND2Connector = {
    0x7DD615C4, 0x6B4C, 0x4866, {0x95, 0x0C, 0xF3, 0xB1, 0xD2, 0x5A, 0x53, 0x02}};
inline constexpr IID IID_IND2Listener = {
    0x65D23D83, 0x3A57, 0x4E02, {0x86, 0xA4, 0x35, 0x01, 0x65, 0xC2, 0xD1, 0x30}};
inline constexpr IID IID_IND2Adapter = {
    0xD89C798C, 0x4823, 0x4D69, {0x84, 0x6C, 0xDF, 0xDC, 0xCF, 0xF9, 0xE5, 0xF3}};
inline constexpr IID IID_IND2Provider = {
    0x49EAE6C1, 0x76C4, 0x46D0, {0x80, 0x03, 0x5C, 0x2E, 0xAA, 0x2C, 0x9A, 0x8E}};

// Version 1 IIDs: ND2 code passes IID_INDAdapter to NdOpenAdapter to ask for a v1 adapter.
inline constexpr IID IID_INDOverlapped = {
    0xC859E15E, 0x75E2, 0x4FE3, {0x8D, 0x6D, 0x0D, 0xFF, 0x36, 0xF0, 0x24, 0x42}};
inline constexpr IID IID_INDCompletionQueue = {
    0x1245A633, 0x2A32, 0x473A, {0x83, 0x0C, 0xE0, 0x5D, 0x1F, 0x86, 0x9D, 0x02}};
inline constexpr IID IID_INDEndpoint = {
    0xDBD00EAB, 0xB679, 0x44A9, {0xBD, 0x65, 0xE8, 0x2F, 0x3D, 0xE1, 0x2D, 0x1A}};
inline constexpr IID IID_INDConnector = {
    0x1BCAF2D1, 0xE274, 0x4AEB, {0xAC, 0x57, 0xCD, 0x5D, 0x43, 0x76, 0xE0, 0xB7}};
inline constexpr IID IID_INDListen = {
    0xBB902588, 0xBA3F, 0x4441, {0x9F, 0xE1, 0x3B, 0x67, 0x95, 0xE4, 0xE6, 0x68}};
inline constexpr IID IID_INDAdapter = {
    0xA023C5A0, 0x5B73, 0x43BC, {0x8D, 0x20, 0x33, 0xAA, 0x07, 0xE9, 0x51, 0x0F}};
inline constexpr IID IID_INDProvider = {
    0x0C5DD316, 0x5FDF, 0x47E6, {0xB2, 0xD0, 0x2A, 0x6E, 0xDA, 0x8D, 0x39, 0xDD}};
inline constexpr IID IID_INDMemoryWindow = IID_IND2MemoryWindow;  // same GUID in both versions

// ---- Interfaces ---------------------------------------------------------------------------------
// Destructors are protected: objects are destroyed by their last Release(), never by delete.

struct IND2Overlapped : public IUnknown {
  virtual HRESULT STDMETHODCALLTYPE CancelOverlappedRequests() = 0;
  virtual HRESULT STDMETHODCALLTYPE GetOverlappedResult(OVERLAPPED* pOverlapped, BOOL bWait) = 0;

 protected:
  ~IND2Overlapped() = default;
};

struct IND2CompletionQueue : public IND2Overlapped {
  virtual HRESULT STDMETHODCALLTYPE GetNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) = 0;
  virtual HRESULT STDMETHODCALLTYPE Resize(ULONG queueDepth) = 0;
  virtual HRESULT STDMETHODCALLTYPE Notify(ULONG type, OVERLAPPED* pOverlapped) = 0;
  virtual ULONG STDMETHODCALLTYPE GetResults(ND2_RESULT results[], ULONG nResults) = 0;

 protected:
  ~IND2CompletionQueue() = default;
};

struct IND2SharedReceiveQueue : public IND2Overlapped {
  virtual HRESULT STDMETHODCALLTYPE GetNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) = 0;
  virtual HRESULT STDMETHODCALLTYPE Modify(ULONG queueDepth, ULONG notifyThreshold) = 0;
  virtual HRESULT STDMETHODCALLTYPE Notify(OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT STDMETHODCALLTYPE Receive(void* requestContext, const ND2_SGE sge[],
                                            ULONG nSge) = 0;

 protected:
  ~IND2SharedReceiveQueue() = default;
};

struct IND2MemoryRegion : public IND2Overlapped {
  virtual HRESULT STDMETHODCALLTYPE Register(const void* pBuffer, SIZE_T cbBuffer, ULONG flags,
                                             OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT STDMETHODCALLTYPE Deregister(OVERLAPPED* pOverlapped) = 0;
  virtual UINT32 STDMETHODCALLTYPE GetLocalToken() = 0;
  virtual UINT32 STDMETHODCALLTYPE GetRemoteToken() = 0;

 protected:
  ~IND2MemoryRegion() = default;
};

struct IND2MemoryWindow : public IUnknown {
  virtual UINT32 STDMETHODCALLTYPE GetRemoteToken() = 0;

 protected:
  ~IND2MemoryWindow() = default;
};

struct IND2QueuePair : public IUnknown {
  virtual HRESULT STDMETHODCALLTYPE Flush() = 0;
  virtual HRESULT STDMETHODCALLTYPE Send(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                                         ULONG flags) = 0;
  virtual HRESULT STDMETHODCALLTYPE Receive(void* requestContext, const ND2_SGE sge[],
                                            ULONG nSge) = 0;
  virtual HRESULT STDMETHODCALLTYPE Bind(void* requestContext, IUnknown* pMemoryRegion,
                                         IUnknown* pMemoryWindow, const void* pBuffer,
                                         SIZE_T cbBuffer, ULONG flags) = 0;
  virtual HRESULT STDMETHODCALLTYPE Invalidate(void* requestContext, IUnknown* pMemoryWindow,
                                               ULONG flags) = 0;
  virtual HRESULT STDMETHODCALLTYPE Read(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                                         UINT64 remoteAddress, UINT32 remoteToken,
                                         ULONG flags) = 0;
  virtual HRESULT STDMETHODCALLTYPE Write(void* requestContext, const ND2_SGE sge[], ULONG nSge,
                                          UINT64 remoteAddress, UINT32 remoteToken,
                                          ULONG flags) = 0;

 protected:
  ~IND2QueuePair() = default;
};

struct IND2Connector : public IND2Overlapped {
  virtual HRESULT STDMETHODCALLTYPE Bind(const sockaddr* pAddress, ULONG cbAddress) = 0;
  virtual HRESULT STDMETHODCALLTYPE Connect(IUnknown* pQueuePair,
                                            const sockaddr* pDestinationAddress,
                                            ULONG cbDestinationAddress, ULONG inboundReadLimit,
                                            ULONG outboundReadLimit, const void* pPrivateData,
                                            ULONG cbPrivateData, OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT STDMETHODCALLTYPE CompleteConnect(OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT STDMETHODCALLTYPE Accept(IUnknown* pQueuePair, ULONG inboundReadLimit,
                                           ULONG outboundReadLimit, const void* pPrivateData,
                                           ULONG cbPrivateData, OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT STDMETHODCALLTYPE Reject(const void* pPrivateData, ULONG cbPrivateData) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetReadLimits(ULONG* pInboundReadLimit,
                                                  ULONG* pOutboundReadLimit) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetPrivateData(void* pPrivateData, ULONG* pcbPrivateData) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetLocalAddress(sockaddr* pAddress, ULONG* pcbAddress) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetPeerAddress(sockaddr* pAddress, ULONG* pcbAddress) = 0;
  virtual HRESULT STDMETHODCALLTYPE NotifyDisconnect(OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT STDMETHODCALLTYPE Disconnect(OVERLAPPED* pOverlapped) = 0;

 protected:
  ~IND2Connector() = default;
};

struct IND2Listener : public IND2Overlapped {
  virtual HRESULT STDMETHODCALLTYPE Bind(const sockaddr* pAddress, ULONG cbAddress) = 0;
  virtual HRESULT STDMETHODCALLTYPE Listen(ULONG backlog) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetLocalAddress(sockaddr* pAddress, ULONG* pcbAddress) = 0;
  virtual HRESULT STDMETHODCALLTYPE GetConnectionRequest(IUnknown* pConnector,
                                                         OVERLAPPED* pOverlapped) = 0;

 protected:
  ~IND2Listener() = default;
};

struct IND2Adapter : public IUnknown {
  virtual HRESULT STDMETHODCALLTYPE CreateOverlappedFile(HANDLE* phOverlappedFile) = 0;
  virtual HRESULT STDMETHODCALLTYPE Query(ND2_ADAPTER_INFO* pInfo, ULONG* pcbInfo) = 0;
  virtual HRESULT STDMETHODCALLTYPE QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList,
                                                     ULONG* pcbAddressList) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateCompletionQueue(REFIID iid, HANDLE hOverlappedFile,
                                                          ULONG queueDepth, USHORT group,
                                                          KAFFINITY affinity,
                                                          void** ppCompletionQueue) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateMemoryRegion(REFIID iid, HANDLE hOverlappedFile,
                                                       void** ppMemoryRegion) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateMemoryWindow(REFIID iid, void** ppMemoryWindow) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateSharedReceiveQueue(REFIID iid, HANDLE hOverlappedFile,
                                                             ULONG queueDepth,
                                                             ULONG maxRequestSge,
                                                             ULONG notifyThreshold, USHORT group,
                                                             KAFFINITY affinity,
                                                             void** ppSharedReceiveQueue) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateQueuePair(
      REFIID iid, IUnknown* pReceiveCompletionQueue, IUnknown* pInitiatorCompletionQueue,
      void* context, ULONG receiveQueueDepth, ULONG initiatorQueueDepth,
      ULONG maxReceiveRequestSge, ULONG maxInitiatorRequestSge, ULONG inlineDataSize,
      void** ppQueuePair) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateQueuePairWithSrq(
      REFIID iid, IUnknown* pReceiveCompletionQueue, IUnknown* pInitiatorCompletionQueue,
      IUnknown* pSharedReceiveQueue, void* context, ULONG initiatorQueueDepth,
      ULONG maxInitiatorRequestSge, ULONG inlineDataSize, void** ppQueuePair) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateConnector(REFIID iid, HANDLE hOverlappedFile,
                                                    void** ppConnector) = 0;
  virtual HRESULT STDMETHODCALLTYPE CreateListener(REFIID iid, HANDLE hOverlappedFile,
                                                   void** ppListener) = 0;

 protected:
  ~IND2Adapter() = default;
};

struct IND2Provider : public IUnknown {
  virtual HRESULT STDMETHODCALLTYPE QueryAddressList(SOCKET_ADDRESS_LIST* pAddressList,
                                                     ULONG* pcbAddressList) = 0;
  virtual HRESULT STDMETHODCALLTYPE ResolveAddress(const sockaddr* pAddress, ULONG cbAddress,
                                                   UINT64* pAdapterId) = 0;
  virtual HRESULT STDMETHODCALLTYPE OpenAdapter(REFIID iid, UINT64 adapterId,
                                                void** ppAdapter) = 0;

 protected:
  ~IND2Provider() = default;
};
