// The MPA exchange's reading and decisions, apart from the sockets that carry it (so that a
// fuzzer reaches them): one frame read exactly, and what a peer's Request or Reply means for the
// connection. The connection manager (endpoint.cpp) feeds a reader from its socket and acts on
// these answers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "dev/endpoint.h"
#include "wire/mpa.h"

namespace ndwv::dev::iwarp {

// One MPA Request or Reply: its header, then exactly the frame the header announces and never a
// byte more (what follows belongs to the stream that takes the socket over).
class MpaFrameReader {
 public:
  enum class Status { More, Whole, Bad };

  void Reset(wire::MpaKind kind);
  // Where the next bytes go: read at most this many. Room for the largest frame, so that one
  // read takes a whole frame: nothing may follow a frame until we answer it (MPA), and bytes
  // that do make the frame Bad.
  std::span<uint8_t> Space() { return {buffer_ + have_, sizeof buffer_ - have_}; }
  // `n` bytes (at most Space().size()) were read into Space().
  Status Took(size_t n);
  wire::MpaError error() const { return error_; }
  // After Whole: the frame, decoded (its private data points into the reader).
  const wire::MpaFrame& frame() const { return frame_; }

 private:
  wire::MpaKind kind_ = wire::MpaKind::Request;
  uint8_t buffer_[wire::kMpaHeaderLen + wire::kMpaMaxPrivateData];
  size_t have_ = 0, need_ = wire::kMpaHeaderLen;  // need_: the header's, then the frame's length
  wire::MpaError error_ = wire::MpaError::Ok;
  wire::MpaFrame frame_;
};

// Whether ndwv serves a peer's Request: rev 2 enhanced, peer to peer with the zero-length Write
// as RTR, no markers, private data within ND's 56 bytes. Else it answers with a reject.
bool Servable(const wire::MpaFrame& request);
// Whether a peer's Reply accepts the connection on terms we can use.
bool Usable(const wire::MpaFrame& reply);
// The peer's IRD, ORD and private data (at most ND's 56 bytes) as the connection keeps them.
ConnectParams PeerParams(const wire::MpaFrame& frame);

}  // namespace ndwv::dev::iwarp
