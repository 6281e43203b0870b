// The install test's consumer: built against an installed ndwv (pkg-config and find_package), it
// goes through the library's entry points and prints OK. See tests/install/run.sh. It includes
// the SDK's headers by the names a Windows program uses; the flags of pkg-config and of the
// CMake target find them.
#include <ndspi.h>
#include <ndstatus.h>
#include <ndsupport.h>
#include <ndwv/ndwv.h>

#include <arpa/inet.h>
#include <cstdio>
#include <vector>

static int Fail(const char* what, HRESULT hr) {
  std::printf("%s failed: %08x\n", what, unsigned(hr));
  return 1;
}

int main() {
  HRESULT hr = NdStartup();
  if (FAILED(hr)) return Fail("NdStartup", hr);

  SIZE_T size = 0;  // first call: the size needed
  hr = NdQueryAddressList(0, nullptr, &size);
  if (hr != ND_BUFFER_OVERFLOW || size == 0) return Fail("NdQueryAddressList (size)", hr);
  std::vector<char> storage(size);
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(storage.data());
  hr = NdQueryAddressList(0, list, &size);
  if (FAILED(hr)) return Fail("NdQueryAddressList", hr);
  std::printf("%d addresses\n", int(list->iAddressCount));

  sockaddr_in loopback{};
  loopback.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &loopback.sin_addr);
  IND2Adapter* adapter = nullptr;
  hr = NdOpenAdapter(IID_IND2Adapter, reinterpret_cast<sockaddr*>(&loopback), sizeof loopback,
                     reinterpret_cast<void**>(&adapter));
  if (FAILED(hr)) return Fail("NdOpenAdapter", hr);

  ND2_ADAPTER_INFO info{};
  info.InfoVersion = ND_VERSION_2;
  ULONG infoSize = sizeof info;
  hr = adapter->Query(&info, &infoSize);
  if (FAILED(hr)) return Fail("IND2Adapter::Query", hr);
  const char* transport = ndwv_adapter_transport(info.AdapterId);
  std::printf("adapter 0x%llx: %s, MaxCompletionQueueDepth %u\n",
              (unsigned long long)info.AdapterId, transport ? transport : "?",
              unsigned(info.MaxCompletionQueueDepth));

  HANDLE file = nullptr;
  hr = adapter->CreateOverlappedFile(&file);
  if (FAILED(hr)) return Fail("CreateOverlappedFile", hr);
  IND2CompletionQueue* cq = nullptr;
  hr = adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 64, 0, 0,
                                      reinterpret_cast<void**>(&cq));
  if (FAILED(hr)) return Fail("CreateCompletionQueue", hr);
  ND2_RESULT result;
  if (cq->GetResults(&result, 1) != 0) return Fail("GetResults on a new CQ", E_UNEXPECTED);

  cq->Release();
  CloseHandle(file);
  adapter->Release();
  hr = NdCleanup();
  if (FAILED(hr)) return Fail("NdCleanup", hr);
  std::printf("OK\n");
  return 0;
}
