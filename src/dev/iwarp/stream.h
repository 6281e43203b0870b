// The iWARP data path of one connected QP: MPA FPDUs carrying DDP/RDMAP over a TCP socket.
//
// Transmit runs on whichever thread kicks it (the poster, the engine when the socket drains, the
// receive path when a Read Response is owed) under one lock, so posting normally goes straight to
// the socket. Receive is a resumable state machine (header, payload, trailer) run by the engine or
// by a CQ poller that lends its thread. Tagged payload (RDMA Write, Read Response) and Send
// payload are read from the socket straight into the registered target buffer once it is checked.
#pragma once
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>

#include "base/capture.h"
#include "base/kicked_runner.h"
#include "base/lazy_deque.h"
#include "base/mutex.h"
#include "base/object_pool.h"
#include "dev/cq.h"
#include "dev/engine.h"
#include "dev/poller_handoff.h"
#include "dev/qp.h"
#include "wire/ddp.h"

namespace ndwv::wire { struct TerminateMsg; }

namespace ndwv::dev::iwarp {

struct StreamParams {
  bool crc = true;
  uint32_t ird = 1;          // Read Requests we answer at once
  uint32_t ord = 1;          // Read Requests we keep outstanding
  uint32_t max_ulpdu = 65000;
  bool expect_rtr = false;   // passive side: the first FPDU must be the zero-length Write RTR
  // The socket lets its port be reused already (an accepted one inherits that from its
  // listener): its TIME_WAIT needs no ReleaseTcpPort.
  bool port_released = false;
  // Writes (and Sends) complete when a zero-length Read (a probe) confirms they were placed.
  bool confirm_writes = true, confirm_sends = false;
};

// Where the receive path reads its bytes: the socket, or bytes a unit test or a fuzzer hands over
// cut wherever it likes. Read returns what recv() would: > 0 bytes, 0 at the end of the stream, or
// -1 with errno (EAGAIN: nothing now).
class ByteSource {
 public:
  virtual ssize_t Read(void* buffer, size_t length) = 0;
 protected:
  ~ByteSource() = default;
};

// What the connection manager learns from the stream.
class StreamObserver {
 public:
  virtual void OnRtr() = 0;             // the RTR arrived (passive side)
  virtual void OnPeerClosed() = 0;      // the peer closed its half (graceful disconnect)
  // Reset, Terminate, protocol error, or (timed_out) the peer stopped acknowledging: the QP goes
  // to Error.
  virtual void OnStreamError(bool timed_out) = 0;
  // The QP went to Error first (a local error, or the application's Modify) and the stream
  // closed its socket: the connection is over, and the peer's close will not be read.
  virtual void OnClosedHere() = 0;
 protected:
  ~StreamObserver() = default;
};

class Stream final : public Link, public IoHandler, public std::enable_shared_from_this<Stream> {
 public:
  // `capture`: the connection's packet capture (NDWV_CAPTURE), if any, which the stream continues.
  // `local` and `peer`: the connection's addresses, for its counters row; null: asked of the
  // socket (the endpoint knows them already, and each question is a system call per connection).
  Stream(int fd, std::shared_ptr<QueuePair> qp, const StreamParams& params,
         std::weak_ptr<StreamObserver> observer,
         std::unique_ptr<base::TcpCapture> capture = nullptr, const sockaddr_storage* local = nullptr,
         const sockaddr_storage* peer = nullptr);
  ~Stream() override;

  void Start();       // attaches to the QP and starts watching the socket
  void SendRtr();     // active side: the zero-length RDMA Write that opens full operation
  void CloseSend();   // graceful close: FIN once everything queued has been sent

