#include "adapter_info.h"

#include <cstdio>
#include <utility>

namespace ndtool {

namespace {

struct FlagName {
  ULONG flag;
  const char* name;
};
constexpr FlagName kAdapterFlags[] = {
    {ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED, "ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED"},
    {ND_ADAPTER_FLAG_CQ_INTERRUPT_MODERATION_SUPPORTED, "ND_ADAPTER_FLAG_CQ_INTERRUPT_MODERATION_SUPPORTED"},
    {ND_ADAPTER_FLAG_MULTI_ENGINE_SUPPORTED, "ND_ADAPTER_FLAG_MULTI_ENGINE_SUPPORTED"},
    {ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED, "ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED"},
    {ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED, "ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED"},
};

}  // namespace

void PrintAdapterInfo(const ND2_ADAPTER_INFO& info) {
  std::printf("InfoVersion: %u\n", info.InfoVersion);
  std::printf("VendorId: %u\n", unsigned(info.VendorId));
  std::printf("DeviceId: %u\n", unsigned(info.DeviceId));
  std::printf("AdapterId: 0x%08llx\n", (unsigned long long)info.AdapterId);
  std::printf("MaxRegistrationSize: %zu\n", size_t(info.MaxRegistrationSize));
  std::printf("MaxWindowSize: %zu\n", size_t(info.MaxWindowSize));
  const std::pair<const char*, ULONG> fields[] = {
      {"MaxInitiatorSge", info.MaxInitiatorSge},
      {"MaxReceiveSge", info.MaxReceiveSge},
      {"MaxReadSge", info.MaxReadSge},
      {"MaxTransferLength", info.MaxTransferLength},
      {"MaxInlineDataSize", info.MaxInlineDataSize},
      {"MaxInboundReadLimit", info.MaxInboundReadLimit},
      {"MaxOutboundReadLimit", info.MaxOutboundReadLimit},
      {"MaxReceiveQueueDepth", info.MaxReceiveQueueDepth},
      {"MaxInitiatorQueueDepth", info.MaxInitiatorQueueDepth},
      {"MaxSharedReceiveQueueDepth", info.MaxSharedReceiveQueueDepth},
      {"MaxCompletionQueueDepth", info.MaxCompletionQueueDepth},
      {"InlineRequestThreshold", info.InlineRequestThreshold},
      {"LargeRequestThreshold", info.LargeRequestThreshold},
      {"MaxCallerData", info.MaxCallerData},
      {"MaxCalleeData", info.MaxCalleeData},
  };
  for (const auto& [name, value] : fields) std::printf("%s: %u\n", name, value);
  std::printf("AdapterFlags:\n");
  ULONG unknown = info.AdapterFlags;
  for (const FlagName& f : kAdapterFlags) {
    if (info.AdapterFlags & f.flag) std::printf("\t\t%s\n", f.name);
    unknown &= ~f.flag;
  }
  if (unknown) std::printf("\t\t%08x\n", unknown);
}

}  // namespace ndtool
