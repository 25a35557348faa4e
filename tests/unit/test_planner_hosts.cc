// The planner on clusters of several hosts: where each axis's groups sit under a rank order
// (planner/placement.h), the cluster files' hosts and links tables (planner/cluster_file.h, read
// with toml++), and what placement does to the predicted step, on GPU nodes (the time
// model) and on this machine split into hosts (the local predictor). No runs: the measured
// side is bench/hosts_layouts.sh, which prints the predictions next to the runs.
#include <gtest/gtest.h>

#include <string>

#include "planner/cluster_file.h"
#include "model/config.h"
#include "planner/cluster.h"
#include "planner/local.h"
#include "planner/placement.h"
#include "planner/time_model.h"

namespace meshtrain::planner::test_planner_hosts {
namespace {

using comm::MeshAxis;

comm::RankOrder order(const std::string& text) {
  comm::RankOrder o;
  EXPECT_TRUE(comm::parse_rank_order(text, &o).is_ok()) << text;
  return o;
}

Layout layout(int tp, int pp, int dp, const std::string& rank_order) {
  Layout l;
  l.tp = tp, l.pp = pp, l.dp = dp, l.order = order(rank_order);
  return l;
}

// Two hosts of two ranks with one NIC each: the namespaces of scripts/hosts.sh.
Cluster two_by_two() {
  Cluster c;
  EXPECT_TRUE(cluster_preset("a100-80g", &c).is_ok());
  c.gpus_per_node = 2, c.nics_per_node = 1, c.nodes = 2;
  return c;
}

TEST(PlannerPlacement, StridesFollowTheRankOrder) {
  const Layout def = layout(2, 3, 4, "tp-dp-pp");
  EXPECT_EQ(axis_stride(def, MeshAxis::kTp), 1);
  EXPECT_EQ(axis_stride(def, MeshAxis::kDp), 2);
  EXPECT_EQ(axis_stride(def, MeshAxis::kPp), 8);
  const Layout dp_first = layout(2, 3, 4, "dp-pp-tp");
  EXPECT_EQ(axis_stride(dp_first, MeshAxis::kDp), 1);
  EXPECT_EQ(axis_stride(dp_first, MeshAxis::kPp), 4);
  EXPECT_EQ(axis_stride(dp_first, MeshAxis::kTp), 12);
}

TEST(PlannerPlacement, GroupsCrossHostsAndShareTheirLinks) {
  const Cluster c = two_by_two();
  // tp2 dp2, tp first: tp stays in a host; both dp groups cross, sharing each host's NIC.
  GroupPlacement tp = place_group(1, 2, c), dp = place_group(2, 2, c);
  EXPECT_FALSE(tp.crosses_hosts);
  EXPECT_TRUE(dp.crosses_hosts);
  EXPECT_EQ(dp.members_per_host, 1);
  EXPECT_DOUBLE_EQ(dp.nic_share, 0.5);
  // dp4 over both hosts: one ring, leaving each host once, has the NIC to itself.
  const GroupPlacement dp4 = place_group(1, 4, c);
  EXPECT_TRUE(dp4.crosses_hosts);
  EXPECT_EQ(dp4.members_per_host, 2);
  EXPECT_DOUBLE_EQ(dp4.nic_share, 1.0);
  // A DGX node (8 GPUs, 8 NICs): a group with one member per node gets one NIC, one with
  // four members per node four (the GPU time model's rail-optimised rings).
  Cluster dgx;
  ASSERT_TRUE(cluster_preset("h100-80g", &dgx).is_ok());
  EXPECT_DOUBLE_EQ(place_group(8, 4, dgx).nic_share, 1.0);
  EXPECT_DOUBLE_EQ(place_group(2, 16, dgx).nic_share, 4.0);
  EXPECT_FALSE(place_group(1, 8, dgx).crosses_hosts);
}

TEST(PlannerPlacement, LayoutsLargerThanTheClusterAreRefused) {
  const Cluster c = two_by_two();
  EXPECT_TRUE(check_fits_nodes(layout(2, 1, 2, "tp-dp-pp"), c).is_ok());
  const Status s = check_fits_nodes(layout(2, 1, 4, "tp-dp-pp"), c);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("needs 8 ranks"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("2 nodes x 2 = 4"), std::string::npos) << s.message();
}

// The GPU time model: Megatron's rule, tp inside a node, holds for a large model: putting the
// tp groups across nodes (dp-tp-pp) makes the step slower, and only the tp time changes.
TEST(PlannerPlacement, TensorParallelismAcrossNodesIsSlowerOnGpus) {
  Cluster h100;
  ASSERT_TRUE(cluster_preset("h100-80g", &h100).is_ok());
  ModelShape m;
  m.layers = 32, m.hidden = 4096, m.heads = 32, m.seq = 4096, m.vocab = 32000;
  Layout inside = layout(8, 1, 8, "tp-dp-pp");
  inside.micro_batch = 1, inside.global_batch = 64;
  Layout across = inside;
  across.order = order("dp-tp-pp");
  Prediction a, b;
  ASSERT_TRUE(predict(m, inside, h100, &a).is_ok());
  ASSERT_TRUE(predict(m, across, h100, &b).is_ok());
  EXPECT_GT(b.step_s, a.step_s * 1.2);
  EXPECT_GT(b.tp.total(), a.tp.total() * 2);
  EXPECT_EQ(b.memory.total(), a.memory.total());
}

// The local predictor on two hosts: the bench model of bench/hosts_layouts.sh (a tied
// 50257-row embedding, width 128), whose dp bytes are 6x its tp bytes. On one host the two
// orders predict the same step; over a slow link the axis that crosses it pays for its
// bytes there, so tp across the link beats tp inside a host, as measured.
TEST(PlannerPlacement, LocalPredictorChargesTheAxisThatCrossesTheLink) {
  model::GptConfig config;
  config.layers = 4, config.dim = 128, config.heads = 4, config.max_seq_len = 64, config.vocab = 50257;
  LocalRun run;
  Cluster one_host = local_cluster(1, 100, 100);
  Cluster hosts = one_host;
  hosts.gpus_per_node = 2, hosts.nics_per_node = 1, hosts.nodes = 2;
  hosts.inter = {0.064e9, 12e-6, 0.040e9, 0.067e9};  // bench/hosts_comm.sh at 1 Gbit/s
  Layout inside = layout(2, 1, 2, "tp-dp-pp");
  inside.micro_batch = 4, inside.global_batch = 8, inside.precision = Precision::kFp32;
  Layout across = inside;
  across.order = order("dp-tp-pp");
  Prediction p_inside, p_across, q_inside, q_across;
  ASSERT_TRUE(predict_local(config, inside, run, one_host, &q_inside).is_ok());
  ASSERT_TRUE(predict_local(config, across, run, one_host, &q_across).is_ok());
  EXPECT_DOUBLE_EQ(q_inside.step_s, q_across.step_s);
  ASSERT_TRUE(predict_local(config, inside, run, hosts, &p_inside).is_ok());
  ASSERT_TRUE(predict_local(config, across, run, hosts, &p_across).is_ok());
  EXPECT_LT(p_across.step_s, p_inside.step_s);
  EXPECT_GT(p_inside.step_s, q_inside.step_s);  // the link costs time
  // 14.5 MB of dp gradients through half a 0.064 GB/s NIC is at least 0.45 s.
  EXPECT_GT(p_inside.dp.total(), 0.45);
  EXPECT_LT(p_across.dp.total(), 0.1);

  // With rates by size (small messages at twice the 16 MiB rate, as TCP moves them), tp's
  // 131 KB activations cross faster; dp's 14.5 MB gradient, near the curve's top, barely
  // changes.
  Cluster curved = hosts;
  curved.inter.by_size = {{16384, 0.128e9, 0.080e9, 0.134e9}, {16777216, 0.064e9, 0.040e9, 0.067e9}};
  Prediction c_inside, c_across;
  ASSERT_TRUE(predict_local(config, inside, run, curved, &c_inside).is_ok());
  ASSERT_TRUE(predict_local(config, across, run, curved, &c_across).is_ok());
  EXPECT_LT(c_across.tp.total(), 0.8 * p_across.tp.total());
  EXPECT_LT(c_across.step_s, p_across.step_s);
  EXPECT_NEAR(c_inside.dp.total(), p_inside.dp.total(), 0.05 * p_inside.dp.total());
}

// The data-parallel traffic tests' setting: a 7.2M-parameter model (29 MB of fp32 gradient)
// over dp 4 on two hosts of two ranks, joined by a 0.064 GB/s link.
struct SlowLinkDp4 {
  model::GptConfig config = [] {
    model::GptConfig c;
    c.layers = 4, c.dim = 128, c.heads = 4, c.max_seq_len = 64, c.vocab = 50257;
    return c;
  }();
  LocalRun run;
  Cluster hosts = [] {
    Cluster h = local_cluster(1, 100, 100);
    h.gpus_per_node = 2, h.nics_per_node = 1, h.nodes = 2;
    h.inter = {0.064e9, 100e-6, 0.035e9, 0.047e9};
    return h;
  }();
  Layout layout = [] {
    Layout l = test_planner_hosts::layout(1, 1, 4, "tp-dp-pp");
    l.micro_batch = 4, l.global_batch = 16, l.precision = Precision::kFp32;
    return l;
  }();
  Status predict(const Layout& l, Prediction* p) const { return predict_local(config, l, run, hosts, p); }
};

// Compression in the local predictor: over the slow link PowerSGD's and 1-bit Adam's few
// bytes make dp 4's step faster than the plain all-reduce's, their state costs memory, and
// the ZeRO stages they do not run with are refused.
TEST(PlannerPlacement, LocalPredictorChargesTheCompressedReduction) {
  const SlowLinkDp4 x;
  Layout plain = x.layout;
  Prediction p_plain, p_psgd, p_onebit, p_onebit1;
  ASSERT_TRUE(x.predict(plain, &p_plain).is_ok());
  Layout psgd = plain, onebit = plain;
  psgd.compression.kind = parallel::Compression::Kind::kPowerSgd;
  onebit.compression.kind = parallel::Compression::Kind::kOneBitAdam;
  ASSERT_TRUE(x.predict(psgd, &p_psgd).is_ok());
  ASSERT_TRUE(x.predict(onebit, &p_onebit).is_ok());
  // 29 MB of gradient over the link against a few hundred KB.
  EXPECT_LT(p_psgd.dp.total(), 0.2 * p_plain.dp.total());
  EXPECT_LT(p_onebit.dp.total(), 0.2 * p_plain.dp.total());
  EXPECT_LT(p_psgd.step_s, p_plain.step_s);
  EXPECT_GT(p_psgd.memory.optim, p_plain.memory.optim);  // the error: 4 B a parameter
  EXPECT_GT(p_onebit.memory.optim, p_psgd.memory.optim);
  Layout onebit_zero1 = onebit;
  onebit_zero1.zero = 1;  // runs, and all-gathers the parameters besides
  ASSERT_TRUE(x.predict(onebit_zero1, &p_onebit1).is_ok());
  EXPECT_GT(p_onebit1.dp.total(), p_onebit.dp.total());
  psgd.zero = 1;
  const Status s = x.predict(psgd, &p_psgd);
  EXPECT_NE(s.message().find("--compress powersgd runs with --zero 0 (its bucket all-reduce), got --zero 1"), std::string::npos) << s.message();
}

// ZeRO++ on ZeRO-3 dp 4 across the link: the int8 gathers and reduce-scatters move about a
// quarter of the bytes, so dp's time falls to about a quarter plus the quantization; qwZ
// needs ZeRO-3, and the search puts each where its stage has it.
TEST(PlannerPlacement, LocalPredictorChargesQuantizedZeroCollectives) {
  const SlowLinkDp4 x;
  Layout exact = x.layout;
  exact.zero = 3;
  Layout weights = exact, both = exact;
  weights.quantized.weights = true;
  both.quantized.weights = both.quantized.grads = true;
  Prediction p_exact, p_weights, p_both;
  ASSERT_TRUE(x.predict(exact, &p_exact).is_ok());
  ASSERT_TRUE(x.predict(weights, &p_weights).is_ok());
  ASSERT_TRUE(x.predict(both, &p_both).is_ok());
  EXPECT_LT(p_weights.dp.total(), p_exact.dp.total());
  EXPECT_LT(p_both.dp.total(), p_weights.dp.total());
  EXPECT_LT(p_both.dp.total(), 0.35 * p_exact.dp.total());
  EXPECT_GT(p_both.dp.total(), 0.2 * p_exact.dp.total());
  EXPECT_LT(p_both.step_s, p_exact.step_s);
  Layout zero1 = weights;
  zero1.zero = 1;
  const Status s = x.predict(zero1, &p_weights);
  EXPECT_NE(s.message().find("--zero-quantized-weights quantizes ZeRO-3's parameter gathers: it needs --zero 3, got --zero 1"), std::string::npos) << s.message();
}

// A rate curve: the points' rates at their sizes, log-size interpolation between them, the
// nearest point's outside, and the all-reduce's rate where a collective has none.
TEST(PlannerPlacement, LinkRatesInterpolateInLogSize) {
  Link l{0.064e9, 1e-4, 0.035e9, 0};
  using C = Link::Collective;
  EXPECT_DOUBLE_EQ(l.rate(C::kAllReduce, 1 << 20), 0.064e9);  // no curve: the fixed rates
  EXPECT_DOUBLE_EQ(l.rate(C::kReduceScatter, 1 << 20), 0.035e9);
  EXPECT_DOUBLE_EQ(l.rate(C::kAllGather, 1 << 20), 0.064e9);
  l.by_size = {{1024, 0.12e9, 0.09e9, 0}, {1 << 20, 0.06e9, 0.03e9, 0.05e9}};
  EXPECT_DOUBLE_EQ(l.rate(C::kAllReduce, 1024), 0.12e9);
  EXPECT_DOUBLE_EQ(l.rate(C::kAllReduce, 10), 0.12e9);
  EXPECT_DOUBLE_EQ(l.rate(C::kAllReduce, 1 << 30), 0.06e9);
  EXPECT_NEAR(l.rate(C::kAllReduce, 32768), 0.09e9, 1e-3 * 0.09e9);  // halfway in log(size)
  EXPECT_NEAR(l.rate(C::kReduceScatter, 32768), 0.06e9, 1e-3 * 0.06e9);
  EXPECT_DOUBLE_EQ(l.rate(C::kAllGather, 1024), 0.12e9);  // not given: the all-reduce's
  EXPECT_NEAR(l.rate(C::kAllGather, 32768), 0.085e9, 1e-3 * 0.085e9);
}

// ---- Cluster files: toml++ tables -------------------------------------------------------

Status parse(const std::string& text, Cluster* c) { return planner::parse_cluster_toml(text, "c.toml", c); }

TEST(ClusterFile, HostsAndLinksTablesSetTheirFields) {
  Cluster c;
  const Status s = parse(R"(base = "a100-80g"
name = "two-racks"
[hosts]
count = 16
ranks_per_host = 4
nics_per_host = 2
[links.intra_host]
bandwidth_gbs = 100
latency_us = 3
[links.inter_host]
bandwidth_gbs = 12.5
latency_us = 7.5
reduce_scatter_gbs = 10
all_gather_gbs = 11
)",
                         &c);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(c.name, "two-racks");
  EXPECT_EQ(c.nodes, 16);
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_EQ(c.nics_per_node, 2);
  EXPECT_DOUBLE_EQ(c.intra.bandwidth, 100e9);
  EXPECT_DOUBLE_EQ(c.intra.latency, 3e-6);
  EXPECT_DOUBLE_EQ(c.inter.bandwidth, 12.5e9);
  EXPECT_DOUBLE_EQ(c.inter.latency, 7.5e-6);
  EXPECT_DOUBLE_EQ(c.inter.reduce_scatter(), 10e9);
  EXPECT_DOUBLE_EQ(c.inter.all_gather(), 11e9);
  EXPECT_DOUBLE_EQ(c.peak_flops_16, 312e12);  // the rest from the base
}

TEST(ClusterFile, ErrorsNameTheTableAndKey) {
  Cluster c;
  auto error = [&](const std::string& text) { return parse(text, &c).message(); };
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  std::string m = error("base = \"a100-80g\"\n[host]\ncount = 2\n");
  EXPECT_TRUE(has(m, "unknown table [host]") && has(m, "[hosts]")) << m;
  m = error("base = \"a100-80g\"\n[hosts]\nranks = 2\n");
  EXPECT_TRUE(has(m, "unknown key 'ranks' in [hosts]") && has(m, "ranks_per_host")) << m;
  m = error("base = \"a100-80g\"\ngpus_per_node = 4\n[hosts]\nranks_per_host = 2\n");
  EXPECT_TRUE(has(m, "'gpus_per_node' is set twice") && has(m, "[hosts] ranks_per_host")) << m;
  m = error("base = \"a100-80g\"\n[links.inter_host]\nbandwidth_gbs = -1\n");
  EXPECT_TRUE(has(m, "'inter_node_gbps'") && has(m, "[links.inter_host] bandwidth_gbs") && has(m, "> 0")) << m;
  m = error("base = \"a100-80g\"\n[hosts]\ncount = [2]\n");
  EXPECT_TRUE(has(m, "'[hosts] count'") && has(m, "one number")) << m;
  m = error("base = \"a100-80g\"\nmemory_gb = \n");
  EXPECT_TRUE(has(m, "cannot parse") && has(m, "line 2")) << m;
  m = error("base = \"local\"\n");  // the parser alone knows only the presets
  EXPECT_TRUE(has(m, "unknown cluster preset 'local'")) << m;
  // Without a base, the optional fields (hosts, NICs, per-collective rates) may be left out.
  m = error("peak_tflops_bf16 = 1\n");
  EXPECT_TRUE(has(m, "lacks") && !has(m, "nics_per_node") && !has(m, "nodes")) << m;
}

TEST(ClusterFile, InterHostRatesBySize) {
  Cluster c;
  const std::string head = "base = \"a100-80g\"\n[links.inter_host]\nbandwidth_gbs = 0.064\n";
  const Status s = parse(head + R"(
[[links.inter_host.by_size]]
bytes = 65536
all_reduce_gbs = 0.119
all_gather_gbs = 0.088
[[links.inter_host.by_size]]
bytes = 16777216
all_reduce_gbs = 0.064
reduce_scatter_gbs = 0.035
all_gather_gbs = 0.047
)",
                         &c);
  ASSERT_TRUE(s.is_ok()) << s.message();
  ASSERT_EQ(c.inter.by_size.size(), 2u);
  EXPECT_DOUBLE_EQ(c.inter.by_size[0].bytes, 65536);
  EXPECT_DOUBLE_EQ(c.inter.by_size[0].all_reduce, 0.119e9);
  EXPECT_DOUBLE_EQ(c.inter.by_size[0].reduce_scatter, 0);  // left out: the all-reduce's
  EXPECT_DOUBLE_EQ(c.inter.by_size[1].reduce_scatter, 0.035e9);
  EXPECT_DOUBLE_EQ(c.inter.rate(Link::Collective::kAllGather, 1 << 24), 0.047e9);