  // Link
  void Kick() override;
  void Posted(const SendWqe& request) override;
  void PollProgress() override;
  void Reaped(bool peer_message) override;
  void StillPolled() override;
  void OnNotifyArmed() override;
  void Shutdown() override;
  // Ends the connection abortively (the QP goes to Error and is flushed).
  void Abort();
  // What the receive side got and who reads the socket, for the log line of a connection that
  // timed out waiting for the peer: bytes left unread tell a socket nobody read from a peer
  // that sent nothing. Takes no lock of the stream's (callers hold their endpoint's).
  std::string ReceiveState();
  // Before Start: the receive path reads from `source` instead of the socket (tests, fuzzing);
  // the socket still carries what the stream sends.
  void ReadFrom(ByteSource* source) { source_ = source; }
  // Read Responses queued for the peer and not yet handed to TCP (at most the IRD). For tests.
  uint32_t ResponsesQueued() const { return responses_queued_.load(std::memory_order_acquire); }
  // IoHandler
  void OnIo(uint32_t events) override;
  // The engine reads until the socket is empty, but takes at most this many segments in one
  // turn of its loop and the rest in the next (Engine::CallAgain): a peer that keeps the
  // socket full (a stream of zero-length Writes costs it nothing) must not hold the loop, whose
  // other sockets, timers and held wake-ups of the application wait for it to return.
  static constexpr uint32_t kEngineSegments = 64;

 private:
  enum class RxPhase { Header, Payload, Trailer, Dead };
  struct ReadResponse {
    uint32_t sink_stag;
    uint64_t sink_to;
    uint32_t source_stag;  // checked when the request arrived, and again whenever bytes leave
    uint64_t source;       // local address
    uint32_t size;
    uint32_t sent;
  };
  // Local memory a batch reads for the peer (Read Responses).
  struct Source {
    uint32_t stag;
    uint64_t addr;
    uint32_t length;
  };
  // Posted(): requests of kCoalesceMin bytes or more wait to go out together, up to
  // kCoalesceBatch, while kCoalesceInFlight bytes are sent and unconfirmed ahead of them.
  static constexpr uint64_t kCoalesceMin = 16 << 10;
  static constexpr uint64_t kCoalesceInFlight = 1 << 20;
  static constexpr uint64_t kCoalesceBatch = 512 << 10;
  // One batch of FPDUs handed to sendmsg; kept until fully written.
  static constexpr int kBatchFpdus = 16;
  static constexpr size_t kSmallFpdu = 256;
  static constexpr int kBatchIov = 64;
  // What a batch of one small FPDU uses comes first, together: a connection that sends little
  // touches (and the kernel maps) one page of the batch, not three.
  struct TxBatch {
    int iov_count = 0, iov_done = 0;
    int fpdus = 0;
    int finished_count = 0;
    int source_count = 0;
    bool terminate = false;  // the batch is the Terminate, the stream's last FPDU
    uint64_t finished[kBatchFpdus];  // send queue positions whose last byte is in this batch
    Source sources[kBatchFpdus];
    iovec iov[kBatchIov];
    // Each FPDU's length field and headers; a small FPDU is built here whole (one iovec).
    uint8_t headers[kBatchFpdus][kSmallFpdu];
    uint8_t trailers[kBatchFpdus][8];
    uint8_t gathered[512];  // a few small pieces copied together, to leave in one send()
    bool empty() const { return iov_done == iov_count; }
    void Clear() {
      iov_count = iov_done = fpdus = finished_count = source_count = 0;
      terminate = false;
    }
  };

