// ND completion queues, memory regions and windows, queue pairs and SRQs over fake WV objects:
// result and status mapping, flag translation, argument checks, the overlapped contract.
#include <endian.h>

#include "test_nd_fakes.h"

namespace ndwv::nd::testing {
namespace {

WV_COMPLETION Completion(WV_WC_OPCODE opcode, WV_WC_STATUS status, UINT64 wrId = 7,
                         UINT32 length = 0, void* qpContext = nullptr) {
  WV_COMPLETION c{};
  c.Opcode = opcode;
  c.Status = status;
  c.WrId = wrId;
  c.Length = length;
  c.QpContext = qpContext;
  return c;
}

// ---- Completion queue ---------------------------------------------------------------------------

TEST_F(NdTest, GetResultsMapsEveryWorkCompletionStatus) {
  struct Row {
    WV_WC_STATUS wv;
    HRESULT nd;
  };
  const Row table[] = {
      {WvWcSuccess, ND_SUCCESS},
      {WvWcFlushed, ND_CANCELED},
      {WvWcLocalProtectionError, ND_ACCESS_VIOLATION},
      {WvWcRemoteAccessError, ND_ACCESS_VIOLATION},
      {WvWcMwBindError, ND_ACCESS_VIOLATION},
      {WvWcLocalAccessError, ND_ACCESS_VIOLATION},
      {WvWcLocalLengthError, ND_DATA_OVERRUN},
      {WvWcRnrRetryError, ND_IO_TIMEOUT},
      {WvWcTimeoutRetryError, ND_IO_TIMEOUT},
      {WvWcRemoteInvalidRequest, STATUS_DATA_ERROR},
      {WvWcRemoteOpError, ND_REMOTE_ERROR},
      {WvWcLocalOpError, ND_INVALID_DEVICE_REQUEST},  // e.g. Invalidate of an unbound window
      {WvWcBadResponse, ND_INTERNAL_ERROR},
      {WvWcError, ND_INTERNAL_ERROR},
  };
  IND2CompletionQueue* cq = MakeCq();
  for (const Row& row : table) device->lastCq->ready.push_back(Completion(WvSend, row.wv));
  ND2_RESULT results[32] = {};
  ASSERT_EQ(cq->GetResults(results, 32), std::size(table));
  for (size_t i = 0; i < std::size(table); ++i)
    EXPECT_EQ(results[i].Status, table[i].nd) << "WV status " << table[i].wv;
  EXPECT_EQ(cq->Release(), 0u);
}

TEST_F(NdTest, GetResultsReportsContextsTypeAndLength) {
  IND2CompletionQueue* cq = MakeCq();
  int qpContext = 0;
  const std::pair<WV_WC_OPCODE, ND2_REQUEST_TYPE> types[] = {
      {WvReceive, Nd2RequestTypeReceive},
      {WvReceiveRdmaWrite, Nd2RequestTypeReceive},
      {WvSend, Nd2RequestTypeSend},
      {WvRdmaWrite, Nd2RequestTypeWrite},
      {WvRdmaRead, Nd2RequestTypeRead},
      {WvBindWindow, Nd2RequestTypeBind},
      {WvInvalidateWindow, Nd2RequestTypeInvalidate},
  };
  for (auto [opcode, type] : types)
    device->lastCq->ready.push_back(
        Completion(opcode, WvWcFlushed, 0x1000 + opcode, 123, &qpContext));
  device->lastCq->ready.push_back(Completion(WvReceive, WvWcSuccess, 0xabc, 0, &qpContext));

  ND2_RESULT results[16] = {};
  ASSERT_EQ(cq->GetResults(results, 16), std::size(types) + 1);
  for (size_t i = 0; i < std::size(types); ++i) {
    EXPECT_EQ(results[i].RequestType, types[i].second) << "also for flushed requests";
    EXPECT_EQ(results[i].RequestContext, reinterpret_cast<void*>(0x1000 + types[i].first));
    EXPECT_EQ(results[i].QueuePairContext, &qpContext);
    EXPECT_EQ(results[i].BytesTransferred, 123u);
    EXPECT_EQ(results[i].Status, ND_CANCELED);
  }
  EXPECT_EQ(results[std::size(types)].BytesTransferred, 0u) << "zero-byte receives stay zero";
  EXPECT_EQ(cq->Release(), 0u);
}

TEST_F(NdTest, GetResultsDrainsLongQueuesAndStopsWhenEmpty) {
  IND2CompletionQueue* cq = MakeCq();
  for (UINT64 i = 0; i < 40; ++i)
    device->lastCq->ready.push_back(Completion(WvSend, WvWcSuccess, i));
  ND2_RESULT results[50] = {};
  ASSERT_EQ(cq->GetResults(results, 35), 35u);
  for (UINT64 i = 0; i < 35; ++i) EXPECT_EQ(results[i].RequestContext, reinterpret_cast<void*>(i));
  EXPECT_EQ(cq->GetResults(results, 50), 5u);
  EXPECT_EQ(results[4].RequestContext, reinterpret_cast<void*>(39));
  EXPECT_EQ(cq->GetResults(results, 50), 0u);
  EXPECT_EQ(cq->GetResults(results, 0), 0u);
  // No array to fill: nothing taken (not written through NULL, nor lost).
  device->lastCq->ready.push_back(Completion(WvSend, WvWcSuccess, 77));
  EXPECT_EQ(cq->GetResults(nullptr, 4), 0u);
  ASSERT_EQ(cq->GetResults(results, 50), 1u);
  EXPECT_EQ(results[0].RequestContext, reinterpret_cast<void*>(77));
  EXPECT_EQ(cq->Release(), 0u);
}

TEST_F(NdTest, NotifyMapsTypesAndPends) {
  IND2CompletionQueue* cq = MakeCq();
  OVERLAPPED ov{};
  EXPECT_EQ(cq->Notify(ND_CQ_NOTIFY_ANY, &ov), ND_PENDING) << "WV_IO_PENDING becomes ND_PENDING";
  EXPECT_EQ(device->lastCq->notifiedWith, WvCqNextCompletion);
  EXPECT_EQ(cq->Notify(ND_CQ_NOTIFY_SOLICITED, &ov), ND_PENDING);
  EXPECT_EQ(device->lastCq->notifiedWith, WvCqSolicited);
  EXPECT_EQ(cq->Notify(ND_CQ_NOTIFY_ERRORS, &ov), ND_PENDING);
  EXPECT_EQ(device->lastCq->notifiedWith, WvCqError);
  EXPECT_EQ(cq->Notify(3, &ov), ND_INVALID_PARAMETER_1);
  EXPECT_EQ(cq->CancelOverlappedRequests(), ND_SUCCESS);
  EXPECT_EQ(device->lastCq->cancels, 1);
  EXPECT_EQ(cq->Release(), 0u);
}

TEST_F(NdTest, ResizeAndAffinity) {
  IND2CompletionQueue* cq = MakeCq();
  EXPECT_EQ(cq->Resize(0), ND_INVALID_PARAMETER);
  EXPECT_EQ(cq->Resize(Info().MaxCompletionQueueDepth + 1), ND_INVALID_PARAMETER);
  EXPECT_EQ(cq->Resize(100), ND_SUCCESS);
  EXPECT_EQ(device->lastCq->resizedTo, 100u);

  // What the device reports, unchanged; missing out-pointers are refused before it is asked.
  USHORT group = 9;
  KAFFINITY affinity = 0;
  EXPECT_EQ(cq->GetNotifyAffinity(&group, &affinity), ND_SUCCESS);
  EXPECT_EQ(group, device->notifyGroup);
  EXPECT_EQ(affinity, device->notifyAffinity);
  EXPECT_EQ(cq->GetNotifyAffinity(nullptr, &affinity), ND_INVALID_PARAMETER);
  EXPECT_EQ(cq->GetNotifyAffinity(&group, nullptr), ND_INVALID_PARAMETER);
  EXPECT_EQ(cq->Release(), 0u);
}

TEST_F(NdTest, ResizeWithoutTheCapabilityIsNotSupported) {
  device->attributes.CapabilityFlags = 0;
  IND2Adapter* second = nullptr;
  ASSERT_EQ(provider->OpenAdapter(IID_IND2Adapter, kGuid, reinterpret_cast<void**>(&second)),
            ND_SUCCESS);
  IND2CompletionQueue* cq = nullptr;
  ASSERT_EQ(second->CreateCompletionQueue(IID_IND2CompletionQueue, file, 4, 0, 0,
                                          reinterpret_cast<void**>(&cq)),
            ND_SUCCESS);
  EXPECT_EQ(cq->Resize(8), ND_NOT_SUPPORTED);
  EXPECT_EQ(cq->Release(), 0u);
  EXPECT_EQ(second->Release(), 0u);
}

// ---- Memory regions -----------------------------------------------------------------------------

TEST_F(NdTest, RegisterDegenerateBuffersFailAtOnce) {
  IND2MemoryRegion* mr = MakeMr();
  char buffer[64];
  OVERLAPPED ov{};
  EXPECT_EQ(mr->Register(nullptr, 0, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &ov), ND_INVALID_PARAMETER);
  EXPECT_EQ(mr->Register(buffer, 0, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &ov), ND_INVALID_BUFFER_SIZE);
  EXPECT_EQ(mr->Register(nullptr, 64, ND_MR_FLAG_ALLOW_LOCAL_WRITE, &ov), ND_ACCESS_VIOLATION);
  EXPECT_EQ(mr->Register(buffer, Info().MaxRegistrationSize + 1, 0, &ov), ND_INVALID_PARAMETER);
  EXPECT_EQ(mr->Register(buffer, 64, 0x40, &ov), ND_INVALID_PARAMETER_3);
  EXPECT_EQ(pd->registeredBuffer, nullptr) << "nothing reached WV";
  EXPECT_EQ(mr->Release(), 0u);
}

TEST_F(NdTest, RegisterPendsAndCompletesThroughTheOverlappedFile) {
  HANDLE port = CreateIoCompletionPort(file, nullptr, 5, 0);
  ASSERT_NE(port, nullptr);
  IND2MemoryRegion* mr = MakeMr();
  char buffer[64];
  OVERLAPPED ov{};
  ASSERT_EQ(mr->Register(buffer, sizeof(buffer), ND_MR_FLAG_ALLOW_LOCAL_WRITE, &ov), ND_PENDING)
      << "always pend: ND applications wait on the port";
  DWORD bytes = 0;
  ULONG_PTR key = 0;
  OVERLAPPED* done = nullptr;
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &done, 0));
  EXPECT_EQ(done, &ov);
  EXPECT_EQ(key, 5u);

