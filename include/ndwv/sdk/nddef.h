// <nddef.h> under the name a Windows program includes (why this directory: CMakeLists.txt).
#pragma once
#include "../ndspi.h"