  void ProcessTx() NDWV_REQUIRES(tx_mutex_);
  bool FlushBatch() NDWV_REQUIRES(tx_mutex_);  // false if the socket is full (or broken)
  bool SourcesGranted() const NDWV_REQUIRES(tx_mutex_)
      NDWV_REQUIRES_SHARED(qp_->pd().placement_lock());
  bool FillBatch() NDWV_REQUIRES(tx_mutex_);  // false if there is nothing to send
  bool AddFpdu(const wire::DdpHeader& hdr, const wire::ReadRequest* read,
               const uint8_t* inline_data, const Sge* sge, uint32_t num_sge,
               uint64_t offset, uint32_t length) NDWV_REQUIRES(tx_mutex_);
  // From the receive path; takes tx_mutex_ (the order: rx_mutex_, then tx_mutex_).
  void QueueTerminate(wire::TermCode code) NDWV_REQUIRES(rx_mutex_) NDWV_EXCLUDES(tx_mutex_);
  // Its transmit part: the Terminate becomes the stream's last FPDU (if it is the first).
  void SendTerminate(wire::TermCode code, std::span<const uint8_t> offending) NDWV_EXCLUDES(tx_mutex_);
  // After a Terminate the socket stays open (nothing read, nothing sent but what is queued) until
  // the peer's TCP has acknowledged the Terminate, or NDWV_DISCONNECT_TIMEOUT_MS: a peer that
  // reads nothing leaves the socket full, and closing it then (with its unread bytes) would
  // reset the Terminate away.
  void CloseSocket();
  void ReleasePort();  // ReleaseTcpPort, once: before the FIN (CloseSend) or the close
  void Linger() NDWV_EXCLUDES(tx_mutex_);
  static void OnLingerTimer(Timer* timer);

  // What a receive reads ahead into: headers, small payloads and the checked tails of segments
  // (the rest of a long payload goes straight from the socket to its target).
  struct RxStaging {
    uint8_t bytes[4096];
  };
  // The staging a receive step (ProcessRx) uses: the stream's own if it has one, else the
  // thread's; on leaving, bytes not yet taken move to the stream's own.
  class StagingInUse {
   public:
    explicit StagingInUse(Stream& stream) NDWV_REQUIRES(stream.rx_mutex_);
    ~StagingInUse();
    StagingInUse(const StagingInUse&) = delete;
    StagingInUse& operator=(const StagingInUse&) = delete;

   private:
    Stream& stream_;
  };