  auto error = [&](const std::string& entries) { return parse(head + entries, &c).message(); };
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  const std::string a = "[[links.inter_host.by_size]]\nbytes = 4096\nall_reduce_gbs = 0.1\n";
  std::string m = error(a + "[[links.inter_host.by_size]]\nbytes = 1024\nall_reduce_gbs = 0.1\n");
  EXPECT_TRUE(has(m, "entry 2") && has(m, "ascending")) << m;
  m = error("[[links.inter_host.by_size]]\nbytes = 4096\nallreduce_gbs = 0.1\n");
  EXPECT_TRUE(has(m, "entry 1") && has(m, "unknown key 'allreduce_gbs'") && has(m, "all_reduce_gbs")) << m;
  m = error("[[links.inter_host.by_size]]\nbytes = 4096\n");
  EXPECT_TRUE(has(m, "needs 'bytes' and 'all_reduce_gbs'")) << m;
  m = error("[[links.inter_host.by_size]]\nbytes = 4096\nall_reduce_gbs = -0.1\n");
  EXPECT_TRUE(has(m, "'all_reduce_gbs' must be > 0")) << m;
  m = error("[[links.inter_host.by_size]]\nbytes = \"big\"\nall_reduce_gbs = 0.1\n");
  EXPECT_TRUE(has(m, "'bytes' takes a number")) << m;
  m = error("by_size = 3\n");
  EXPECT_TRUE(has(m, "array of tables")) << m;
}

