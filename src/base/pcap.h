// A classic pcap file writer (LINKTYPE_ETHERNET, microsecond timestamps) for looking at what the
// device sends with Wireshark/tshark. The device's sockets never see the Ethernet, IP, UDP or
// TCP headers their payload travels in, so the writer synthesizes them from the two socket
// addresses: fixed locally-administered MACs, IPv4 (no options, identification 0, DF, TTL 64,
// correct header checksum) or IPv6 (no extension headers, hop limit 64), and UDP or TCP with
// correct checksums. An IPv4-mapped IPv6 address is written as IPv4; a pair of different
// families is written as IPv6 (the IPv4 one mapped).
//
// Thread-safe: one mutex around each record, so records never interleave.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <span>
#include <string>

namespace ndwv::base {

class PcapWriter {
 public:
  // TCP flag bits (byte 13 of the TCP header).
  static constexpr uint8_t kFin = 0x01, kSyn = 0x02, kRst = 0x04, kPsh = 0x08, kAck = 0x10;

  PcapWriter() = default;
  ~PcapWriter() { Close(); }
  PcapWriter(const PcapWriter&) = delete;
  PcapWriter& operator=(const PcapWriter&) = delete;

  // Creates (truncates) `path` and writes the file header. False (errno set) on failure. An open
  // writer is closed first. `unbuffered`: every record goes to the file in one write(2) as it is
  // written, so that the file ends on a whole record even if the process is killed (a system call
  // per record); otherwise records are buffered until Flush or Close.
  bool Open(const std::string& path, bool unbuffered = false);
  // Flushes and closes; records written after this are dropped.
  void Close();
  bool is_open() const;
  void Flush();

  // One UDP datagram from `src` to `dst` (AF_INET or AF_INET6, with ports). False if the writer
  // is closed, an address family is unsupported, the datagram does not fit in an IP packet, or
  // the write fails.
  bool WriteUdp(const sockaddr* src, const sockaddr* dst, std::span<const uint8_t> payload);
  // One TCP segment (no options). `flags` is a set of the k* bits above.
  bool WriteTcp(const sockaddr* src, const sockaddr* dst, uint32_t seq, uint32_t ack,
                uint8_t flags, std::span<const uint8_t> payload, uint16_t window = 65535);

 private:
  bool WriteIp(const sockaddr* src, const sockaddr* dst, uint8_t protocol,
               std::span<const uint8_t> l4_header, std::span<const uint8_t> payload,
               size_t checksum_offset);

  mutable std::mutex mu_;
  std::FILE* file_ = nullptr;
};

}  // namespace ndwv::base
