// ndwv's own additions to the NetworkDirect API: what has no place in the SPI itself.
#pragma once
#include <cstdint>
#include <cstdio>

extern "C" {
// The wire protocol of the adapter `adapter_id` (ND2_ADAPTER_INFO::AdapterId): "iWARP" (MPA,
// DDP and RDMAP over TCP) or "RoCEv2" (InfiniBand RC over UDP, IB CM); NULL if no such adapter.
const char* ndwv_adapter_transport(uint64_t adapter_id);

// Writes every NDWV_ environment setting, with its default, its current value if set, and its
// meaning (what `ndinfo --env` prints).
void ndwv_settings_describe(FILE* out);
}
