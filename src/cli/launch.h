// Starting a multi-rank job from a plain shell: meshtrain re-executes itself under mpirun
// with the flags a new user should not need to know (root, oversubscription, one OpenMP
// thread per rank when ranks outnumber cores).
#pragma once
#include <string>
#include <vector>

namespace meshtrain::cli {

// The command line this process was started with (set by main).
void set_original_args(int argc, char** argv);

// Replaces this process with `mpirun -n ranks ... <this program> <same args>`; returns
// only on failure (with an exit code).
int relaunch_under_mpirun(int ranks, int threads_per_rank);

}  // namespace meshtrain::cli
