// The engine's timers: what an owner's fire can rely on when it races with its own re-arming.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

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

}  // namespace
}  // namespace ndwv::dev
