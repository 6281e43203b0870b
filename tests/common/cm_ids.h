// Forging IB CM messages in tests: the two communication IDs of a message of any kind but REQ
// (which carries only its sender's). wire::ib::SenderCommId reads the first.
#pragma once
#include <cstdint>

#include "wire/ib_cm.h"

namespace ndwv::testing {

// `local` is the sender's communication ID, `remote` the receiver's.
inline void SetCommIds(wire::ib::CmMessage& m, uint32_t local, uint32_t remote) {
  using wire::ib::CmAttr;
  switch (m.attr) {
    case CmAttr::Req: m.req.local_comm_id = local; break;
    case CmAttr::Mra: m.mra.local_comm_id = local, m.mra.remote_comm_id = remote; break;
    case CmAttr::Rej: m.rej.local_comm_id = local, m.rej.remote_comm_id = remote; break;
    case CmAttr::Rep: m.rep.local_comm_id = local, m.rep.remote_comm_id = remote; break;
    case CmAttr::Rtu: m.rtu.local_comm_id = local, m.rtu.remote_comm_id = remote; break;
    case CmAttr::Dreq: m.dreq.local_comm_id = local, m.dreq.remote_comm_id = remote; break;
    case CmAttr::Drep: m.drep.local_comm_id = local, m.drep.remote_comm_id = remote; break;
    default: break;
  }
}

}  // namespace ndwv::testing
