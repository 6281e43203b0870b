// ndwv's own additions to the NetworkDirect API: what has no place in the SPI itself.
#pragma once
#include <cstdio>

extern "C" {
// Writes every NDWV_ environment setting, with its default, its current value if set, and its
// meaning (what `ndinfo --env` prints).
void ndwv_settings_describe(FILE* out);
}
