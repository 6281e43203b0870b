// libFuzzer target: the iWARP receive state machine, an established Stream
// (tests/common/iwarp_stream_rig.h) fed arbitrary bytes cut at arbitrary points.
//
// Input: byte 0 chooses CRCs (bit 0), a Read outstanding so that Read Responses have somewhere to
// land (bit 1), and the peer's FIN after the bytes (bit 2). Then chunks: a length byte (0 -> 1)
// and that many bytes, each chunk delivered on its own. In the delivered bytes the tokens "WKEY"
// and "RKEY" become the R_Keys of the writable and the readable region, and "WADR"/"RADR" followed
// by 4 bytes the address of that region plus that offset (keys are random: the fuzzer could not
// name them otherwise).
//
// Besides ASan's and UBSan's checks: nothing changes outside what a peer may write (the writable
// region, the receive buffers, the Read's sink SGEs; never a guard zone, the gap between the
// Read's SGEs, or a region without remote write rights), and after the flush every posted request
// has completed exactly once.
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "../common/iwarp_stream_rig.h"
#include "wire/bytes.h"
#include "check.h"

using ndwv::test_support::GuardedRegion;
using ndwv::test_support::StreamRig;


namespace {

void Substitute(std::vector<uint8_t>& bytes, StreamRig& rig) {
  for (size_t i = 0; i + 4 <= bytes.size(); ++i) {
    uint8_t* p = bytes.data() + i;
    if (!memcmp(p, "WKEY", 4)) ndwv::wire::StoreBe32(p, rig.writable.rkey);
    if (!memcmp(p, "RKEY", 4)) ndwv::wire::StoreBe32(p, rig.readable.rkey);
    bool w = !memcmp(p, "WADR", 4), r = !memcmp(p, "RADR", 4);
    if ((w || r) && i + 8 <= bytes.size()) {
      uint64_t base = w ? rig.writable.addr() : rig.readable.addr();
      ndwv::wire::StoreBe64(p, base + ndwv::wire::LoadBe32(p + 4));
      i += 7;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // A Terminate keeps its socket until the peer took it; the fuzzer's peer never reads late.
  setenv("NDWV_DISCONNECT_TIMEOUT_MS", "10", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool crc = data[0] & 1, read = data[0] & 2, fin = data[0] & 4;
  std::vector<uint8_t> stream;
  std::vector<size_t> cuts;
  for (size_t at = 1; at < size;) {
    size_t n = std::min<size_t>(std::max<size_t>(data[at], 1), size - at - 1);
    stream.insert(stream.end(), data + at + 1, data + at + 1 + n);
    cuts.push_back(stream.size());
    at += 1 + n;
  }

  StreamRig rig(crc);
  CHECK(rig.stream);
  constexpr uint32_t kSinkAt = 16, kReadLength = 300;  // two SGEs, 7 bytes apart (PostRead)
  if (read) CHECK(rig.PostRead(7, kSinkAt, kReadLength));
  Substitute(stream, rig);
  size_t from = 0;
  for (size_t cut : cuts) {
    rig.Deliver({stream.data() + from, cut - from});
    rig.DiscardSent();  // the "peer" reads what ndwv answers
    from = cut;
  }
  if (fin) rig.DeliverEnd();
  rig.Finish();

  CHECK(rig.writable.UnchangedOutside(0, rig.writable.length));
  CHECK(rig.recv.UnchangedOutside(0, rig.recv.length));
  CHECK(rig.readable.bytes == rig.readable.original);
  CHECK(rig.locked.bytes == rig.locked.original);
  const uint32_t first = kReadLength / 3;  // the first SGE; the second starts 7 bytes after it
  if (read) {
    CHECK(rig.sink.UnchangedOutside(kSinkAt, kSinkAt + kReadLength + 7));
    for (uint32_t i = kSinkAt + first; i < kSinkAt + first + 7; ++i)
      CHECK(rig.sink.bytes[GuardedRegion::kGuard + i] == rig.sink.original[GuardedRegion::kGuard + i]);
  } else {
    CHECK(rig.sink.bytes == rig.sink.original);
  }
  std::map<uint64_t, int> seen;
  for (const ndwv::dev::Completion& c : rig.completions) seen[c.wr_id]++;
  for (uint64_t id = 100; id < 100 + StreamRig::kRecvs; ++id) CHECK(seen[id] == 1);
  CHECK(seen.count(7) == (read ? 1u : 0u) && (!read || seen[7] == 1));
  CHECK(seen.size() == StreamRig::kRecvs + (read ? 1 : 0));
  return 0;
}
