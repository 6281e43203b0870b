/* A C program on the NetworkDirect headers, as Windows ND programs written in C use them: the
 * helper functions by their C names (also through dlsym), the interfaces through their lpVtbl
 * tables. It opens the adapter serving 127.0.0.1 (on the transport NDWV_TRANSPORTS selects),
 * queries it, makes and releases a few objects, and checks that every reference count comes back
 * to zero. Prints "OK" last on success; exits 1 with a message on the first failure. */
#include <ndspi.h>
#include <ndstatus.h>
#include <ndsupport.h>
#include <ndwv/ndwv.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The C vtables list the methods in the SPI's order, after QueryInterface, AddRef, Release. */
#define SLOT(vtbl, method) (offsetof(vtbl, method) / sizeof(void*))
_Static_assert(SLOT(IUnknownVtbl, Release) == 2, "IUnknown");
_Static_assert(SLOT(IND2OverlappedVtbl, GetOverlappedResult) == 4, "IND2Overlapped");
_Static_assert(SLOT(IND2CompletionQueueVtbl, GetResults) == 8, "IND2CompletionQueue");
_Static_assert(SLOT(IND2SharedReceiveQueueVtbl, Receive) == 8, "IND2SharedReceiveQueue");
_Static_assert(SLOT(IND2MemoryWindowVtbl, GetRemoteToken) == 3, "IND2MemoryWindow");
_Static_assert(SLOT(IND2MemoryRegionVtbl, GetRemoteToken) == 8, "IND2MemoryRegion");
_Static_assert(SLOT(IND2QueuePairVtbl, Write) == 9, "IND2QueuePair");
_Static_assert(SLOT(IND2ConnectorVtbl, Disconnect) == 15, "IND2Connector");
_Static_assert(SLOT(IND2ListenerVtbl, GetConnectionRequest) == 8, "IND2Listener");
_Static_assert(SLOT(IND2AdapterVtbl, CreateListener) == 13, "IND2Adapter");
_Static_assert(SLOT(IND2ProviderVtbl, OpenAdapter) == 5, "IND2Provider");
_Static_assert(SLOT(INDOverlappedVtbl, GetOverlappedResult) == 4, "INDOverlapped");
_Static_assert(SLOT(INDCompletionQueueVtbl, GetResults) == 7, "INDCompletionQueue");
_Static_assert(SLOT(INDMemoryWindowVtbl, Release) == 2, "INDMemoryWindow");
_Static_assert(SLOT(INDEndpointVtbl, Write) == 12, "INDEndpoint");
_Static_assert(SLOT(INDConnectorVtbl, Disconnect) == 14, "INDConnector");
_Static_assert(SLOT(INDListenVtbl, GetConnectionRequest) == 5, "INDListen");
_Static_assert(SLOT(INDAdapterVtbl, Listen) == 13, "INDAdapter");
_Static_assert(SLOT(INDProviderVtbl, OpenAdapter) == 4, "INDProvider");
_Static_assert(SLOT(IClassFactoryVtbl, LockServer) == 4, "IClassFactory");

/* The tags of Microsoft's header are there too. */
_Static_assert(sizeof(struct _ND2_ADAPTER_INFO) == 96, "_ND2_ADAPTER_INFO");
_Static_assert(sizeof(struct _ND2_ADAPTER_INFO32) == 88, "_ND2_ADAPTER_INFO32");
_Static_assert(sizeof(struct _ND2_RESULT) == 32, "_ND2_RESULT");
_Static_assert(sizeof(struct _ND2_SGE) == 16, "_ND2_SGE");
_Static_assert(sizeof(enum _ND2_REQUEST_TYPE) == 4, "_ND2_REQUEST_TYPE");
_Static_assert(sizeof(struct _ND_ADAPTER_INFO1) == 128, "_ND_ADAPTER_INFO1");
_Static_assert(sizeof(struct _ND_RESULT) == 16, "_ND_RESULT");
_Static_assert(sizeof(struct _ND_SGE) == 24, "_ND_SGE");
_Static_assert(sizeof(struct _ND_MW_DESCRIPTOR) == 20, "_ND_MW_DESCRIPTOR");

static void Fail(const char* what, long value) {
  printf("FAIL: %s (0x%08lx)\n", what, (unsigned long)value);
  exit(1);
}