  // Any object of the adapter resolves the OVERLAPPED (ndmrrate).
  IND2MemoryRegion* other = MakeMr();
  EXPECT_EQ(other->GetOverlappedResult(&ov, FALSE), ND_SUCCESS);
  EXPECT_EQ(mr->GetLocalToken(), 0x11u);
  EXPECT_EQ(mr->GetRemoteToken(), htonl(0x22)) << "network order, as WV gives it";
  EXPECT_EQ(pd->registeredLength, sizeof(buffer));

  ASSERT_EQ(mr->Deregister(&ov), ND_PENDING);
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &done, 0));
  EXPECT_EQ(mr->GetOverlappedResult(&ov, TRUE), ND_SUCCESS);
  EXPECT_EQ(pd->deregisteredLkey, 0x11u);
  EXPECT_EQ(pd->registrations, 0);

  // The object can register again after deregistering.
  EXPECT_EQ(Register(mr, buffer, 8, ND_MR_FLAG_ALLOW_LOCAL_WRITE), ND_SUCCESS);
  EXPECT_EQ(mr->Release(), 0u);
  EXPECT_EQ(pd->registrations, 0) << "a registration left behind is undone on release";
  EXPECT_EQ(other->Release(), 0u);
  ASSERT_TRUE(GetQueuedCompletionStatus(port, &bytes, &key, &done, 0));  // the re-registration
  CloseHandle(port);
}

