#include "train/interrupt.h"

#include <signal.h>

#include <algorithm>
#include <atomic>

namespace meshtrain::train {

namespace {

std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free, "set from a signal handler");

extern "C" void on_stop(int sig) {
  // The launcher's forwarded signals stand for the terminal's.
  const int meant = sig == SIGUSR1 ? SIGINT : sig == SIGUSR2 ? SIGTERM : sig;
  int seen = g_stop.load();
  while (meant > seen && !g_stop.compare_exchange_weak(seen, meant)) {
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction once {};
  once.sa_handler = on_stop;
  sigemptyset(&once.sa_mask);
  // SA_RESETHAND: a second Ctrl-C gets the default action, for a user who will not wait.
  once.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGINT, &once, nullptr);
  sigaction(SIGTERM, &once, nullptr);
  struct sigaction forwarded = once;
  forwarded.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &forwarded, nullptr);
  sigaction(SIGUSR2, &forwarded, nullptr);
}

int stop_signal() { return g_stop.load(); }

void request_stop(int sig) { on_stop(sig); }

int agreed_stop_signal(comm::Group& world) {
  if (world.size() == 1) return stop_signal();
  double sig = stop_signal();
  world.all_reduce_f64(&sig, 1, comm::ReduceOp::kMax);
  return (int)sig;
}

const char* stop_signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal"; }

}  // namespace meshtrain::train
