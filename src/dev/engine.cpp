#include "dev/engine.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "base/checked.h"
#include "base/fork.h"
#include "base/futex.h"
#include "base/overlapped.h"
#include "base/settings.h"

namespace ndwv::dev {

Engine& Engine::Get() {
  // Never destroyed: sockets and timers of objects released during exit stay valid to the end.
  static Engine* engine = new Engine();
  return *engine;
}

namespace {

// The descriptor in the low half (where epoll_data's fd is), the watch's tag in the high half.
epoll_event EventOf(int fd, uint32_t tag, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = uint64_t(tag) << 32 | uint32_t(fd);
  return ev;
}

}  // namespace

Engine::Engine() {
  epoll_fd_ = base::OpenDescriptor([] { return epoll_create1(EPOLL_CLOEXEC); });
  // steady_clock is CLOCK_MONOTONIC: a Timer's deadline is the timerfd's absolute time.
  alarm_fd_ = base::OpenDescriptor([] { return timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC); });
  if (epoll_fd_ < 0 || alarm_fd_ < 0) {
    perror("ndwv: engine");
    abort();
  }
  epoll_event ev = EventOf(alarm_fd_, 0, EPOLLIN);
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, alarm_fd_, &ev);
  // Named so that top -H, gdb and perf tell ndwv's threads from the application's.
  engine_thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "ndwv-engine");
    Loop();
  });
  engine_thread_id_ = engine_thread_.get_id();
  engine_thread_handle_ = engine_thread_.native_handle();
  const base::Settings* settings = base::LoadSettings();
  unsigned n = settings ? settings->work_threads : 2;
  for (unsigned i = 0; i < n; ++i) {
    workers_.emplace_back([this] {
      pthread_setname_np(pthread_self(), "ndwv-work");
      WorkerLoop();
    });
  }
  engine_thread_.detach();
  for (auto& w : workers_) w.detach();
}

Engine::~Engine() = default;

bool Engine::EngineAffinity(cpu_set_t* cpus) const {
  return pthread_getaffinity_np(engine_thread_handle_, sizeof(cpu_set_t), cpus) == 0;
}

// Watch and Modify read a watch's tag and give it to epoll under handlers_mutex_, in one step:
// a Modify that read the CM's tag and set it after the stream's Watch (a poller hands the socket
// over while the stream starts) would leave events that Dispatch drops, for good.
void Engine::Watch(int fd, uint32_t events, std::weak_ptr<IoHandler> handler) {
  base::MutexLock lock(handlers_mutex_);
  if (++last_tag_ == 0) ++last_tag_;
  auto [it, added] = handlers_.try_emplace(fd);
  // A hand-over finds the descriptor in the set, unless its watch was taken out (Modify 0).
  const bool in_set = !added && it->second.in_set;
  it->second = Watched{last_tag_, true, std::move(handler)};
  PutInSetLocked(fd, EventOf(fd, last_tag_, events), in_set);
}

void Engine::Modify(int fd, uint32_t events) {
  base::MutexLock lock(handlers_mutex_);
  auto it = handlers_.find(fd);
  // Not watched (yet, or any more): the next Watch sets the interest. An entry made here would
  // carry no watch's tag, its events would reach nobody, and that Watch's ADD would fail.
  if (it == handlers_.end()) return;
  Watched& watched = it->second;
  if (events == 0) {
    // Out of the epoll set entirely (the handler stays): a socket in it calls into epoll on
    // every packet, even with no event of interest, and a spinning poller pays for that.
    if (watched.in_set) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    watched.in_set = false;
    return;
  }
  PutInSetLocked(fd, EventOf(fd, watched.tag, events), watched.in_set);
  watched.in_set = true;
}

