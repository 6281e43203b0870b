// The engine's timers: what an owner's fire can rely on when it races with its own re-arming.
// Where work it defers runs. Its watches: an event is handed only to the handler of the watch it
// was reported for.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <string>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dev/engine.h"
#include "wait.h"

namespace ndwv::dev {
namespace {

using namespace std::chrono_literals;

// An owner as the transports write them: fire takes the lock the owner arms under.
struct Owner {
  std::mutex mutex;
  Timer timer;
  std::atomic<int> fired{0};
  std::atomic<int> saw_armed{0};  // fires that found the timer armed again
  Owner() {
    timer.owner = this;
    timer.fire = [](Timer* t) {
      auto* self = static_cast<Owner*>(t->owner);
      std::lock_guard<std::mutex> lock(self->mutex);
      if (Engine::Get().IsArmed(t)) self->saw_armed++;
      self->fired++;
    };
  }
};

TEST(EngineTimer, AFiringOvertakenByANewArmingFindsItArmedAndTheNewOneFiresLater) {
  Owner owner;
  {
    std::unique_lock<std::mutex> lock(owner.mutex);
    Engine::Get().Arm(&owner.timer, 0ms);
    // Due: the engine takes it off its list, then its fire waits for our lock.
    ASSERT_TRUE(WaitUntil([&] { return !Engine::Get().IsArmed(&owner.timer); }));
    Engine::Get().Arm(&owner.timer, 20ms);  // the owner arms it again meanwhile
    EXPECT_TRUE(Engine::Get().IsArmed(&owner.timer));
  }
  ASSERT_TRUE(WaitUntil([&] { return owner.fired.load() == 2; }));
  EXPECT_EQ(owner.saw_armed.load(), 1);  // the first firing, overtaken; not the second
  EXPECT_FALSE(Engine::Get().IsArmed(&owner.timer));
}

TEST(EngineTimer, DisarmedBeforeItFallsDueItNeverFires) {
  Owner owner;
  Engine::Get().Arm(&owner.timer, 50ms);
  EXPECT_TRUE(Engine::Get().IsArmed(&owner.timer));
  EXPECT_TRUE(Engine::Get().Disarm(&owner.timer));
  EXPECT_FALSE(Engine::Get().IsArmed(&owner.timer));
  std::this_thread::sleep_for(100ms);  // past its deadline: a firing would have come
  EXPECT_EQ(owner.fired.load(), 0);
}

// Armed from another thread while the engine sleeps with no deadline, or a later one than ours:
// nothing wakes it but the deadline itself (the kernel's timer it is moved to), so an engine
// that missed it would sleep past it (for good with no other timer).
TEST(EngineTimer, ArmedOffTheEngineWhileItSleepsItStillFiresAndOvertakesALaterOne) {
  Owner later, earlier;
  std::this_thread::sleep_for(50ms);  // the engine's earlier work done: it sleeps
  Engine::Get().Arm(&later.timer, 60'000ms);
  std::this_thread::sleep_for(20ms);  // asleep again, until the minute is up
  Engine::Get().Arm(&earlier.timer, 30ms);
  ASSERT_TRUE(WaitUntil([&] { return earlier.fired.load() == 1; }));
  EXPECT_EQ(later.fired.load(), 0);
  EXPECT_TRUE(Engine::Get().Disarm(&later.timer));
}


// Many timers armed out of order, some re-armed earlier or later and some disarmed: every one
// still armed fires once, in the order of its deadline (the heap's order), none of the others.
TEST(EngineTimer, ManyTimersFireOnceEachInDeadlineOrder) {
  constexpr int kTimers = 400;
  struct Tick {
    Timer timer;
    int id = 0;
    std::atomic<int> fired{0};
  };
  static std::mutex order_mutex;
  static std::vector<int> order;
  order.clear();
  std::vector<Tick> ticks(kTimers);
  std::vector<int> delay_ms(kTimers);
  for (int i = 0; i < kTimers; ++i) {
    ticks[i].id = i;
    ticks[i].timer.owner = &ticks[i];
    ticks[i].timer.fire = [](Timer* t) {
      auto* tick = static_cast<Tick*>(t->owner);
      tick->fired++;
      std::lock_guard<std::mutex> lock(order_mutex);
      order.push_back(tick->id);
    };
    delay_ms[i] = 300 + (i * 7919) % kTimers;  // a permutation of 300..699 ms
    Engine::Get().Arm(&ticks[i].timer, std::chrono::milliseconds(delay_ms[i]));
  }
  for (int i = 0; i < kTimers; i += 5) {  // re-armed: alternately earlier and later
    delay_ms[i] = i % 2 ? delay_ms[i] - 150 : delay_ms[i] + 150;
    Engine::Get().Arm(&ticks[i].timer, std::chrono::milliseconds(delay_ms[i]));
  }
  int disarmed = 0;
  for (int i = 3; i < kTimers; i += 7) {
    ASSERT_TRUE(Engine::Get().Disarm(&ticks[i].timer));
    delay_ms[i] = -1;
    ++disarmed;
  }
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(order_mutex);
    return int(order.size()) == kTimers - disarmed;
  }, 5s));
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < kTimers; ++i) EXPECT_EQ(ticks[i].fired.load(), delay_ms[i] < 0 ? 0 : 1) << i;
  std::lock_guard<std::mutex> lock(order_mutex);
  ASSERT_EQ(int(order.size()), kTimers - disarmed);
  // Every arming came before the earliest deadline (150 ms at least), so the timers fire in the
  // order of the deadlines they were given.
  for (size_t k = 1; k < order.size(); ++k)
    EXPECT_LE(ticks[order[k - 1]].timer.deadline, ticks[order[k]].timer.deadline)
        << "timer " << order[k - 1] << " then " << order[k];
}


