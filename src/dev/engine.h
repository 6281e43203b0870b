// The progress engine and the work pool: the only threads the device owns, one set per process.
//
// The engine is one thread running an epoll loop over every socket of every adapter, connection
// and listener, plus the device's timers. Handlers run on it and must never block; anything that
// changes a QP's state is deferred as a pre-allocated WorkItem, which runs where no lock is held:
// on the engine once its turn's handlers are done, or, deferred by another thread, on the pool.
#pragma once
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/mutex.h"
#include "dev/async.h"

struct epoll_event;

namespace ndwv::dev {

// Receives readiness events for one file descriptor, on the engine thread.
struct IoHandler {
  virtual void OnIo(uint32_t epoll_events) = 0;
 protected:
  ~IoHandler() = default;
};

using Clock = std::chrono::steady_clock;

// A one-shot timer owned by its user (no allocation when armed). fire runs on the engine thread,
// outside every engine lock; it may still run once after a Disarm that returned false (the timer
// was already due), so an owner keeps itself alive while its timer is armed or firing. It may
// also run after its owner armed the timer again (between falling due and fire taking the lock
// the owner arms under): fire then finds IsArmed true and leaves it to that later firing, which
// the new arming's keep-alive covers.
struct Timer {
  void (*fire)(Timer*) = nullptr;
  void* owner = nullptr;  // for fire to find its object
  Clock::time_point deadline{};
  bool armed = false;  // guarded by the engine
  size_t slot = 0;     // its place in the engine's heap while armed (guarded by the engine)
};

class Engine {
 public:
  static Engine& Get();

  // Watches fd for `events` (EPOLLIN/EPOLLOUT/EPOLLET...). The engine holds the handler only
  // weakly and pins it while it runs, so Unwatch never waits and a handler may be released on
  // any thread; a handler may still see one event after Unwatch and must tolerate it.
  // Watching a descriptor that has a watch hands it to the new handler (one EPOLL_CTL_MOD, not a
  // DEL and an ADD): from then on only the new handler sees its events, and epoll reports again
  // what is pending for `events`.
  void Watch(int fd, uint32_t events, std::weak_ptr<IoHandler> handler);
  // The interest of a watched descriptor; 0: out of the epoll set until events are given again.
  // A descriptor not watched is left alone (its next Watch gives the interest).
  void Modify(int fd, uint32_t events);
  void Unwatch(int fd);
  // Closes a watched descriptor (base::CloseDescriptor): its handler is forgotten and the close
  // takes the epoll registration with it, as the kernel drops a closed file's. One system call
  // where Unwatch and a close were two, on every connection's teardown. A file still open
  // elsewhere for a moment (a poller inside recv(), a fork's child before its handler closes its
  // copies) may have events reported until it goes: under the old watch's tag, so dropped.
  void CloseWatched(int fd);
  // Whether a descriptor has a watch, and whether it is in the epoll set (Modify 0 takes it out):
  // for the diagnosis of a connection that heard nothing (iwarp::Stream::ReceiveState).
  struct WatchState {
    bool watched = false;
    bool in_set = false;
  };
  WatchState StateOf(int fd);
  // From a handler, on the engine thread, that ended its turn with work left (a socket it did not
  // read to its end, bytes it read ahead): its OnIo(events) runs again in the next turn of the
  // loop, after the timers due, beside the sockets ready by then, without waiting for epoll
  // (which would not report an edge-triggered socket again, nor bytes already read).
  void CallAgain(std::weak_ptr<IoHandler> handler, uint32_t events);

  void Arm(Timer* timer, std::chrono::milliseconds delay);
  // True if the timer was armed and will not fire.
  bool Disarm(Timer* timer);
  // Whether the timer is armed (will fire): false in its own fire unless armed again since.
  bool IsArmed(const Timer* timer);

  // Runs item on the work pool; asked on the engine thread (a handler or a timer), on the engine
  // itself once its turn's handlers and timers are done (RunEngineWork).
  void Defer(WorkItem* item);

  bool OnEngineThread() const { return std::this_thread::get_id() == engine_thread_id_; }
  // Socket events handled so far: a watch left ready (level-triggered, with nobody reading)
  // makes this climb while nothing happens. For tests.
  uint64_t EventsHandled() const { return events_handled_.load(std::memory_order_relaxed); }

  // The CPUs the engine thread may run on: where the device completes requests and notifies.
  bool EngineAffinity(cpu_set_t* cpus) const;

 private:
  Engine();
  ~Engine();
  void Loop();
  void Dispatch(const epoll_event& event);  // one ready descriptor to its handler
  // Adds fd to the epoll set or changes its entry to `ev`, trying MOD first if `likely_in_set`.
  void PutInSetLocked(int fd, epoll_event ev, bool likely_in_set) NDWV_REQUIRES(handlers_mutex_);
  void WorkerLoop();
  int NextTimeoutMs();
  void FireDueTimers();
  void RunEngineWork();
  // The armed timers are a binary heap ordered by deadline, each timer knowing its slot: arming,
  // re-arming and disarming cost O(log n) and the next deadline O(1), whatever the number of
  // connections (each has a few timers, and transports re-arm theirs per message).
  void HeapPlace(Timer* timer, size_t slot) NDWV_REQUIRES(timer_mutex_);
  void HeapUp(size_t slot) NDWV_REQUIRES(timer_mutex_);
  void HeapDown(size_t slot) NDWV_REQUIRES(timer_mutex_);
  void HeapRemove(Timer* timer) NDWV_REQUIRES(timer_mutex_);

