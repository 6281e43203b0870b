#include "base/pcap.h"

#include <netinet/in.h>

#include <cstring>
#include <ctime>
#include <vector>

namespace ndwv::base {

namespace {

constexpr uint32_t kPcapMagic = 0xA1B2C3D4;  // microsecond timestamps
constexpr uint32_t kSnapLen = 262144;
constexpr uint32_t kLinkEthernet = 1;
constexpr size_t kEthLen = 14, kIpv4Len = 20, kIpv6Len = 40;
constexpr uint8_t kTtl = 64;

void Be16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
void Be32(uint8_t* p, uint32_t v) {
  Be16(p, uint16_t(v >> 16));
  Be16(p + 2, uint16_t(v));
}

// An endpoint reduced to an IP version, 16 address bytes (IPv4 in the first 4) and a port.
struct Endpoint {
  int family = 0;  // AF_INET, AF_INET6 or 0 (unsupported)
  uint8_t ip[16] = {};
  uint8_t port[2] = {};  // network order
};

Endpoint Reduce(const sockaddr* sa) {
  Endpoint e;
  if (sa == nullptr) return e;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    e.family = AF_INET;
    std::memcpy(e.ip, &in->sin_addr, 4);
    std::memcpy(e.port, &in->sin_port, 2);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    std::memcpy(e.port, &in6->sin6_port, 2);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      e.family = AF_INET;
      std::memcpy(e.ip, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      e.family = AF_INET6;
      std::memcpy(e.ip, in6->sin6_addr.s6_addr, 16);
    }
  }
  return e;
}

void ToV6(Endpoint& e) {
  if (e.family != AF_INET) return;
  uint8_t v4[4];
  std::memcpy(v4, e.ip, 4);
  std::memset(e.ip, 0, 10);
  e.ip[10] = e.ip[11] = 0xFF;
  std::memcpy(e.ip + 12, v4, 4);
  e.family = AF_INET6;
}

// The Internet checksum's ones'-complement sum, unfolded.
uint32_t Sum(const uint8_t* p, size_t n, uint32_t acc = 0) {
  for (; n >= 2; p += 2, n -= 2) acc += uint32_t(p[0]) << 8 | p[1];
  if (n) acc += uint32_t(p[0]) << 8;
  return acc;
}
uint16_t Fold(uint32_t acc) {
  while (acc >> 16) acc = (acc & 0xFFFF) + (acc >> 16);
  return uint16_t(~acc);
}

}  // namespace

bool PcapWriter::Open(const std::string& path, bool unbuffered) {
  std::lock_guard lock(mu_);
  if (file_ != nullptr) std::fclose(file_);
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) return false;
  if (unbuffered) std::setvbuf(file_, nullptr, _IONBF, 0);
  // Written in host order; readers detect the order from the magic number.
  struct {
    uint32_t magic;
    uint16_t major, minor;
    int32_t thiszone;
    uint32_t sigfigs, snaplen, network;
  } hdr{kPcapMagic, 2, 4, 0, 0, kSnapLen, kLinkEthernet};
  static_assert(sizeof(hdr) == 24);
  if (std::fwrite(&hdr, sizeof(hdr), 1, file_) != 1) {
    std::fclose(file_);
    file_ = nullptr;
    return false;
  }
  return true;
}

void PcapWriter::Close() {
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return;
  std::fclose(file_);  // flushes
  file_ = nullptr;
}

bool PcapWriter::is_open() const {
  std::lock_guard lock(mu_);
  return file_ != nullptr;
}

void PcapWriter::Flush() {
  std::lock_guard lock(mu_);
  if (file_ != nullptr) std::fflush(file_);
}

bool PcapWriter::WriteUdp(const sockaddr* src, const sockaddr* dst,
                          std::span<const uint8_t> payload) {
  uint8_t udp[8] = {};
  const Endpoint s = Reduce(src), d = Reduce(dst);
  std::memcpy(udp, s.port, 2);
  std::memcpy(udp + 2, d.port, 2);
  if (payload.size() > 65535 - 8) return false;
  Be16(udp + 4, uint16_t(8 + payload.size()));
  return WriteIp(src, dst, IPPROTO_UDP, udp, payload, 6);
}