void Engine::PutInSetLocked(int fd, epoll_event ev, bool likely_in_set) {
  handlers_mutex_.AssertHeld();
  // Whichever it was, what the set holds for fd afterwards is `ev`, with its watch's tag (the
  // guess is wrong only for a descriptor closed and reopened under the same number unwatched).
  if (epoll_ctl(epoll_fd_, likely_in_set ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0)
    epoll_ctl(epoll_fd_, likely_in_set ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev);
}

void Engine::CallAgain(std::weak_ptr<IoHandler> handler, uint32_t events) {
  if constexpr (base::kCheckedBuild) {
    if (!OnEngineThread()) {  // again_ is the engine thread's own
      fprintf(stderr, "ndwv: Engine::CallAgain off the engine thread\n");
      abort();
    }
  }
  again_.emplace_back(std::move(handler), events);
}

void Engine::Unwatch(int fd) {
  base::MutexLock lock(handlers_mutex_);
  auto it = handlers_.find(fd);
  if (it == handlers_.end()) return;
  if (it->second.in_set) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  handlers_.erase(it);
}

Engine::WatchState Engine::StateOf(int fd) {
  base::MutexLock lock(handlers_mutex_);
  auto it = handlers_.find(fd);
  if (it == handlers_.end()) return {};
  return {true, it->second.in_set};
}

void Engine::CloseWatched(int fd) {
  {
    base::MutexLock lock(handlers_mutex_);
    handlers_.erase(fd);
  }
  base::CloseDescriptor(fd);
}

void Engine::Arm(Timer* timer, std::chrono::milliseconds delay) {
  base::MutexLock lock(timer_mutex_);
  Clock::time_point before = timer->deadline;
  timer->deadline = Clock::now() + delay;
  if (!timer->armed) {
    timer->armed = true;
    timers_.push_back(timer);
    HeapUp(timers_.size() - 1);
  } else if (timer->deadline < before) {
    HeapUp(timer->slot);
  } else {
    HeapDown(timer->slot);
  }
  // Only a deadline before the one the loop sleeps until concerns it: it finds later ones when it
  // wakes, and recomputes before it sleeps again anyway (timers armed from its own handlers).
  // For an earlier one the kernel's timer behind alarm_fd_ is moved, which wakes nobody now: a
  // connection's setup arms one from the application's thread, and waking the engine for it (an
  // eventfd before) cost a thread switch per connection on an idle engine.
  if (timer->deadline < sleeps_until_.load(std::memory_order_relaxed) && !OnEngineThread()) {
    sleeps_until_.store(timer->deadline, std::memory_order_relaxed);
    itimerspec at{};
    const auto since_boot = timer->deadline.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_boot);
    at.it_value.tv_sec = seconds.count();
    // A zero it_value would disarm: a deadline at the clock's origin is long past, 1 ns is too.
    at.it_value.tv_nsec = std::max<long>(1, std::chrono::duration_cast<std::chrono::nanoseconds>(since_boot - seconds).count());
    timerfd_settime(alarm_fd_, TFD_TIMER_ABSTIME, &at, nullptr);
  }
}

bool Engine::Disarm(Timer* timer) {
  base::MutexLock lock(timer_mutex_);
  if (!timer->armed) return false;
  HeapRemove(timer);
  return true;
}

void Engine::HeapPlace(Timer* timer, size_t slot) {
  timer_mutex_.AssertHeld();
  timers_[slot] = timer;
  timer->slot = slot;
}

void Engine::HeapUp(size_t slot) {
  Timer* timer = timers_[slot];
  while (slot > 0) {
    size_t parent = (slot - 1) / 2;
    if (!(timer->deadline < timers_[parent]->deadline)) break;
    HeapPlace(timers_[parent], slot);
    slot = parent;
  }
  HeapPlace(timer, slot);
}

void Engine::HeapDown(size_t slot) {
  Timer* timer = timers_[slot];
  size_t n = timers_.size();
  for (;;) {
    size_t child = 2 * slot + 1;
    if (child >= n) break;
    if (child + 1 < n && timers_[child + 1]->deadline < timers_[child]->deadline) ++child;
    if (!(timers_[child]->deadline < timer->deadline)) break;
    HeapPlace(timers_[child], slot);
    slot = child;
  }
  HeapPlace(timer, slot);
}

void Engine::HeapRemove(Timer* timer) {
  timer_mutex_.AssertHeld();
  size_t slot = timer->slot;
  timer->armed = false;
  Timer* last = timers_.back();
  timers_.pop_back();
  if (last == timer) return;
  HeapPlace(last, slot);
  HeapUp(slot);
  HeapDown(last->slot);
}

bool Engine::IsArmed(const Timer* timer) {
  base::MutexLock lock(timer_mutex_);
  return timer->armed;
}

void Engine::WorkList::Push(WorkItem* item) {
  item->next = nullptr;
  if (tail) tail->next = item; else head = item;
  tail = item;
}

WorkItem* Engine::WorkList::Pop() {
  WorkItem* item = head;
  if (!item) return nullptr;
  head = item->next;
  if (!head) tail = nullptr;
  item->queued = false;
  return item;
}

void Engine::Defer(WorkItem* item) {
  const bool on_engine = OnEngineThread();
  bool wake = false;
  {
    base::MutexLock lock(work_mutex_);
    if (item->queued) return;
    item->queued = true;
    if (on_engine) {
      engine_work_.Push(item);
      engine_work_deferred_ = true;
      return;
    }
    pool_work_.Push(item);
    if (workers_asleep_ > 0 && wakes_on_the_way_ == 0) {
      ++wakes_on_the_way_;
      wake = true;
    }
  }
  if (wake) {
    // seq_cst with the sleeper's count and its word check in the kernel: either it is counted
    // here or its wait sees the word moved.
    work_wakes_.fetch_add(1, std::memory_order_seq_cst);
    if (workers_in_futex_.load(std::memory_order_seq_cst) != 0) base::FutexWake(work_wakes_, 1);
  }
}