  int epoll_fd_ = -1;
  int alarm_fd_ = -1;  // a timerfd: deadlines armed off the engine thread while it sleeps
  std::thread engine_thread_;
  std::thread::id engine_thread_id_;
  pthread_t engine_thread_handle_{};  // kept: a detached std::thread no longer has it
  // Leaves of the lock order: nothing is called while one is held (but epoll_ctl under
  // handlers_mutex_: a watch's tag and its epoll entry change together). Timers' own fields
  // (armed, deadline, slot) are under timer_mutex_ too.
  base::Mutex handlers_mutex_{"Engine::handlers_mutex_"};
  // A watch's tag rides in its events, beside the descriptor (EventOf): an event reported for a
  // socket that was closed meanwhile, and whose number a new socket took before the loop got to
  // the event, carries the old watch's tag and is dropped, not handed to the new socket's handler.
  struct Watched {
    uint32_t tag = 0;
    // In the epoll set (Modify 0 takes it out): a hand-back puts it in with one system call,
    // not a MOD that fails and an ADD. Beside the tag, in its padding: 24 bytes a watch.
    bool in_set = false;
    std::weak_ptr<IoHandler> handler;
  };
  std::unordered_map<int, Watched> handlers_ NDWV_GUARDED_BY(handlers_mutex_);
  uint32_t last_tag_ NDWV_GUARDED_BY(handlers_mutex_) = 0;  // one per Watch; 0 is no watch's

  base::Mutex timer_mutex_{"Engine::timer_mutex_"};
  // Armed timers, a heap: the earliest deadline first.
  std::vector<Timer*> timers_ NDWV_GUARDED_BY(timer_mutex_);
  // The loop's wake-up, at the latest; min() while it runs, for it looks at the timers again
  // before it sleeps (written under timer_mutex_, but for that min()).
  std::atomic<Clock::time_point> sleeps_until_{Clock::time_point::max()};
  std::atomic<uint64_t> events_handled_{0};  // written by the engine thread only
  // CallAgain's handlers for the next turn; the engine thread's only.
  std::vector<std::pair<std::weak_ptr<IoHandler>, uint32_t>> again_;

  base::Mutex work_mutex_{"Engine::work_mutex_"};
  // Items in the order they were deferred, linked through WorkItem::next: queuing one never
  // allocates (a handler must not fail for lack of memory).
  struct WorkList {
    WorkItem* head = nullptr;
    WorkItem* tail = nullptr;
    void Push(WorkItem* item);
    WorkItem* Pop();  // null when empty
  };
  WorkList pool_work_ NDWV_GUARDED_BY(work_mutex_);  // for the pool's workers
  // Deferred by the engine's own handlers and timers, for the engine once they are done. An item
  // run there holds no lock, as on a worker; it saves the worker's wake-up, a thread hand-off
  // that a one-at-a-time teardown paid on both sides of every connection.
  WorkList engine_work_ NDWV_GUARDED_BY(work_mutex_);
  bool engine_work_deferred_ = false;  // the engine thread's own: engine_work_ may hold items
  std::vector<std::thread> workers_;
  // An idle worker sleeps on work_wakes_ (a futex word), which Defer bumps to wake one. Defer
  // wakes one only if no wake is on its way, so a burst of items wakes one sleeper (it takes
  // every item queued by then; an item queued once it is busy wakes the next), and the woken worker
  // never finds its waker holding a lock (a std::condition_variable_any's internal mutex was:
  // the futex calls of its lock and unlock showed up per item in the profile of a connection
  // setup).
  std::atomic<uint32_t> work_wakes_{0};
  std::atomic<uint32_t> workers_in_futex_{0};  // of those asleep, the ones Defer must wake by system call
  static constexpr int kLooksBeforeSleep = 4;
  unsigned workers_asleep_ NDWV_GUARDED_BY(work_mutex_) = 0;
  unsigned wakes_on_the_way_ NDWV_GUARDED_BY(work_mutex_) = 0;
};

// A Timer that keeps its owner alive while it is armed or firing: the keep-alive protocol,
// written once. Every call is made under the lock the owner's fire function takes first; that
// lock is what orders an arming against a firing. The fire function, holding it, calls
// TakeFiring: a timer armed again since it fell due yields nothing (its later firing runs, and the
// new arming's keep-alive covers it); otherwise the fire function gets the keep-alive, and drops
// it last, after the lock.
template <class Owner>
class OwnedTimer {
 public:
  OwnedTimer(void (*fire)(Timer*), Owner* owner) {
    timer_.fire = fire;
    timer_.owner = owner;
  }
  OwnedTimer(const OwnedTimer&) = delete;
  OwnedTimer& operator=(const OwnedTimer&) = delete;

  static Owner* OwnerOf(Timer* timer) { return static_cast<Owner*>(timer->owner); }

  // Arms, or re-arms, the timer; `self` (the owner) stays alive until a firing takes it or a
  // Disarm drops it.
  void Arm(std::shared_ptr<Owner> self, std::chrono::milliseconds delay) {
    self_ = std::move(self);
    Engine::Get().Arm(&timer_, delay);
  }
  // Stops the timer. One already due still fires: it gets the keep-alive from TakeFiring and
  // must find for itself that there is nothing left to do.
  void Disarm() {
    if (Engine::Get().Disarm(&timer_)) self_.reset();
  }
  // Armed, or due and not yet taken by its firing.
  bool pending() const { return self_ != nullptr; }

  // In the fire function: the owner, kept alive for this firing, or null when the firing is stale.
  std::shared_ptr<Owner> TakeFiring() {
    if (Engine::Get().IsArmed(&timer_)) return nullptr;
    return std::move(self_);
  }

 private:
  Timer timer_;
  std::shared_ptr<Owner> self_;
};

}  // namespace ndwv::dev