// Work deferred on the engine (a CM handler ending a Disconnect's CM phase, a timer finding a QP
// dead) runs on the engine once its handlers and timers are done, holding nothing: not inside the
// handler that asked (whose locks it may need), and not on a worker, whose wake-up was a thread
// hand-off on every one-at-a-time teardown. Work deferred by any other thread still goes to the
// pool, for its caller may hold locks the work needs.
struct Deferred : WorkItem {
  std::atomic<bool> ran{false}, on_engine{false}, after_its_asker{false};
  std::atomic<bool> asker_done{false};
  Deferred() {
    run = [](WorkItem* item) {
      auto* self = static_cast<Deferred*>(item);
      self->on_engine = Engine::Get().OnEngineThread();
      self->after_its_asker = self->asker_done.load();
      self->ran = true;
    };
  }
};

TEST(EngineWork, WorkATimerDefersRunsOnTheEngineAfterTheTimerNotOnAWorker) {
  struct Asker {
    Timer timer;
    Deferred work;
  } asker;
  asker.timer.owner = &asker;
  asker.timer.fire = [](Timer* t) {
    auto* self = static_cast<Asker*>(t->owner);
    Engine::Get().Defer(&self->work);
    std::this_thread::sleep_for(20ms);  // a worker would have run it by now
    self->work.asker_done = true;
  };
  Engine::Get().Arm(&asker.timer, 0ms);
  ASSERT_TRUE(WaitUntil([&] { return asker.work.ran.load(); }));
  EXPECT_TRUE(asker.work.on_engine);
  EXPECT_TRUE(asker.work.after_its_asker);
}

TEST(EngineWork, WorkAnotherThreadDefersRunsOnAWorker) {
  Deferred work;
  work.asker_done = true;
  Engine::Get().Defer(&work);
  ASSERT_TRUE(WaitUntil([&] { return work.ran.load(); }));
  EXPECT_FALSE(work.on_engine);
}

// A handler as the transports' are: shared, watched through a weak reference.
struct Handler : IoHandler, std::enable_shared_from_this<Handler> {
  std::function<void()> on_io;
  std::atomic<int> calls{0};
  void OnIo(uint32_t) override {
    ++calls;
    if (on_io) on_io();
  }
};

// One end of a socket pair, the other end kept to make it readable.
struct Pair {
  std::array<int, 2> fds{-1, -1};
  Pair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds.data()), 0); }
  ~Pair() {
    for (int fd : fds)
      if (fd >= 0) close(fd);
  }
  void MakeReadable() { ASSERT_EQ(write(fds[1], "x", 1), 1); }
};