TEST(ClusterFile, LocalBaseIsThisMachine) {
  Cluster c;
  const Status s = planner::parse_cluster_toml("base = \"local\"\n[hosts]\nranks_per_host = 2\n", "c.toml", &c,
                                           [](const std::string& name, Cluster* out) {
                                             if (name != "local") return cluster_preset(name, out);
                                             *out = local_cluster(1, 100, 100);
                                             return Status::ok();
                                           });
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_GT(c.cores, 0);  // what makes `plan` use the local predictor
  EXPECT_EQ(c.gpus_per_node, 2);
}

// The presets are the files of configs/clusters/presets/, built in: read from the source
// tree as a user's cluster file, each predicts what the built-in one does, to the bit.
TEST(ClusterFile, PresetFilesAreTheBuiltInPresets) {
  ModelShape m;
  m.layers = 24, m.hidden = 2048, m.heads = 16, m.seq = 2048, m.vocab = 51200;
  Layout l;
  l.tp = 2, l.pp = 2, l.dp = 4, l.micro_batch = 1, l.global_batch = 64, l.zero = 1;
  ASSERT_EQ(cluster_preset_names(), (std::vector<std::string>{"a100-80g", "h100-80g", "h200"}));
  for (const std::string& name : cluster_preset_names()) {
    Cluster built_in, from_file;
    ASSERT_TRUE(cluster_preset(name, &built_in).is_ok()) << name;
    const Status s = load_cluster_file(std::string(MESHTRAIN_SOURCE_DIR) + "/configs/clusters/presets/" + name + ".toml",
                                       &from_file);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_EQ(from_file.name, name);
    Prediction a, b;
    ASSERT_TRUE(predict(m, l, built_in, &a).is_ok() && predict(m, l, from_file, &b).is_ok()) << name;
    EXPECT_EQ(a.step_s, b.step_s) << name;
    EXPECT_EQ(a.memory.total(), b.memory.total()) << name;
  }
}

