// The NetworkDirect service provider interface: version 2 (IND2*) and, after it, version 1
// (IND*, the HPC Pack 2008 interfaces), with their IIDs, structures and constants, as in
// Microsoft's ndspi.h and nddef.h: the same names, struct tags, values and vtable order, so that
// ND programs written for Windows compile unchanged, in C or in C++ (win32.h explains the
// interface macros). Sizes and offsets are those of the 64-bit Windows layout (checked below).
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

// ---- Notify types (both versions) ---------------------------------------------------------------

#define ND_CQ_NOTIFY_ERRORS 0
#define ND_CQ_NOTIFY_ANY 1
#define ND_CQ_NOTIFY_SOLICITED 2

// ---- IND2MemoryRegion::Register flags (remote access implies local access) ----------------------

#define ND_MR_FLAG_ALLOW_LOCAL_WRITE 0x00000001
#define ND_MR_FLAG_ALLOW_REMOTE_READ 0x00000002
#define ND_MR_FLAG_ALLOW_REMOTE_WRITE 0x00000005
#define ND_MR_FLAG_RDMA_READ_SINK 0x00000008
#define ND_MR_FLAG_DO_NOT_SECURE_VM 0x80000000

// ---- Operation flags (both versions; INLINE is version 2 only) ----------------------------------

#define ND_OP_FLAG_SILENT_SUCCESS 0x00000001
#define ND_OP_FLAG_READ_FENCE 0x00000002
#define ND_OP_FLAG_SEND_AND_SOLICIT_EVENT 0x00000004
#define ND_OP_FLAG_ALLOW_READ 0x00000008
#define ND_OP_FLAG_ALLOW_WRITE 0x00000010
#if NDVER >= ND_VERSION_2
#define ND_OP_FLAG_INLINE 0x00000020
#endif

// ---- NdQueryAddressList flags -------------------------------------------------------------------

#define ND_QUERY_EXCLUDE_EMULATOR_ADDRESSES 0x00000001
#define ND_QUERY_EXCLUDE_NDv1_ADDRESSES 0x00000002
#define ND_QUERY_EXCLUDE_NDv2_ADDRESSES 0x00000004

// ---- Version 2 structures -----------------------------------------------------------------------

typedef struct _ND2_ADAPTER_INFO {
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
} ND2_ADAPTER_INFO;

// ND2_ADAPTER_INFO as a 32-bit caller sees it: the two sizes are ULONG (clamped to 0xFFFFFFFF).
typedef struct _ND2_ADAPTER_INFO32 {
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
} ND2_ADAPTER_INFO32;

typedef enum _ND2_REQUEST_TYPE {
  Nd2RequestTypeReceive,
  Nd2RequestTypeSend,
  Nd2RequestTypeBind,
  Nd2RequestTypeInvalidate,
  Nd2RequestTypeRead,
  Nd2RequestTypeWrite
} ND2_REQUEST_TYPE;

typedef struct _ND2_RESULT {
  HRESULT Status;
  ULONG BytesTransferred;  // meaningful for receives only
  void* QueuePairContext;  // the context given when the queue pair was created
  void* RequestContext;    // the context given with the request
  ND2_REQUEST_TYPE RequestType;
} ND2_RESULT;

typedef struct _ND2_SGE {
  void* Buffer;
  ULONG BufferLength;
  UINT32 MemoryRegionToken;
} ND2_SGE;

NDWV_STATIC_ASSERT(sizeof(ND2_REQUEST_TYPE) == 4);

NDWV_STATIC_ASSERT(sizeof(ND2_ADAPTER_INFO) == 96);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, InfoVersion) == 0);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, VendorId) == 4);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, DeviceId) == 6);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, AdapterId) == 8);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxRegistrationSize) == 16);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxWindowSize) == 24);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxInitiatorSge) == 32);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxReceiveSge) == 36);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxReadSge) == 40);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxTransferLength) == 44);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxInlineDataSize) == 48);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxInboundReadLimit) == 52);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxOutboundReadLimit) == 56);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxReceiveQueueDepth) == 60);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxInitiatorQueueDepth) == 64);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxSharedReceiveQueueDepth) == 68);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxCompletionQueueDepth) == 72);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, InlineRequestThreshold) == 76);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, LargeRequestThreshold) == 80);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxCallerData) == 84);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, MaxCalleeData) == 88);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO, AdapterFlags) == 92);