  void DriveReceive(bool poller = false) NDWV_EXCLUDES(rx_mutex_);
  ssize_t Receive(void* buffer, size_t length) NDWV_REQUIRES(rx_mutex_);  // the socket or the ByteSource
  void ProcessRx() NDWV_REQUIRES(rx_mutex_);
  // PollerHandoff's calls: the socket's epoll interest, and the engine's return.
  friend class PollerHandoff<Stream>;
  // Under handoff_.mutex(), asserted (at the hand-off's call the analysis cannot tell that its
  // lock is this handoff_'s).
  void ApplyWatchLocked();
  uint32_t WatchedEvents() const;  // while the engine reads the socket
  void WatchWritable();  // a transmit found it full (takes handoff_.mutex(): after tx_mutex_)
  void EngineReturned(bool by_timer) NDWV_EXCLUDES(rx_mutex_);
  // The receive path ended a message the peer started.
  void PlacedPeerMessage() NDWV_REQUIRES(rx_mutex_);
  // Whether requests left queued or a Read Response owed wait for a kick (the flag is taken).
  bool TakeWaitingTransmit();
  // staging holds `need` unread bytes; false on EAGAIN (or dead)
  bool Fill(size_t need) NDWV_REQUIRES(rx_mutex_);
  bool StartSegment() NDWV_REQUIRES(rx_mutex_);
  bool PlacePayload() NDWV_REQUIRES(rx_mutex_);
  std::pair<uint8_t*, uint64_t> Target(uint32_t offset) NDWV_REQUIRES(rx_mutex_);
  bool LockTarget(std::shared_lock<base::SharedMutex>& placement) NDWV_REQUIRES(rx_mutex_);
  bool SgesGranted(const Sge* sge, uint32_t num_sge) const
      NDWV_REQUIRES_SHARED(qp_->pd().placement_lock());
  bool FinishSegment() NDWV_REQUIRES(rx_mutex_);
  // What StartSegment, Target, LockTarget and FinishSegment do that depends on the opcode: one
  // row per RDMAP opcode (kRxHandlers, stream_rx.cpp), one handler per opcode class and step.
  struct RxHandlers {
    bool (Stream::*start)();  // the opcode's checks; false: failed (or wait)
    std::pair<uint8_t*, uint64_t> (Stream::*target)(uint32_t offset);  // where payload goes
    bool (Stream::*lock_target)(std::shared_lock<base::SharedMutex>& placement);
    bool (Stream::*finish)();  // the segment is placed: what it completes
  };
  static const RxHandlers kRxHandlers[];
  const RxHandlers& RxHandlersFor() const NDWV_REQUIRES(rx_mutex_);  // rx_.hdr's row
  bool StartWrite() NDWV_REQUIRES(rx_mutex_);
  bool StartReadRequest() NDWV_REQUIRES(rx_mutex_);
  bool StartReadResponse() NDWV_REQUIRES(rx_mutex_);
  bool StartSend() NDWV_REQUIRES(rx_mutex_);
  bool StartTerminate() NDWV_REQUIRES(rx_mutex_);
  std::pair<uint8_t*, uint64_t> WriteTarget(uint32_t offset) NDWV_REQUIRES(rx_mutex_);
  std::pair<uint8_t*, uint64_t> ReadResponseTarget(uint32_t offset) NDWV_REQUIRES(rx_mutex_);
  std::pair<uint8_t*, uint64_t> SendTarget(uint32_t offset) NDWV_REQUIRES(rx_mutex_);
  std::pair<uint8_t*, uint64_t> TerminateTarget(uint32_t offset) NDWV_REQUIRES(rx_mutex_);
  bool LockWriteTarget(std::shared_lock<base::SharedMutex>& placement) NDWV_REQUIRES(rx_mutex_);
  bool LockReadResponseTarget(std::shared_lock<base::SharedMutex>& placement) NDWV_REQUIRES(rx_mutex_);
  bool LockSendTarget(std::shared_lock<base::SharedMutex>& placement) NDWV_REQUIRES(rx_mutex_);
  bool LockTerminateTarget(std::shared_lock<base::SharedMutex>& placement) NDWV_REQUIRES(rx_mutex_);
  bool FinishWrite() NDWV_REQUIRES(rx_mutex_);
  bool FinishReadRequest() NDWV_REQUIRES(rx_mutex_);
  bool FinishReadResponse() NDWV_REQUIRES(rx_mutex_);
  bool FinishSend() NDWV_REQUIRES(rx_mutex_);
  bool FinishTerminate() NDWV_REQUIRES(rx_mutex_);
  // A Terminate whose headers are wrong (`what`): counted, the stream ends unanswered.
  void DropBadTerminate(const char* what) NDWV_REQUIRES(rx_mutex_);
  void Fail(wire::TermCode code, WcStatus local_status) NDWV_REQUIRES(rx_mutex_);
  void Broken() NDWV_REQUIRES(rx_mutex_);  // the socket is gone: stop and let the CM know
  void NotifyObserver(void (StreamObserver::*event)());

  const int fd_;
  ByteSource* source_ = nullptr;  // null: the socket
  // Every byte sent and received, when capturing (else null: one branch per system call).
  const std::unique_ptr<base::TcpCapture> capture_;
  std::shared_ptr<QueuePair> qp_;  // held while attached; dropped by Shutdown
  StreamParams params_;  // ird and ord at least 1: an ndwv peer's probes are zero-length Reads
  // The application granted the peer Reads (its inbound read limit was not 0): without, a Read
  // Request for data is a protocol error (a probe still takes the one slot).
  const bool reads_granted_;
  std::weak_ptr<StreamObserver> observer_;
  uint32_t qpn_;

