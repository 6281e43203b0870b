// IWVDevice::QueryNotifyAffinity reports the CPUs of the device's progress engine thread, where
// notifications are completed, not those of the thread that asks.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>

#include <ndwv/winverbs.h>

namespace {

// The first device of a new provider, or nullptr.
IWVDevice* OpenDevice(IWVProvider** provider) {
  if (FAILED(WvGetObject(IID_IWVProvider, reinterpret_cast<LPVOID*>(provider)))) return nullptr;
  NET64 guids[8] = {};
  SIZE_T size = sizeof guids;
  IWVDevice* device = nullptr;
  if (FAILED((*provider)->QueryDeviceList(guids, &size)) || FAILED((*provider)->OpenDevice(guids[0], &device)))
    return nullptr;
  return device;
}

// Exits 0 if the report matches the engine's CPU after the asking thread moved elsewhere.
[[noreturn]] void PinEngineThenAsk() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) std::exit(2);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &allowed)) ++cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);

  IWVProvider* provider = nullptr;
  IWVDevice* device = OpenDevice(&provider);
  if (!device) std::exit(3);
  // The engine starts on first use and inherits the starting thread's CPUs: this one, pinned.
  USHORT group = 0xFFFF;
  KAFFINITY mask = 0;
  if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) std::exit(5);
  if (FAILED(device->QueryNotifyAffinity(&group, &mask))) std::exit(6);
  if (pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed) != 0) std::exit(7);
  if (FAILED(device->QueryNotifyAffinity(&group, &mask))) std::exit(8);
  const int bits = 8 * sizeof(KAFFINITY);
  bool ok = group == cpu / bits && mask == KAFFINITY(1) << (cpu % bits);
  std::exit(ok ? 0 : 1);
}

TEST(WvDevice, NotifyAffinityIsTheEngineThreads) {
  // A fresh process, so that the engine is started in it, by the pinned thread.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(PinEngineThenAsk(), testing::ExitedWithCode(0), "");
}

TEST(WvDevice, NotifyAffinityNeedsBothOutputs) {
  IWVProvider* provider = nullptr;
  IWVDevice* device = OpenDevice(&provider);
  ASSERT_NE(device, nullptr);
  USHORT group = 0;
  KAFFINITY mask = 0;
  EXPECT_EQ(device->QueryNotifyAffinity(nullptr, &mask), WV_INVALID_PARAMETER);
  EXPECT_EQ(device->QueryNotifyAffinity(&group, nullptr), WV_INVALID_PARAMETER);
  EXPECT_EQ(device->QueryNotifyAffinity(&group, &mask), WV_SUCCESS);
  EXPECT_NE(mask, 0u);
  device->Release();
  provider->Release();
}

}  // namespace
