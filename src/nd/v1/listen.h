// INDListen: a version 2 listener, bound and listening on the adapter's address (Adapter::Listen
// makes it so). Releasing it stops listening and cancels its pending GetConnectionRequests.
#pragma once

#include "nd/v1/object.h"

namespace ndwv::nd {
class Listener;
}

namespace ndwv::nd::v1 {

class Adapter;

class Listen final : public OverlappedObject<Listen, INDListen, IID_INDListen> {
 public:
  Listen(Adapter& adapter, Ref<nd::Listener> listener);

  Adapter* adapter() const { return adapter_.get(); }
  IWVOverlapped* wvRequests() const;

  // INDListen
  HRESULT STDMETHODCALLTYPE GetConnectionRequest(INDConnector* pConnector,
                                                 OVERLAPPED* pOverlapped) override;

 private:
  const Ref<Adapter> adapter_;
  const Ref<nd::Listener> listener_;
};

}  // namespace ndwv::nd::v1
