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
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "base/capture.h"
#include "base/mutex.h"
#include "dev/cq.h"
#include "dev/engine.h"
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
  // Before Start: the receive path reads from `source` instead of the socket (tests, fuzzing);
  // the socket still carries what the stream sends.
  void ReadFrom(ByteSource* source) { source_ = source; }
  // Read Responses queued for the peer and not yet handed to TCP (at most the IRD). For tests.
  uint32_t ResponsesQueued() const { return responses_queued_.load(std::memory_order_acquire); }
  // IoHandler
  void OnIo(uint32_t events) override;

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
  };

  void ProcessTx();
  bool FlushBatch();  // false if the socket is full (or broken)
  bool SourcesGranted() const;  // under the PD's placement lock
  bool FillBatch();   // false if there is nothing to send
  bool AddFpdu(const wire::DdpHeader& hdr, const wire::ReadRequest* read,
               const uint8_t* inline_data, const Sge* sge, uint32_t num_sge,
               uint64_t offset, uint32_t length);
  void QueueTerminate(wire::TermCode code);
  // After a Terminate the socket stays open (nothing read, nothing sent but what is queued) until
  // the peer's TCP has acknowledged the Terminate, or NDWV_DISCONNECT_TIMEOUT_MS: a peer that
  // reads nothing leaves the socket full, and closing it then (with its unread bytes) would
  // reset the Terminate away.
  void CloseSocket();
  void Linger();
  static void OnLingerTimer(Timer* timer);

  void DriveReceive(bool poller = false);
  ssize_t Receive(void* buffer, size_t length);  // from the socket or the ByteSource
  // A hint read on every message (written under watch_mutex_): a stale answer costs at most
  // one more read of the socket, or a Read Response left for the poller's next poll.
  bool rx_watched_relaxed() const { return rx_watched_.load(std::memory_order_relaxed); }
  void ProcessRx();
  void WatchReceive(bool on, bool by_timer = false);
  void PlacedPeerMessage();  // the receive path ended a message the peer started (rx_mutex_)
  // Whether requests left queued or a Read Response owed wait for a kick (the flag is taken).
  bool TakeWaitingTransmit();
  static void OnWatchTimer(Timer* timer);
  bool Fill(size_t need);  // staging holds `need` unread bytes; false on EAGAIN (or dead)
  bool StartSegment();
  bool PlacePayload();
  std::pair<uint8_t*, uint64_t> Target(uint32_t offset);
  bool LockTarget(std::shared_lock<base::SharedMutex>& placement);
  bool SgesGranted(const Sge* sge, uint32_t num_sge) const;  // under the PD's placement lock
  bool FinishSegment();
  void Fail(wire::TermCode code, WcStatus local_status);
  void Broken();  // the socket is gone: stop and let the CM know
  void NotifyObserver(void (StreamObserver::*event)());

  const int fd_;
  ByteSource* source_ = nullptr;  // null: the socket
  // Every byte sent and received, when capturing (else null: one branch per system call).
  const std::unique_ptr<base::TcpCapture> capture_;
  std::shared_ptr<QueuePair> qp_;  // held while attached; dropped by Shutdown
  StreamParams params_;
  std::weak_ptr<StreamObserver> observer_;
  uint32_t qpn_;

  // ---- transmit (tx_mutex_) ----
  base::Mutex tx_mutex_;
  std::atomic<uint64_t> tx_kicks_{0};
  TxBatch batch_;
  uint64_t next_tx_ = 0;            // next send queue position to start
  uint32_t send_msn_ = 1, read_msn_ = 1;
  // Reads awaiting their response, in order: a request's send queue position, or for a probe
  // (the zero-length Read that confirms Sends and Writes) the position up to which it confirms.
  struct OutstandingRead {
    uint64_t position;
    bool probe;
  };
  std::deque<OutstandingRead> reads_outstanding_;
  struct Unconfirmed {
    uint64_t position;
    uint32_t msn;  // Sends: the message's MSN
  };
  std::deque<Unconfirmed> unconfirmed_;  // Sends and Writes sent, not yet confirmed
  bool probe_due_ = false;
  uint32_t probe_seq_ = 0;                   // probes sent (transmit path)
  std::atomic<uint32_t> probes_answered_{0};  // their Read Responses received (receive path)
  bool AddProbe(size_t reads);
  size_t ReadsOutstanding();
  void ConfirmPlaced(uint64_t below);
  void FailUnconfirmed(const wire::TerminateMsg& term, WcStatus status);
  base::Mutex responses_mutex_;              // receive path adds, transmit path takes
  std::deque<ReadResponse> responses_;
  // The sizes of responses_ and reads_outstanding_, readable without their locks: the transmit
  // path looks at both for every message, and they are nearly always empty.
  std::atomic<uint32_t> responses_queued_{0}, reads_queued_{0};
  uint8_t terminate_[wire::kTerminateMaxLen];
  size_t terminate_len_ = 0;        // a Terminate waits to be sent; it is the stream's last FPDU
  bool terminated_ = false;         // a Terminate was queued: nothing else is sent
  bool terminate_written_ = false;  // ... and handed to TCP whole
  bool rtr_pending_ = false;
  std::atomic<bool> shut_{false};   // Shutdown ran (set with both locks held)
  std::atomic<bool> error_reported_{false};
  base::Mutex reads_mutex_;  // reads_outstanding_ and unconfirmed_: transmit adds, receive retires
  bool close_send_ = false, send_closed_ = false;
  std::atomic<bool> broken_{false};
  std::atomic<bool> timed_out_{false};   // the socket ended with ETIMEDOUT (NDWV_IWARP_TIMEOUT_MS)
  std::atomic<bool> tx_stalled_{false};  // the last sendmsg found the socket full
  std::atomic<bool> response_owed_{false};  // a Read Response waits for the poller's next kick
  // The bytes of the requests Posted() left queued (nonzero: some wait); the next kick sends them.
  std::atomic<uint64_t> deferred_bytes_{0};
  std::atomic<uint64_t> unconfirmed_bytes_{0};  // the length of the requests in unconfirmed_
  bool rx_by_poller_ = false;             // rx_mutex_: the receive path runs on a poller

  // ---- receive (rx_mutex_) ----
  base::Mutex rx_mutex_;
  std::atomic<uint64_t> rx_kicks_{0};
  RxPhase phase_ = RxPhase::Header;
  uint8_t staging_[4096];
  size_t staging_begin_ = 0, staging_end_ = 0;
  uint32_t ulpdu_len_ = 0;
  wire::DdpHeader hdr_;
  wire::ReadRequest read_req_;
  size_t hdr_len_ = 0;
  uint8_t raw_hdr_[2 + wire::kTerminateMaxLen];  // this segment's length field and headers
  uint32_t payload_len_ = 0, payload_done_ = 0, tail_len_ = 0;
  bool crc_streaming_ = false;  // the segment's CRC is built as its bytes go by (else checked whole)
  wire::FpduCrcBuilder crc_;
  // The message being received.
  bool have_recv_ = false;
  RecvWqe recv_;
  uint32_t recv_msn_ = 1, read_req_msn_ = 1;
  uint64_t recv_bytes_ = 0;
  OutstandingRead rx_read_{};  // the Read whose response is arriving
  bool peer_closed_ = false;

  // While a poller spins on an empty CQ it drives the socket itself (receive, and transmit when
  // the socket was full), and the engine stops watching it: a wake-up per message on a busy core
  // costs more than the message. A timer gives the socket back to the engine when the polling
  // stops, and so does a Notify.
  base::Mutex watch_mutex_;
  std::atomic<bool> rx_watched_{true};
  PollerRule poller_rule_;
  // A poller's receive placed a message the peer started (written under rx_mutex_, taken by the
  // poller after the receive: PollerRule's evidence).
  std::atomic<bool> peer_message_by_poller_{false};
  Timer watch_timer_;
  std::shared_ptr<Stream> watch_self_;  // alive while the timer is armed

  // Lingering after a Terminate (CloseSocket); under tx_mutex_.
  bool lingering_ = false;
  Clock::time_point linger_until_{};
  Timer linger_timer_;
  std::shared_ptr<Stream> linger_self_;  // alive while lingering
};

}  // namespace ndwv::dev::iwarp
