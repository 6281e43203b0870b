// The fuzz targets' assertion: a failed check aborts, which libFuzzer reports with the input.
#pragma once
#include <cstdlib>

#define CHECK(c)              \
  do {                        \
    if (!(c)) std::abort();   \
  } while (0)