// nd2-spi: a registration refused is an immediate error; the request never started, and its
// OVERLAPPED is neither touched nor completed.
TEST_F(NdTest, RegisterFailureIsReturnedAtOnceAndNotNotified) {
  IND2MemoryRegion* mr = MakeMr();
  char buffer[64];
  pd->registerStatus = WV_INSUFFICIENT_RESOURCES;
  OVERLAPPED ov{};
  ov.Internal = 0x1234;
  EXPECT_EQ(mr->Register(buffer, sizeof(buffer), 0, &ov), ND_INSUFFICIENT_RESOURCES);
  EXPECT_EQ(ov.Internal, 0x1234u) << "the OVERLAPPED of a request that never started was written";
  EXPECT_EQ(mr->Deregister(&ov), ND_INVALID_DEVICE_STATE) << "nothing is registered";
  EXPECT_EQ(mr->Release(), 0u);
}

TEST_F(NdTest, RegisterEventWithBitZeroSkipsThePort) {
  HANDLE port = CreateIoCompletionPort(file, nullptr, 0, 0);
  HANDLE event = CreateEvent(nullptr, FALSE, FALSE, nullptr);
  IND2MemoryRegion* mr = MakeMr();
  char buffer[64];
  OVERLAPPED ov{};
  ov.hEvent = reinterpret_cast<HANDLE>(reinterpret_cast<ULONG_PTR>(event) | 1);
  ASSERT_EQ(mr->Register(buffer, sizeof(buffer), 0, &ov), ND_PENDING);
  EXPECT_EQ(WaitForSingleObject(event, 0), WAIT_OBJECT_0);
  DWORD bytes;
  ULONG_PTR key;
  OVERLAPPED* done = nullptr;
  EXPECT_FALSE(GetQueuedCompletionStatus(port, &bytes, &key, &done, 0));
  EXPECT_EQ(done, nullptr);
  OVERLAPPED dereg{};
  ASSERT_EQ(mr->Deregister(&dereg), ND_PENDING);
  EXPECT_EQ(mr->Release(), 0u);
  CloseHandle(event);
  CloseHandle(port);
}

