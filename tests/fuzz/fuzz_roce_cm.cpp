// libFuzzer target: the IB CM agent's MAD input (dev/roce/cm.h), a pure state machine, under a
// fake clock, with a consumer that calls it as an endpoint would. Each input is a script of
// steps, the first byte of each saying what it is:
//   0  a MAD as raw bytes (256 of them) from one of three addresses;
//   1  a MAD built from fields in the input, naming IDs the agent really uses, so that messages
//      reach CEPs in every state: attribute, IDs, QPN, service, timeouts, reason...;
//   2  time passes (up to ~65 s) and the agent's timers run;
//   3  the consumer calls Accept, Reject, RefuseRequest, Disconnect, Established, SendRtu or
//      Destroy on an ID it was told of;
//   4  the consumer connects (a REQ to one of the addresses);
//   5  the consumer listens on, or stops listening on, a service.
// Besides ASan/UBSan:
//   * a MAD in draws at most two MADs out (the stale-connection rule's REJ and DREQ): no
//     amplification;
//   * a day after the last step, no CEP waits on a peer (a request, a REP, a DREQ, time-wait):
//     what is left waits for the consumer alone; and once the consumer has let go of every ID it
//     was told of and another day has passed, the agent holds no CEP and no timer.
#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "dev/roce/cm.h"
#include "wire/bytes.h"
#include "wire/ib_cm.h"
#include "../common/cm_ids.h"

using namespace ndwv::dev::roce;
namespace ib = ndwv::wire::ib;

#define CHECK(c) \
  do {           \
    if (!(c)) std::abort(); \
  } while (0)

namespace {

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint32_t U32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v = v << 8 | Byte();
    return v;
  }
  std::span<const uint8_t> Bytes(size_t n) {
    n = std::min(n, size_ - std::min(at_, size_));
    std::span<const uint8_t> s(data_ + at_, n);
    at_ += n;
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_, at_ = 0;
};

sockaddr_storage Address(int i) {
  sockaddr_storage s{};
  auto& in = reinterpret_cast<sockaddr_in&>(s);
  in.sin_family = AF_INET;
  in.sin_port = htons(uint16_t(5000 + i % 2));
  in.sin_addr.s_addr = htonl(0x0A000001 + uint32_t(i / 2));
  return s;
}

class Env final : public CmEnv {
 public:
  uint64_t NowMs() override { return now; }
  void SendMad(const sockaddr_storage&, const ib::CmMessage&) override { sent++; }
  bool Overloaded() override { return false; }
  uint64_t now = 1000;
  uint64_t sent = 0;
};