// The loop hands out a batch of events after the kernel reported them. A handler early in the
// batch may close a socket that has an event later in it, and a new socket take its number and be
// watched (an accepted connection, say): the old socket's event must not reach the new socket's
// handler, which would take a hang-up or an error of the closed socket for its own.
TEST(EngineWatch, AnEventOfAClosedSocketDoesNotReachTheNextSocketWithItsNumber) {
  Pair hold, closer, closed, reused;
  auto holder = std::make_shared<Handler>(), closing = std::make_shared<Handler>(),
       old_owner = std::make_shared<Handler>(), new_owner = std::make_shared<Handler>();
  // The holder keeps the engine until the two events below are both reported, so that they come
  // in one batch: the closer's first (the kernel reports in the order sockets became ready).
  std::atomic<bool> release{false};
  holder->on_io = [&] {
    WaitUntil([&] { return release.load(); });
    char byte;
    (void)!read(hold.fds[0], &byte, 1);
  };
  const int number = closed.fds[0];
  closing->on_io = [&] {
    char byte;
    (void)!read(closer.fds[0], &byte, 1);
    Engine::Get().Unwatch(number);
    ASSERT_EQ(dup2(reused.fds[0], number), number);  // a new socket (never readable) takes the number
    Engine::Get().Watch(number, EPOLLIN, new_owner);
  };
  Engine::Get().Watch(hold.fds[0], EPOLLIN, holder);
  Engine::Get().Watch(closer.fds[0], EPOLLIN, closing);
  Engine::Get().Watch(number, EPOLLIN, old_owner);
  hold.MakeReadable();
  ASSERT_TRUE(WaitUntil([&] { return holder->calls.load() == 1; }));
  closer.MakeReadable();
  closed.MakeReadable();
  release = true;
  ASSERT_TRUE(WaitUntil([&] { return closing->calls.load() == 1; }));
  std::this_thread::sleep_for(50ms);  // the rest of the batch, and any later one
  EXPECT_EQ(old_owner->calls.load(), 0) << "the closer came first in the batch";
  EXPECT_EQ(new_owner->calls.load(), 0) << "the closed socket's event reached the new socket's handler";
  for (int fd : {hold.fds[0], closer.fds[0], number}) Engine::Get().Unwatch(fd);
}

// A connection's socket passes from its CM's handler to its stream's with a second Watch (one
// EPOLL_CTL_MOD): only the new handler sees events from then on, also a socket taken out of the
// set (Modify 0) meanwhile, whose pending event the new watch reports.
// CloseWatched closes without an EPOLL_CTL_DEL: the close takes the registration with it. A file
// that outlives the close (here a copy, as a fork's child holds one for a moment) stays in the
// epoll set, ready, until its last copy goes: its events carry the closed watch's tag and reach
// nobody, neither its old handler nor the new socket that took its number.
TEST(EngineWatch, ASocketClosedWatchedReachesNobodyAndItsNumberIsWatchedAgain) {
  Pair old_pair, new_pair;
  auto old_owner = std::make_shared<Handler>(), new_owner = std::make_shared<Handler>();
  const int number = old_pair.fds[0];
  Engine::Get().Watch(number, EPOLLIN, old_owner);
  const int copy = dup(number);
  ASSERT_GE(copy, 0);
  Engine::Get().CloseWatched(number);
  old_pair.fds[0] = -1;
  old_pair.MakeReadable();  // the file lives on in `copy`: level-triggered, reported every turn
  ASSERT_EQ(dup2(new_pair.fds[0], number), number);  // a new socket takes the number
  Engine::Get().Watch(number, EPOLLIN, new_owner);
  const uint64_t before = Engine::Get().EventsHandled();
  ASSERT_TRUE(WaitUntil([&] { return Engine::Get().EventsHandled() > before + 10; }));
  EXPECT_EQ(old_owner->calls.load(), 0);
  EXPECT_EQ(new_owner->calls.load(), 0) << "the closed socket's event reached the new socket's handler";
  new_pair.MakeReadable();
  EXPECT_TRUE(WaitUntil([&] { return new_owner->calls.load() > 0; }));
  close(copy);  // the last copy: the registration goes with it
  Engine::Get().Unwatch(number);
  close(number);
}

TEST(EngineWatch, ASecondWatchHandsTheSocketToTheNewHandlerWithWhatIsPending) {
  Pair pair;
  const int fd = pair.fds[0];
  auto first = std::make_shared<Handler>(), second = std::make_shared<Handler>(), third = std::make_shared<Handler>();
  auto take = [fd] {
    char byte;
    (void)!read(fd, &byte, 1);
  };
  first->on_io = second->on_io = third->on_io = take;
  Engine::Get().Watch(fd, EPOLLIN, first);
  pair.MakeReadable();
  ASSERT_TRUE(WaitUntil([&] { return first->calls.load() == 1; }));
  Engine::Get().Watch(fd, EPOLLIN | EPOLLET, second);
  pair.MakeReadable();
  ASSERT_TRUE(WaitUntil([&] { return second->calls.load() == 1; })) << "the new handler was not told";
  Engine::Get().Modify(fd, 0);
  pair.MakeReadable();  // while out of the set: nobody is told
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(second->calls.load(), 1);
  Engine::Get().Watch(fd, EPOLLIN | EPOLLET, third);
  ASSERT_TRUE(WaitUntil([&] { return third->calls.load() == 1; })) << "the pending byte was not reported";
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(first->calls.load(), 1);
  EXPECT_EQ(second->calls.load(), 1);
  Engine::Get().Unwatch(fd);
}

