// libFuzzer target: the passive and the active side's reading of an MPA Request or Reply as the
// iWARP connection manager does it (dev/iwarp/negotiation.h, which endpoint.cpp feeds from its
// socket): the frame read in arbitrary pieces, then the decision on it.
//
// Input: byte 0 = the most the socket hands over per read (1-256), then the bytes. Checked: the
// reader never asks for a byte past the frame its header announces (what follows belongs to the
// stream), a whole frame is exactly 20 + PD_Length <= 532 bytes, a served Request has every
// property ndwv needs, and what the connection keeps of a peer (its IRD, ORD and private data) is
// within ND's bounds.
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <span>

#include "dev/iwarp/negotiation.h"
#include "wire/bytes.h"
#include "check.h"

using namespace ndwv::dev;
using namespace ndwv::dev::iwarp;
using namespace ndwv::wire;


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t per_read = size_t(data[0]) + 1;
  const std::span<const uint8_t> in(data + 1, size - 1);
  for (MpaKind kind : {MpaKind::Request, MpaKind::Reply}) {
    MpaFrameReader reader;
    reader.Reset(kind);
    size_t taken = 0;
    MpaFrameReader::Status status = MpaFrameReader::Status::More;
    while (status == MpaFrameReader::Status::More && taken < in.size()) {
      std::span<uint8_t> space = reader.Space();
      CHECK(!space.empty());
      size_t n = std::min({space.size(), per_read, in.size() - taken});
      memcpy(space.data(), in.data() + taken, n);
      taken += n;
      status = reader.Took(n);
    }
    if (status == MpaFrameReader::Status::Bad) {
      CHECK(reader.error() != MpaError::Ok);
      continue;
    }
    if (status != MpaFrameReader::Status::Whole) continue;
    CHECK(taken >= kMpaHeaderLen && taken <= kMpaHeaderLen + kMpaMaxPrivateData);
    CHECK(taken == kMpaHeaderLen + LoadBe16(in.data() + 18));  // exactly the frame
    const MpaFrame& frame = reader.frame();
    CHECK(frame.reply == (kind == MpaKind::Reply));
    CHECK(frame.private_data.size() <= kMpaMaxPrivateData);
    if (kind == MpaKind::Request && Servable(frame))
      CHECK(!frame.markers && frame.enhanced && frame.p2p && frame.rtr_write &&
            frame.private_data.size() <= kMaxPrivateData);
    if (kind == MpaKind::Reply && Usable(frame)) CHECK(!frame.reject && !frame.markers && frame.p2p && frame.rtr_write);
    ConnectParams params = PeerParams(frame);
    CHECK(params.data_length <= kMaxPrivateData && params.ird <= kMpaIrdOrdMask && params.ord <= kMpaIrdOrdMask);
    CHECK(!memcmp(params.data, frame.private_data.data(), params.data_length));
  }
  return 0;
}
