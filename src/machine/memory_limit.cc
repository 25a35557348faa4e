#include "machine/memory_limit.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

namespace meshtrain::machine {

namespace {

namespace fs = std::filesystem;
constexpr double kNoLimit = std::numeric_limits<double>::infinity();

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string gb(double bytes) {
  char t[32];
  std::snprintf(t, sizeof t, "%.3g GB", bytes / 1e9);
  return t;
}

// The cgroup paths of this process: v2's "0::/path", v1's memory controller "N:memory:/path".
void cgroup_paths(std::string* v2, std::string* v1) {
  std::istringstream in(slurp("/proc/self/cgroup"));
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.starts_with("0::")) *v2 = path;
    std::istringstream names(controllers);
    for (std::string c; std::getline(names, c, ',');)
      if (c == "memory") *v1 = path;
  }
}

// The smallest limit in `file` along the cgroup path, from the process's own group up to
// the mount's root: a parent's limit binds its children too. A container usually sees its
// own group as the root.
double limit_along(const fs::path& mount, const std::string& path, const char* file, std::string* where) {
  double best = kNoLimit;
  fs::path p = mount / fs::path(path).relative_path();
  for (;;) {
    std::error_code ec;
    if (fs::exists(p / file, ec)) {
      const double v = parse_cgroup_limit(slurp((p / file).string()));
      if (v > 0 && v < best) best = v, *where = (p / file).string();
    }
    if (p == mount || !p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
    if (p.string().size() < mount.string().size()) break;
  }
  return best;
}

double cgroup_limit(std::string* where) {
  std::string v2, v1;
  cgroup_paths(&v2, &v1);
  double best = kNoLimit;
  std::string w;
  if (!v2.empty()) best = std::min(best, limit_along("/sys/fs/cgroup", v2, "memory.max", &w));
  if (!w.empty()) *where = w;
  w.clear();
  const double l1 = limit_along("/sys/fs/cgroup/memory", v1.empty() ? "/" : v1, "memory.limit_in_bytes", &w);
  if (l1 < best) best = l1, *where = w;
  return best;
}

// ulimit -v and -d bind this process alone, whatever the host's ranks share.
double rlimit_bytes(std::string* which) {
  double best = kNoLimit;
  for (auto [resource, name] :
       {std::pair{RLIMIT_AS, "ulimit -v (RLIMIT_AS)"}, {RLIMIT_DATA, "ulimit -d (RLIMIT_DATA)"}}) {
    struct rlimit r {};
    if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) continue;
    if ((double)r.rlim_cur < best) best = (double)r.rlim_cur, *which = name;
  }
  return best;
}

}  // namespace

double parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("MemAvailable:")) continue;
    double kib = -1;
    if (std::sscanf(line.c_str() + 13, "%lf", &kib) != 1 || kib < 0) return -1;
    return kib * 1024;
  }
  return -1;
}

double parse_cgroup_limit(const std::string& text) {
  if (text.starts_with("max")) return kNoLimit;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || v <= 0) return -1;
  return v >= 0x7ffffffffffff000 * 0.5 ? kNoLimit : v;  // v1 writes "no limit" as about 2^63
}

MemoryLimit usable_memory(int ranks_on_host) {
  const int n = std::max(1, ranks_on_host);
  const std::string shared = n > 1 ? " shared by " + std::to_string(n) + " ranks on this host" : "";
  MemoryLimit out{kNoLimit, ""};
  auto consider = [&](double host_bytes, const std::string& what) {
    if (host_bytes > 0 && host_bytes / n < out.bytes) out = {host_bytes / n, what + " " + gb(host_bytes) + shared};
  };
  if (const char* env = std::getenv("MESHTRAIN_MEMORY_LIMIT_GB"); env && *env) {
    consider(std::atof(env) * 1e9, "MESHTRAIN_MEMORY_LIMIT_GB");
    return out;  // said explicitly: it replaces every detected figure
  }
  consider(parse_mem_available(slurp("/proc/meminfo")), "the host's available memory (MemAvailable)");
  std::string where;
  const double cg = cgroup_limit(&where);
  if (cg < kNoLimit) consider(cg, "the cgroup limit (" + where + ")");
  std::string which;
  const double rl = rlimit_bytes(&which);
  if (rl < out.bytes) out = {rl, which + " " + gb(rl) + " of this process"};
  return out;
}

}  // namespace meshtrain::machine
