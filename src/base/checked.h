// Whether this build stops at a broken invariant (debug and sanitizer builds: a test run should
// fail loudly where it broke) or notes it and carries on (release: a user's process goes on).
#pragma once

namespace ndwv::base {

#if defined(NDWV_CHECKED_BUILD)  // CMakeLists.txt: Debug, sanitizer or -DNDWV_CHECKED=ON
inline constexpr bool kCheckedBuild = true;
#else
inline constexpr bool kCheckedBuild = false;
#endif

}  // namespace ndwv::base
