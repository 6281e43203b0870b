// The process's packet capture (NDWV_CAPTURE): every packet the device sends and receives,
// written to one pcap file by a PcapWriter (whose mutex keeps records whole across threads).
//
// Off (the default), a hook costs one load and a predictable branch: Capture() is a load of an
// atomic pointer that is null. The file is opened at the first call, unbuffered: each record
// reaches the file in one write(2), so a process killed at any moment leaves a readable capture
// (a system call per packet is the price, paid only while capturing).
//
// RoCE datagrams are written as the UDP datagrams they are (CaptureUdp). An iWARP connection is a
// TCP byte stream whose segments the device never sees: a TcpCapture, owned by the connection,
// writes each run of bytes a send or receive call moved as TCP segments with sequence numbers
// counting the bytes of each direction, and acknowledgement numbers the bytes seen the other way,
// so that Wireshark reassembles the stream and decodes MPA and DDP/RDMAP in it.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>

#include "base/pcap.h"

namespace ndwv::base {

namespace capture_detail {
// The writer, nullptr when capture is off, kUnknown before the first call.
inline PcapWriter* const kUnknown = reinterpret_cast<PcapWriter*>(uintptr_t(1));
extern std::atomic<PcapWriter*> g_writer;
PcapWriter* Open();  // reads NDWV_CAPTURE once and opens the file
}  // namespace capture_detail

// The process's capture, or nullptr when NDWV_CAPTURE is empty (or the file could not be
// created: logged once).
inline PcapWriter* Capture() {
  PcapWriter* w = capture_detail::g_writer.load(std::memory_order_acquire);
  if (w == capture_detail::kUnknown) [[unlikely]]
    w = capture_detail::Open();
  return w;
}

// One datagram, when capturing.
inline void CaptureUdp(const sockaddr_storage& src, const sockaddr_storage& dst,
                       std::span<const uint8_t> datagram) {
  if (PcapWriter* w = Capture()) [[unlikely]]
    w->WriteUdp(reinterpret_cast<const sockaddr*>(&src), reinterpret_cast<const sockaddr*>(&dst),
                datagram);
}

// The capture of one TCP connection: both directions' next sequence numbers. Thread-safe (one
// sender and one receiver at a time is what a connection has; the lock keeps each segment's
// acknowledgement number consistent with what the file already shows the other way).
//
// Segments carry PSH|ACK and no options; there is no synthesized SYN handshake: Wireshark tracks
// the stream from its first segment (relative sequence numbers start there) and its MPA dissector
// is a heuristic that needs only the MPA Request and Reply. The initial sequence number of a
// direction is a hash of its two addresses, so that two processes capturing the two ends of a
// connection write the same numbers (their files can be merged with mergecap).
class TcpCapture {
 public:
  // The capture of the connected socket `fd` (its two addresses from getsockname and
  // getpeername), or nullptr when capture is off or the addresses cannot be had.
  static std::unique_ptr<TcpCapture> Start(int fd);
  TcpCapture(const sockaddr_storage& local, const sockaddr_storage& peer);

  // Runs a send call (returning what send/sendmsg returns) and records what it sent, as one
  // step against Received: loopback can deliver the peer's answer, and another thread record
  // it, before the send call even returns; the file must still show our bytes first.
  template <class SendCall, class Record>
  ssize_t SendAndRecord(SendCall&& send_call, Record&& record) {
    std::lock_guard<std::mutex> order(order_);
    ssize_t n = send_call();
    record(n);
    return n;
  }

  // What a send call returned: `n` bytes of `data` (nothing if n <= 0).
  void Sent(const void* data, ssize_t n);
  // What sendmsg returned: the first `n` bytes of the `count` buffers of `iov`.
  void Sent(const iovec* iov, size_t count, ssize_t n);
  // What a recv call returned: `n` bytes at `data`; 0 is the peer's FIN; < 0 nothing.
  void Received(const void* data, ssize_t n);
  // Our FIN (shutdown(SHUT_WR)).
  void SentFin();

  // The sequence number the next byte from us (peer) will carry.
  uint32_t next_sent() const;
  uint32_t next_received() const;

  // The largest payload of one synthesized segment: bytes beyond it go in further segments
  // (loopback's MSS, which keeps every frame within an IPv4 or IPv6 packet).
  static constexpr size_t kMaxSegment = 65483;

 private:
  void WriteLocked(bool outgoing, std::span<const uint8_t> bytes, uint8_t flags);

  const sockaddr_storage local_, peer_;
  PcapWriter* const writer_;
  mutable std::mutex mu_;
  std::mutex order_;  // a send call and its record against a receive's record (SendAndRecord)
  uint32_t next_[2];  // [0] local -> peer, [1] peer -> local
  bool fin_[2] = {false, false};
};

}  // namespace ndwv::base
