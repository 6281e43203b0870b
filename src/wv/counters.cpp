// ndwv_counters_* (include/ndwv/ndwv.h): the device's counters, for the ND provider's users and
// the tools. The verbs layer answers, as it answers everything about devices.
#include <ndwv/ndwv.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "dev/address.h"
#include "dev/counters.h"
#include "dev/device.h"

namespace {

using ndwv::dev::Counter;
using ndwv::dev::kCounters;

static_assert(kCounters <= NDWV_COUNTERS_MAX, "the public row has room for every counter");

std::vector<ndwv::dev::Transport> OfferedTransports() {
  std::vector<ndwv::dev::Transport> transports;
  for (ndwv::dev::Device* device : ndwv::dev::Device::All()) transports.push_back(device->transport());
  return transports;
}

void CopyText(char* out, size_t size, const std::string& text) {
  size_t n = std::min(text.size(), size - 1);
  memcpy(out, text.data(), n);
  out[n] = '\0';
}

}  // namespace

extern "C" size_t ndwv_counter_count(void) { return kCounters; }

extern "C" const char* ndwv_counter_name(size_t index) {
  return index < kCounters ? ndwv::dev::CounterName(Counter(index)) : nullptr;
}

extern "C" size_t ndwv_counters_snapshot(ndwv_counter_row* rows, size_t capacity) {
  const std::vector<ndwv::dev::Transport> transports = OfferedTransports();
  // The adapters' rows come first, then as many connections' as there is room for.
  size_t total = 0;
  size_t room = rows ? capacity - std::min(capacity, transports.size()) : 0;
  std::vector<ndwv::dev::CounterRow> all = ndwv::dev::CollectCounters(transports, room, &total);
  for (size_t i = 0; i < all.size() && i < capacity && rows; ++i) {
    const ndwv::dev::CounterRow& from = all[i];
    ndwv_counter_row& to = rows[i];
    memset(&to, 0, sizeof to);
    CopyText(to.transport, sizeof to.transport, from.transport == ndwv::dev::Transport::Roce ? "RoCEv2" : "iWARP");
    if (!from.adapter) {
      to.qpn = from.qpn;
      to.peer_qpn = from.peer_qpn;
      CopyText(to.local, sizeof to.local, ndwv::dev::Describe(from.local));
      CopyText(to.peer, sizeof to.peer, ndwv::dev::Describe(from.peer));
    }
    for (size_t c = 0; c < kCounters; ++c)
      if (ndwv::dev::CounterApplies(Counter(c), from.transport)) to.values[c] = from.values[c];
  }
  return total;
}

extern "C" uint64_t ndwv_counter_value(const ndwv_counter_row* row, const char* name) {
  if (!row || !name) return UINT64_MAX;
  for (size_t c = 0; c < kCounters; ++c)
    if (!strcmp(ndwv::dev::CounterName(Counter(c)), name)) return row->values[c];
  return UINT64_MAX;
}

extern "C" int ndwv_counters_write(FILE* out, const char* format) {
  if (!out) return -1;
  return ndwv::dev::WriteCounters(out, format, OfferedTransports()) ? 0 : -1;
}
