// Clang's thread-safety analysis (-Wthread-safety): which lock guards which member, and which
// functions must be called with it held, written where the compiler checks them. Other compilers
// see nothing. The CI's clang build (scripts/fuzz.sh's tree) fails on a violation; the lock order
// itself is in docs/architecture.md, "Locking".
#pragma once

#if defined(__clang__)
#define NDWV_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define NDWV_THREAD_ANNOTATION(x)
#endif

#define NDWV_CAPABILITY(name) NDWV_THREAD_ANNOTATION(capability(name))
#define NDWV_SCOPED_CAPABILITY NDWV_THREAD_ANNOTATION(scoped_lockable)
#define NDWV_GUARDED_BY(lock) NDWV_THREAD_ANNOTATION(guarded_by(lock))
#define NDWV_REQUIRES(...) NDWV_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define NDWV_ACQUIRE(...) NDWV_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define NDWV_ACQUIRE_SHARED(...) NDWV_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define NDWV_RELEASE(...) NDWV_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define NDWV_RELEASE_SHARED(...) NDWV_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define NDWV_TRY_ACQUIRE(...) NDWV_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define NDWV_EXCLUDES(...) NDWV_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define NDWV_REQUIRES_SHARED(...) NDWV_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
// A function that checks (at run time) that the caller holds the lock: the analysis believes it.
#define NDWV_ASSERT_CAPABILITY(x) NDWV_THREAD_ANNOTATION(assert_capability(x))
#define NDWV_ASSERT_SHARED_CAPABILITY(x) NDWV_THREAD_ANNOTATION(assert_shared_capability(x))
// An accessor that returns a reference to the lock it names.
#define NDWV_RETURN_CAPABILITY(x) NDWV_THREAD_ANNOTATION(lock_returned(x))
// For the implementation of a lock itself, which the analysis cannot follow.
#define NDWV_NO_THREAD_SAFETY_ANALYSIS NDWV_THREAD_ANNOTATION(no_thread_safety_analysis)
