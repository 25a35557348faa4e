// Stopping a run cleanly on a signal. SIGINT (Ctrl-C) and SIGTERM (what schedulers send
// before they kill) only raise a flag, set by a thread that waits for them; the training loop looks at it at each step boundary,
// where every rank agrees on it (one small all-reduce), so every rank stops after the same
// step, saves if asked and exits with 128 + the signal. A second SIGINT or SIGTERM ends the
// process at once (the default action). Under the launcher (cli/launch.h) the terminal's
// signal reaches the launcher alone, which passes it on to the ranks as SIGUSR1 (for SIGINT)
// or SIGUSR2 (for SIGTERM): mpirun forwards those two to every rank, where it would abort
// the job on SIGINT or SIGTERM itself.
#pragma once
#include "comm/group.h"

namespace meshtrain::train {

// Blocks the stop signals in the calling thread, and so in every thread it starts later,
// and starts the one thread that waits for them (idempotent). Call it before any other
// thread starts (MPI's, OpenMP's). Before it, a signal has its default effect; a process
// that never calls it (an in-process caller of run_training) is never asked to stop.
void install_stop_handlers();
// The signal that asked this process to stop (SIGINT or SIGTERM), or 0.
int stop_signal();
// What agreed_stop returns when no signal came but some rank's caller asked to stop (a
// run subscriber, reporter.h). It is below SIGINT's and SIGTERM's numbers, so a signal wins.
constexpr int kStopRequested = 1;
// Collective over `world` (every rank, at the same step): the signal any rank received
// (SIGTERM over SIGINT when both), else kStopRequested when `requested` on any rank, else 0.
// One rank: no communication.
int agreed_stop(comm::Group& world, bool requested);
// "SIGINT" or "SIGTERM".
const char* stop_signal_name(int sig);
// Testing: as if `sig` had arrived.
void request_stop(int sig);

}  // namespace meshtrain::train
