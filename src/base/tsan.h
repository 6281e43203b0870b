// What ThreadSanitizer must be told about the hand-written locks (base/mutex.h). It sees their
// atomics, but not that they are locks: its reports would name no mutex, its lock-order checks
// would skip them, and a lock's own atomics would order more than the lock promises (a reader's
// fetch_add after another reader's fetch_sub). Each lock tells it what it does through these
// calls; in a build without TSan they are empty and inline to nothing.
#pragma once

#if defined(__SANITIZE_THREAD__)  // gcc
#define NDWV_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)  // clang
#define NDWV_TSAN 1
#endif
#endif

#ifdef NDWV_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace ndwv::base::tsan {

#ifdef NDWV_TSAN
inline constexpr unsigned kReadReentrant = __tsan_mutex_read_reentrant;
inline constexpr unsigned kReadLock = __tsan_mutex_read_lock;
inline constexpr unsigned kTryLock = __tsan_mutex_try_lock;
inline constexpr unsigned kTryLockFailed = __tsan_mutex_try_lock_failed;

inline void MutexCreate(void* m, unsigned flags) { __tsan_mutex_create(m, flags); }
inline void MutexDestroy(void* m) { __tsan_mutex_destroy(m, 0); }
// Between PreLock and PostLock (and PreUnlock and PostUnlock) TSan ignores the lock's own
// memory accesses and synchronisation, and takes the lock's word for what happened.
inline void PreLock(void* m, unsigned flags) { __tsan_mutex_pre_lock(m, flags); }
inline void PostLock(void* m, unsigned flags) { __tsan_mutex_post_lock(m, flags, 0); }
inline void PreUnlock(void* m, unsigned flags) { __tsan_mutex_pre_unlock(m, flags); }
inline void PostUnlock(void* m, unsigned flags) { __tsan_mutex_post_unlock(m, flags); }
#else
inline constexpr unsigned kReadReentrant = 0, kReadLock = 0, kTryLock = 0, kTryLockFailed = 0;

inline void MutexCreate(void*, unsigned) {}
inline void MutexDestroy(void*) {}
inline void PreLock(void*, unsigned) {}
inline void PostLock(void*, unsigned) {}
inline void PreUnlock(void*, unsigned) {}
inline void PostUnlock(void*, unsigned) {}
#endif

}  // namespace ndwv::base::tsan