NDWV_STATIC_ASSERT(sizeof(ND2_ADAPTER_INFO32) == 88);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO32, MaxRegistrationSize) == 16);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO32, MaxWindowSize) == 20);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO32, MaxInitiatorSge) == 24);
NDWV_STATIC_ASSERT(offsetof(ND2_ADAPTER_INFO32, AdapterFlags) == 84);

NDWV_STATIC_ASSERT(sizeof(ND2_RESULT) == 32);
NDWV_STATIC_ASSERT(offsetof(ND2_RESULT, Status) == 0);
NDWV_STATIC_ASSERT(offsetof(ND2_RESULT, BytesTransferred) == 4);
NDWV_STATIC_ASSERT(offsetof(ND2_RESULT, QueuePairContext) == 8);
NDWV_STATIC_ASSERT(offsetof(ND2_RESULT, RequestContext) == 16);
NDWV_STATIC_ASSERT(offsetof(ND2_RESULT, RequestType) == 24);

NDWV_STATIC_ASSERT(sizeof(ND2_SGE) == 16);
NDWV_STATIC_ASSERT(offsetof(ND2_SGE, Buffer) == 0);
NDWV_STATIC_ASSERT(offsetof(ND2_SGE, BufferLength) == 8);
NDWV_STATIC_ASSERT(offsetof(ND2_SGE, MemoryRegionToken) == 12);

// ---- Version 2 interfaces -----------------------------------------------------------------------
// Each repeats the methods of its bases (win32.h). C++ destructors are protected: objects are
// destroyed by their last Release(), never by delete.

#define NDWV_IND2OVERLAPPED_METHODS                                                 \
  NDWV_IUNKNOWN_METHODS;                                                            \
  IFACEMETHOD(CancelOverlappedRequests)(THIS) PURE;                                 \
  IFACEMETHOD(GetOverlappedResult)(THIS_ OVERLAPPED * pOverlapped, BOOL bWait) PURE

#undef INTERFACE
#define INTERFACE IND2Overlapped
// {ABF72719-B016-4A40-A6F7-622791A7044C}
NDWV_DEFINE_GUID(IID_IND2Overlapped, 0xABF72719, 0xB016, 0x4A40, 0xA6, 0xF7, 0x62, 0x27, 0x91,
                 0xA7, 0x04, 0x4C);
DECLARE_INTERFACE_(IND2Overlapped, IUnknown) {
  NDWV_IND2OVERLAPPED_METHODS;
  NDWV_DESTROYED_BY_RELEASE(IND2Overlapped)
};

#undef INTERFACE
#define INTERFACE IND2CompletionQueue
// {20CC445E-64A0-4CBB-AA75-F6A7251FDA9E}
NDWV_DEFINE_GUID(IID_IND2CompletionQueue, 0x20CC445E, 0x64A0, 0x4CBB, 0xAA, 0x75, 0xF6, 0xA7,
                 0x25, 0x1F, 0xDA, 0x9E);
DECLARE_INTERFACE_(IND2CompletionQueue, IND2Overlapped) {
  NDWV_IND2OVERLAPPED_METHODS;
  STDMETHOD(GetNotifyAffinity)(THIS_ USHORT * pGroup, KAFFINITY * pAffinity) PURE;
  STDMETHOD(Resize)(THIS_ ULONG queueDepth) PURE;
  STDMETHOD(Notify)(THIS_ ULONG type, OVERLAPPED * pOverlapped) PURE;
  STDMETHOD_(ULONG, GetResults)(THIS_ ND2_RESULT results[], ULONG nResults) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2CompletionQueue)
};

#undef INTERFACE
#define INTERFACE IND2SharedReceiveQueue
// {AABD67DC-459A-4DB1-826B-56CFCC278883}
NDWV_DEFINE_GUID(IID_IND2SharedReceiveQueue, 0xAABD67DC, 0x459A, 0x4DB1, 0x82, 0x6B, 0x56, 0xCF,
                 0xCC, 0x27, 0x88, 0x83);
DECLARE_INTERFACE_(IND2SharedReceiveQueue, IND2Overlapped) {
  NDWV_IND2OVERLAPPED_METHODS;
  STDMETHOD(GetNotifyAffinity)(THIS_ USHORT * pGroup, KAFFINITY * pAffinity) PURE;
  STDMETHOD(Modify)(THIS_ ULONG queueDepth, ULONG notifyThreshold) PURE;
  STDMETHOD(Notify)(THIS_ OVERLAPPED * pOverlapped) PURE;
  STDMETHOD(Receive)(THIS_ void* requestContext, const ND2_SGE sge[], ULONG nSge) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2SharedReceiveQueue)
};

