// The verbs layer of ndwv, shaped like WinVerbs (WinOFED's winverbs.h): COM-style interfaces over
// the software RDMA device. The ND provider is built only on this header; verbs-level programs may
// use it directly.
//
// Deliberate differences from WinVerbs, each for a reason:
//  * Objects with overlapped methods are created with the HANDLE of the overlapped file their
//    requests complete to (WinVerbs routes everything through one kernel file per provider; ND2
//    gives every object its own file, so the handle is passed where the object is made).
//  * Memory registration is synchronous in the software device: RegisterMemory/DeregisterMemory
//    return WV_SUCCESS or an error and never touch the OVERLAPPED (which may be NULL).
//  * IWVConnectQueuePair::InvalidateMemoryWindow exists (ND2 type-2 windows need it).
//  * Send with Invalidate (WV_SEND_INVALIDATE) and the report of a remote invalidation
//    (IWVMemoryWindow::SetRemoteInvalidateId) exist: ND v1's SendAndInvalidate needs them.
//  * Two endpoint options (IWVEndpoint::Modify) give ND v1's connection rules: the service's IP
//    protocol, and timeouts that say "try again".
//  * WV_COMPLETION carries the status as a WV_WC_STATUS code, as WinVerbs does.
#pragma once
#include <ndwv/win32.h>
#include <ndwv/wvstatus.h>
#include <sys/socket.h>
#include <netinet/in.h>

typedef UINT64 NET64;
typedef UINT32 NET32;
typedef UINT16 NET16;

inline constexpr IID IID_IWVOverlapped          = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x01}};
inline constexpr IID IID_IWVCompletionQueue     = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x02}};
inline constexpr IID IID_IWVMemoryWindow        = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x03}};
inline constexpr IID IID_IWVSharedReceiveQueue  = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x04}};
inline constexpr IID IID_IWVQueuePair           = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x05}};
inline constexpr IID IID_IWVConnectQueuePair    = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x06}};
inline constexpr IID IID_IWVProtectionDomain    = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x07}};
inline constexpr IID IID_IWVDevice              = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x08}};
inline constexpr IID IID_IWVEndpoint            = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x09}};
inline constexpr IID IID_IWVConnectEndpoint     = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x0a}};
inline constexpr IID IID_IWVProvider            = {0x6a3d54f1, 0x3c5a, 0x4e5f, {0x9b, 0x21, 0x4f, 0x1a, 0x77, 0x02, 0xc1, 0x0b}};

// ---- device and port ------------------------------------------------------------------------

enum WV_DEVICE_TYPE { WvDeviceUnknown, WvDeviceInfiniband, WvDeviceIwarp };
enum WV_PORT_TRANSPORT { WvPortTransportIb, WvPortTransportIwarp, WvPortTransportRdmaoe };
enum WV_PORT_STATE { WvPortNop, WvPortDown, WvPortInit, WvPortArmed, WvPortActive, WvPortActiveDefer };

#define WV_DEVICE_RESIZE_MAX_WR   0x00000001
#define WV_DEVICE_RC_RNR_NAK_GEN  0x00000008
#define WV_DEVICE_MEM_WINDOW      0x00000100
#define WV_DEVICE_RESIZE_CQ       0x00000200  // ndwv: CQ Resize is supported
#define WV_DEVICE_IN_ORDER_PLACEMENT 0x00000400  // ndwv: bytes of one Write land in address order

struct WV_DEVICE_ATTRIBUTES {
  UINT64 FwVersion;
  NET64 NodeGuid;
  NET64 SystemImageGuid;
  UINT32 VendorId;
  UINT32 VendorPartId;
  UINT32 HwVersion;
  DWORD CapabilityFlags;
  SIZE_T MaxMrSize;
  SIZE_T MaxQp;
  SIZE_T MaxQpWr;
  SIZE_T MaxSge;
  SIZE_T MaxCq;
  SIZE_T MaxCqEntries;
  SIZE_T MaxMr;
  SIZE_T MaxPd;
  SIZE_T MaxQpResponderResources;  // IRD per QP
  SIZE_T MaxResponderResources;
  SIZE_T MaxQpInitiatorDepth;      // ORD per QP
  SIZE_T MaxInlineSend;
  SIZE_T MaxMw;
  SIZE_T MaxSrq;
  SIZE_T MaxSrqWr;
  SIZE_T MaxSrqSge;
  SIZE_T MaxTransferLength;        // ndwv: bytes one work request may move
  SIZE_T MaxPrivateData;           // ndwv: private-data bytes of Connect/Accept/Reject
  WV_DEVICE_TYPE DeviceType;
  UINT8 LocalAckDelay;
  UINT8 PhysPortCount;
};