#define CHECK(condition) \
  do {                   \
    if (!(condition)) Fail(#condition, 0); \
  } while (0)
#define CHECK_HR(expected, expr)                  \
  do {                                            \
    HRESULT hr_ = (expr);                         \
    if (hr_ != (expected)) Fail(#expr, (long)hr_); \
  } while (0)

/* The helper library's entry points, by the names a program loading it would look up (the
 * handle of the program itself reaches the libraries it was linked with). Returns NdStartup. */
static HRESULT (*FindEntryPointsByName(void))(void) {
  static const char* const names[] = {"NdStartup",       "NdCleanup",          "NdFlushProviders",
                                      "NdQueryAddressList", "NdResolveAddress", "NdCheckAddress",
                                      "NdOpenAdapter"};
  void* program = dlopen(NULL, RTLD_NOW);
  CHECK(program != NULL);
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
    if (dlsym(program, names[i]) == NULL) Fail(names[i], 0);
  }
  /* POSIX's way to turn dlsym's object pointer into a function pointer. */
  HRESULT (*startup)(void) = NULL;
  void* symbol = dlsym(program, "NdStartup");
  memcpy(&startup, &symbol, sizeof symbol);
  dlclose(program);
  return startup;
}

/* 127.0.0.1 from NdQueryAddressList, found the way a C program walks the list. */
static struct sockaddr_in Loopback(void) {
  SIZE_T size = 0;
  CHECK_HR(ND_BUFFER_OVERFLOW, NdQueryAddressList(0, NULL, &size));
  CHECK(size >= sizeof(SOCKET_ADDRESS_LIST));
  SOCKET_ADDRESS_LIST* list = (SOCKET_ADDRESS_LIST*)malloc(size);
  CHECK(list != NULL);
  CHECK_HR(ND_SUCCESS, NdQueryAddressList(0, list, &size));
  struct sockaddr_in found;
  memset(&found, 0, sizeof found);
  for (INT i = 0; i < list->iAddressCount; ++i) {
    const struct sockaddr_in* a = (const struct sockaddr_in*)list->Address[i].lpSockaddr;
    if (a->sin_family == AF_INET && a->sin_addr.s_addr == htonl(INADDR_LOOPBACK)) found = *a;
  }
  free(list);
  CHECK(found.sin_family == AF_INET);
  return found;
}

static void UseAdapter(IND2Adapter* adapter) {
  ND2_ADAPTER_INFO info;
  memset(&info, 0, sizeof info);
  info.InfoVersion = ND_VERSION_2;
  ULONG size = 0;
  CHECK_HR(ND_BUFFER_OVERFLOW, adapter->lpVtbl->Query(adapter, NULL, &size));
  CHECK(size == sizeof info);
  CHECK_HR(ND_SUCCESS, adapter->lpVtbl->Query(adapter, &info, &size));
  CHECK(info.MaxCompletionQueueDepth > 0 && info.MaxReceiveQueueDepth > 0);
  printf("adapter %016llx (%s): MaxCompletionQueueDepth %u, MaxInitiatorSge %u\n",
         (unsigned long long)info.AdapterId, ndwv_adapter_transport(info.AdapterId),
         info.MaxCompletionQueueDepth, info.MaxInitiatorSge);

  /* QueryInterface by pointer, as C passes REFIID. */
  IUnknown* unknown = NULL;
  CHECK_HR(S_OK, adapter->lpVtbl->QueryInterface(adapter, &IID_IUnknown, (void**)&unknown));
  CHECK(unknown != NULL && unknown->lpVtbl->Release(unknown) == 1);
  void* other = &other;
  CHECK_HR(E_NOINTERFACE, adapter->lpVtbl->QueryInterface(adapter, &IID_IND2QueuePair, &other));
  CHECK(other == NULL);

  HANDLE file = NULL;
  CHECK_HR(ND_SUCCESS, adapter->lpVtbl->CreateOverlappedFile(adapter, &file));
  IND2CompletionQueue* cq = NULL;
  CHECK_HR(ND_SUCCESS, adapter->lpVtbl->CreateCompletionQueue(adapter, &IID_IND2CompletionQueue,
                                                              file, 16, 0, 0, (void**)&cq));
  ND2_RESULT result;
  CHECK(cq->lpVtbl->GetResults(cq, &result, 1) == 0);
  IND2QueuePair* qp = NULL;
  CHECK_HR(ND_SUCCESS, adapter->lpVtbl->CreateQueuePair(adapter, &IID_IND2QueuePair,
                                                        (IUnknown*)cq, (IUnknown*)cq, NULL, 4, 4,
                                                        1, 1, 0, (void**)&qp));
  CHECK(qp->lpVtbl->Release(qp) == 0);
  CHECK(cq->lpVtbl->Release(cq) == 0);
  CHECK(CloseHandle(file));
}

int main(void) {
  HRESULT (*startup)(void) = FindEntryPointsByName();
  CHECK_HR(ND_DEVICE_NOT_READY, NdCheckAddress(NULL, 0));
  CHECK_HR(ND_SUCCESS, startup());
  struct sockaddr_in loopback = Loopback();
  CHECK_HR(ND_SUCCESS, NdCheckAddress((const struct sockaddr*)&loopback, sizeof loopback));

  IND2Adapter* adapter = NULL;
  CHECK_HR(ND_SUCCESS, NdOpenAdapter(&IID_IND2Adapter, (const struct sockaddr*)&loopback,
                                     sizeof loopback, (void**)&adapter));
  UseAdapter(adapter);
  CHECK(adapter->lpVtbl->Release(adapter) == 0);

  CHECK_HR(ND_SUCCESS, NdCleanup());
  puts("OK");
  return 0;
}
