// <ndsupport.h> under the name a Windows program includes (why this directory: CMakeLists.txt).
#pragma once
#include "../ndsupport.h"