// A poller takes a socket from the engine (Modify 0) and hands it back (Modify with events): what
// came meanwhile is reported to the handler the socket had.
TEST(EngineWatch, ASocketHandedBackReportsWhatCameWhileItWasOut) {
  Pair pair;
  const int fd = pair.fds[0];
  auto handler = std::make_shared<Handler>();
  handler->on_io = [fd] {
    char byte;
    (void)!read(fd, &byte, 1);
  };
  Engine::Get().Watch(fd, EPOLLIN | EPOLLET, handler);
  for (int round = 1; round <= 3; ++round) {
    Engine::Get().Modify(fd, 0);
    pair.MakeReadable();
    std::this_thread::sleep_for(20ms);
    EXPECT_EQ(handler->calls.load(), round - 1) << "told while out of the set";
    Engine::Get().Modify(fd, EPOLLIN | EPOLLET);
    ASSERT_TRUE(WaitUntil([&] { return handler->calls.load() == round; })) << "round " << round;
  }
  Engine::Get().Unwatch(fd);
}

// Whether the kernel has `fd` in an epoll set of this process (/proc/self/fdinfo of each epoll
// descriptor lists its targets as "tfd: N").
bool InAnEpollSet(int fd) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    if (std::filesystem::read_symlink(entry.path(), error).string() != "anon_inode:[eventpoll]") continue;
    std::ifstream info("/proc/self/fdinfo/" + entry.path().filename().string());
    for (std::string line; std::getline(info, line);)
      if (line.rfind("tfd:", 0) == 0 && std::stoi(line.substr(4)) == fd) return true;
  }
  return false;
}

// What StateOf says (a connection's diagnosis when it timed out) is the kernel's epoll set,
// through the pollers' take and hand-back, a hand-over and the end of the watch.
TEST(EngineWatch, StateOfAWatchIsWhatTheKernelHas) {
  Pair pair;
  const int fd = pair.fds[0];
  auto first = std::make_shared<Handler>(), second = std::make_shared<Handler>();
  auto expect = [fd](bool watched, bool in_set, const char* after) {
    const Engine::WatchState state = Engine::Get().StateOf(fd);
    EXPECT_EQ(state.watched, watched) << after;
    EXPECT_EQ(state.in_set, in_set) << after;
    EXPECT_EQ(InAnEpollSet(fd), in_set) << after << ": the kernel's set";
  };
  expect(false, false, "before the watch");
  Engine::Get().Watch(fd, EPOLLIN | EPOLLET, first);
  expect(true, true, "Watch");
  Engine::Get().Modify(fd, 0);
  expect(true, false, "Modify 0");
  Engine::Get().Modify(fd, 0);
  expect(true, false, "Modify 0 again");
  Engine::Get().Watch(fd, EPOLLIN | EPOLLET, second);
  expect(true, true, "a hand-over of a socket taken out");
  Engine::Get().Modify(fd, EPOLLIN);
  expect(true, true, "Modify");
  Engine::Get().Modify(fd, 0);
  Engine::Get().Unwatch(fd);
  expect(false, false, "Unwatch of a socket taken out");
  Engine::Get().Watch(fd, EPOLLIN, first);
  Engine::Get().Unwatch(fd);
  expect(false, false, "Unwatch");
}

// A stream's pollers may set its socket's interest (Modify) while the stream starts, after the
// CM let the socket go (Unwatch) and before the stream's Watch: that Modify must not put the
// socket in the set under no watch, or the Watch would not take it and its events would reach
// nobody (a connection whose peer's data and close were never read: a hang in 3 runs of 25
// of IntegrationCompletionPortThreads under AddressSanitizer beside a build).
TEST(EngineWatch, AModifyBeforeTheWatchIsLeftToTheWatchWhichThenSeesEvents) {
  Pair pair;
  const int fd = pair.fds[0];
  auto cm = std::make_shared<Handler>(), stream = std::make_shared<Handler>();
  stream->on_io = [fd] {
    char byte;
    (void)!read(fd, &byte, 1);
  };
  Engine::Get().Watch(fd, EPOLLIN, cm);
  Engine::Get().Unwatch(fd);
  Engine::Get().Modify(fd, 0);
  Engine::Get().Modify(fd, EPOLLIN | EPOLLET);
  Engine::Get().Watch(fd, EPOLLIN | EPOLLET, stream);
  pair.MakeReadable();
  ASSERT_TRUE(WaitUntil([&] { return stream->calls.load() == 1; })) << "the watch's handler was not told";
  EXPECT_EQ(cm->calls.load(), 0);
  Engine::Get().Unwatch(fd);
}

}  // namespace
}  // namespace ndwv::dev
