// ndcat: address catalog check (nd-tools.md §8). The given address and every entry of the
// provider's address list must pass NdCheckAddress; the list is fetched with the size probe
// NdQueryAddressList(0, NULL, &0) -> ND_BUFFER_OVERFLOW. No banners.
#include <cstdio>
#include <memory>

#include "nd_objects.h"

using namespace ndtool;

namespace {

const char kUsage[] =
    "ndcat [-l logFile] [-h] <ip>\n"
    "\n"
    "Address catalog check: <ip> must be a NetworkDirect address, and so must every entry of\n"
    "the address list (NdQueryAddressList).\n"
    "\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>            a local address: a.b.c.d or [ipv6], last\n";

const LocalToolSpec kSpec{"ndcat", kUsage, false};

}  // namespace

int main(int argc, char* argv[]) {
  LocalOptions o = ParseLocalOptions(argc, argv, kSpec);
  NdLibrary nd;
  ND_CHECK(NdCheckAddress(reinterpret_cast<const sockaddr*>(&o.address), o.addressLength),
           "NdCheckAddress");

  std::printf("Retrieving the full Addresslist\n");
  SIZE_T size = 0;
  HRESULT hr = NdQueryAddressList(0, nullptr, &size);
  if (hr != ND_BUFFER_OVERFLOW) Fail("NdQueryAddressList (size probe)", hr, __LINE__);
  if (size == 0) FailMessage("NdQueryAddressList (size probe) gave a size of 0", __LINE__);
  auto storage = std::make_unique<char[]>(size);
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(storage.get());
  ND_CHECK(NdQueryAddressList(0, list, &size), "NdQueryAddressList");
  if (list->iAddressCount <= 0) FailMessage("NdQueryAddressList returned no address", __LINE__);
  for (INT i = 0; i < list->iAddressCount; ++i) {
    const SOCKET_ADDRESS& a = list->Address[i];
    hr = NdCheckAddress(a.lpSockaddr, SIZE_T(a.iSockaddrLength));
    if (FAILED(hr)) {
      char text[64];
      std::printf("Address %d (%s) of the list:\n", i, FormatAddress(a.lpSockaddr, text, sizeof text));
      Fail("NdCheckAddress", hr, __LINE__);
    }
  }
  std::printf("\nValidation of full Addresslist passed\n");
  std::fflush(stdout);
  return 0;
}