#undef INTERFACE
#define INTERFACE IND2MemoryWindow
// {070FE1F5-0AB5-4361-88DB-974BA704D4B9}: the same IID as INDMemoryWindow (version 1).
NDWV_DEFINE_GUID(IID_IND2MemoryWindow, 0x070FE1F5, 0x0AB5, 0x4361, 0x88, 0xDB, 0x97, 0x4B, 0xA7,
                 0x04, 0xD4, 0xB9);
DECLARE_INTERFACE_(IND2MemoryWindow, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  STDMETHOD_(UINT32, GetRemoteToken)(THIS) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2MemoryWindow)
};

#undef INTERFACE
#define INTERFACE IND2MemoryRegion
// {55DFEA2F-BC56-4982-8A45-0301BE46C413}
NDWV_DEFINE_GUID(IID_IND2MemoryRegion, 0x55DFEA2F, 0xBC56, 0x4982, 0x8A, 0x45, 0x03, 0x01, 0xBE,
                 0x46, 0xC4, 0x13);
DECLARE_INTERFACE_(IND2MemoryRegion, IND2Overlapped) {
  NDWV_IND2OVERLAPPED_METHODS;
  // flags: ND_MR_FLAG_*.
  STDMETHOD(Register)(THIS_ const void* pBuffer, SIZE_T cbBuffer, ULONG flags,
                      OVERLAPPED* pOverlapped) PURE;
  STDMETHOD(Deregister)(THIS_ OVERLAPPED * pOverlapped) PURE;
  STDMETHOD_(UINT32, GetLocalToken)(THIS) PURE;
  STDMETHOD_(UINT32, GetRemoteToken)(THIS) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2MemoryRegion)
};

#undef INTERFACE
#define INTERFACE IND2QueuePair
// {EEF2F332-B75D-4063-BCE3-3A0BAD2D02CE}
NDWV_DEFINE_GUID(IID_IND2QueuePair, 0xEEF2F332, 0xB75D, 0x4063, 0xBC, 0xE3, 0x3A, 0x0B, 0xAD,
                 0x2D, 0x02, 0xCE);
DECLARE_INTERFACE_(IND2QueuePair, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  STDMETHOD(Flush)(THIS) PURE;
  STDMETHOD(Send)(THIS_ void* requestContext, const ND2_SGE sge[], ULONG nSge, ULONG flags) PURE;
  STDMETHOD(Receive)(THIS_ void* requestContext, const ND2_SGE sge[], ULONG nSge) PURE;
  // The window's new remote token is then IND2MemoryWindow::GetRemoteToken.
  STDMETHOD(Bind)(THIS_ void* requestContext, IUnknown* pMemoryRegion, IUnknown* pMemoryWindow,
                  const void* pBuffer, SIZE_T cbBuffer, ULONG flags) PURE;
  STDMETHOD(Invalidate)(THIS_ void* requestContext, IUnknown* pMemoryWindow, ULONG flags) PURE;
  STDMETHOD(Read)(THIS_ void* requestContext, const ND2_SGE sge[], ULONG nSge,
                  UINT64 remoteAddress, UINT32 remoteToken, ULONG flags) PURE;
  STDMETHOD(Write)(THIS_ void* requestContext, const ND2_SGE sge[], ULONG nSge,
                   UINT64 remoteAddress, UINT32 remoteToken, ULONG flags) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2QueuePair)
};

#undef INTERFACE
#define INTERFACE IND2Connector
// {7DD615C4-6B4C-4866-950C-F3B1D25A5302}
NDWV_DEFINE_GUID(IID_IND2Connector, 0x7DD615C4, 0x6B4C, 0x4866, 0x95, 0x0C, 0xF3, 0xB1, 0xD2,
                 0x5A, 0x53, 0x02);
