// ndadapterinfo: the ND2_ADAPTER_INFO of the adapter that owns an address (nd-tools.md §8), one
// "Name: value" line per field in struct order, then the adapter flags. No banners.
#include <cstdio>

#include "adapter_info.h"
#include "nd_objects.h"

using namespace ndtool;

namespace {

const char kUsage[] =
    "ndadapterinfo [-l logFile] [-h] <ip>\n"
    "\n"
    "Prints the ND2_ADAPTER_INFO of the adapter that owns <ip>: one line per field, then\n"
    "the adapter flags.\n"
    "\n"
    "  -l, --logFile f write stdout (and append stderr) to file f\n"
    "  -h, --help      this text\n"
    "  <ip>            a local address: a.b.c.d or [ipv6], last\n";

const LocalToolSpec kSpec{"ndadapterinfo", kUsage, false};

}  // namespace

int main(int argc, char* argv[]) {
  LocalOptions o = ParseLocalOptions(argc, argv, kSpec);
  const sockaddr* address = reinterpret_cast<const sockaddr*>(&o.address);
  NdLibrary nd;
  ND_CHECK(NdCheckAddress(address, o.addressLength), "NdCheckAddress");
  Adapter adapter;
  adapter.Open(address, o.addressLength);  // NdOpenAdapter, Query with InfoVersion = ND_VERSION_2
  PrintAdapterInfo(adapter.info());
  std::fflush(stdout);
  return 0;
}
