// wake_latency: what one wake-up of a sleeping thread costs on this machine, the unit in which a
// connection setup with one connect outstanding is paid (bench/README.md, "The floor under a
// setup"). Two threads of one process hand a futex word back and forth (ndwv's engine waking an
// application thread), then two processes hand a byte back and forth through two pipes (one
// process's message waking the other). Each side sleeps until the other wakes it; half a round
// trip is one wake-up.
//
//   wake_latency [round trips]     (default 20000)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

std::atomic<int> turn{0};  // odd: the second thread's turn; even: the first's

// Sleeps until `turn` is `want`.
void AwaitTurn(int want) {
  for (int seen; (seen = turn.load()) != want;)
    syscall(SYS_futex, &turn, FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
}

void GiveTurn(int next) {
  turn.store(next);
  syscall(SYS_futex, &turn, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

double Microseconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 20000;
  if (rounds <= 0) {
    std::fprintf(stderr, "usage: wake_latency [round trips]\n");
    return 2;
  }

  auto start = std::chrono::steady_clock::now();
  std::thread second([rounds] {
    for (int i = 0; i < rounds; ++i) {
      AwaitTurn(2 * i + 1);
      GiveTurn(2 * i + 2);
    }
  });
  for (int i = 0; i < rounds; ++i) {
    GiveTurn(2 * i + 1);
    AwaitTurn(2 * i + 2);
  }
  second.join();
  std::printf("two threads, futex:   %6.1f us per wake-up\n", Microseconds(start) / rounds / 2);

  int there[2], back[2];
  if (pipe(there) != 0 || pipe(back) != 0) {
    std::perror("pipe");
    return 1;
  }
  char byte = 0;
  start = std::chrono::steady_clock::now();
  pid_t child = fork();
  if (child < 0) {
    std::perror("fork");
    return 1;
  }
  if (child == 0) {
    for (int i = 0; i < rounds; ++i)
      if (read(there[0], &byte, 1) != 1 || write(back[1], &byte, 1) != 1) _exit(1);
    _exit(0);
  }
  for (int i = 0; i < rounds; ++i)
    if (write(there[1], &byte, 1) != 1 || read(back[0], &byte, 1) != 1) return 1;
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("two processes, pipes: %6.1f us per wake-up\n", Microseconds(start) / rounds / 2);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
