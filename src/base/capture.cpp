#include "base/capture.h"

#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/settings.h"

namespace ndwv::base {

namespace capture_detail {

std::atomic<PcapWriter*> g_writer{kUnknown};

PcapWriter* Open() {
  static std::once_flag once;
  std::call_once(once, [] {
    PcapWriter* writer = nullptr;
    std::string path = Config().capture;
    if (!path.empty()) {
      for (size_t at; (at = path.find("%p")) != std::string::npos;)
        path.replace(at, 2, std::to_string(getpid()));
      // Never destroyed: a packet may still be written while the process exits.
      auto* w = new PcapWriter;
      if (w->Open(path, /*unbuffered=*/true)) {
        writer = w;
        NDWV_LOG(Info, "capturing packets to %s", path.c_str());
      } else {
        NDWV_LOG(Error, "NDWV_CAPTURE: cannot create %s (%s); no capture", path.c_str(),
                 std::strerror(errno));
        delete w;
      }
    }
    g_writer.store(writer, std::memory_order_release);
  });
  return g_writer.load(std::memory_order_acquire);
}

}  // namespace capture_detail

namespace {

// FNV-1a over the address bytes and port of both ends: the initial sequence number of the
// direction src -> dst, the same in whichever process computes it.
void Mix(uint32_t& h, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
}
void MixAddress(uint32_t& h, const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(a);
    Mix(h, &in.sin_addr, 4);
    Mix(h, &in.sin_port, 2);
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a);
    // An IPv4-mapped address hashes as the IPv4 address it is (the writer shows it so).
    if (IN6_IS_ADDR_V4MAPPED(&in6.sin6_addr))
      Mix(h, in6.sin6_addr.s6_addr + 12, 4);
    else
      Mix(h, &in6.sin6_addr, 16);
    Mix(h, &in6.sin6_port, 2);
  }
}
uint32_t InitialSequence(const sockaddr_storage& src, const sockaddr_storage& dst) {
  uint32_t h = 2166136261u;
  MixAddress(h, src);
  MixAddress(h, dst);
  return h;
}

}  // namespace

std::unique_ptr<TcpCapture> TcpCapture::Start(int fd) {
  if (Capture() == nullptr) return nullptr;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
    return nullptr;
  return std::make_unique<TcpCapture>(local, peer);
}

TcpCapture::TcpCapture(const sockaddr_storage& local, const sockaddr_storage& peer)
    : local_(local), peer_(peer), writer_(Capture()) {
  next_[0] = InitialSequence(local, peer);
  next_[1] = InitialSequence(peer, local);
}

uint32_t TcpCapture::next_sent() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_[0];
}

uint32_t TcpCapture::next_received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_[1];
}

void TcpCapture::WriteLocked(bool outgoing, std::span<const uint8_t> bytes, uint8_t flags) {
  const int way = outgoing ? 0 : 1;
  const sockaddr* src = reinterpret_cast<const sockaddr*>(outgoing ? &local_ : &peer_);
  const sockaddr* dst = reinterpret_cast<const sockaddr*>(outgoing ? &peer_ : &local_);
  if (writer_) writer_->WriteTcp(src, dst, next_[way], next_[1 - way], flags, bytes);
  next_[way] += uint32_t(bytes.size());
}

void TcpCapture::Sent(const void* data, ssize_t n) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t done = 0; done < size_t(n);) {
    const size_t step = std::min(size_t(n) - done, kMaxSegment);
    WriteLocked(true, {p + done, step}, PcapWriter::kPsh | PcapWriter::kAck);
    done += step;
  }
}

void TcpCapture::Sent(const iovec* iov, size_t count, ssize_t n) {
  if (n <= 0) return;
  std::vector<uint8_t> segment;
  segment.reserve(std::min(size_t(n), kMaxSegment));
  std::lock_guard<std::mutex> lock(mu_);
  size_t left = size_t(n);
  for (size_t i = 0; i < count && left > 0; ++i) {
    const auto* p = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, left);
    left -= len;
    while (len > 0) {
      const size_t step = std::min(len, kMaxSegment - segment.size());
      segment.insert(segment.end(), p, p + step);
      p += step;
      len -= step;
      if (segment.size() == kMaxSegment) {
        WriteLocked(true, segment, PcapWriter::kPsh | PcapWriter::kAck);
        segment.clear();
      }
    }
  }
  if (!segment.empty()) WriteLocked(true, segment, PcapWriter::kPsh | PcapWriter::kAck);
}

void TcpCapture::Received(const void* data, ssize_t n) {
  if (n < 0) return;
  std::lock_guard<std::mutex> order(order_);  // after a send whose call is still recording
  std::lock_guard<std::mutex> lock(mu_);
  if (n == 0) {  // the peer's FIN, once (a closed socket reads 0 again and again)
    if (fin_[1]) return;
    fin_[1] = true;
    WriteLocked(false, {}, PcapWriter::kFin | PcapWriter::kAck);
    next_[1] += 1;  // a FIN takes a sequence number
    return;
  }
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t done = 0; done < size_t(n);) {
    const size_t step = std::min(size_t(n) - done, kMaxSegment);
    WriteLocked(false, {p + done, step}, PcapWriter::kPsh | PcapWriter::kAck);
    done += step;
  }
}

void TcpCapture::SentFin() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fin_[0]) return;
  fin_[0] = true;
  WriteLocked(true, {}, PcapWriter::kFin | PcapWriter::kAck);
  next_[0] += 1;
}

}  // namespace ndwv::base
