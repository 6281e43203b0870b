// The helper library before NdStartup, and the address chores it shares with the provider.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ndwv/ndsupport.h>

#include "nd/address.h"
#include "nd/provider.h"

namespace ndwv::nd {
namespace {

sockaddr_in Ipv4(const char* ip, uint16_t port = 0) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

TEST(NdSupport, HelpersNeedNdStartup) {
  sockaddr_in loopback = Ipv4("127.0.0.1");
  const sockaddr* sa = reinterpret_cast<const sockaddr*>(&loopback);
  SIZE_T size = 0;
  void* adapter = nullptr;
  sockaddr_in local{};
  EXPECT_EQ(NdCleanup(), ND_DEVICE_NOT_READY);
  EXPECT_EQ(NdQueryAddressList(0, nullptr, &size), ND_DEVICE_NOT_READY);
  EXPECT_EQ(NdCheckAddress(sa, sizeof(loopback)), ND_DEVICE_NOT_READY);
  EXPECT_EQ(NdResolveAddress(sa, sizeof(loopback), reinterpret_cast<sockaddr*>(&local), &size),
            ND_DEVICE_NOT_READY);
  EXPECT_EQ(NdOpenAdapter(IID_IND2Adapter, sa, sizeof(loopback), &adapter), ND_DEVICE_NOT_READY);
  NdFlushProviders();  // harmless at any time
}

// The helpers over the real device, on loopback only.
TEST(NdSupport, StartedHelpersFindTheLoopbackAdapter) {
  ASSERT_EQ(NdStartup(), S_OK);
  ASSERT_EQ(NdStartup(), S_OK);  // counted
  sockaddr_in loopback = Ipv4("127.0.0.1", 9999);
  const sockaddr* sa = reinterpret_cast<const sockaddr*>(&loopback);
  EXPECT_EQ(NdCheckAddress(sa, sizeof(loopback)), ND_SUCCESS);
  sockaddr_in elsewhere = Ipv4("192.0.2.200");
  EXPECT_EQ(NdCheckAddress(reinterpret_cast<const sockaddr*>(&elsewhere), sizeof(elsewhere)),
            ND_INVALID_ADDRESS);
  EXPECT_EQ(NdCheckAddress(sa, 3), ND_INVALID_PARAMETER_2);

  SIZE_T size = 0;
  ASSERT_EQ(NdQueryAddressList(0, nullptr, &size), ND_BUFFER_OVERFLOW);
  EXPECT_GT(size, 0u);
  std::vector<BYTE> buffer(size);
  ASSERT_EQ(NdQueryAddressList(0, reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data()), &size),
            ND_SUCCESS);
  EXPECT_GT(reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data())->iAddressCount, 0);
  // The provider serves both versions: excluding one still lists every address (MS-MPI's v1
  // channel excludes v2), excluding both lists none.
  SIZE_T v1Only = 0;
  EXPECT_EQ(NdQueryAddressList(ND_QUERY_EXCLUDE_NDv2_ADDRESSES, nullptr, &v1Only),
            ND_BUFFER_OVERFLOW);
  EXPECT_EQ(v1Only, buffer.size());
  SIZE_T none = 0;
  EXPECT_EQ(NdQueryAddressList(ND_QUERY_EXCLUDE_NDv1_ADDRESSES | ND_QUERY_EXCLUDE_NDv2_ADDRESSES,
                               nullptr, &none),
            ND_SUCCESS);
  EXPECT_EQ(none, 0u);