Cluster local_based(const std::string& text, Status* s) {
  Cluster c;
  *s = planner::parse_cluster_toml(text, "mine.toml", &c, [](const std::string& name, Cluster* out) {
    if (name != "local") return cluster_preset(name, out);
    *out = local_cluster(1, 100, 100);
    return Status::ok();
  });
  return c;
}

// The local predictor's calibration is local.toml's: figures a file of one's own, starting
// from `base = "local"`, may replace in a [calibration] table.
TEST(ClusterFile, TheLocalCalibrationIsDataAFileMayOverride) {
  const Cluster built_in = local_cluster(1, 100, 100);
  EXPECT_EQ(built_in.cpu.memory_bandwidth, 21e9);  // configs/clusters/presets/local.toml
  EXPECT_EQ(built_in.cpu.gelu_forward_s, 0.9e-9);
  EXPECT_EQ(built_in.cpu.cold.reduce_scatter, 0.52e9);
  EXPECT_EQ(built_in.cpu.attention_backward_block_s, 2.5e-6);
  EXPECT_EQ(built_in.gemm.max_fraction, 0.72);
  EXPECT_EQ(built_in.hbm_bandwidth, 21e9);  // one thread
  EXPECT_EQ(local_cluster(2, 100, 100).hbm_bandwidth, 21e9 * std::min(2, built_in.cores));
  Cluster gpu;
  ASSERT_TRUE(cluster_preset("a100-80g", &gpu).is_ok());
  EXPECT_EQ(gpu.cpu.memory_bandwidth, 0);  // the GPU model does not read it

  Status s;
  const Cluster slow = local_based("base = \"local\"\n[calibration]\ngelu_forward_s = 1e-7\n"
                                   "[calibration.cold]\nreduce_scatter_gbps = 0.1\n", &s);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(slow.cpu.gelu_forward_s, 1e-7);
  EXPECT_EQ(slow.cpu.cold.reduce_scatter, 0.1e9);
  EXPECT_EQ(slow.cpu.gelu_backward_s, built_in.cpu.gelu_backward_s);  // the rest kept
  // A ZeRO-1 pair reduce-scatters cold gradients and runs GELU: both cost more now.
  model::GptConfig config;
  ASSERT_TRUE(model::preset_config("tiny", &config).is_ok());
  Layout l;
  l.precision = Precision::kFp32, l.dp = 2, l.zero = 1, l.micro_batch = 2, l.global_batch = 4;
  Prediction fast_run, slow_run;
  ASSERT_TRUE(predict_local(config, l, LocalRun{}, built_in, &fast_run).is_ok());
  ASSERT_TRUE(predict_local(config, l, LocalRun{}, slow, &slow_run).is_ok());
  EXPECT_GT(slow_run.layer_forward.memory, fast_run.layer_forward.memory);
  EXPECT_GT(slow_run.dp.total(), fast_run.dp.total());

  std::string m = (local_based("base = \"local\"\n[calibration]\ngelu_forwrd_s = 1e-9\n", &s), s.message());
  EXPECT_TRUE(m.find("unknown key 'gelu_forwrd_s' in [calibration]") != std::string::npos &&
              m.find("gelu_forward_s") != std::string::npos) << m;
  m = (local_based("base = \"local\"\n[calibration.cold]\nall_gather_gbps = -2\n", &s), s.message());
  EXPECT_TRUE(m.find("'cpu_cold_all_gather_gbps'") != std::string::npos && m.find(">= 0") != std::string::npos) << m;
}

}  // namespace
}  // namespace meshtrain::planner::test_planner_hosts