TEST_F(NdTest, DeregisterWithBoundWindowsIsBusyAtOnce) {
  IND2MemoryRegion* mr = MakeMr();
  char buffer[64];
  ASSERT_EQ(Register(mr, buffer, sizeof(buffer), ND_MR_FLAG_ALLOW_LOCAL_WRITE), ND_SUCCESS);
  pd->deregisterStatus = WV_DEVICE_BUSY;
  OVERLAPPED ov{};
  ov.Internal = 0x77;
  EXPECT_EQ(mr->Deregister(&ov), ND_DEVICE_BUSY);
  EXPECT_EQ(ov.Internal, 0x77u) << "not reported through the OVERLAPPED";
  pd->deregisterStatus = WV_SUCCESS;
  ASSERT_EQ(mr->Deregister(&ov), ND_PENDING);
  EXPECT_EQ(mr->GetOverlappedResult(&ov, TRUE), ND_SUCCESS);
  EXPECT_EQ(mr->Release(), 0u);
}

TEST_F(NdTest, RegistrationFlagsBecomeWvAccessRights) {
  struct Row {
    ULONG nd;
    DWORD wv;
  };
  const Row table[] = {
      {0, WV_ACCESS_MW_BIND},
      {ND_MR_FLAG_ALLOW_LOCAL_WRITE, WV_ACCESS_LOCAL_WRITE | WV_ACCESS_MW_BIND},
      {ND_MR_FLAG_ALLOW_REMOTE_READ, WV_ACCESS_REMOTE_READ | WV_ACCESS_MW_BIND},
      {ND_MR_FLAG_ALLOW_REMOTE_WRITE, WV_ACCESS_REMOTE_WRITE | WV_ACCESS_MW_BIND},
      {ND_MR_FLAG_RDMA_READ_SINK, WV_ACCESS_LOCAL_WRITE | WV_ACCESS_MW_BIND},
      {ND_MR_FLAG_DO_NOT_SECURE_VM | ND_MR_FLAG_ALLOW_REMOTE_READ,
       WV_ACCESS_REMOTE_READ | WV_ACCESS_MW_BIND},
  };
  char buffer[64];
  for (const Row& row : table) {
    IND2MemoryRegion* mr = MakeMr();
    ASSERT_EQ(Register(mr, buffer, sizeof(buffer), row.nd), ND_SUCCESS);
    EXPECT_EQ(pd->registeredAccess, row.wv) << "ND flags 0x" << std::hex << row.nd;
    OVERLAPPED ov{};
    ASSERT_EQ(mr->Deregister(&ov), ND_PENDING);
    EXPECT_EQ(mr->Release(), 0u);
  }
}

