// ND provider and adapter over fake WV objects: COM rules, adapter info, argument validation of
// the Create* methods.
#include <set>
#include <string>

#include "test_nd_fakes.h"

namespace ndwv::nd::testing {
namespace {

TEST_F(NdTest, QueryInterfaceAnswersOwnIidUnknownAndOverlapped) {
  IND2CompletionQueue* cq = MakeCq();
  void* p = nullptr;
  EXPECT_EQ(cq->QueryInterface(IID_IUnknown, &p), S_OK);
  EXPECT_EQ(p, cq);
  EXPECT_EQ(cq->QueryInterface(IID_IND2Overlapped, &p), S_OK);
  EXPECT_EQ(p, cq);
  EXPECT_EQ(cq->QueryInterface(IID_IND2CompletionQueue, &p), S_OK);
  EXPECT_EQ(cq->QueryInterface(IID_IND2QueuePair, &p), E_NOINTERFACE);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(cq->Release(), 3u);  // three successful queries took references
  EXPECT_EQ(cq->Release(), 2u);
  EXPECT_EQ(cq->Release(), 1u);
  EXPECT_EQ(cq->Release(), 0u);

  // The adapter is no IND2Overlapped.
  EXPECT_EQ(adapter->QueryInterface(IID_IND2Overlapped, &p), E_NOINTERFACE);
}

TEST_F(NdTest, ReleaseCountsOnlyClientReferences) {
  IND2CompletionQueue* cq = MakeCq();
  IND2QueuePair* qp = MakeQp(cq);  // holds the CQ internally
  EXPECT_EQ(cq->AddRef(), 2u);
  EXPECT_EQ(cq->Release(), 1u);
  EXPECT_EQ(cq->Release(), 0u);  // the QP's hold is not the client's business
  EXPECT_EQ(device->lastCq->refs.load(), 1u) << "the WV CQ must outlive the QP using it";
  EXPECT_EQ(qp->Release(), 0u);
}

TEST_F(NdTest, CreateWithWrongIidFails) {
  void* p = nullptr;
  EXPECT_EQ(adapter->CreateCompletionQueue(IID_IND2QueuePair, file, 4, 0, 0, &p), E_NOINTERFACE);
  EXPECT_EQ(p, nullptr);
}

TEST_F(NdTest, QueryReportsDeviceLimitsInNdTerms) {
  ULONG size = 0;
  EXPECT_EQ(adapter->Query(nullptr, &size), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, sizeof(ND2_ADAPTER_INFO));

  ND2_ADAPTER_INFO info{};
  info.InfoVersion = ND_VERSION_2;
  size = sizeof(info) - 1;
  EXPECT_EQ(adapter->Query(&info, &size), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(info.MaxCompletionQueueDepth, 0u) << "a short buffer stays untouched";

  info = Info();
  EXPECT_EQ(info.InfoVersion, ULONG(ND_VERSION_2));
  EXPECT_EQ(info.VendorId, 0x1234);
  EXPECT_EQ(info.DeviceId, 0x42);
  EXPECT_EQ(info.AdapterId, kGuid);
  EXPECT_EQ(info.MaxRegistrationSize, SIZE_T(1) << 32);
  EXPECT_EQ(info.MaxInitiatorSge, 8u);
  EXPECT_EQ(info.MaxReceiveSge, 8u);
  EXPECT_EQ(info.MaxReadSge, 8u);
  EXPECT_EQ(info.MaxTransferLength, 1u << 30);
  EXPECT_EQ(info.MaxInlineDataSize, 256u);
  EXPECT_EQ(info.MaxInboundReadLimit, 16u);
  EXPECT_EQ(info.MaxOutboundReadLimit, 16u);
  EXPECT_EQ(info.MaxReceiveQueueDepth, 4096u);
  EXPECT_EQ(info.MaxInitiatorQueueDepth, 4096u);
  EXPECT_EQ(info.MaxSharedReceiveQueueDepth, 1024u);
  EXPECT_EQ(info.MaxCompletionQueueDepth, 65536u);
  EXPECT_EQ(info.InlineRequestThreshold, 128u);
  EXPECT_LE(info.InlineRequestThreshold, info.MaxInlineDataSize);
  EXPECT_EQ(info.LargeRequestThreshold, 64u * 1024);
  EXPECT_EQ(info.MaxCallerData, ULONG(WV_MAX_PRIVATE_DATA)) << "what WV_CONNECT_PARAM carries";
  EXPECT_EQ(info.MaxCalleeData, ULONG(WV_MAX_PRIVATE_DATA));
  EXPECT_EQ(info.AdapterFlags,
            ULONG(ND_ADAPTER_FLAG_IN_ORDER_DMA_SUPPORTED | ND_ADAPTER_FLAG_CQ_RESIZE_SUPPORTED |
                  ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED));

  info.InfoVersion = ND_VERSION_1;
  size = sizeof(info);
  EXPECT_EQ(adapter->Query(&info, &size), ND_SUCCESS);
  info.InfoVersion = 7;
  EXPECT_EQ(adapter->Query(&info, &size), ND_INVALID_PARAMETER_1);
}

TEST_F(NdTest, FlagsFollowDeviceCapabilities) {
  device->attributes.CapabilityFlags = 0;
  device->attributes.MaxInlineSend = 64;
  device->attributes.MaxPrivateData = 40;
  IND2Adapter* second = nullptr;
  ASSERT_EQ(provider->OpenAdapter(IID_IND2Adapter, kGuid, reinterpret_cast<void**>(&second)),
            ND_SUCCESS);
  ND2_ADAPTER_INFO info{};
  info.InfoVersion = ND_VERSION_2;
  ULONG size = sizeof(info);
  ASSERT_EQ(second->Query(&info, &size), ND_SUCCESS);
  EXPECT_EQ(info.AdapterFlags, ULONG(ND_ADAPTER_FLAG_LOOPBACK_CONNECTIONS_SUPPORTED));
  EXPECT_EQ(info.InlineRequestThreshold, 64u);
  EXPECT_EQ(info.MaxCallerData, 40u);
  EXPECT_EQ(second->Release(), 0u);
}

TEST_F(NdTest, ProviderResolvesServedAddressesToTheDeviceGuid) {
  sockaddr_in loopback = Ipv4("127.0.0.1", 4242);
  UINT64 id = 0;
  EXPECT_EQ(provider->ResolveAddress(Sa(loopback), sizeof(loopback), &id), ND_SUCCESS);
  EXPECT_EQ(id, kGuid);
  sockaddr_in other = Ipv4("192.0.2.1");
  EXPECT_EQ(provider->ResolveAddress(Sa(other), sizeof(other), &id), ND_INVALID_ADDRESS);
  EXPECT_EQ(provider->ResolveAddress(nullptr, sizeof(other), &id), ND_INVALID_PARAMETER_1);
  EXPECT_EQ(provider->ResolveAddress(Sa(other), 8, &id), ND_INVALID_PARAMETER_2);
}

TEST_F(NdTest, OpenAdapterWithUnknownIdIsInvalidParameter) {
  void* p = nullptr;
  EXPECT_EQ(provider->OpenAdapter(IID_IND2Adapter, kGuid + 1, &p), ND_INVALID_PARAMETER);
  EXPECT_EQ(provider->OpenAdapter(IID_INDAdapter, kGuid, &p), E_NOINTERFACE);
}

// The loopback addresses are served by the fake; the host has at least 127.0.0.1.
TEST_F(NdTest, AddressListUsesTheSizeProtocol) {
  ULONG size = 0;
  ASSERT_EQ(provider->QueryAddressList(nullptr, &size), ND_BUFFER_OVERFLOW);
  ASSERT_GE(size, offsetof(SOCKET_ADDRESS_LIST, Address) + sizeof(SOCKET_ADDRESS) + 16);
  std::vector<BYTE> buffer(size + 64, 0xee);
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data());
  ULONG shortSize = size - 1;
  EXPECT_EQ(provider->QueryAddressList(list, &shortSize), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(shortSize, size);
  EXPECT_EQ(buffer[0], 0xee) << "untouched on overflow";

  ULONG bigger = ULONG(buffer.size());
  ASSERT_EQ(provider->QueryAddressList(list, &bigger), ND_SUCCESS);
  EXPECT_EQ(bigger, size);
  std::set<std::string> seen;
  for (INT i = 0; i < list->iAddressCount; ++i) {
    const SOCKET_ADDRESS& entry = (&list->Address[0])[i];
    auto* where = reinterpret_cast<BYTE*>(entry.lpSockaddr);
    EXPECT_GE(where, buffer.data());
    EXPECT_LE(where + entry.iSockaddrLength, buffer.data() + size) << "inside the caller's buffer";
    char text[64] = {};
    const void* ip =
        entry.lpSockaddr->sa_family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(where)->sin_addr)
            : &reinterpret_cast<sockaddr_in6*>(where)->sin6_addr;
    inet_ntop(entry.lpSockaddr->sa_family, ip, text, sizeof(text));
    seen.insert(text);
  }
  EXPECT_TRUE(seen.count("127.0.0.1"));
  EXPECT_EQ(seen.size(), size_t(list->iAddressCount)) << "no duplicates";

  // The adapter lists the addresses of its own device: the same ones here.
  ULONG adapterSize = 0;
  EXPECT_EQ(adapter->QueryAddressList(nullptr, &adapterSize), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(adapterSize, size);
}

TEST_F(NdTest, CreateCompletionQueueChecksDepthGroupAndHandle) {
  const ULONG max = Info().MaxCompletionQueueDepth;
  void* p = nullptr;
  EXPECT_EQ(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 0, 0, 0, &p),
            ND_INVALID_PARAMETER_3);
  EXPECT_EQ(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, max + 1, 0, 0, &p),
            ND_INVALID_PARAMETER_3);
  EXPECT_EQ(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, 4, 1, 0, &p),
            ND_INVALID_PARAMETER_4);
  EXPECT_EQ(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, nullptr, 4, 0, 0, &p),
            ND_INVALID_HANDLE);
  // Exactly the maximum works; the affinity is advisory.
  ASSERT_EQ(adapter->CreateCompletionQueue(IID_IND2CompletionQueue, file, max, 0, 0x3, &p),
            ND_SUCCESS);
  EXPECT_EQ(device->cqEntries, max);
  EXPECT_EQ(device->cqFile, file) << "the CQ's notifications complete to its overlapped file";
  EXPECT_EQ(static_cast<IND2CompletionQueue*>(p)->Release(), 0u);
}

