// The command line as a function, for main() and for a host program that runs commands in
// its own process (cli/in_process.h).
#pragma once

namespace meshtrain::cli {

// `meshtrain argv[1..]`: parses (misspelt commands and flags named with the nearest known
// ones, --config expanded), runs the chosen command and returns its exit code.
int run_command_line(int argc, char** argv);

}  // namespace meshtrain::cli