DECLARE_INTERFACE_(IND2Connector, IND2Overlapped) {
  NDWV_IND2OVERLAPPED_METHODS;
  STDMETHOD(Bind)(THIS_ const struct sockaddr* pAddress, ULONG cbAddress) PURE;
  STDMETHOD(Connect)(THIS_ IUnknown * pQueuePair, const struct sockaddr* pDestinationAddress,
                     ULONG cbDestinationAddress, ULONG inboundReadLimit, ULONG outboundReadLimit,
                     const void* pPrivateData, ULONG cbPrivateData, OVERLAPPED* pOverlapped) PURE;
  STDMETHOD(CompleteConnect)(THIS_ OVERLAPPED * pOverlapped) PURE;
  STDMETHOD(Accept)(THIS_ IUnknown * pQueuePair, ULONG inboundReadLimit, ULONG outboundReadLimit,
                    const void* pPrivateData, ULONG cbPrivateData, OVERLAPPED* pOverlapped) PURE;
  STDMETHOD(Reject)(THIS_ const void* pPrivateData, ULONG cbPrivateData) PURE;
  STDMETHOD(GetReadLimits)(THIS_ ULONG * pInboundReadLimit, ULONG * pOutboundReadLimit) PURE;
  STDMETHOD(GetPrivateData)(THIS_ void* pPrivateData, ULONG* pcbPrivateData) PURE;
  STDMETHOD(GetLocalAddress)(THIS_ struct sockaddr * pAddress, ULONG * pcbAddress) PURE;
  STDMETHOD(GetPeerAddress)(THIS_ struct sockaddr * pAddress, ULONG * pcbAddress) PURE;
  STDMETHOD(NotifyDisconnect)(THIS_ OVERLAPPED * pOverlapped) PURE;
  STDMETHOD(Disconnect)(THIS_ OVERLAPPED * pOverlapped) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2Connector)
};

#undef INTERFACE
#define INTERFACE IND2Listener
// {65D23D83-3A57-4E02-86A4-350165C2D130}
NDWV_DEFINE_GUID(IID_IND2Listener, 0x65D23D83, 0x3A57, 0x4E02, 0x86, 0xA4, 0x35, 0x01, 0x65,
                 0xC2, 0xD1, 0x30);
DECLARE_INTERFACE_(IND2Listener, IND2Overlapped) {
  NDWV_IND2OVERLAPPED_METHODS;
  STDMETHOD(Bind)(THIS_ const struct sockaddr* pAddress, ULONG cbAddress) PURE;
  STDMETHOD(Listen)(THIS_ ULONG backlog) PURE;
  STDMETHOD(GetLocalAddress)(THIS_ struct sockaddr * pAddress, ULONG * pcbAddress) PURE;
  STDMETHOD(GetConnectionRequest)(THIS_ IUnknown * pConnector, OVERLAPPED * pOverlapped) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2Listener)
};

#undef INTERFACE
#define INTERFACE IND2Adapter
// {D89C798C-4823-4D69-846C-DFDCCFF9E5F3}
NDWV_DEFINE_GUID(IID_IND2Adapter, 0xD89C798C, 0x4823, 0x4D69, 0x84, 0x6C, 0xDF, 0xDC, 0xCF, 0xF9,
                 0xE5, 0xF3);
DECLARE_INTERFACE_(IND2Adapter, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  STDMETHOD(CreateOverlappedFile)(THIS_ HANDLE * phOverlappedFile) PURE;
  STDMETHOD(Query)(THIS_ ND2_ADAPTER_INFO * pInfo, ULONG * pcbInfo) PURE;
  STDMETHOD(QueryAddressList)(THIS_ SOCKET_ADDRESS_LIST * pAddressList,
                              ULONG * pcbAddressList) PURE;
  STDMETHOD(CreateCompletionQueue)(THIS_ REFIID iid, HANDLE hOverlappedFile, ULONG queueDepth,
                                   USHORT group, KAFFINITY affinity,
                                   void** ppCompletionQueue) PURE;
  STDMETHOD(CreateMemoryRegion)(THIS_ REFIID iid, HANDLE hOverlappedFile,
                                void** ppMemoryRegion) PURE;
  STDMETHOD(CreateMemoryWindow)(THIS_ REFIID iid, void** ppMemoryWindow) PURE;
  STDMETHOD(CreateSharedReceiveQueue)(THIS_ REFIID iid, HANDLE hOverlappedFile, ULONG queueDepth,
                                      ULONG maxRequestSge, ULONG notifyThreshold, USHORT group,
                                      KAFFINITY affinity, void** ppSharedReceiveQueue) PURE;
  STDMETHOD(CreateQueuePair)(THIS_ REFIID iid, IUnknown* pReceiveCompletionQueue,
                             IUnknown* pInitiatorCompletionQueue, void* context,
                             ULONG receiveQueueDepth, ULONG initiatorQueueDepth,
                             ULONG maxReceiveRequestSge, ULONG maxInitiatorRequestSge,
                             ULONG inlineDataSize, void** ppQueuePair) PURE;
  STDMETHOD(CreateQueuePairWithSrq)(THIS_ REFIID iid, IUnknown* pReceiveCompletionQueue,
                                    IUnknown* pInitiatorCompletionQueue,
                                    IUnknown* pSharedReceiveQueue, void* context,
                                    ULONG initiatorQueueDepth, ULONG maxInitiatorRequestSge,
                                    ULONG inlineDataSize, void** ppQueuePair) PURE;
  STDMETHOD(CreateConnector)(THIS_ REFIID iid, HANDLE hOverlappedFile, void** ppConnector) PURE;
  STDMETHOD(CreateListener)(THIS_ REFIID iid, HANDLE hOverlappedFile, void** ppListener) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2Adapter)
};