struct WV_PORT_ATTRIBUTES {
  DWORD PortCabilityFlags;
  WV_PORT_STATE State;
  UINT32 MaxMtu;
  UINT32 ActiveMtu;
  UINT32 GidTableLength;
  UINT16 PkeyTableLength;
  WV_PORT_TRANSPORT Transport;
};

struct WV_DEVICE_ADDRESS {
  NET64 DeviceGuid;
  NET16 Pkey;
  UINT8 PortNumber;
};

// ---- memory -----------------------------------------------------------------------------------

#define WV_ACCESS_REMOTE_READ    0x00000001
#define WV_ACCESS_REMOTE_WRITE   0x0000000A  // remote write implies local write
#define WV_ACCESS_REMOTE_ATOMIC  0x00000004
#define WV_ACCESS_LOCAL_WRITE    0x00000008
#define WV_ACCESS_MW_BIND        0x00000010
#define WV_ACCESS_NON_CACHABLE   0x80000000

struct WV_MEMORY_KEYS {
  UINT32 Lkey;
  NET32 Rkey;
};

struct WV_SGE {
  VOID* pAddress;
  UINT32 Length;
  UINT32 Lkey;
};

// ---- completions --------------------------------------------------------------------------------

enum WV_WC_OPCODE {
  WvSend, WvRdmaWrite, WvRdmaRead, WvCompareExchange, WvFetchAdd, WvBindWindow,
  WvInvalidateWindow,  // ndwv
  WvReceive = (1 << 7), WvReceiveRdmaWrite
};

enum WV_WC_STATUS {
  WvWcSuccess, WvWcLocalLengthError, WvWcLocalOpError, WvWcLocalProtectionError, WvWcFlushed,
  WvWcMwBindError, WvWcRemoteAccessError, WvWcRemoteOpError, WvWcRnrRetryError,
  WvWcTimeoutRetryError, WvWcRemoteInvalidRequest, WvWcBadResponse, WvWcLocalAccessError, WvWcError
};

#define WV_WC_IMMEDIATE  0x00000001
#define WV_WC_GRH_VALID  0x00000004

struct WV_COMPLETION {
  VOID* QpContext;
  UINT64 WrId;
  WV_WC_OPCODE Opcode;
  UINT32 Length;
  UINT64 VendorCode;
  WV_WC_STATUS Status;
  UINT32 Flags;
  NET32 ImmediateData;
  NET32 SourceQpn;
  UINT16 PkeyIndex;
  NET16 SLid;
  UINT8 SL;
  UINT8 DLidPathBits;
};

enum WV_CQ_NOTIFY_TYPE { WvCqError, WvCqNextCompletion, WvCqSolicited };

// ---- queue pairs ------------------------------------------------------------------------------

enum WV_QP_TYPE { WvQpTypeRc, WvQpTypeUc, WvQpTypeReserved, WvQpTypeUd };
enum WV_QP_STATE { WvQpStateReset, WvQpStateInit, WvQpStateRtr, WvQpStateRts, WvQpStateSqd,
                   WvQpStateSqError, WvQpStateError };

#define WV_SEND_IMMEDIATE  0x00000001
#define WV_SEND_FENCE      0x00000002
#define WV_SEND_SIGNALED   0x00000004
#define WV_SEND_SOLICITED  0x00000008
#define WV_SEND_INLINE     0x00000010
// ndwv: Send with Invalidate. The peer invalidates the memory window whose R_Key (network order)
// is the request's ImmediateData, before the Send's receive completes; a key that names no window
// bound to the connection fails the receive (WvWcLocalOpError) and ends the connection.
#define WV_SEND_INVALIDATE 0x00000020

