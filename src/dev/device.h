// The software RDMA device: one per transport offered (NDWV_TRANSPORTS), serving every IP address
// of the host. It gives the capabilities and makes the connection endpoints of its transport;
// everything else (PD, CQ, QP, SRQ) is transport independent.
#pragma once
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dev/endpoint.h"

namespace ndwv::dev {

// Inbound and outbound RDMA Reads a QP may have outstanding at most (IRD, ORD).
inline constexpr uint32_t kMaxReadLimit = 128;

struct DeviceAttributes {
  uint64_t max_mr_size;
  uint32_t max_qp_wr, max_sge, max_cq_entries, max_inline, max_ird, max_ord;
  uint32_t max_srq_wr, max_srq_sge;
  uint64_t max_transfer_length;
  uint32_t max_private_data;
  bool in_order_placement;  // bytes of one Write land in address order
  bool cq_resize;
};

class Device {
 public:
  // The devices of the offered transports, in the order of preference; empty if the settings
  // were refused.
  static const std::vector<Device*>& All();
  static Device* Find(uint64_t guid);

  uint64_t guid() const { return guid_; }
  Transport transport() const { return transport_; }
  const char* name() const { return name_; }
  const DeviceAttributes& attributes() const { return attributes_; }
  // WV_SUCCESS if the address (port ignored) is one of the host's (found so in the last second,
  // or now), WV_INVALID_ADDRESS if not, WV_INSUFFICIENT_RESOURCES if the process has no
  // descriptor left to find out.
  static int32_t CheckServedAddress(const sockaddr* address, socklen_t length);
  std::shared_ptr<ConnectEndpoint> CreateEndpoint() const;

 private:
  Device(uint64_t guid, Transport transport, const char* name);
  uint64_t guid_;
  Transport transport_;
  const char* name_;
  DeviceAttributes attributes_;
};

}  // namespace ndwv::dev
