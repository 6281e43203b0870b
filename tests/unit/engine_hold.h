// For the unit tests of what the engine does, and in which order: EngineHold keeps it busy,
// TurnRecorder notes what a turn of its loop did.
#pragma once
#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "dev/engine.h"

namespace ndwv::dev {

// Holds the engine thread inside an event handler until released (or 5 s): what the engine
// would do meanwhile (read sockets, fire timers) waits, as on an engine busy with thousands of
// connections.
class EngineHold final : public IoHandler, public std::enable_shared_from_this<EngineHold> {
 public:
  ~EngineHold() {
    Release();
    if (pipe_[0] >= 0) Engine::Get().Unwatch(pipe_[0]);
    for (int fd : pipe_)
      if (fd >= 0) ::close(fd);
  }
  // The engine is inside OnIo when this returns true.
  bool Engage() {
    if (pipe2(pipe_, O_NONBLOCK | O_CLOEXEC) != 0) return false;
    Engine::Get().Watch(pipe_[0], EPOLLIN, weak_from_this());
    if (write(pipe_[1], "x", 1) != 1) return false;
    return entered_.get_future().wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  }
  void Release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
  }
  void OnIo(uint32_t) override {
    char byte;
    (void)!read(pipe_[0], &byte, 1);
    if (std::exchange(held_, true)) return;
    entered_.set_value();
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(5), [&] { return released_; });
  }

 private:
  int pipe_[2] = {-1, -1};
  std::promise<void> entered_;
  bool held_ = false;  // the engine's
  std::mutex mutex_;
  std::condition_variable changed_;
  bool released_ = false;
};

// Holds every thread of the shared work pool inside a work item until released (or 5 s): work
// deferred meanwhile from outside the engine (a poller's CM events, say) waits, as in a process
// whose pool is slow to come round.
class WorkPoolHold {
 public:
  // Waits until every item has run and left (the pool must not keep one of ours).
  ~WorkPoolHold() {
    Release();
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, std::chrono::seconds(10), [&] { return left_ == items_.size(); });
  }
  // Every worker is inside a held item when this returns true. One item at a time: the pool
  // wakes one sleeper per Defer while none is on its way, so an item queued behind a held one
  // would wait for it.
  bool Engage(uint32_t workers) {
    items_.resize(workers);
    for (uint32_t i = 0; i < workers; ++i) {
      items_[i].hold = this;
      items_[i].run = [](WorkItem* w) { static_cast<Item*>(w)->hold->Hold(); };
      Engine::Get().Defer(&items_[i]);
      std::unique_lock lock(mutex_);
      if (!changed_.wait_for(lock, std::chrono::seconds(5), [&] { return inside_ == i + 1; })) return false;
    }
    return true;
  }
  void Release() {
    {
      std::lock_guard lock(mutex_);
      released_ = true;
    }
    changed_.notify_all();
  }

 private:
  struct Item : WorkItem {
    WorkPoolHold* hold = nullptr;
  };
  void Hold() {
    std::unique_lock lock(mutex_);
    ++inside_;
    changed_.notify_all();
    changed_.wait_for(lock, std::chrono::seconds(5), [&] { return released_; });
    ++left_;
    changed_.notify_all();
  }
  std::vector<Item> items_;
  std::mutex mutex_;
  std::condition_variable changed_;
  uint32_t inside_ = 0;
  size_t left_ = 0;
  bool released_ = false;
};

// A timer due at once that arms itself again from its fire, `firings` times, and records
// `look()` at each: the engine fires the timers due once per turn of its loop, after the
// sockets that turn read, so the values are what each turn did. Start it while the engine is
// held: the first firing ends the held turn.
class TurnRecorder {
 public:
  TurnRecorder(size_t firings, std::function<uint64_t()> look) : firings_(firings), look_(std::move(look)) {
    timer_.owner = this;
    timer_.fire = [](Timer* timer) { static_cast<TurnRecorder*>(timer->owner)->Fire(); };
  }
  ~TurnRecorder() { Engine::Get().Disarm(&timer_); }
  void Start() { Engine::Get().Arm(&timer_, std::chrono::milliseconds(0)); }
  // The values, once every firing happened (at most `bound`); fewer if they did not.
  std::vector<uint64_t> Wait(std::chrono::milliseconds bound) {
    std::unique_lock lock(mutex_);
    done_.wait_for(lock, bound, [&] { return seen_.size() == firings_; });
    return seen_;
  }

 private:
  void Fire() {
    uint64_t value = look_();
    std::lock_guard lock(mutex_);
    seen_.push_back(value);
    if (seen_.size() < firings_) Engine::Get().Arm(&timer_, std::chrono::milliseconds(0));
    else done_.notify_all();
  }

  Timer timer_;
  const size_t firings_;
  const std::function<uint64_t()> look_;
  std::mutex mutex_;
  std::condition_variable done_;
  std::vector<uint64_t> seen_;
};

}  // namespace ndwv::dev
