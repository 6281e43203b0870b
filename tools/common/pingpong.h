// The send/receive rounds of the ping-pongs (ndpingpong, nd1pingpong), over an endpoint of
// either version. Ep has:
//   Result Next(const char* what)            the next result (waits as the options say)
//   Completed KindOf(const Result&)          what the result is of
//   HRESULT StatusOf(const Result&), std::size_t BytesOf(const Result&)
//   void Repost(const Result&)               posts the receive of that result again
//   void Send(std::size_t size)              sends the first `size` bytes
//   [[noreturn]] void Fail(const char* what, const Result&, int line)
#pragma once

#include <cstddef>
#include <deque>

#include <ndwv/ndstatus.h>

namespace ndtool {

enum class Completed { Receive, Send, Other };

// Pong until the client disconnects (its flush completes a receive with ND_CANCELED). One pong
// is in flight at a time: the next is sent once the previous send has completed.
template <class Ep>
void ServePongs(Ep& ep) {
  std::deque<std::size_t> pending;  // sizes of pings not yet answered
  bool sending = false;
  for (;;) {
    auto r = ep.Next("Waiting for a ping");
    if (ep.StatusOf(r) == ND_CANCELED) return;
    if (ep.StatusOf(r) != ND_SUCCESS) ep.Fail("Pong", r, __LINE__);
    switch (ep.KindOf(r)) {
      case Completed::Receive:
        pending.push_back(ep.BytesOf(r));
        ep.Repost(r);
        break;
      case Completed::Send:
        sending = false;
        break;
      default:
        ep.Fail("Pong", r, __LINE__);
    }
    if (!sending && !pending.empty()) {
      ep.Send(pending.front());
      pending.pop_front();
      sending = true;
    }
  }
}

// One round trip: send, then reap both the send's result and the pong.
template <class Ep>
void PingOnce(Ep& ep, std::size_t size) {
  ep.Send(size);
  bool sent = false, answered = false;
  while (!sent || !answered) {
    auto r = ep.Next("Waiting for a pong");
    if (ep.StatusOf(r) != ND_SUCCESS) ep.Fail("Ping", r, __LINE__);
    switch (ep.KindOf(r)) {
      case Completed::Send:
        sent = true;
        break;
      case Completed::Receive:
        if (ep.BytesOf(r) != size) ep.Fail("Pong of the wrong size", r, __LINE__);
        ep.Repost(r);
        answered = true;
        break;
      default:
        ep.Fail("Ping", r, __LINE__);
    }
  }
}

}  // namespace ndtool
