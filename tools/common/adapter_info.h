// ND2_ADAPTER_INFO as ndadapterinfo prints it (nd-tools.md §8), shared with ndinfo.
#pragma once

#include <ndwv/ndspi.h>

namespace ndtool {

// One "Name: value" line per field in struct order: InfoVersion, VendorId, DeviceId (decimal),
// AdapterId (0x%08llx), MaxRegistrationSize, MaxWindowSize, every ULONG field, then
// "AdapterFlags:" and one line per set flag (two tabs, the flag's name; unknown bits as %08x).
void PrintAdapterInfo(const ND2_ADAPTER_INFO& info);

}  // namespace ndtool