// ---- Queue pairs --------------------------------------------------------------------------------

class NdQpTest : public NdTest {
 protected:
  void SetUp() override {
    NdTest::SetUp();
    cq = MakeCq();
    qp = MakeQp(cq, &qpContext);
    wvQp = pd->lastQp;
  }
  void TearDown() override {
    EXPECT_EQ(qp->Release(), 0u);
    EXPECT_EQ(cq->Release(), 0u);
    NdTest::TearDown();
  }
  IND2CompletionQueue* cq = nullptr;
  IND2QueuePair* qp = nullptr;
  FakeQp* wvQp = nullptr;
  int qpContext = 0;
};

TEST_F(NdQpTest, SendTranslatesSgesAndFlags) {
  char a[8], b[16];
  ND2_SGE sge[2] = {{a, sizeof(a), 0x11}, {b, sizeof(b), 0x12}};
  ASSERT_EQ(qp->Send(reinterpret_cast<void*>(0x99), sge, 2, 0), ND_SUCCESS);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::Send);
  EXPECT_EQ(wvQp->lastWrId, 0x99u);
  EXPECT_EQ(wvQp->lastFlags, DWORD(WV_SEND_SIGNALED));
  ASSERT_EQ(wvQp->sges.size(), 2u);
  EXPECT_EQ(wvQp->sges[1].pAddress, b);
  EXPECT_EQ(wvQp->sges[1].Length, sizeof(b));
  EXPECT_EQ(wvQp->sges[1].Lkey, 0x12u);

  ASSERT_EQ(qp->Send(nullptr, sge, 1,
                     ND_OP_FLAG_SILENT_SUCCESS | ND_OP_FLAG_READ_FENCE |
                         ND_OP_FLAG_SEND_AND_SOLICIT_EVENT | ND_OP_FLAG_INLINE),
            ND_SUCCESS);
  EXPECT_EQ(wvQp->lastFlags, DWORD(WV_SEND_FENCE | WV_SEND_SOLICITED | WV_SEND_INLINE));

  EXPECT_EQ(qp->Send(nullptr, nullptr, 0, 0), ND_SUCCESS) << "zero-byte send";
  EXPECT_TRUE(wvQp->sges.empty());
  EXPECT_EQ(qp->Send(nullptr, nullptr, 1, 0), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(qp->Send(nullptr, sge, 1, ND_OP_FLAG_ALLOW_READ), ND_INVALID_PARAMETER_4);
}

TEST_F(NdQpTest, LongSgeListsAreCopiedWhole) {
  std::vector<ND2_SGE> sge(40);
  for (size_t i = 0; i < sge.size(); ++i) sge[i] = {nullptr, ULONG(i), UINT32(i)};
  ASSERT_EQ(qp->Send(nullptr, sge.data(), ULONG(sge.size()), ND_OP_FLAG_INLINE), ND_SUCCESS);
  ASSERT_EQ(wvQp->sges.size(), 40u);
  EXPECT_EQ(wvQp->sges[39].Length, 39u);
}

TEST_F(NdQpTest, PostsPassWvStatusesThrough) {
  for (HRESULT status :
       {WV_CONNECTION_INVALID, WV_NO_MORE_ENTRIES, WV_DATA_OVERRUN, WV_BUFFER_OVERFLOW}) {
    wvQp->postStatus = status;
    EXPECT_EQ(qp->Send(nullptr, nullptr, 0, 0), status);
    EXPECT_EQ(qp->Receive(nullptr, nullptr, 0), status);
    EXPECT_EQ(qp->Read(nullptr, nullptr, 0, 0, 0, 0), status);
    EXPECT_EQ(qp->Write(nullptr, nullptr, 0, 0, 0, 0), status);
  }
}

