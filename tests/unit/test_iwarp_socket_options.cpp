// iWARP connection sockets: the options a listener's accepted sockets take from it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "base/settings.h"
#include "dev/iwarp/endpoint.h"

namespace ndwv::dev {
namespace {

int Option(int fd, int level, int name) {
  int value = -1;
  socklen_t length = sizeof value;
  EXPECT_EQ(getsockopt(fd, level, name, &value, &length), 0) << level << "/" << name;
  return value;
}

// OnListenReady does not tune an accepted socket again: the kernel must hand it the listener's
// options. Checked on the kernel that runs the tests.
TEST(IwarpSocketOptions, AnAcceptedSocketHasTheListenersTuning) {
  if (base::Config().iwarp_timeout_ms == 0) GTEST_SKIP() << "NDWV_IWARP_TIMEOUT_MS=0: only TCP_NODELAY is set";
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  iwarp::TuneConnectionSocket(listener);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  int client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(client, 0);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  int accepted = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(accepted, 0);
  const struct {
    int level, name;
  } options[] = {{IPPROTO_TCP, TCP_NODELAY},   {IPPROTO_TCP, TCP_USER_TIMEOUT},
                 {SOL_SOCKET, SO_KEEPALIVE},   {IPPROTO_TCP, TCP_KEEPIDLE},
                 {IPPROTO_TCP, TCP_KEEPINTVL}};
  // The accepted socket's options are the listener's, and not the defaults of a new socket.
  int fresh = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fresh, 0);
  for (const auto& o : options) {
    EXPECT_EQ(Option(accepted, o.level, o.name), Option(listener, o.level, o.name)) << o.level << "/" << o.name;
    EXPECT_NE(Option(fresh, o.level, o.name), Option(listener, o.level, o.name)) << o.level << "/" << o.name;
  }
  EXPECT_EQ(Option(accepted, IPPROTO_TCP, TCP_KEEPIDLE), iwarp::KeepaliveIdleSeconds(base::Config().iwarp_timeout_ms));
  EXPECT_EQ(Option(accepted, IPPROTO_TCP, TCP_USER_TIMEOUT), int(base::Config().iwarp_timeout_ms));
  for (int fd : {listener, client, accepted, fresh}) close(fd);
}

// The first probe of an idle connection never waits longer than 2 s, whatever the bound: later
// deadlines fall in the kernel's coarser timer buckets, and connections that went quiet together
// then probe in bursts that a host's input backlog drops (bench/README.md, "Keepalive bursts").
TEST(IwarpSocketOptions, AnIdleConnectionIsFirstProbedWithinTwoSeconds) {
  EXPECT_EQ(iwarp::KeepaliveIdleSeconds(1000), 1);
  EXPECT_EQ(iwarp::KeepaliveIdleSeconds(3999), 1);
  EXPECT_EQ(iwarp::KeepaliveIdleSeconds(4000), 2);
  EXPECT_EQ(iwarp::KeepaliveIdleSeconds(10000), 2);
  EXPECT_EQ(iwarp::KeepaliveIdleSeconds(600000), 2);
}

}  // namespace
}  // namespace ndwv::dev
