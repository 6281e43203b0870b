// ndwv's own additions to the NetworkDirect API: what has no place in the SPI itself.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif
// The wire protocol of the adapter `adapter_id` (ND2_ADAPTER_INFO::AdapterId): "iWARP" (MPA,
// DDP and RDMAP over TCP) or "RoCEv2" (InfiniBand RC over UDP, IB CM); NULL if no such adapter.
const char* ndwv_adapter_transport(uint64_t adapter_id);

// Writes every NDWV_ environment setting, with its default, its current value if set, and its
// meaning (what `ndinfo --env` prints).
void ndwv_settings_describe(FILE* out);

// Writes the configuration reference (docs/configuration.md) as a Markdown document generated from
// the same declarations: every NDWV_ setting with its type, default, accepted values and meaning.
// The environment is not consulted, so the output is the same on every machine
// (`ndinfo --env --markdown`).
void ndwv_settings_describe_markdown(FILE* out);

// ---- Counters (docs/counters.md names and explains every one) --------------------------------
// The device counts per adapter (one set per transport offered: "iWARP", "RoCEv2") and per
// connection (each connected QP, while it lives; when it ends its counts stay in the adapter's).
// Reading never disturbs the data path. NDWV_COUNTERS=exit|signal writes the same report at exit
// or on SIGUSR2.

// Room for every counter, present and future: a row's size never changes.
#define NDWV_COUNTERS_MAX 128

typedef struct ndwv_counter_row {
  char transport[8];      // "iWARP" or "RoCEv2"
  uint32_t qpn;           // 0: the adapter's totals (then local and peer are empty)
  uint32_t peer_qpn;      // the peer's QPN (RoCE); 0 where the wire carries none (iWARP)
  char local[64];         // "address:port" of this side of the connection
  char peer[64];          // "address:port" of the peer
  uint64_t values[NDWV_COUNTERS_MAX];  // by index: see ndwv_counter_name
} ndwv_counter_row;

// The number of counters and the name of counter `index` (NULL past the end). Names are stable;
// new counters are added at the end.
size_t ndwv_counter_count(void);
const char* ndwv_counter_name(size_t index);

// Fills up to `capacity` rows (rows may be NULL when capacity is 0): first one totals row per
// adapter transport, then one row per live connection. Returns how many rows there are, which
// may exceed `capacity` (call again with more room). A counter that does not apply to a row's
// transport reads 0.
size_t ndwv_counters_snapshot(ndwv_counter_row* rows, size_t capacity);

// The value of the counter `name` in `row`; UINT64_MAX if there is no such counter.
uint64_t ndwv_counter_value(const ndwv_counter_row* row, const char* name);

// Writes the counters to `out`. format "text": a block per adapter and per connection, lines of
// name=value; "adapters": the adapter blocks only (what the tools print); "json": one object
// {"adapters": [...], "connections": [...]}. Returns 0, or -1 for an unknown format.
int ndwv_counters_write(FILE* out, const char* format);
#ifdef __cplusplus
}
#endif