TEST_F(NdQpTest, ReceivePostsToWv) {
  char a[8];
  ND2_SGE sge = {a, sizeof(a), 0x44};
  ASSERT_EQ(qp->Receive(reinterpret_cast<void*>(5), &sge, 1), ND_SUCCESS);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::Receive);
  EXPECT_EQ(wvQp->lastWrId, 5u);
  EXPECT_EQ(wvQp->sges.at(0).Lkey, 0x44u);
  EXPECT_EQ(qp->Receive(nullptr, nullptr, 2), ND_INVALID_PARAMETER_2);
}

TEST_F(NdQpTest, ReadAndWriteSendTheRemoteAddressInNetworkOrder) {
  char a[8];
  ND2_SGE sge = {a, sizeof(a), 0x44};
  ASSERT_EQ(qp->Read(nullptr, &sge, 1, 0x1122334455667788ull, 0xaabbccdd, ND_OP_FLAG_READ_FENCE),
            ND_SUCCESS);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::Read);
  EXPECT_EQ(wvQp->remoteAddress, htobe64(0x1122334455667788ull));
  EXPECT_EQ(wvQp->remoteKey, 0xaabbccddu) << "tokens are network order already";
  EXPECT_EQ(wvQp->lastFlags, DWORD(WV_SEND_SIGNALED | WV_SEND_FENCE));

  ASSERT_EQ(qp->Write(nullptr, &sge, 1, 0x10, 0x20, ND_OP_FLAG_INLINE | ND_OP_FLAG_SILENT_SUCCESS),
            ND_SUCCESS);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::Write);
  EXPECT_EQ(wvQp->remoteAddress, htobe64(0x10));
  EXPECT_EQ(wvQp->lastFlags, DWORD(WV_SEND_INLINE));

  EXPECT_EQ(qp->Read(nullptr, &sge, 1, 0, 0, ND_OP_FLAG_INLINE), ND_INVALID_PARAMETER_6);
  EXPECT_EQ(qp->Read(nullptr, &sge, 1, 0, 0, ND_OP_FLAG_SEND_AND_SOLICIT_EVENT),
            ND_INVALID_PARAMETER_6);
  EXPECT_EQ(qp->Write(nullptr, &sge, 1, 0, 0, ND_OP_FLAG_ALLOW_WRITE), ND_INVALID_PARAMETER_6);
  EXPECT_EQ(qp->Read(nullptr, nullptr, 0, 0, 0, 0), ND_SUCCESS) << "zero-byte read";
}

TEST_F(NdQpTest, FlushMovesTheQueuePairToError) {
  EXPECT_EQ(qp->Flush(), ND_SUCCESS);
  EXPECT_EQ(wvQp->modifiedState, WvQpStateError);
  EXPECT_EQ(wvQp->modifyOptions, DWORD(WV_QP_ATTR_STATE));
}

