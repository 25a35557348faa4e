// CHECK: invariants whose violation is a bug. Prints file:line and aborts the process
// (and, once running under MPI, the whole job).
#pragma once
#include <cstdio>
#include <cstdlib>

namespace meshtrain {
[[noreturn]] void check_failed(const char* file, int line, const char* expr, const char* msg);
}

#define CHECK(cond)                                                             \
  do {                                                                          \
    if (!(cond)) ::meshtrain::check_failed(__FILE__, __LINE__, #cond, nullptr); \
  } while (0)

#define CHECK_MSG(cond, msg)                                                  \
  do {                                                                        \
    if (!(cond)) ::meshtrain::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