#undef INTERFACE
#define INTERFACE IND2Provider
// {49EAE6C1-76C4-46D0-8003-5C2EAA2C9A8E}
NDWV_DEFINE_GUID(IID_IND2Provider, 0x49EAE6C1, 0x76C4, 0x46D0, 0x80, 0x03, 0x5C, 0x2E, 0xAA,
                 0x2C, 0x9A, 0x8E);
DECLARE_INTERFACE_(IND2Provider, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  STDMETHOD(QueryAddressList)(THIS_ SOCKET_ADDRESS_LIST * pAddressList,
                              ULONG * pcbAddressList) PURE;
  STDMETHOD(ResolveAddress)(THIS_ const struct sockaddr* pAddress, ULONG cbAddress,
                            UINT64* pAdapterId) PURE;
  STDMETHOD(OpenAdapter)(THIS_ REFIID iid, UINT64 adapterId, void** ppAdapter) PURE;
  NDWV_DESTROYED_BY_RELEASE(IND2Provider)
};

// ---- Version 1 (HPC Pack 2008 SDK) structures -----------------------------------------------------

// A registration, as the provider names it in SGEs and window binds; opaque to the application.
DECLARE_HANDLE(ND_MR_HANDLE);

// Two UINT32 and fifteen SIZE_T: 128 bytes on 64-bit.
typedef struct _ND_ADAPTER_INFO1 {
  UINT32 VendorId;
  UINT32 DeviceId;
  SIZE_T MaxInboundSge;
  SIZE_T MaxInboundRequests;
  SIZE_T MaxInboundLength;
  SIZE_T MaxOutboundSge;
  SIZE_T MaxOutboundRequests;
  SIZE_T MaxOutboundLength;
  SIZE_T MaxInlineData;
  SIZE_T MaxInboundReadLimit;
  SIZE_T MaxOutboundReadLimit;
  SIZE_T MaxCqEntries;
  SIZE_T MaxRegistrationSize;
  SIZE_T MaxWindowSize;
  SIZE_T LargeRequestThreshold;
  SIZE_T MaxCallerData;
  SIZE_T MaxCalleeData;
} ND_ADAPTER_INFO1;
#define ND_ADAPTER_INFO ND_ADAPTER_INFO1

// Caller memory, one per posted request, that the provider completes in place: GetResults hands
// back the very pointer given with the request.
typedef struct _ND_RESULT {
  HRESULT Status;
  SIZE_T BytesTransferred;
} ND_RESULT;

// What a Bind produces and the peer's Read/Write/SendAndInvalidate name: every field in network
// byte order, packed, so that the application can ship the 20 bytes verbatim.
#pragma pack(push, 1)
typedef struct _ND_MW_DESCRIPTOR {
  UINT64 Base;
  UINT64 Length;
  UINT32 Token;
} ND_MW_DESCRIPTOR;
#pragma pack(pop)

// hMr NULL: the bytes are copied at post time (inline), no registration needed.
typedef struct _ND_SGE {
  void* pAddr;
  SIZE_T Length;
  ND_MR_HANDLE hMr;
} ND_SGE;

NDWV_STATIC_ASSERT(sizeof(ND_ADAPTER_INFO1) == 128);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, VendorId) == 0);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, DeviceId) == 4);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxInboundSge) == 8);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxInboundRequests) == 16);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxInboundLength) == 24);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxOutboundSge) == 32);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxOutboundRequests) == 40);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxOutboundLength) == 48);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxInlineData) == 56);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxInboundReadLimit) == 64);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxOutboundReadLimit) == 72);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxCqEntries) == 80);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxRegistrationSize) == 88);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxWindowSize) == 96);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, LargeRequestThreshold) == 104);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxCallerData) == 112);
NDWV_STATIC_ASSERT(offsetof(ND_ADAPTER_INFO1, MaxCalleeData) == 120);