constexpr uint64_t kService = ib::TcpServiceId(4000);

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Env env;
  CmConfig config;
  config.response_timeout_ms = 100;
  config.max_retries = 3;
  config.timewait_ms = 500;
  config.ca_guid = 0xB0B0B0B0B0B0B0B0ull;
  config.id_seed = 0x22000000;
  config.max_rnr_retry = 6;
  CmAgent agent(env, config);
  agent.Listen(kService);
  std::vector<uint32_t> ids;  // every ID the consumer was told of
  std::set<uint32_t> known;
  std::vector<uint32_t> peer_ids;  // the peers' IDs the events carried
  auto drain = [&] {
    CmEvent e;
    while (agent.PopEvent(&e)) {
      if (known.insert(e.id).second) ids.push_back(e.id);
      if (e.has_message) peer_ids.push_back(ndwv::wire::ib::SenderCommId(e.msg));
    }
  };
  auto pick_id = [&](Reader& in) -> uint32_t {
    uint8_t b = in.Byte();
    if (ids.empty() || b >= 0xF0) return in.U32();  // now and then an ID nobody holds
    return ids[b % ids.size()];
  };

  Reader in(data, size);
  while (!in.empty()) {
    switch (in.Byte() % 6) {
      case 0: {  // raw MAD
        sockaddr_storage from = Address(in.Byte() % 3);
        std::span<const uint8_t> mad = in.Bytes(ib::kMadLen);
        uint64_t before = env.sent;
        agent.OnMad(from, mad);
        CHECK(env.sent - before <= 2);
        break;
      }
      case 1: {  // a structured MAD naming our IDs
        sockaddr_storage from = Address(in.Byte() % 3);
        ib::CmMessage m;
        m.attr = ib::CmAttr(uint16_t(ib::CmAttr::Req) + in.Byte() % 7);
        m.mad.transaction_id = in.Byte();
        uint32_t ours = pick_id(in);
        uint8_t t = in.Byte();
        uint32_t theirs = t < 0xF0 && !peer_ids.empty() ? peer_ids[t % peer_ids.size()] : in.U32();
        uint8_t a = in.Byte(), b = in.Byte(), c = in.Byte();
        ndwv::testing::SetCommIds(m, theirs, ours);
        switch (m.attr) {
          case ib::CmAttr::Req:
            m.req.service_id = a & 1 ? kService : ib::TcpServiceId(a);
            m.req.local_ca_guid = b & 1 ? 0xA0A0A0A0A0A0A0A0ull : b;
            m.req.local_qpn = c & 3;
            m.req.path_mtu = a >> 4;
            m.req.transport_service_type = (b >> 6) & 3;
            m.req.remote_cm_response_timeout = (a >> 1) & 31;
            m.req.local_cm_response_timeout = (b >> 1) & 31;
            m.req.max_cm_retries = c >> 4;
            m.req.responder_resources = a;
            m.req.initiator_depth = b;
            m.req.rnr_retry_count = c & 7;
            break;
          case ib::CmAttr::Mra:
            m.mra.message_mraed = a % 3;
            m.mra.service_timeout = b & 31;
            break;
          case ib::CmAttr::Rej:
            if (a & 1) m.rej.remote_comm_id = 0;  // a REJ timeout that names us by our GUID only
            m.rej.reason = b % 36;
            m.rej.reject_info_length = c & 0x7F;
            ndwv::wire::StoreBe64(m.rej.reject_info, 0xA0A0A0A0A0A0A0A0ull);  // a peer's GUID
            break;
          case ib::CmAttr::Rep:
            m.rep.local_qpn = c & 3;
            m.rep.local_ca_guid = 0xA0A0A0A0A0A0A0A0ull;
            m.rep.responder_resources = a;
            m.rep.initiator_depth = b;
            m.rep.rnr_retry_count = c & 7;
            break;
          case ib::CmAttr::Dreq:
            m.dreq.remote_qpn = a & 1 ? 0x111 : c;
            break;
          default:
            break;
        }
        std::vector<uint8_t> mad(ib::kMadLen);
        ib::EncodeCm(m, std::span<uint8_t, ib::kMadLen>(mad.data(), ib::kMadLen));
        uint64_t before = env.sent;
        agent.OnMad(from, mad);
        CHECK(env.sent - before <= 2);
        break;
      }
      case 2:  // time passes
        env.now += uint64_t(in.Byte()) << (in.Byte() % 9);
        agent.OnTimer();
        break;
      case 3: {  // the consumer
        uint32_t id = pick_id(in);
        AcceptArgs accept;
        accept.local_qpn = 0x222;
        switch (in.Byte() % 7) {
          case 0: agent.Accept(id, accept); break;
          case 1: agent.Reject(id); break;
          case 2: agent.RefuseRequest(id); break;
          case 3: agent.Disconnect(id); break;
          case 4: agent.Established(id); break;
          case 5: agent.SendRtu(id); break;
          default: agent.Destroy(id); break;
        }
        break;
      }
      case 4: {
        ConnectArgs args;
        args.service_id = kService;
        args.local_qpn = 0x111;
        if (uint32_t id = agent.Connect(Address(in.Byte() % 3), args); id && known.insert(id).second)
          ids.push_back(id);
        break;
      }
      default:
        if (in.Byte() & 1) agent.Listen(kService);
        else agent.StopListening(kService);
        break;
    }
    drain();
  }

  // A day passes with nothing said: whatever the peers left waits for the consumer alone (a
  // connection, a request it took, an answer it owes); nothing waits on a peer any more.
  auto day = [&] {
    for (int hour = 0; hour < 24; ++hour) {
      env.now += 3600 * 1000;
      agent.OnTimer();
      drain();
    }
  };
  day();
  for (uint32_t id : ids) {
    CmState state = agent.StateOf(id);
    CHECK(state == CmState::NoSuchId || state == CmState::Idle || state == CmState::RepRcvd ||
          state == CmState::MraRepSent || state == CmState::Established || state == CmState::DreqRcvd);
  }
  // The consumer lets go of everything; a day later nothing is left.
  for (uint32_t id : ids) agent.Destroy(id);
  drain();
  day();
  CHECK(agent.size() == 0);
  CHECK(agent.NextDeadlineMs() == UINT64_MAX);
  return 0;
}