void Engine::WorkerLoop() {
  unsigned ran = 0;  // items run since this worker last slept
  for (;;) {
    WorkItem* item;
    {
      base::MutexLock lock(work_mutex_);
      while (!pool_work_.head) {
        // A Defer after this load changes the word, and the wait below does not sleep.
        const uint32_t seen = work_wakes_.load(std::memory_order_acquire);
        ++workers_asleep_;
        work_mutex_.unlock();
        // After a burst (many connections at once) the next item tends to follow within
        // microseconds: look a few times, yielding the core, before sleeping; Defer then makes
        // no system call. After a lone item, sleep at once: looking is only cost there.
        for (int look = 0; ran > 1 && look < kLooksBeforeSleep; ++look) {
          if (work_wakes_.load(std::memory_order_relaxed) != seen) break;
          sched_yield();
        }
        workers_in_futex_.fetch_add(1, std::memory_order_seq_cst);
        base::FutexWait(work_wakes_, seen);
        workers_in_futex_.fetch_sub(1, std::memory_order_relaxed);
        work_mutex_.lock();
        --workers_asleep_;
        if (wakes_on_the_way_ > 0) --wakes_on_the_way_;
        ran = 0;
      }
      ++ran;
      item = pool_work_.Pop();
    }
    item->run(item);
  }
}

int Engine::NextTimeoutMs() {
  base::MutexLock lock(timer_mutex_);
  if (timers_.empty()) {
    sleeps_until_.store(Clock::time_point::max(), std::memory_order_relaxed);
    return -1;
  }
  Clock::time_point until = timers_.front()->deadline;
  sleeps_until_.store(until, std::memory_order_relaxed);
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  return int(std::max<int64_t>(0, wait.count() + 1));
}

void Engine::FireDueTimers() {
  // The timers due now: one re-armed by its own fire waits for the next turn of the loop.
  const Clock::time_point now = Clock::now();
  for (;;) {
    Timer* due = nullptr;
    {
      base::MutexLock lock(timer_mutex_);
      if (!timers_.empty() && timers_.front()->deadline <= now) {
        due = timers_.front();
        HeapRemove(due);
      }
    }
    if (!due) return;
    due->fire(due);
  }
}

void Engine::Loop() {
  constexpr int kBatch = 64;
  // Ready sockets are read before due timers fire, up to this many (~10 ms of work), so that a
  // timer judging a peer by its silence (an ACK timeout) does not fire while the peer's answer
  // waits unread: with thousands of busy sockets one batch is not all of them.
  constexpr int kReadyBeforeTimers = 1024;
  epoll_event events[kBatch];
  std::vector<std::pair<std::weak_ptr<IoHandler>, uint32_t>> again;
  for (;;) {
    const int timeout = NextTimeoutMs();
    int n = epoll_wait(epoll_fd_, events, kBatch, again_.empty() ? timeout : 0);
    // Awake: a timer armed from now on needs no wake-up (a connection's setup and teardown arm
    // one from the application's thread, mostly while the loop is busy with other connections).
    sleeps_until_.store(Clock::time_point::min(), std::memory_order_relaxed);
    again.swap(again_);  // a handler that asks again now runs in the next turn
    for (int handled = 0;;) {
      {
        // A waiter with several completions in this batch wakes once, at its end.
        base::WakeBatch wakes;
        for (auto& [weak, what] : again)
          if (auto handler = weak.lock()) handler->OnIo(what);
        again.clear();
        for (int i = 0; i < n; ++i) Dispatch(events[i]);
        RunEngineWork();
      }
      handled += n;
      events_handled_.store(events_handled_.load(std::memory_order_relaxed) + uint64_t(std::max(n, 0)),
                            std::memory_order_relaxed);
      if (n < kBatch || handled >= kReadyBeforeTimers) break;
      n = epoll_wait(epoll_fd_, events, kBatch, 0);
    }
    base::WakeBatch wakes;  // a waiter that timers and their work release wakes once
    FireDueTimers();
    RunEngineWork();
  }
}

void Engine::RunEngineWork() {
  // Called every turn: without work deferred here since the last call, no lock is taken.
  if (!std::exchange(engine_work_deferred_, false)) return;
  for (;;) {
    WorkItem* item;
    {
      base::MutexLock lock(work_mutex_);
      item = engine_work_.Pop();
    }
    if (!item) return;
    item->run(item);  // may defer more, which this loop runs too
  }
}

void Engine::Dispatch(const epoll_event& event) {
  int fd = event.data.fd;
  if (fd == alarm_fd_) {  // a deadline armed while the loop slept: FireDueTimers follows
    uint64_t expirations;
    (void)!read(alarm_fd_, &expirations, sizeof expirations);
    return;
  }
  const uint32_t tag = uint32_t(event.data.u64 >> 32);
  std::shared_ptr<IoHandler> handler;
  {
    base::MutexLock lock(handlers_mutex_);
    auto it = handlers_.find(fd);
    if (it != handlers_.end() && it->second.tag == tag) handler = it->second.handler.lock();
  }
  if (handler) handler->OnIo(event.events);
}

}  // namespace ndwv::dev