NDWV_STATIC_ASSERT(sizeof(ND_RESULT) == 16);
NDWV_STATIC_ASSERT(offsetof(ND_RESULT, Status) == 0);
NDWV_STATIC_ASSERT(offsetof(ND_RESULT, BytesTransferred) == 8);

NDWV_STATIC_ASSERT(sizeof(ND_MW_DESCRIPTOR) == 20);
NDWV_STATIC_ASSERT(offsetof(ND_MW_DESCRIPTOR, Base) == 0);
NDWV_STATIC_ASSERT(offsetof(ND_MW_DESCRIPTOR, Length) == 8);
NDWV_STATIC_ASSERT(offsetof(ND_MW_DESCRIPTOR, Token) == 16);

NDWV_STATIC_ASSERT(sizeof(ND_SGE) == 24);
NDWV_STATIC_ASSERT(offsetof(ND_SGE, pAddr) == 0);
NDWV_STATIC_ASSERT(offsetof(ND_SGE, Length) == 8);
NDWV_STATIC_ASSERT(offsetof(ND_SGE, hMr) == 16);

// ---- Version 1 interfaces -----------------------------------------------------------------------
// Every overlapped request of an INDAdapter and of the objects made from it completes on the
// adapter's one file (INDAdapter::GetFileHandle).

#define NDWV_INDOVERLAPPED_METHODS                                                     \
  NDWV_IUNKNOWN_METHODS;                                                               \
  IFACEMETHOD(CancelOverlappedRequests)(THIS) PURE;                                    \
  IFACEMETHOD(GetOverlappedResult)(THIS_ OVERLAPPED * pOverlapped,                     \
                                   SIZE_T * pNumberOfBytesTransferred, BOOL bWait) PURE

#undef INTERFACE
#define INTERFACE INDOverlapped
// {C859E15E-75E2-4FE3-8D6D-0DFF36F02442}
NDWV_DEFINE_GUID(IID_INDOverlapped, 0xC859E15E, 0x75E2, 0x4FE3, 0x8D, 0x6D, 0x0D, 0xFF, 0x36,
                 0xF0, 0x24, 0x42);
DECLARE_INTERFACE_(INDOverlapped, IUnknown) {
  NDWV_INDOVERLAPPED_METHODS;
  NDWV_DESTROYED_BY_RELEASE(INDOverlapped)
};

#undef INTERFACE
#define INTERFACE INDCompletionQueue
// {1245A633-2A32-473A-830C-E05D1F869D02}
NDWV_DEFINE_GUID(IID_INDCompletionQueue, 0x1245A633, 0x2A32, 0x473A, 0x83, 0x0C, 0xE0, 0x5D,
                 0x1F, 0x86, 0x9D, 0x02);
DECLARE_INTERFACE_(INDCompletionQueue, INDOverlapped) {
  NDWV_INDOVERLAPPED_METHODS;
  STDMETHOD(Resize)(THIS_ SIZE_T nEntries) PURE;
  STDMETHOD(Notify)(THIS_ DWORD Type, OVERLAPPED * pOverlapped) PURE;
  // Stores in pResults[i] the ND_RESULT pointers given with the completed requests.
  STDMETHOD_(SIZE_T, GetResults)(THIS_ ND_RESULT * pResults[], SIZE_T nResults) PURE;
  NDWV_DESTROYED_BY_RELEASE(INDCompletionQueue)
};

#undef INTERFACE
#define INTERFACE INDMemoryWindow
// {070FE1F5-0AB5-4361-88DB-974BA704D4B9}: the same IID as IND2MemoryWindow.
NDWV_DEFINE_GUID(IID_INDMemoryWindow, 0x070FE1F5, 0x0AB5, 0x4361, 0x88, 0xDB, 0x97, 0x4B, 0xA7,
                 0x04, 0xD4, 0xB9);
DECLARE_INTERFACE_(INDMemoryWindow, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  NDWV_DESTROYED_BY_RELEASE(INDMemoryWindow)
};