  // ---- transmit (tx_mutex_) ----
  base::Mutex tx_mutex_{"iwarp::Stream::tx_mutex_"};
  base::KickedRunner tx_runner_;  // Kick: one sender at a time
  // Reads awaiting their response, in order: a request's send queue position, or for a probe
  // (the zero-length Read that confirms Sends and Writes) the position up to which it confirms.
  struct OutstandingRead {
    uint64_t position;
    bool probe;
    uint32_t sink_stag;  // what its response must name: this Read's own, no earlier one's
  };
  struct TxState {
    TxBatch* batch = nullptr;  // inside a BatchInUse: the one being built and flushed
    // The stream's own, from its socket's first refusal on (the pool's; kept for good: a stream
    // that filled its socket once streams, and would need one again).
    base::PoolPtr<TxBatch> own_batch;
    uint64_t next = 0;  // next send queue position to start
    uint32_t send_msn = 1;
    uint32_t read_msn = 1;
    bool probe_due = false;
    uint32_t probe_seq = 0;  // probes sent (transmit path)
    uint8_t terminate[wire::kTerminateMaxLen];
    // A Terminate waits to be sent; it is the stream's last FPDU.
    size_t terminate_len = 0;
    // A Terminate was queued: nothing else is sent.
    bool terminated = false;
    bool terminate_written = false;  // ... and handed to TCP whole
    bool rtr_pending = false;
    bool close_send = false;
    bool send_closed = false;
    // Lingering after a Terminate (CloseSocket).
    bool lingering = false;
    Clock::time_point linger_until = {};
    std::shared_ptr<Stream> linger_self;  // alive while lingering
  };
  TxState tx_ NDWV_GUARDED_BY(tx_mutex_);
  // The batch a transmit step (ProcessTx, Linger) builds and flushes: the stream's own if it has
  // one, else the thread's. On leaving, what the socket did not take moves to the stream's own.
  // So a connection holds a batch only once its socket has filled: an idle or lightly used one
  // costs 6 KiB less (10,000 connections: 60 MiB a process).
  class BatchInUse {
   public:
    explicit BatchInUse(Stream& stream) NDWV_REQUIRES(stream.tx_mutex_);
    ~BatchInUse();
    BatchInUse(const BatchInUse&) = delete;
    BatchInUse& operator=(const BatchInUse&) = delete;

   private:
    Stream& stream_;
  };
  base::LazyDeque<OutstandingRead> reads_outstanding_ NDWV_GUARDED_BY(reads_mutex_);
  struct Unconfirmed {
    uint64_t position;
    uint32_t msn;  // Sends: the message's MSN
  };
  // Sends and Writes sent, not yet confirmed.
  base::LazyDeque<Unconfirmed> unconfirmed_ NDWV_GUARDED_BY(reads_mutex_);
  std::atomic<uint32_t> probes_answered_{0};  // their Read Responses received (receive path)
  bool AddProbe(size_t reads) NDWV_REQUIRES(tx_mutex_);
  size_t ReadsOutstanding();
  void ConfirmPlaced(uint64_t below) NDWV_EXCLUDES(reads_mutex_);
  void FailUnconfirmed(const wire::TerminateMsg& term, WcStatus status) NDWV_EXCLUDES(reads_mutex_);
  // Receive path adds, transmit path takes.
  base::Mutex responses_mutex_{"iwarp::Stream::responses_mutex_"};
  base::LazyDeque<ReadResponse> responses_ NDWV_GUARDED_BY(responses_mutex_);
  // The sizes of responses_ and reads_outstanding_, readable without their locks: the transmit
  // path looks at both for every message, and they are nearly always empty.
  std::atomic<uint32_t> responses_queued_{0}, reads_queued_{0};
  std::atomic<bool> shut_{false};   // Shutdown ran (set with both locks held)
  std::atomic<bool> error_reported_{false};
  // reads_outstanding_ and unconfirmed_: transmit adds, receive retires.
  base::Mutex reads_mutex_{"iwarp::Stream::reads_mutex_"};
  std::atomic<bool> broken_{false};
  std::atomic<bool> port_released_;
  std::atomic<bool> timed_out_{false};   // the socket ended with ETIMEDOUT (NDWV_IWARP_TIMEOUT_MS)
  std::atomic<bool> tx_stalled_{false};  // the last sendmsg found the socket full
  // Room in the socket is watched for (EPOLLOUT) from its first stall on, not before: a socket
  // added to epoll with EPOLLOUT is ready at once, which woke the engine for nothing at every
  // connection's start. Set under handoff_.mutex(), like the interest it changes.
  std::atomic<bool> writable_watched_{false};
  std::atomic<bool> response_owed_{false};  // a Read Response waits for the poller's next kick
  // The bytes of the requests Posted() left queued (nonzero: some wait); the next kick sends them.
  std::atomic<uint64_t> deferred_bytes_{0};
  std::atomic<uint64_t> unconfirmed_bytes_{0};  // the length of the requests in unconfirmed_