TEST_F(NdQpTest, BindChecksRightsAndPublishesTheToken) {
  IND2MemoryRegion* readOnly = MakeMr();
  IND2MemoryRegion* writable = MakeMr();
  IND2MemoryWindow* mw = MakeMw();
  char buffer[64];
  ASSERT_EQ(Register(readOnly, buffer, sizeof(buffer), ND_MR_FLAG_ALLOW_REMOTE_READ), ND_SUCCESS);
  ASSERT_EQ(Register(writable, buffer, sizeof(buffer), ND_MR_FLAG_ALLOW_LOCAL_WRITE), ND_SUCCESS);

  EXPECT_EQ(qp->Bind(nullptr, readOnly, mw, buffer, 8, ND_OP_FLAG_ALLOW_WRITE),
            ND_ACCESS_VIOLATION);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::None);

  // Windows on local-write-only regions may grant remote rights; flags 0 is accepted too.
  wvQp->nextRkey = 0x01020304;
  ASSERT_EQ(qp->Bind(reinterpret_cast<void*>(3), writable, mw, buffer + 8, 16,
                     ND_OP_FLAG_ALLOW_READ | ND_OP_FLAG_ALLOW_WRITE | ND_OP_FLAG_SILENT_SUCCESS),
            ND_SUCCESS);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::Bind);
  EXPECT_EQ(wvQp->lastWrId, 3u);
  EXPECT_EQ(wvQp->bindAccess, DWORD(WV_ACCESS_REMOTE_READ | WV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(wvQp->lastFlags, 0u);
  EXPECT_EQ(wvQp->bindLkey, writable->GetLocalToken());
  EXPECT_EQ(wvQp->bindBuffer, buffer + 8);
  EXPECT_EQ(wvQp->bindLength, 16u);
  EXPECT_EQ(mw->GetRemoteToken(), 0x01020304u) << "valid as soon as Bind returns";
  ASSERT_EQ(qp->Bind(nullptr, writable, mw, buffer, 8, 0), ND_SUCCESS);
  EXPECT_EQ(wvQp->bindAccess, 0u);
  EXPECT_EQ(wvQp->lastFlags, DWORD(WV_SEND_SIGNALED));

  Foreign* foreign = new Foreign;
  EXPECT_EQ(qp->Bind(nullptr, foreign, mw, buffer, 8, 0), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(qp->Bind(nullptr, writable, writable, buffer, 8, 0), ND_INVALID_PARAMETER_3);
  EXPECT_EQ(qp->Bind(nullptr, writable, mw, buffer, 8, ND_OP_FLAG_INLINE), ND_INVALID_PARAMETER_6);

  ASSERT_EQ(qp->Invalidate(reinterpret_cast<void*>(4), mw, ND_OP_FLAG_READ_FENCE), ND_SUCCESS);
  EXPECT_EQ(wvQp->lastOp, FakeQp::Op::Invalidate);
  EXPECT_EQ(wvQp->lastFlags, DWORD(WV_SEND_SIGNALED | WV_SEND_FENCE));
  EXPECT_EQ(qp->Invalidate(nullptr, foreign, 0), ND_INVALID_PARAMETER_2);
  EXPECT_EQ(qp->Invalidate(nullptr, mw, ND_OP_FLAG_ALLOW_READ), ND_INVALID_PARAMETER_3);

  foreign->Release();
  EXPECT_EQ(mw->Release(), 0u);
  EXPECT_EQ(writable->Release(), 0u);
  EXPECT_EQ(readOnly->Release(), 0u);
}

TEST_F(NdQpTest, BindOnAnUnregisteredRegionIsAnAccessViolation) {
  IND2MemoryRegion* mr = MakeMr();
  IND2MemoryWindow* mw = MakeMw();
  char buffer[8];
  EXPECT_EQ(qp->Bind(nullptr, mr, mw, buffer, 8, 0), ND_ACCESS_VIOLATION);
  EXPECT_EQ(mw->Release(), 0u);
  EXPECT_EQ(mr->Release(), 0u);
}

// ---- Shared receive queues ----------------------------------------------------------------------

TEST_F(NdTest, SharedReceiveQueueModifyKeepsZeroValues) {
  IND2SharedReceiveQueue* srq = nullptr;
  ASSERT_EQ(adapter->CreateSharedReceiveQueue(IID_IND2SharedReceiveQueue, file, 32, 2, 4, 0, 0,
                                              reinterpret_cast<void**>(&srq)),
            ND_SUCCESS);
  FakeSrq* wvSrq = pd->lastSrq;
  EXPECT_EQ(srq->Modify(64, 0), ND_SUCCESS);
  EXPECT_EQ(wvSrq->maxWr, 64u);
  EXPECT_EQ(wvSrq->limit, 4u);
  EXPECT_EQ(srq->Modify(0, 8), ND_SUCCESS);
  EXPECT_EQ(wvSrq->maxWr, 64u);
  EXPECT_EQ(wvSrq->limit, 8u);
  EXPECT_EQ(srq->Modify(Info().MaxSharedReceiveQueueDepth + 1, 0), ND_INVALID_PARAMETER);

  char a[8];
  ND2_SGE sge = {a, sizeof(a), 9};
  EXPECT_EQ(srq->Receive(reinterpret_cast<void*>(6), &sge, 1), ND_SUCCESS);
  EXPECT_EQ(wvSrq->lastWrId, 6u);
  EXPECT_EQ(wvSrq->sges.at(0).Lkey, 9u);
  OVERLAPPED ov{};
  EXPECT_EQ(srq->Notify(&ov), ND_PENDING);
  EXPECT_EQ(srq->Release(), 0u);
}

}  // namespace
}  // namespace ndwv::nd::testing