#undef INTERFACE
#define INTERFACE INDEndpoint
// {DBD00EAB-B679-44A9-BD65-E82F3DE12D1A}
NDWV_DEFINE_GUID(IID_INDEndpoint, 0xDBD00EAB, 0xB679, 0x44A9, 0xBD, 0x65, 0xE8, 0x2F, 0x3D, 0xE1,
                 0x2D, 0x1A);
DECLARE_INTERFACE_(INDEndpoint, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  STDMETHOD(Flush)(THIS) PURE;
  STDMETHOD_(void, StartRequestBatch)(THIS) PURE;
  STDMETHOD_(void, SubmitRequestBatch)(THIS) PURE;
  STDMETHOD(Send)(THIS_ ND_RESULT * pResult, const ND_SGE* pSgl, SIZE_T nSge, DWORD Flags) PURE;
  STDMETHOD(SendAndInvalidate)(THIS_ ND_RESULT * pResult, const ND_SGE* pSgl, SIZE_T nSge,
                               const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, DWORD Flags) PURE;
  STDMETHOD(Receive)(THIS_ ND_RESULT * pResult, const ND_SGE* pSgl, SIZE_T nSge) PURE;
  STDMETHOD(Bind)(THIS_ ND_RESULT * pResult, ND_MR_HANDLE hMr, INDMemoryWindow * pMw,
                  const void* pBuffer, SIZE_T BufferSize, DWORD Flags,
                  ND_MW_DESCRIPTOR* pMwDescriptor) PURE;
  STDMETHOD(Invalidate)(THIS_ ND_RESULT * pResult, INDMemoryWindow * pMw, DWORD Flags) PURE;
  STDMETHOD(Read)(THIS_ ND_RESULT * pResult, const ND_SGE* pSgl, SIZE_T nSge,
                  const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, ULONGLONG Offset,
                  DWORD Flags) PURE;
  STDMETHOD(Write)(THIS_ ND_RESULT * pResult, const ND_SGE* pSgl, SIZE_T nSge,
                   const ND_MW_DESCRIPTOR* pRemoteMwDescriptor, ULONGLONG Offset,
                   DWORD Flags) PURE;
  NDWV_DESTROYED_BY_RELEASE(INDEndpoint)
};

#undef INTERFACE
#define INTERFACE INDConnector
// {1BCAF2D1-E274-4AEB-AC57-CD5D4376E0B7}
NDWV_DEFINE_GUID(IID_INDConnector, 0x1BCAF2D1, 0xE274, 0x4AEB, 0xAC, 0x57, 0xCD, 0x5D, 0x43,
                 0x76, 0xE0, 0xB7);
DECLARE_INTERFACE_(INDConnector, INDOverlapped) {
  NDWV_INDOVERLAPPED_METHODS;
  STDMETHOD(CreateEndpoint)(THIS_ INDCompletionQueue * pInboundCq,
                            INDCompletionQueue * pOutboundCq, SIZE_T nInboundEntries,
                            SIZE_T nOutboundEntries, SIZE_T nInboundSge, SIZE_T nOutboundSge,
                            SIZE_T InboundReadLimit, SIZE_T OutboundReadLimit,
                            SIZE_T * pMaxInlineData, INDEndpoint * *ppEndpoint) PURE;
  // LocalPort in network order, 0 for any; Protocol: the listener's IANA protocol number.
  STDMETHOD(Connect)(THIS_ INDEndpoint * pEndpoint, const struct sockaddr* pAddress,
                     SIZE_T AddressLength, INT Protocol, USHORT LocalPort,
                     const void* pPrivateData, SIZE_T PrivateDataLength,
                     OVERLAPPED* pOverlapped) PURE;
  STDMETHOD(CompleteConnect)(THIS_ OVERLAPPED * pOverlapped) PURE;
  STDMETHOD(Accept)(THIS_ INDEndpoint * pEndpoint, const void* pPrivateData,
                    SIZE_T PrivateDataLength, OVERLAPPED* pOverlapped) PURE;
  STDMETHOD(Reject)(THIS_ const void* pPrivateData, SIZE_T PrivateDataLength) PURE;
  STDMETHOD(GetConnectionData)(THIS_ SIZE_T * pInboundReadLimit, SIZE_T * pOutboundReadLimit,
                               void* pPrivateData, SIZE_T* pPrivateDataLength) PURE;
  STDMETHOD(GetLocalAddress)(THIS_ struct sockaddr * pAddress, SIZE_T * pAddressLength) PURE;
  STDMETHOD(GetPeerAddress)(THIS_ struct sockaddr * pAddress, SIZE_T * pAddressLength) PURE;
  STDMETHOD(NotifyDisconnect)(THIS_ OVERLAPPED * pOverlapped) PURE;
  STDMETHOD(Disconnect)(THIS_ OVERLAPPED * pOverlapped) PURE;
  NDWV_DESTROYED_BY_RELEASE(INDConnector)
};