  // ---- receive (rx_mutex_) ----
  base::Mutex rx_mutex_{"iwarp::Stream::rx_mutex_"};
  base::KickedRunner rx_runner_;  // DriveReceive: one receiver at a time
  // A read shorter than asked has emptied the socket, and bytes arriving later raise a new edge:
  // the read after it, which would find nothing (a system call per message received), is skipped
  // unless DriveReceive was called since. Every call sets rx_called_ (an edge, a poll, the
  // engine's return, CloseSend's look at what is left), each read clears it before it begins.
  // Not once the peer's FIN or an error is signalled (rx_to_end_): that shows only as a read of
  // its own, and its edge may have come with the data's.
  std::atomic<bool> rx_called_{true};
  std::atomic<bool> rx_to_end_{false};
  struct RxState {
    // The receive path runs on a poller.
    bool by_poller = false;
    uint32_t turn_left = 0;  // segments this call may still take (kEngineSegments)
    RxPhase phase = RxPhase::Header;
    // Bytes read and not yet taken: [staging_begin, staging_end) of the staging a receive step
    // uses (StagingInUse). Between steps only the stream's own holds any: from the first step
    // that left some (a segment read in part) on, kept for good like the transmit batch.
    RxStaging* staging = nullptr;
    base::PoolPtr<RxStaging> own_staging;
    size_t staging_begin = 0;
    size_t staging_end = 0;
    bool socket_emptied = false;  // by the last read (rx_called_)
    uint32_t ulpdu_len = 0;
    wire::DdpHeader hdr;
    wire::ReadRequest read_req;
    size_t hdr_len = 0;
    // This segment's length field and headers.
    uint8_t raw_hdr[2 + wire::kTerminateMaxLen];
    uint32_t payload_len = 0;
    uint32_t payload_done = 0;
    uint32_t tail_len = 0;
    // The segment's CRC is built as its bytes go by (else checked whole).
    bool crc_streaming = false;
    wire::FpduCrcBuilder crc;
    // The message being received.
    bool have_recv = false;
    RecvWqe recv;
    uint32_t recv_msn = 1;
    uint32_t read_req_msn = 1;
    uint64_t recv_bytes = 0;
    wire::RdmapOpcode recv_opcode = wire::RdmapOpcode::Send;  // its first segment's: all must carry it
    uint32_t recv_inv_stag = 0;  // likewise, for a Send with Invalidate
    OutstandingRead read = {};  // the Read whose response is arriving
    uint64_t response_bytes = 0;  // of its response, placed so far (the next TO)
    bool peer_closed = false;
  };
  RxState rx_ NDWV_GUARDED_BY(rx_mutex_);

  // While a poller spins on an empty CQ it drives the socket itself (receive, and transmit when
  // the socket was full), and the engine stops watching it: a wake-up per message on a busy core
  // costs more than the message (PollerHandoff, dev/poller_handoff.h). engine_reads() is read on
  // every message: a stale answer costs at most one more read of the socket, or a Read Response
  // left for the poller's next poll.
  PollerHandoff<Stream> handoff_{this};
  // A poller's receive placed a message the peer started (written under rx_mutex_, taken by the
  // poller after the receive: PollerRule's evidence).
  std::atomic<bool> peer_message_by_poller_{false};

  // Lingering after a Terminate (CloseSocket): while armed or due it keeps the stream alive, so
  // that a firing never finds it gone, whichever thread ended the lingering meanwhile.
  OwnedTimer<Stream> linger_timer_ NDWV_GUARDED_BY(tx_mutex_){&Stream::OnLingerTimer, this};
};

}  // namespace ndwv::dev::iwarp