#define WV_QP_SIGNAL_SENDS        0x00000001
#define WV_QP_MEMORY_MANAGEMENT   0x00000002

struct IWVCompletionQueue;
struct IWVSharedReceiveQueue;
struct IWVMemoryWindow;

struct WV_QP_CREATE {
  IWVCompletionQueue* pSendCq;
  IWVCompletionQueue* pReceiveCq;
  IWVSharedReceiveQueue* pSharedReceiveQueue;
  VOID* Context;
  SIZE_T SendDepth;
  SIZE_T SendSge;
  SIZE_T ReceiveDepth;
  SIZE_T ReceiveSge;
  SIZE_T MaxInlineSend;
  SIZE_T InitiatorDepth;
  SIZE_T ResponderResources;
  WV_QP_TYPE QpType;
  DWORD QpFlags;
};

#define WV_QP_ATTR_CAPABILITIES         0x00000001
#define WV_QP_ATTR_INITIATOR_DEPTH      0x00000002
#define WV_QP_ATTR_RESPONDER_RESOURCES  0x00000004
#define WV_QP_ATTR_CURRENT_STATE        0x00000008
#define WV_QP_ATTR_STATE                0x00000010

struct WV_QP_ATTRIBUTES {
  IWVCompletionQueue* pSendCq;
  IWVCompletionQueue* pReceiveCq;
  IWVSharedReceiveQueue* pSharedReceiveQueue;
  SIZE_T SendDepth;
  SIZE_T SendSge;
  SIZE_T ReceiveDepth;
  SIZE_T ReceiveSge;
  SIZE_T MaxInlineSend;
  SIZE_T InitiatorDepth;
  SIZE_T ResponderResources;
  WV_QP_TYPE QpType;
  WV_QP_STATE CurrentQpState;
  WV_QP_STATE QpState;
  NET32 Qpn;
  NET32 DestinationQpn;
};

struct WV_SEND_REQUEST;  // chained PostSend is not offered; use the single-request methods

// ---- connections ------------------------------------------------------------------------------

#define WV_MAX_PRIVATE_DATA 56

struct WV_CONNECT_PARAM {
  SIZE_T DataLength;
  UINT32 ResponderResources;  // inbound RDMA Reads this side accepts (IRD)
  UINT32 InitiatorDepth;      // outbound RDMA Reads this side issues (ORD)
  UINT8 RetryCount;
  UINT8 RnrRetryCount;
  UINT8 Reserved[2];
  UINT8 Data[WV_MAX_PRIVATE_DATA];
};

union WV_SOCKADDR {
  sockaddr Sa;
  sockaddr_in Sin;
  sockaddr_in6 Sin6;
};

struct WV_CONNECT_ATTRIBUTES {
  WV_SOCKADDR LocalAddress;
  WV_SOCKADDR PeerAddress;
  WV_DEVICE_ADDRESS Device;
  WV_CONNECT_PARAM Param;  // what the peer sent: its private data and its IRD/ORD, unswapped
  // ndwv: TRUE once Param holds what the peer sent (its request, reply or rejection came); FALSE
  // before (a Connect or GetRequest still waiting), Param then zeros.
  BOOL PeerParamReceived;
};

// ---- interfaces --------------------------------------------------------------------------------

struct IWVOverlapped : IUnknown {
  virtual HRESULT CancelOverlappedRequests() = 0;
  virtual HRESULT GetOverlappedResult(OVERLAPPED* pOverlapped, DWORD* pNumberOfBytesTransferred,
                                      BOOL bWait) = 0;
};

