// Where a busy-polling ping-pong's time goes, without a PMU: an LD_PRELOAD library that times
// the socket calls of one thread and the user-space work between them, in TSC cycles.
//
//   LD_PRELOAD=build/bench/libsyscall_probe.so NDWV_PROBE=server ndpingpong -s -p 127.0.0.1:5000
//
// At exit it prints to stderr, for every series with more than 1000 samples, the 10th, 50th and
// 90th percentiles:
//   turnaround   a recv() that returned a small message (< 200 bytes) to the next send() or
//                sendmsg(): the user-space work of answering a ping
//   poll gap     a recv() that found nothing to the next recv(): the user-space work of one
//                empty poll (half of it, on average, is added to noticing a message)
//   send, recv with data, recv empty   the system calls themselves
// Interposes recv, send and sendmsg only (what ndwv and the references use on the data path);
// ndwv calls libc through the PLT, so the probe sees its calls. rdtsc: x86-64 only. A measuring
// instrument for bench/README.md, not part of the library.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <x86intrin.h>

enum { kBuckets = 16384 };  // cycles; longer samples land in the last bucket
enum { kTurnaround, kPollGap, kSend, kRecvData, kRecvEmpty, kSeries };
static const char* const kNames[kSeries] = {"turnaround", "poll gap", "send", "recv with data",
                                            "recv empty"};
// Samples from any thread: the counts are a histogram, and a lost increment under a race is one
// sample less, not a wrong figure. The ping-pongs measured have one polling thread.
static uint32_t histogram[kSeries][kBuckets];
static uint64_t samples[kSeries];

static __thread uint64_t message_at;  // when a recv() returned a message (0: none pending)
static __thread uint64_t empty_at;    // when a recv() found nothing

static void Record(int series, uint64_t cycles) {
  histogram[series][cycles < kBuckets ? cycles : kBuckets - 1]++;
  samples[series]++;
}

static void* Next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) abort();
  return f;
}

ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  static ssize_t (*real)(int, void*, size_t, int);
  if (!real) real = (ssize_t(*)(int, void*, size_t, int))Next("recv");
  uint64_t start = __rdtsc();
  if (empty_at) Record(kPollGap, start - empty_at);
  empty_at = 0;
  ssize_t n = real(fd, buffer, length, flags);
  uint64_t end = __rdtsc();
  if (n > 0) {
    Record(kRecvData, end - start);
    if (n < 200) message_at = end;
  } else if (n < 0) {
    Record(kRecvEmpty, end - start);
    empty_at = end;
  }
  return n;
}

static void Sending(void) {
  if (message_at) Record(kTurnaround, __rdtsc() - message_at);
  message_at = 0;
}

ssize_t send(int fd, const void* buffer, size_t length, int flags) {
  static ssize_t (*real)(int, const void*, size_t, int);
  if (!real) real = (ssize_t(*)(int, const void*, size_t, int))Next("send");
  Sending();
  uint64_t start = __rdtsc();
  ssize_t n = real(fd, buffer, length, flags);
  Record(kSend, __rdtsc() - start);
  return n;
}

ssize_t sendmsg(int fd, const struct msghdr* message, int flags) {
  static ssize_t (*real)(int, const struct msghdr*, int);
  if (!real) real = (ssize_t(*)(int, const struct msghdr*, int))Next("sendmsg");
  Sending();
  uint64_t start = __rdtsc();
  ssize_t n = real(fd, message, flags);
  Record(kSend, __rdtsc() - start);
  return n;
}

static uint64_t Percentile(int series, uint64_t rank) {
  uint64_t seen = 0;
  for (uint64_t c = 0; c < kBuckets; ++c)
    if ((seen += histogram[series][c]) >= rank) return c;
  return kBuckets - 1;
}

__attribute__((destructor)) static void Report(void) {
  const char* label = getenv("NDWV_PROBE");
  for (int s = 0; s < kSeries; ++s) {
    uint64_t n = samples[s];
    if (n <= 1000) continue;
    fprintf(stderr, "probe %s: %-14s n=%-8lu p10=%-6lu p50=%-6lu p90=%lu cycles\n",
            label ? label : "", kNames[s], (unsigned long)n, (unsigned long)Percentile(s, n / 10),
            (unsigned long)Percentile(s, n / 2), (unsigned long)Percentile(s, n * 9 / 10));
  }
}
