// hello.cpp: a complete NetworkDirect program. The server accepts one connection and answers
// the client's message; both then disconnect.
//   hello server <ip>          listens on <ip> at a free port and prints the port
//   hello client <ip> <port>   connects, sends "hello", prints the answer
#include <ndwv/ndspi.h>
#include <ndwv/ndstatus.h>
#include <ndwv/ndsupport.h>

#include <arpa/inet.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static void Check(HRESULT hr, const char* what) {
  if (FAILED(hr)) {
    std::fprintf(stderr, "%s failed: %08x\n", what, unsigned(hr));
    std::exit(1);
  }
}

// An overlapped call either completes at once or returns ND_PENDING; then
// GetOverlappedResult(..., TRUE) waits for its final status.
static void Wait(IND2Overlapped* object, OVERLAPPED* ov, HRESULT hr, const char* what) {
  if (hr == ND_PENDING) hr = object->GetOverlappedResult(ov, TRUE);
  Check(hr, what);
}

// Polls the CQ until `count` requests have completed, each successfully.
static void Await(IND2CompletionQueue* cq, int count) {
  for (ND2_RESULT r; count > 0; --count) {
    while (cq->GetResults(&r, 1) == 0) {
    }
    Check(r.Status, r.RequestType == Nd2RequestTypeSend ? "Send completion" : "Receive completion");
  }
}

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[1], "server") && argc < 4)) {
    std::fprintf(stderr, "usage: hello server <ip> | hello client <ip> <port>\n");
    return 2;
  }
  const bool server = std::strcmp(argv[1], "server") == 0;
  sockaddr_in address{};  // the server's address; the client's is the same IP, port 0
  address.sin_family = AF_INET;
  if (inet_pton(AF_INET, argv[2], &address.sin_addr) != 1) return 2;
  sockaddr_in local = address;
  if (!server) address.sin_port = htons(std::atoi(argv[3]));

  Check(NdStartup(), "NdStartup");
  IND2Adapter* adapter;
  Check(NdOpenAdapter(IID_IND2Adapter, (sockaddr*)&local, sizeof local, (void**)&adapter),
        "NdOpenAdapter");
  HANDLE file;  // every overlapped object of the adapter completes through this file
  Check(adapter->CreateOverlappedFile(&file), "CreateOverlappedFile");
  IND2CompletionQueue* cq;
  Check(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 16, 0, 0, (void**)&cq),
        "CreateCompletionQueue");
  IND2QueuePair* qp;  // one CQ for both queues; depth 4, one SGE each way, no inline data
  Check(adapter->CreateQueuePair(IID_IND2QueuePair, cq, cq, nullptr, 4, 4, 1, 1, 0, (void**)&qp),
        "CreateQueuePair");

  // Buffers are registered before use: [0, 64) receives, [64, 128) sends.
  static char buffer[128];
  IND2MemoryRegion* mr;
  Check(adapter->CreateMemoryRegion(IID_IND2MemoryRegion, file, (void**)&mr), "CreateMemoryRegion");
  OVERLAPPED ov{};
  Wait(mr, &ov, mr->Register(buffer, sizeof buffer, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &ov), "Register");
  ND2_SGE receive = {buffer, 64, mr->GetLocalToken()};
  Check(qp->Receive(nullptr, &receive, 1), "Receive");  // posted before the peer can send

  IND2Connector* connector;
  Check(adapter->CreateConnector(IID_IND2Connector, file, (void**)&connector), "CreateConnector");
  IND2Listener* listener = nullptr;
  if (server) {
    Check(adapter->CreateListener(IID_IND2Listener, file, (void**)&listener), "CreateListener");
    Check(listener->Bind((sockaddr*)&address, sizeof address), "Listener Bind");
    Check(listener->Listen(1), "Listen");
    ULONG length = sizeof address;
    Check(listener->GetLocalAddress((sockaddr*)&address, &length), "GetLocalAddress");
    std::printf("listening on port %u\n", ntohs(address.sin_port));
    std::fflush(stdout);
    Wait(listener, &ov, listener->GetConnectionRequest(connector, &ov), "GetConnectionRequest");
    Wait(connector, &ov, connector->Accept(qp, 0, 0, nullptr, 0, &ov), "Accept");
  } else {
    Check(connector->Bind((sockaddr*)&local, sizeof local), "Connector Bind");
    Wait(connector, &ov,
         connector->Connect(qp, (sockaddr*)&address, sizeof address, 0, 0, nullptr, 0, &ov),
         "Connect");
    Wait(connector, &ov, connector->CompleteConnect(&ov), "CompleteConnect");
  }

  // The client speaks first; the server answers what it received.
  const char* message = server ? "world" : "hello";
  if (server) Await(cq, 1);  // the receive
  std::strcpy(buffer + 64, message);
  ND2_SGE send = {buffer + 64, ULONG(std::strlen(message) + 1), mr->GetLocalToken()};
  Check(qp->Send(nullptr, &send, 1, 0), "Send");
  Await(cq, server ? 1 : 2);  // the send; on the client also the answer, in either order
  std::printf("%s received: %s\n", argv[1], buffer);

  // Both sides disconnect; the QP is flushed when Disconnect completes.
  Wait(connector, &ov, connector->Disconnect(&ov), "Disconnect");
  Wait(mr, &ov, mr->Deregister(&ov), "Deregister");
  connector->Release();
  if (listener) listener->Release();
  mr->Release();
  qp->Release();
  cq->Release();
  CloseHandle(file);
  adapter->Release();
  Check(NdCleanup(), "NdCleanup");
  return 0;
}