struct IWVCompletionQueue : IWVOverlapped {
  virtual HRESULT Resize(SIZE_T* pEntries) = 0;
  virtual HRESULT Peek(SIZE_T* pCompletedEntries) = 0;
  virtual HRESULT Notify(WV_CQ_NOTIFY_TYPE Type, OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT BatchNotify(SIZE_T CompletedEntries, OVERLAPPED* pOverlapped) = 0;
  virtual SIZE_T Poll(WV_COMPLETION Completions[], SIZE_T Entries) = 0;
};

struct IWVMemoryWindow : IUnknown {
  // ndwv: when a peer's Send with Invalidate unbinds the window, a WvInvalidateWindow completion
  // with this WrId (status WvWcSuccess) reaches the receive CQ of the QP the window was bound to,
  // before that Send's receive completion. Until it is set, a remote invalidation reports nothing.
  virtual HRESULT SetRemoteInvalidateId(UINT64 WrId) = 0;
};

struct IWVSharedReceiveQueue : IWVOverlapped {
  virtual HRESULT Query(SIZE_T* pMaxWr, SIZE_T* pMaxSge, SIZE_T* pSrqLimit) = 0;
  virtual HRESULT Modify(SIZE_T MaxWr, SIZE_T SrqLimit) = 0;
  virtual HRESULT PostReceive(UINT64 WrId, WV_SGE* pSgl, SIZE_T nSge) = 0;
  virtual HRESULT Notify(OVERLAPPED* pOverlapped) = 0;
};

struct IWVQueuePair : IWVOverlapped {
  virtual HRESULT Query(WV_QP_ATTRIBUTES* pAttributes) = 0;
  virtual HRESULT Modify(WV_QP_ATTRIBUTES* pAttributes, DWORD Options, OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT PostReceive(UINT64 WrId, WV_SGE* pSgl, SIZE_T nSge) = 0;
  virtual HRESULT PostSend(WV_SEND_REQUEST* pSend, WV_SEND_REQUEST** ppFailed) = 0;
};

struct IWVConnectQueuePair : IWVQueuePair {
  virtual HRESULT Send(UINT64 WrId, WV_SGE* pSgl, SIZE_T nSge, DWORD Flags, NET32 ImmediateData) = 0;
  virtual HRESULT Read(UINT64 WrId, WV_SGE* pSgl, SIZE_T nSge, DWORD Flags, NET64 Address,
                       NET32 Rkey) = 0;
  virtual HRESULT Write(UINT64 WrId, WV_SGE* pSgl, SIZE_T nSge, DWORD Flags, NET32 ImmediateData,
                        NET64 Address, NET32 Rkey) = 0;
  virtual HRESULT CompareExchange(UINT64 WrId, WV_SGE* pSge, DWORD Flags, NET64 Compare,
                                  NET64 Exchange, NET64 Address, NET32 Rkey) = 0;
  virtual HRESULT FetchAdd(UINT64 WrId, WV_SGE* pSge, DWORD Flags, NET64 Value, NET64 Address,
                           NET32 Rkey) = 0;
  virtual HRESULT BindMemoryWindow(IWVMemoryWindow* pMw, UINT64 WrId, UINT32 Lkey, DWORD AccessFlags,
                                   DWORD SendFlags, const VOID* pBuffer, SIZE_T BufferLength,
                                   NET32* pRkey) = 0;
  virtual HRESULT InvalidateMemoryWindow(IWVMemoryWindow* pMw, UINT64 WrId, DWORD SendFlags) = 0;
};

struct IWVProtectionDomain : IWVOverlapped {
  virtual HRESULT CreateSharedReceiveQueue(HANDLE hFile, SIZE_T MaxWr, SIZE_T MaxSge, SIZE_T SrqLimit,
                                           IWVSharedReceiveQueue** ppSrq) = 0;
  virtual HRESULT CreateConnectQueuePair(WV_QP_CREATE* pAttributes, IWVConnectQueuePair** ppQp) = 0;
  virtual HRESULT RegisterMemory(const VOID* pBuffer, SIZE_T BufferLength, DWORD AccessFlags,
                                 OVERLAPPED* pOverlapped, WV_MEMORY_KEYS* pKeys) = 0;
  virtual HRESULT DeregisterMemory(UINT32 Lkey, OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT AllocateMemoryWindow(IWVMemoryWindow** ppMw) = 0;
};

struct IWVDevice : IWVOverlapped {
  virtual HRESULT Query(WV_DEVICE_ATTRIBUTES* pAttributes) = 0;
  virtual HRESULT QueryPort(UINT8 PortNumber, WV_PORT_ATTRIBUTES* pAttributes) = 0;
  virtual HRESULT CreateCompletionQueue(HANDLE hFile, SIZE_T* pEntries, IWVCompletionQueue** ppCq) = 0;
  virtual HRESULT AllocateProtectionDomain(IWVProtectionDomain** ppPd) = 0;
  // ndwv: where the device completes requests and notifications (the CPUs of its progress engine
  // thread), as a processor group of 64 CPUs and a mask of CPUs in that group.
  virtual HRESULT QueryNotifyAffinity(USHORT* pGroup, KAFFINITY* pAffinity) = 0;
};

#define WV_EP_OPTION_ROUTE 0x00000001
// ndwv: OptionData one UINT8, the IANA protocol number of the service the endpoint listens or
// connects for (default 6, TCP). RoCE carries it in the IB CM service ID (port space, Annex A11),
// so a request reaches only a listener of the same protocol; iWARP's wire has no place for it.
#define WV_EP_OPTION_PROTOCOL 0x00000002
// ndwv: no OptionData. A Connect or Accept that times out completes WV_TIMEOUT, a success status
// meaning "not answered: try again", instead of WV_IO_TIMEOUT (ND v1's rule).
#define WV_EP_OPTION_RETRYABLE_TIMEOUT 0x00000004

struct IWVEndpoint : IWVOverlapped {
  virtual HRESULT Modify(DWORD Option, const VOID* pOptionData, SIZE_T OptionLength) = 0;
  virtual HRESULT BindAddress(const sockaddr* pAddress) = 0;
  virtual HRESULT Listen(SIZE_T Backlog) = 0;
  virtual HRESULT Reject(const VOID* pUserData, SIZE_T UserDataLength) = 0;
};

struct IWVConnectEndpoint : IWVEndpoint {
  // Completes when a connection request has been attached to pEndpoint.
  virtual HRESULT GetRequest(IWVConnectEndpoint* pEndpoint, OVERLAPPED* pOverlapped) = 0;
  // Completes when the peer accepted (WV_SUCCESS) or refused (WV_CONNECTION_REFUSED); the QP is
  // made ready to send by a later Accept(NULL, ...) on this (active) endpoint.
  virtual HRESULT Connect(IWVConnectQueuePair* pQp, const sockaddr* pAddress, WV_CONNECT_PARAM* pParam,
                          OVERLAPPED* pOverlapped) = 0;
  // Passive: readies pQp and answers the request; completes when the connection is established.
  // Active (pQp NULL, after Connect completed): readies the QP and completes the handshake.
  virtual HRESULT Accept(IWVConnectQueuePair* pQp, WV_CONNECT_PARAM* pParam, OVERLAPPED* pOverlapped) = 0;
  // Disconnect and flush: closes the connection, then moves the endpoint's QP to Error so every
  // outstanding request completes WvWcFlushed; completes after the flush.
  virtual HRESULT Disconnect(OVERLAPPED* pOverlapped) = 0;
  // Completes when the peer tears the connection down.
  virtual HRESULT NotifyDisconnect(OVERLAPPED* pOverlapped) = 0;
  virtual HRESULT Query(WV_CONNECT_ATTRIBUTES* pAttributes) = 0;
};

struct IWVProvider : IUnknown {
  virtual HANDLE GetFileHandle() = 0;
  virtual HRESULT QueryDeviceList(NET64* pGuidList, SIZE_T* pBufferSize) = 0;
  virtual HRESULT QueryDevice(NET64 Guid, WV_DEVICE_ATTRIBUTES* pAttributes) = 0;
  // Maps a local IP address to the device that serves it; fails with WV_INVALID_ADDRESS otherwise.
  virtual HRESULT TranslateAddress(const sockaddr* pAddress, WV_DEVICE_ADDRESS* pDeviceAddress) = 0;
  virtual HRESULT OpenDevice(NET64 Guid, IWVDevice** ppDevice) = 0;
  virtual HRESULT CreateConnectEndpoint(HANDLE hFile, IWVConnectEndpoint** ppConnectEndpoint) = 0;
};

// Returns a new provider (IID_IWVProvider); each has its own overlapped file handle.
HRESULT WvGetObject(REFIID riid, LPVOID* ppvObj);
