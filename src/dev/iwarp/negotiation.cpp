#include "dev/iwarp/negotiation.h"

#include <algorithm>
#include <cstring>

namespace ndwv::dev::iwarp {

using namespace ndwv::wire;

void MpaFrameReader::Reset(MpaKind kind) {
  kind_ = kind;
  have_ = 0;
  need_ = kMpaHeaderLen;
  error_ = MpaError::Ok;
}

MpaFrameReader::Status MpaFrameReader::Took(size_t n) {
  have_ += std::min(n, sizeof buffer_ - have_);
  if (have_ < need_) return Status::More;
  if (need_ == kMpaHeaderLen) {
    size_t frame_len = 0;
    error_ = DecodeMpaHeader({buffer_, kMpaHeaderLen}, kind_, frame_len);
    if (error_ != MpaError::Ok) return Status::Bad;
    need_ = frame_len;  // within the buffer: the header check bounds PD_Length
    if (have_ < need_) return Status::More;
  }
  if (have_ > need_) {
    error_ = MpaError::BytesAfterFrame;
    return Status::Bad;
  }
  error_ = DecodeMpaFrame({buffer_, have_}, kind_, frame_);
  return error_ == MpaError::Ok ? Status::Whole : Status::Bad;
}

bool Servable(const MpaFrame& request) {
  return !request.markers && request.enhanced && request.p2p && request.rtr_write &&
         request.private_data.size() <= kMaxPrivateData;
}

bool Usable(const MpaFrame& reply) {
  return !reply.reject && !reply.markers && reply.enhanced && reply.p2p && reply.rtr_write;
}

ConnectParams PeerParams(const MpaFrame& frame) {
  ConnectParams params;
  size_t data = std::min(frame.private_data.size(), kMaxPrivateData);
  memcpy(params.data, frame.private_data.data(), data);
  params.data_length = uint32_t(data);
  params.ird = frame.ird;
  params.ord = frame.ord;
  return params;
}

}  // namespace ndwv::dev::iwarp
