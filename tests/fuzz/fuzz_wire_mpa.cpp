// libFuzzer target: MPA Request/Reply and FPDU decoders. Besides "no crash, no read past the
// input" (ASan), it checks that whatever decodes cleanly re-encodes to the same bytes.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "wire/crc.h"
#include "wire/mpa.h"
#include "check.h"

using namespace ndwv::wire;


extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);

  for (MpaKind kind : {MpaKind::Request, MpaKind::Reply}) {
    for (ReservedBits rb : {ReservedBits::Reject, ReservedBits::Ignore}) {
      size_t frame_len = 0;
      const MpaError herr = DecodeMpaHeader(in, kind, frame_len, rb);
      MpaFrame f;
      const MpaError err = DecodeMpaFrame(in, kind, f, rb);
      if (herr != MpaError::Ok) {
        CHECK(err == herr);
        continue;
      }
      CHECK(frame_len >= kMpaHeaderLen && frame_len <= kMpaHeaderLen + kMpaMaxPrivateData);
      if (err != MpaError::Ok) {
        CHECK(err == MpaError::Truncated && size < frame_len);
        continue;
      }
      CHECK(MpaFrameLength(f) == frame_len);
      CHECK(f.private_data.data() >= data && f.private_data.data() + f.private_data.size() <=
                                                 data + size);
      std::vector<uint8_t> out(frame_len);
      CHECK(EncodeMpaFrame(f, out) == frame_len);
      if (rb == ReservedBits::Reject) {
        CHECK(std::memcmp(out.data(), data, frame_len) == 0);
      } else {
        MpaFrame g;  // reserved bits are dropped; the rest survives
        CHECK(DecodeMpaFrame(out, kind, g) == MpaError::Ok);
        CHECK(g.crc == f.crc && g.markers == f.markers && g.reject == f.reject &&
              g.enhanced == f.enhanced && g.ird == f.ird && g.ord == f.ord);
      }
    }
  }

  for (bool check : {false, true}) {
    FpduView v;
    const FpduError err = DecodeFpdu(in, check, v);
    if (err == FpduError::Truncated) {
      CHECK(size < kFpduLengthLen || size < FpduLength(size_t(data[0]) << 8 | data[1]));
      continue;
    }
    CHECK(v.length == FpduLength(v.ulpdu.size()) && v.length <= size);
    // The CRC over pieces, split anywhere, equals the contiguous one.
    const size_t body = v.length - kFpduCrcLen;
    const size_t cut = size ? data[size - 1] % (body + 1) : 0;
    const std::span<const uint8_t> pieces[] = {in.first(cut), in.subspan(cut, body - cut)};
    const uint32_t crc = FpduCrc(pieces);
    CHECK(crc == Crc32c(data, body));
    CHECK((err == FpduError::BadCrc) == (check && crc != v.crc));
    if (err == FpduError::Ok) {
      std::vector<uint8_t> out(v.length);
      CHECK(EncodeFpdu(v.ulpdu, true, out) == v.length);
      CHECK(std::memcmp(out.data(), data, kFpduLengthLen + v.ulpdu.size()) == 0);
    }
  }
  return 0;
}
