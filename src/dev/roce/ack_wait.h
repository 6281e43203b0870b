// How long a RoCE requester waits for an acknowledgement before it sends again; and, with an
// estimate of its own per port, how long the CM waits for the answer to a REQ, REP or DREQ
// (cm.h: the same queues delay MADs, and the IB CM's fixed response timeout repeats them into
// the load that delayed them).
//
// On hardware the ACK timeout is a fixed property of the path. Here both ends are processes on
// shared cores: with thousands of connections an engine takes hundreds of milliseconds to come
// round to a packet, and a fixed timeout then takes late ACKs for lost packets. Retransmitting
// them adds to the load that made them late, and the retry budget ends healthy connections.
//
// So the configured timeout is a floor: the wait stretches to what acknowledgements are measured
// to take (smoothed round trip plus four deviations, TCP's rule, RFC 6298), at most kMaxStretch
// times the floor, so that a dead peer is still found within a bounded time. A round trip is
// measured from a request's first transmission to the ACK that covers it, even when it was sent
// again: that lets the estimate learn while every ACK is late, which Karn's rule (ignore repeated
// requests) would not. Except when the ACK comes soon after the repeat (Acknowledged): then it
// answers the repeat, the first transmission was lost, and the time until the repeat was the
// timeout's, not the path's. Taken as a round trip it stretched every later wait: with 10 % loss
// on a link each loss came to wait up to kMaxStretch times the floor.
//
// One estimate per process: the delay measured is the two engines' queueing, which every
// connection shares. A peer that delays its ACKs stretches everyone's wait, by kMaxStretch at most.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace ndwv::dev::roce {

class AckWait {
 public:
  static constexpr int kMaxStretch = 8;

  // One measured round trip. Updates race harmlessly (a lost update is a lost sample).
  void Sample(std::chrono::microseconds round_trip) {
    int64_t sample = std::max<int64_t>(round_trip.count(), 0);
    int64_t srtt = srtt_us_.load(std::memory_order_relaxed);
    int64_t rttvar = rttvar_us_.load(std::memory_order_relaxed);
    if (srtt < 0) {  // the first sample
      srtt = sample;
      rttvar = sample / 2;
    } else {
      rttvar += (std::abs(srtt - sample) - rttvar) / 4;
      srtt += (sample - srtt) / 8;
    }
    srtt_us_.store(srtt, std::memory_order_relaxed);
    rttvar_us_.store(rttvar, std::memory_order_relaxed);
  }

  // A request's acknowledgement at `acked`: it was first sent at `sent` and, after ACK timeouts,
  // last sent again at `resent` (a default time_point if never), on a connection whose
  // configured ACK timeout is `floor`. An ACK within a quarter of the floor of the repeat (10 ms
  // at least: the clock read is the coarse one) answers the repeat, and is no sample.
  void Acknowledged(std::chrono::steady_clock::time_point sent, std::chrono::steady_clock::time_point resent,
                    std::chrono::steady_clock::time_point acked, std::chrono::milliseconds floor) {
    using std::chrono::duration_cast;
    if (resent != std::chrono::steady_clock::time_point{} &&
        acked - resent < std::max<std::chrono::milliseconds>(floor / 4, std::chrono::milliseconds(10)))
      return;
    Sample(duration_cast<std::chrono::microseconds>(acked - sent));
  }

  // The wait for a connection whose configured ACK timeout is `floor`.
  std::chrono::microseconds For(std::chrono::milliseconds floor) const {
    int64_t srtt = srtt_us_.load(std::memory_order_relaxed);
    std::chrono::microseconds lo = floor;
    if (srtt < 0) return lo;
    std::chrono::microseconds measured{srtt + 4 * rttvar_us_.load(std::memory_order_relaxed)};
    return std::clamp(measured, lo, lo * kMaxStretch);
  }

 private:
  std::atomic<int64_t> srtt_us_{-1}, rttvar_us_{0};
};

}  // namespace ndwv::dev::roce
