#include "train/interrupt.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace meshtrain::train {

namespace {

std::atomic<int> g_stop{0};

void note(int sig) {
  // The launcher's forwarded signals stand for the terminal's.
  const int meant = sig == SIGUSR1 ? SIGINT : sig == SIGUSR2 ? SIGTERM : sig;
  int seen = g_stop.load();
  while (meant > seen && !g_stop.compare_exchange_weak(seen, meant)) {
  }
}

// Waits for the stop signals, which every other thread blocks. A second SIGINT or SIGTERM
// gets its default action: the process ends at once.
void wait_for_signals(sigset_t set) {
  for (int seen = 0;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if ((sig == SIGINT || sig == SIGTERM) && seen++ > 0) {
      signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      raise(sig);
    }
    if (sig == SIGUSR1 || sig == SIGUSR2) seen++;
    note(sig);
  }
}

}  // namespace

// Why a thread of its own, and not a handler: a handler runs on the stack of whichever
// thread the signal lands on, which in a step is most often inside a oneDNN JIT kernel.
// With a handler, 3 to 4 of every 12 Ctrl-Cs of a tiny run ended in glibc's heap-corruption
// abort mid-step (the signal frame pushed mid-kernel; found with gdb, not explained
// further); with the signals taken on this thread alone, 0 of 20.
void install_stop_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGUSR2}) sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);  // this thread, and every thread it starts later
    std::thread(wait_for_signals, set).detach();
  });
}

int stop_signal() { return g_stop.load(); }

void request_stop(int sig) { note(sig); }

int agreed_stop(comm::Group& world, bool requested) {
  const int sig = stop_signal();
  const int mine = sig != 0 ? sig : requested ? kStopRequested : 0;
  if (world.size() == 1) return mine;
  double agreed = mine;
  world.all_reduce_f64(&agreed, 1, comm::ReduceOp::kMax);
  return (int)agreed;
}

const char* stop_signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal"; }

}  // namespace meshtrain::train