#undef INTERFACE
#define INTERFACE INDListen
// {BB902588-BA3F-4441-9FE1-3B6795E4E668}
NDWV_DEFINE_GUID(IID_INDListen, 0xBB902588, 0xBA3F, 0x4441, 0x9F, 0xE1, 0x3B, 0x67, 0x95, 0xE4,
                 0xE6, 0x68);
DECLARE_INTERFACE_(INDListen, INDOverlapped) {
  NDWV_INDOVERLAPPED_METHODS;
  STDMETHOD(GetConnectionRequest)(THIS_ INDConnector * pConnector,
                                  OVERLAPPED * pOverlapped) PURE;
  NDWV_DESTROYED_BY_RELEASE(INDListen)
};

#undef INTERFACE
#define INTERFACE INDAdapter
// {A023C5A0-5B73-43BC-8D20-33AA07E9510F}
NDWV_DEFINE_GUID(IID_INDAdapter, 0xA023C5A0, 0x5B73, 0x43BC, 0x8D, 0x20, 0x33, 0xAA, 0x07, 0xE9,
                 0x51, 0x0F);
DECLARE_INTERFACE_(INDAdapter, INDOverlapped) {
  NDWV_INDOVERLAPPED_METHODS;
  STDMETHOD_(HANDLE, GetFileHandle)(THIS) PURE;
  // VersionRequested: 1 (ND_VERSION_1).
  STDMETHOD(Query)(THIS_ DWORD VersionRequested, ND_ADAPTER_INFO * pInfo,
                   SIZE_T * pBufferSize) PURE;
  STDMETHOD(Control)(THIS_ DWORD IoControlCode, const void* pInBuffer, SIZE_T InBufferSize,
                     void* pOutBuffer, SIZE_T OutBufferSize, SIZE_T* pBytesReturned,
                     OVERLAPPED* pOverlapped) PURE;
  STDMETHOD(CreateCompletionQueue)(THIS_ SIZE_T nEntries, INDCompletionQueue * *ppCq) PURE;
  STDMETHOD(RegisterMemory)(THIS_ const void* pBuffer, SIZE_T BufferSize,
                            OVERLAPPED* pOverlapped, ND_MR_HANDLE* phMr) PURE;
  STDMETHOD(DeregisterMemory)(THIS_ ND_MR_HANDLE hMr, OVERLAPPED * pOverlapped) PURE;
  STDMETHOD(CreateMemoryWindow)(THIS_ ND_RESULT * pInvalidateResult,
                                INDMemoryWindow * *ppMw) PURE;
  STDMETHOD(CreateConnector)(THIS_ INDConnector * *ppConnector) PURE;
  // Port in network order; 0 lets the provider choose and report it in *pAssignedPort.
  STDMETHOD(Listen)(THIS_ SIZE_T Backlog, INT Protocol, USHORT Port, USHORT * pAssignedPort,
                    INDListen * *ppListen) PURE;
  NDWV_DESTROYED_BY_RELEASE(INDAdapter)
};

#undef INTERFACE
#define INTERFACE INDProvider
// {0C5DD316-5FDF-47E6-B2D0-2A6EDA8D39DD}
NDWV_DEFINE_GUID(IID_INDProvider, 0x0C5DD316, 0x5FDF, 0x47E6, 0xB2, 0xD0, 0x2A, 0x6E, 0xDA, 0x8D,
                 0x39, 0xDD);
DECLARE_INTERFACE_(INDProvider, IUnknown) {
  NDWV_IUNKNOWN_METHODS;
  STDMETHOD(QueryAddressList)(THIS_ SOCKET_ADDRESS_LIST * pAddressList,
                              SIZE_T * pBufferSize) PURE;
  STDMETHOD(OpenAdapter)(THIS_ const struct sockaddr* pAddress, SIZE_T AddressLength,
                         INDAdapter** ppAdapter) PURE;
  NDWV_DESTROYED_BY_RELEASE(INDProvider)
};

#undef INTERFACE
