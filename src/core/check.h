// CHECK: invariants whose violation is a bug. Prints file:line and aborts the process
// (and, once running under MPI, the whole job); in a host program that asked for it (the
// Python module), throws CheckFailure instead, so that a bug does not end the interpreter.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace meshtrain {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg);

// The message is check_failed's line. Thrown only after throw_on_check_failure(true); a CHECK
// on an OpenMP thread, or in a destructor, still ends the process.
struct CheckFailure : std::logic_error {
  using std::logic_error::logic_error;
};
void throw_on_check_failure(bool on);
}

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) ::meshtrain::check_failed(__FILE__, __LINE__, #cond, nullptr); \
  } while (0)

#define CHECK_MSG(cond, msg)                                                  \
  do {                                                                        \
    if (!(cond)) ::meshtrain::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
