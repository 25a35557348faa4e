// meshtrain_bench_comm: bus bandwidth of all_reduce, reduce_scatter and all_gather through
// the Group API (comm thread included), nccl-tests style. Run it under mpirun
// (bench/comm.sh). For each message size S (bytes of the whole buffer: the all_reduce
// buffer, reduce_scatter's input, all_gather's output):
//   time   = slowest rank's mean time per call (after warmup, barrier-aligned)
//   algbw  = S / time
//   busbw  = algbw · 2(N−1)/N for all_reduce, · (N−1)/N for reduce_scatter and all_gather
// Flags: --min-bytes B (4096) --max-bytes B (64 MiB) --factor F (4) --warmup W (3)
//        --iters I (0: as many as fit ~0.25 s per size, 5..1000)
//        --groups G (1): split the ranks into G groups, which run their collectives at the
//        same time (each group's N is the world's / G), by rank mod G, or with --blocks 1 in
//        blocks of consecutive ranks. On 2 hosts of 2 ranks, G=2 gives two pairs across the
//        link sharing each host's NIC (tp2·dp2's dp groups with tp inside a host), and with
//        --blocks 1 a pair inside each host (its tp groups), every slot busy.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/group.h"

using meshtrain::comm::Group;
using meshtrain::comm::ReduceOp;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  size_t min_bytes = 4096, max_bytes = size_t{64} << 20;
  int factor = 4, warmup = 3, iters = 0, groups = 1, blocks = 0;
};

bool parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (k == "--min-bytes")
      a->min_bytes = std::strtoull(v, nullptr, 10);
    else if (k == "--max-bytes")
      a->max_bytes = std::strtoull(v, nullptr, 10);
    else if (k == "--factor")
      a->factor = std::atoi(v);
    else if (k == "--warmup")
      a->warmup = std::atoi(v);
    else if (k == "--iters")
      a->iters = std::atoi(v);
    else if (k == "--groups")
      a->groups = std::atoi(v);
    else if (k == "--blocks")
      a->blocks = std::atoi(v);
    else
      return false;
  }
  return a->min_bytes >= 4 && a->max_bytes >= a->min_bytes && a->factor >= 2 && a->groups >= 1;
}

enum class Op { kAllReduce, kReduceScatter, kAllGather };

// One call of `op` on a buffer of `bytes` (whole-buffer size, see the header comment).
void run_once(Group& g, Op op, size_t bytes, std::vector<float>& a, std::vector<float>& b) {
  const size_t total = bytes / sizeof(float);
  const size_t block = total / g.size();
  switch (op) {
    case Op::kAllReduce:
      g.all_reduce(a.data(), total);
      break;
    case Op::kReduceScatter:
      g.reduce_scatter(a.data(), b.data(), block);
      break;
    case Op::kAllGather:
      g.all_gather(a.data(), b.data(), block);
      break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<Group> world = meshtrain::comm::init_world(&argc, &argv);
  Args args;
  if (!parse(argc, argv, &args) || world->size() % args.groups != 0) {
    if (world->rank() == 0)
      std::fprintf(stderr, "usage: see the comment at the top of bench/comm_busbw.cc\n");
    world.reset();
    meshtrain::comm::finalize();
    return 2;
  }
  // The collectives run on `group` (the world, or this rank's share of it); timing is
  // aligned and reduced over the world, so concurrent groups are timed together.
  std::unique_ptr<Group> split;
  const int per_group = world->size() / args.groups;
  const int color = args.blocks ? world->rank() / per_group : world->rank() % args.groups;
  if (args.groups > 1) split = world->split(color, world->rank(), "bench");
  Group& group = split ? *split : *world;
  const int N = group.size();
  std::vector<float> a(args.max_bytes / sizeof(float), 1.f), b(args.max_bytes / sizeof(float), 0.f);

  if (world->rank() == 0) {
    std::printf(
        "# meshtrain comm bus bandwidth: %d ranks in each of %d concurrent groups, float32, times are the slowest "
        "rank's mean\n",
        N, args.groups);
  }
  const struct {
    Op op;
    const char* name;
    double factor;
  } ops[] = {
      {Op::kAllReduce, "all_reduce", 2.0 * (N - 1) / N},
      {Op::kReduceScatter, "reduce_scatter", static_cast<double>(N - 1) / N},
      {Op::kAllGather, "all_gather", static_cast<double>(N - 1) / N},
  };
  for (const auto& o : ops) {
    if (world->rank() == 0) {
      std::printf("\n# %s\n# %12s %8s %12s %12s %12s\n", o.name, "size(B)", "iters", "time(us)",
                  "algbw(GB/s)", "busbw(GB/s)");
    }
    for (size_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= args.factor) {
      // Whole blocks per rank.
      const size_t size = bytes / (sizeof(float) * N) * sizeof(float) * N;
      for (int w = 0; w < args.warmup; ++w) run_once(group, o.op, size, a, b);
      // Same iteration count on every rank: rank 0's estimate from one timed call.
      double iters = args.iters;
      if (iters <= 0) {
        world->barrier();
        const double t0 = now_s();
        run_once(group, o.op, size, a, b);
        double one = now_s() - t0;
        world->all_reduce_f64(&one, 1, ReduceOp::kMax);
        iters = std::clamp(0.25 / std::max(one, 1e-7), 5.0, 1000.0);
      }
      const int n_iters = static_cast<int>(iters);
      world->barrier();
      const double t0 = now_s();
      for (int i = 0; i < n_iters; ++i) run_once(group, o.op, size, a, b);
      double t = (now_s() - t0) / n_iters;
      world->all_reduce_f64(&t, 1, ReduceOp::kMax);
      if (world->rank() == 0) {
        const double algbw = static_cast<double>(size) / t / 1e9;
        std::printf("  %12zu %8d %12.1f %12.3f %12.3f\n", size, n_iters, t * 1e6, algbw,
                    algbw * o.factor);
        std::fflush(stdout);
      }
    }
  }
  split.reset();
  world.reset();
  meshtrain::comm::finalize();
  return 0;
}
