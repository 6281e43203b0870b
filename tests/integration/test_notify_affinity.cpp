// GetNotifyAffinity on a CQ and an SRQ (nd2-spi.md §10, §13): real data, the CPUs of the thread
// that completes notifications. That it is that thread's and not the caller's is checked by the
// unit test WvDevice.NotifyAffinityIsTheEngineThreads; here the ND contract: a non-empty subset
// of the CPUs this process may use, and the argument checks.
#include <sched.h>

#include <gtest/gtest.h>

#include "harness.h"

namespace ndit {
namespace {

// The process's allowed CPUs as group + mask, the way ND counts them (64 CPUs per group).
bool Allowed(USHORT group, KAFFINITY mask) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return false;
  for (unsigned bit = 0; bit < 8 * sizeof(KAFFINITY); ++bit) {
    unsigned cpu = group * 8 * sizeof(KAFFINITY) + bit;
    if ((mask >> bit & 1) && (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &allowed))) return false;
  }
  return true;
}

template <class Queue>
void CheckAffinity(Queue* queue, const char* what) {
  USHORT group = 0xFFFF;
  KAFFINITY mask = 0;
  IT_OK(queue->GetNotifyAffinity(&group, &mask));
  IT_CHECK_MSG(mask != 0, std::string(what) + ": empty affinity");
  IT_CHECK_MSG(Allowed(group, mask), std::string(what) + ": CPUs this process may not use");
  IT_CHECK_HR(ND_INVALID_PARAMETER, queue->GetNotifyAffinity(nullptr, &mask));
  IT_CHECK_HR(ND_INVALID_PARAMETER, queue->GetNotifyAffinity(&group, nullptr));
}

TEST(IntegrationNotifyAffinity, IsAnAllowedSetOfCpus) {
  RunLocal([] {
    Adapter adapter;
    Ref<IND2CompletionQueue> cq = adapter.CreateCq(16);
    CheckAffinity(cq.get(), "CQ");
    Ref<IND2SharedReceiveQueue> srq;
    IT_OK(adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, adapter.file(), 16, 1, 0,
                                            0, 0, srq.Out()));
    CheckAffinity(srq.get(), "SRQ");
  });
}

}  // namespace
}  // namespace ndit