bool PcapWriter::WriteTcp(const sockaddr* src, const sockaddr* dst, uint32_t seq, uint32_t ack,
                          uint8_t flags, std::span<const uint8_t> payload, uint16_t window) {
  uint8_t tcp[20] = {};
  const Endpoint s = Reduce(src), d = Reduce(dst);
  std::memcpy(tcp, s.port, 2);
  std::memcpy(tcp + 2, d.port, 2);
  Be32(tcp + 4, seq);
  Be32(tcp + 8, ack);
  tcp[12] = 5 << 4;  // data offset: 5 words, no options
  tcp[13] = flags;
  Be16(tcp + 14, window);
  return WriteIp(src, dst, IPPROTO_TCP, tcp, payload, 16);
}

bool PcapWriter::WriteIp(const sockaddr* src, const sockaddr* dst, uint8_t protocol,
                         std::span<const uint8_t> l4_header, std::span<const uint8_t> payload,
                         size_t checksum_offset) {
  Endpoint s = Reduce(src), d = Reduce(dst);
  if (s.family == 0 || d.family == 0) return false;
  if (s.family != d.family) ToV6(s), ToV6(d);
  const bool v4 = s.family == AF_INET;
  const size_t l4_len = l4_header.size() + payload.size();
  const size_t ip_len = v4 ? kIpv4Len : kIpv6Len;
  if ((v4 ? ip_len + l4_len : l4_len) > 65535) return false;

  // The record: its 16-byte header, then the frame, so that it is written in one call.
  constexpr size_t kRecordLen = 16;
  std::vector<uint8_t> record(kRecordLen + kEthLen + ip_len + l4_len);
  uint8_t* p = record.data() + kRecordLen;
  // Ethernet: locally administered unicast MACs 02:00:00:00:00:02 <- 02:00:00:00:00:01.
  const uint8_t dst_mac[6] = {0x02, 0, 0, 0, 0, 0x02}, src_mac[6] = {0x02, 0, 0, 0, 0, 0x01};
  std::memcpy(p, dst_mac, 6);
  std::memcpy(p + 6, src_mac, 6);
  Be16(p + 12, v4 ? 0x0800 : 0x86DD);
  p += kEthLen;

  uint32_t pseudo;  // the L4 checksum's pseudo-header sum
  if (v4) {
    p[0] = 0x45;
    Be16(p + 2, uint16_t(ip_len + l4_len));
    Be16(p + 6, 0x4000);  // DF
    p[8] = kTtl;
    p[9] = protocol;
    std::memcpy(p + 12, s.ip, 4);
    std::memcpy(p + 16, d.ip, 4);
    Be16(p + 10, Fold(Sum(p, kIpv4Len)));
    pseudo = Sum(s.ip, 4, Sum(d.ip, 4)) + protocol + uint32_t(l4_len);
  } else {
    p[0] = 0x60;
    Be16(p + 4, uint16_t(l4_len));
    p[6] = protocol;
    p[7] = kTtl;
    std::memcpy(p + 8, s.ip, 16);
    std::memcpy(p + 24, d.ip, 16);
    pseudo = Sum(s.ip, 16, Sum(d.ip, 16)) + protocol + uint32_t(l4_len);
  }
  p += ip_len;
  std::memcpy(p, l4_header.data(), l4_header.size());
  if (!payload.empty()) std::memcpy(p + l4_header.size(), payload.data(), payload.size());
  uint16_t csum = Fold(Sum(p, l4_len, pseudo));
  // UDP sends a computed 0 as all ones (0 means "no checksum").
  if (protocol == IPPROTO_UDP && csum == 0) csum = 0xFFFF;
  Be16(p + checksum_offset, csum);

  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const uint32_t frame_len = uint32_t(record.size() - kRecordLen);
  const uint32_t rec[4] = {uint32_t(ts.tv_sec), uint32_t(ts.tv_nsec / 1000), frame_len, frame_len};
  std::memcpy(record.data(), rec, kRecordLen);
  std::lock_guard lock(mu_);
  if (file_ == nullptr) return false;
  return std::fwrite(record.data(), record.size(), 1, file_) == 1;
}

}  // namespace ndwv::base