TEST_F(NdTest, CreateQueuePairChecksEveryArgumentByPosition) {
  IND2CompletionQueue* cq = MakeCq();
  Foreign* foreign = new Foreign;
  IND2MemoryRegion* mr = MakeMr();
  const ND2_ADAPTER_INFO info = Info();
  void* p = nullptr;
  auto create = [&](IUnknown* rcq, IUnknown* icq, ULONG rq, ULONG iq, ULONG rsge, ULONG isge,
                    ULONG inlineSize) {
    return adapter->CreateQueuePair(IID_IND2QueuePair, rcq, icq, nullptr, rq, iq, rsge, isge,
                                    inlineSize, &p);
  };
  EXPECT_EQ(create(nullptr, cq, 4, 4, 1, 1, 0), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(create(foreign, cq, 4, 4, 1, 1, 0), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(create(mr, cq, 4, 4, 1, 1, 0), ND_INVALID_PARAMETER_2) << "an MR is no CQ";
  EXPECT_EQ(create(cq, foreign, 4, 4, 1, 1, 0), ND_INVALID_PARAMETER_3);
  EXPECT_EQ(create(cq, cq, 0, 4, 1, 1, 0), ND_INVALID_PARAMETER_5);
  EXPECT_EQ(create(cq, cq, info.MaxReceiveQueueDepth + 1, 4, 1, 1, 0), ND_INVALID_PARAMETER_5);
  EXPECT_EQ(create(cq, cq, 4, 0, 1, 1, 0), ND_INVALID_PARAMETER_6);
  EXPECT_EQ(create(cq, cq, 4, info.MaxInitiatorQueueDepth + 1, 1, 1, 0), ND_INVALID_PARAMETER_6);
  EXPECT_EQ(create(cq, cq, 4, 4, info.MaxReceiveSge + 1, 1, 0), ND_INVALID_PARAMETER_7);
  EXPECT_EQ(create(cq, cq, 4, 4, 1, info.MaxInitiatorSge + 1, 0), ND_INVALID_PARAMETER_8);
  EXPECT_EQ(create(cq, cq, 4, 4, 1, 1, info.MaxInlineDataSize + 1), ND_INVALID_PARAMETER_9);
  EXPECT_EQ(pd->lastQp, nullptr) << "nothing reached WV";

  // The maxima themselves are fine. SGE capacity asked of WV: one more than the application asked
  // (ndmw posts that many), which WV rounds up to what fills its entries; at most the maximum.
  int context = 0;
  ASSERT_EQ(adapter->CreateQueuePair(IID_IND2QueuePair, cq, cq, &context, info.MaxReceiveQueueDepth,
                                     info.MaxInitiatorQueueDepth, 1, 1, info.MaxInlineDataSize, &p),
            ND_SUCCESS);
  const WV_QP_CREATE& made = pd->lastCreate;
  EXPECT_EQ(made.Context, &context);
  EXPECT_EQ(made.ReceiveDepth, info.MaxReceiveQueueDepth);
  EXPECT_EQ(made.SendDepth, info.MaxInitiatorQueueDepth);
  EXPECT_EQ(made.SendSge, 2u);
  EXPECT_EQ(made.ReceiveSge, 2u);
  EXPECT_EQ(made.MaxInlineSend, info.MaxInlineDataSize);
  EXPECT_EQ(made.QpType, WvQpTypeRc);
  EXPECT_EQ(made.pSendCq, device->lastCq);
  EXPECT_EQ(made.pReceiveCq, device->lastCq);
  EXPECT_EQ(made.pSharedReceiveQueue, nullptr);

  EXPECT_EQ(static_cast<IND2QueuePair*>(p)->Release(), 0u);
  ASSERT_EQ(create(cq, cq, 4, 4, info.MaxReceiveSge, info.MaxInitiatorSge, 0), ND_SUCCESS);
  EXPECT_EQ(pd->lastCreate.SendSge, info.MaxInitiatorSge);
  EXPECT_EQ(pd->lastCreate.ReceiveSge, info.MaxReceiveSge);
  EXPECT_EQ(static_cast<IND2QueuePair*>(p)->Release(), 0u);
  EXPECT_EQ(mr->Release(), 0u);
  EXPECT_EQ(cq->Release(), 0u);
  foreign->Release();
}

TEST_F(NdTest, ObjectsOfAnotherAdapterAreForeign) {
  IND2Adapter* other = nullptr;
  ASSERT_EQ(provider->OpenAdapter(IID_IND2Adapter, kGuid, reinterpret_cast<void**>(&other)),
            ND_SUCCESS);
  IND2CompletionQueue* otherCq = nullptr;
  ASSERT_EQ(other->CreateCompletionQueue(IID_IND2CompletionQueue, file, 4, 0, 0,
                                         reinterpret_cast<void**>(&otherCq)),
            ND_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(
      adapter->CreateQueuePair(IID_IND2QueuePair, otherCq, otherCq, nullptr, 4, 4, 1, 1, 0, &p),
      ND_INVALID_PARAMETER_2);
  EXPECT_EQ(otherCq->Release(), 0u);
  EXPECT_EQ(other->Release(), 0u);
}

TEST_F(NdTest, CreateQueuePairWithSrqNumbersItsOwnArguments) {
  IND2CompletionQueue* cq = MakeCq();
  IND2SharedReceiveQueue* srq = nullptr;
  ASSERT_EQ(adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, file, 32, 2, 0, 0, 0,
                                              reinterpret_cast<void**>(&srq)),
            ND_SUCCESS);
  const ND2_ADAPTER_INFO info = Info();
  void* p = nullptr;
  auto create = [&](IUnknown* s, ULONG iq, ULONG isge, ULONG inlineSize) {
    return adapter->CreateQueuePairWithSrq(IID_IND2QueuePair, cq, cq, s, nullptr, iq, isge,
                                           inlineSize, &p);
  };
  EXPECT_EQ(create(cq, 4, 1, 0), ND_INVALID_PARAMETER_4) << "a CQ is no SRQ";
  EXPECT_EQ(create(srq, 0, 1, 0), ND_INVALID_PARAMETER_6);
  EXPECT_EQ(create(srq, info.MaxInitiatorQueueDepth + 1, 1, 0), ND_INVALID_PARAMETER_6);
  EXPECT_EQ(create(srq, 4, info.MaxInitiatorSge + 1, 0), ND_INVALID_PARAMETER_7);
  EXPECT_EQ(create(srq, 4, 1, info.MaxInlineDataSize + 1), ND_INVALID_PARAMETER_8);
  ASSERT_EQ(create(srq, 4, 1, 0), ND_SUCCESS);
  EXPECT_EQ(pd->lastCreate.pSharedReceiveQueue, pd->lastSrq);
  EXPECT_EQ(static_cast<IND2QueuePair*>(p)->Release(), 0u);
  EXPECT_EQ(srq->Release(), 0u);
  EXPECT_EQ(cq->Release(), 0u);
}

TEST_F(NdTest, CreateSharedReceiveQueueChecksArguments) {
  const ND2_ADAPTER_INFO info = Info();
  void* p = nullptr;
  auto create = [&](ULONG depth, ULONG sge, ULONG threshold) {
    return adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, file, depth, sge,
                                             threshold, 0, 0, &p);
  };
  EXPECT_EQ(create(0, 1, 0), ND_INVALID_PARAMETER_3);
  EXPECT_EQ(create(info.MaxSharedReceiveQueueDepth + 1, 1, 0), ND_INVALID_PARAMETER_3);
  EXPECT_EQ(create(8, 5, 0), ND_INVALID_PARAMETER_4);  // the fake's MaxSrqSge is 4
  EXPECT_EQ(create(8, 1, 9), ND_INVALID_PARAMETER_5);
  ASSERT_EQ(create(8, 1, 2), ND_SUCCESS);
  EXPECT_EQ(pd->srqFile, file);
  EXPECT_EQ(pd->srqMaxSge, 4u);
  EXPECT_EQ(static_cast<IND2SharedReceiveQueue*>(p)->Release(), 0u);
}

TEST_F(NdTest, NoSrqSupportMeansNotSupported) {
  device->attributes.MaxSrq = 0;
  IND2Adapter* second = nullptr;
  ASSERT_EQ(provider->OpenAdapter(IID_IND2Adapter, kGuid, reinterpret_cast<void**>(&second)),
            ND_SUCCESS);
  void* p = nullptr;
  EXPECT_EQ(second->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, file, 8, 1, 0, 0, 0, &p),
            ND_NOT_SUPPORTED);
  EXPECT_EQ(second->CreateQueuePairWithSrq(IID_IND2QueuePair, nullptr, nullptr, nullptr, nullptr, 4,
                                           1, 0, &p),
            ND_NOT_SUPPORTED);
  EXPECT_EQ(second->Release(), 0u);
}

TEST_F(NdTest, CreateOverlappedFileGivesAWorkingHandle) {
  HANDLE h = nullptr;
  ASSERT_EQ(adapter->CreateOverlappedFile(&h), ND_SUCCESS);
  HANDLE port = CreateIoCompletionPort(h, nullptr, 0, 0);
  EXPECT_NE(port, nullptr);
  EXPECT_TRUE(CloseHandle(h));
  EXPECT_TRUE(CloseHandle(port));
  EXPECT_EQ(adapter->CreateOverlappedFile(nullptr), ND_INVALID_PARAMETER_1);
}

}  // namespace
}  // namespace ndwv::nd::testing
