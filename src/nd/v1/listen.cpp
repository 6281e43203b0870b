#include "nd/v1/listen.h"

#include "nd/connector.h"
#include "nd/listener.h"
#include "nd/v1/adapter.h"
#include "nd/v1/connector.h"

namespace ndwv::nd::v1 {

Listen::Listen(Adapter& adapter, Ref<nd::Listener> listener)
    : adapter_(&adapter), listener_(std::move(listener)) {}

IWVOverlapped* Listen::wvRequests() const { return listener_->wvRequests(); }

HRESULT Listen::GetConnectionRequest(INDConnector* pConnector, OVERLAPPED* pOverlapped) {
  if (adapter_->released()) return ND_DEVICE_REMOVED;
  Connector* connector = adapter_->Mine<Connector>(pConnector);
  if (connector == nullptr) return ND_INVALID_PARAMETER_1;
  if (pOverlapped == nullptr) return ND_INVALID_PARAMETER_2;
  return listener_->GetConnectionRequest(&connector->base(), pOverlapped);
}

}  // namespace ndwv::nd::v1
