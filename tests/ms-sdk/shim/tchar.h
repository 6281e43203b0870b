// Stands in for the Windows header <tchar.h> that the NetworkDirect SDK programs include: the
// whole platform shim (windows_shim.h) comes with it.
#pragma once
#include "windows_shim.h"
