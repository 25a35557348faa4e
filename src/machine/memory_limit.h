// The memory this process may use, as the kernel would enforce it: what the host has free
// (/proc/meminfo MemAvailable), its cgroup's limit (v2 memory.max or v1
// memory.limit_in_bytes, along the process's cgroup path) and the process's own rlimits
// (ulimit -v / -d). train's up-front memory check (train/memory_check.h) compares the
// planner's predicted peak with it, so a run too large for the machine is refused with
// figures instead of dying in an allocation.
#pragma once
#include <string>

namespace meshtrain::machine {

struct MemoryLimit {
  double bytes = 0;    // what one rank may use (> 0), already shared among the host's ranks
  std::string source;  // where the figure came from, in words, for the error message
};

// The smallest of: MemAvailable and the cgroup limit, each shared by `ranks_on_host` ranks,
// and this process's RLIMIT_AS / RLIMIT_DATA. The environment variable
// MESHTRAIN_MEMORY_LIMIT_GB (decimal GB for the whole host, shared by its ranks) replaces
// every detected figure: to leave room for other jobs, or in tests. A figure that cannot be
// read is left out; with none, bytes is +infinity.
MemoryLimit usable_memory(int ranks_on_host);

// The figures parsed from their files' text (exposed for tests): MemAvailable in bytes from
// /proc/meminfo's text, a cgroup limit file's value ("max" and v1's huge "no limit" are
// +infinity). Negative: not found or not a number.
double parse_mem_available(const std::string& meminfo);
double parse_cgroup_limit(const std::string& text);

}  // namespace meshtrain::machine