  sockaddr_in local{};
  size = 0;
  EXPECT_EQ(NdResolveAddress(sa, sizeof(loopback), nullptr, &size), ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, sizeof(sockaddr_in));
  ASSERT_EQ(NdResolveAddress(sa, sizeof(loopback), reinterpret_cast<sockaddr*>(&local), &size),
            ND_SUCCESS);
  EXPECT_EQ(local.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_EQ(local.sin_port, 0);

  IND2Adapter* adapter = nullptr;
  ASSERT_EQ(
      NdOpenAdapter(IID_IND2Adapter, sa, sizeof(loopback), reinterpret_cast<void**>(&adapter)),
      ND_SUCCESS);
  EXPECT_EQ(adapter->Release(), 0u);
  // Version 1 the way Windows' helper opens it (class factory, INDProvider); NdOpenV1Adapter too.
  INDAdapter* v1 = nullptr;
  ASSERT_EQ(NdOpenAdapter(IID_INDAdapter, sa, sizeof(loopback), reinterpret_cast<void**>(&v1)),
            ND_SUCCESS);
  EXPECT_EQ(v1->Release(), 0u);
  ASSERT_EQ(NdOpenV1Adapter(sa, sizeof(loopback), &v1), ND_SUCCESS);
  EXPECT_EQ(v1->Release(), 0u);
  EXPECT_EQ(NdOpenV1Adapter(reinterpret_cast<const sockaddr*>(&elsewhere), sizeof(elsewhere), &v1),
            ND_INVALID_ADDRESS);

  EXPECT_EQ(NdCleanup(), S_OK);
  EXPECT_EQ(NdCheckAddress(sa, sizeof(loopback)), ND_SUCCESS) << "still started once";
  EXPECT_EQ(NdCleanup(), S_OK);
  EXPECT_EQ(NdCleanup(), ND_DEVICE_NOT_READY);
}

TEST(NdSupport, ProviderEntryPoint) {
  IND2Provider* provider = nullptr;
  ASSERT_EQ(NdwvGetProvider(IID_IND2Provider, reinterpret_cast<void**>(&provider)), ND_SUCCESS);
  sockaddr_in loopback = Ipv4("127.0.0.1");
  UINT64 id = 0;
  EXPECT_EQ(
      provider->ResolveAddress(reinterpret_cast<const sockaddr*>(&loopback), sizeof(loopback), &id),
      ND_SUCCESS);
  EXPECT_EQ(provider->Release(), 0u);
  void* p = nullptr;
  EXPECT_EQ(NdwvGetProvider(IID_IND2Adapter, &p), E_NOINTERFACE);
}

TEST(NdAddress, ValidationNamesTheArgument) {
  sockaddr_in v4 = Ipv4("127.0.0.1");
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  sockaddr other{};
  other.sa_family = AF_UNIX;
  auto sa = [](const auto& a) { return reinterpret_cast<const sockaddr*>(&a); };
  EXPECT_EQ(CheckSockaddr(sa(v4), sizeof(v4), 1), ND_SUCCESS);
  EXPECT_EQ(CheckSockaddr(sa(v6), sizeof(v6), 1), ND_SUCCESS);
  EXPECT_EQ(CheckSockaddr(nullptr, sizeof(v4), 1), ND_INVALID_PARAMETER_1);
  EXPECT_EQ(CheckSockaddr(sa(v4), sizeof(sockaddr) - 1, 1), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(CheckSockaddr(sa(v4), SIZE_T(1) << 33, 1), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(CheckSockaddr(sa(v6), sizeof(sockaddr_in), 1), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(CheckSockaddr(sa(other), sizeof(v6), 1), ND_INVALID_ADDRESS);
  EXPECT_EQ(CheckSockaddr(sa(v4), 4, 2), ND_INVALID_PARAMETER_3);
  EXPECT_EQ(CheckSockaddr(sa(v4), 4, 2, 2), ND_INVALID_PARAMETER_2);
}

TEST(NdAddress, EmptyListIsSuccessWithSizeZero) {
  SIZE_T size = 100;
  alignas(8) BYTE buffer[100];
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer);
  list->iAddressCount = 7;
  EXPECT_EQ(ReturnAddressList({}, list, &size), ND_SUCCESS);
  EXPECT_EQ(size, 0u);
  EXPECT_EQ(list->iAddressCount, 0);
  size = 0;
  EXPECT_EQ(ReturnAddressList({}, nullptr, &size), ND_SUCCESS);
}

TEST(NdAddress, ListHoldsIpv4AndIpv6AfterTheArray) {
  std::vector<WV_SOCKADDR> addresses(2);
  addresses[0].Sin = Ipv4("10.0.0.1", 99);
  addresses[1].Sin6.sin6_family = AF_INET6;
  addresses[1].Sin6.sin6_addr = in6addr_loopback;
  const SIZE_T expected = 8 + 2 * sizeof(SOCKET_ADDRESS) + 16 + 28;
  SIZE_T size = 0;
  ASSERT_EQ(ReturnAddressList(addresses, nullptr, &size), ND_BUFFER_OVERFLOW);
  ASSERT_EQ(size, expected);
  std::vector<BYTE> buffer(size);
  auto* list = reinterpret_cast<SOCKET_ADDRESS_LIST*>(buffer.data());
  ASSERT_EQ(ReturnAddressList(addresses, list, &size), ND_SUCCESS);
  ASSERT_EQ(list->iAddressCount, 2);
  SOCKET_ADDRESS* entries = list->Address;
  EXPECT_EQ(reinterpret_cast<BYTE*>(entries[0].lpSockaddr), buffer.data() + 8 + 32);
  EXPECT_EQ(entries[0].iSockaddrLength, 16);
  EXPECT_EQ(reinterpret_cast<BYTE*>(entries[1].lpSockaddr), buffer.data() + 8 + 32 + 16);
  EXPECT_EQ(entries[1].iSockaddrLength, 28);
  EXPECT_EQ(entries[1].lpSockaddr->sa_family, AF_INET6);
}

TEST(NdAddress, RouteToLoopbackLeavesFromLoopback) {
  sockaddr_in remote = Ipv4("127.0.0.1", 0);
  WV_SOCKADDR local{};
  ASSERT_EQ(RouteSource(reinterpret_cast<const sockaddr*>(&remote), &local), ND_SUCCESS);
  EXPECT_EQ(local.Sin.sin_family, AF_INET);
  EXPECT_EQ(local.Sin.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
  EXPECT_EQ(local.Sin.sin_port, 0);
}

TEST(NdAddress, ReturnSockaddrLeavesShortBuffersAlone) {
  sockaddr_in from = Ipv4("127.0.0.1", 80);
  sockaddr_in to{};
  to.sin_port = 1;
  ULONG size = 15;
  EXPECT_EQ(
      ReturnSockaddr(reinterpret_cast<sockaddr*>(&from), reinterpret_cast<sockaddr*>(&to), &size),
      ND_BUFFER_OVERFLOW);
  EXPECT_EQ(size, 16u);
  EXPECT_EQ(to.sin_port, 1);
  size = 0;
  EXPECT_EQ(ReturnSockaddr(reinterpret_cast<sockaddr*>(&from), nullptr, &size), ND_BUFFER_OVERFLOW);
  size = 100;
  EXPECT_EQ(
      ReturnSockaddr(reinterpret_cast<sockaddr*>(&from), reinterpret_cast<sockaddr*>(&to), &size),
      ND_SUCCESS);
  EXPECT_EQ(size, 16u);
  EXPECT_EQ(to.sin_port, htons(80));
}

}  // namespace
}  // namespace ndwv::nd
