#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/self_group.h"
#include "core/cpu_info.h"
#include "data/training_data.h"
#include "kernels/cpu/onednn.h"
#include "machine/describe.h"
#include "train/console.h"
#include "train/heartbeat.h"
#include "train/run.h"
#include "trace/trace.h"

namespace meshtrain::train {

namespace fs = std::filesystem;
using nlohmann::json;

json comm_json(const std::map<std::string, comm::AxisStats>& stats, double* wait_ms,
               double* busy_ms) {
  json out = json::object();
  *wait_ms = *busy_ms = 0;
  for (const auto& [axis, s] : stats) {
    if (s.calls == 0) continue;
    out[axis] = {{"bytes", s.bytes}, {"calls", s.calls}};
    *wait_ms += s.wait_s * 1e3;
    *busy_ms += s.busy_s * 1e3;
  }
  return out;
}

json comm_time_json(const std::map<std::string, comm::AxisStats>& stats) {
  json out = json::object();
  for (const auto& [axis, s] : stats)
    if (s.calls > 0) out[axis] = {{"wait_ms", s.wait_s * 1e3}, {"busy_ms", s.busy_s * 1e3}};
  return out;
}

// The measured bubble explained (parallel::pp::explain_bubble) from each stage's measured
// forward, backward and W times per micro-batch (-1s where the simulator fails).
json bubble_parts_json(Run& run, double measured) {
  namespace pp = parallel::pp;
  const pp::PassCosts& stages = run.pipeline->times().stages;
  pp::BubbleParts parts;
  if (!pp::explain_bubble(run.layout.schedule, run.mesh_shape.pp, run.shape.A, run.layout.chunks(), stages, measured, &parts).is_ok())
    parts = {-1, -1, -1};
  auto ms = [](std::vector<double> x) {
    for (double& e : x) e *= 1e3;
    return x;
  };
  return {{"bubble_parts", {{"schedule", parts.schedule}, {"imbalance", parts.imbalance}, {"overhead", parts.overhead}}},
          {"pp_stage_ms", {{"forward", ms(stages.forward)}, {"backward", ms(stages.backward)}, {"weight", ms(stages.weight)}}}};
}

// The step's measured pipeline bubble over the pp group: idle time inside the pipeline
// window of every stage over the window (see PipelineTimes), next to the schedule's own
// bubble from the simulator with the backward costing twice the forward (split in equal
// halves under a zero-bubble schedule), and the measured bubble's parts.
json pipeline_json(Run& run) {
  if (!run.pipeline) return json::object();
  const auto& t = run.pipeline->times();
  double sums[2] = {t.compute_s, t.window_s};
  run.mesh->pp().all_reduce_f64(sums, 2, comm::ReduceOp::kSum);
  parallel::pp::SimResult sim;
  const Status simulated = parallel::pp::simulate(run.layout.schedule, run.mesh_shape.pp, run.shape.A,
                                                  run.layout.chunks(), 1.0, 2.0, &sim);
  const double bubble = sums[1] > 0 ? 1.0 - sums[0] / sums[1] : 0.0;
  json out = {{"bubble", bubble},
              {"bubble_theory", simulated.is_ok() ? sim.bubble_fraction : -1.0},
              {"pp_compute_ms", t.compute_s * 1e3},
              {"pp_window_ms", t.window_s * 1e3},
              {"pp_peak_sets", t.peak_sets}};
  out.update(bubble_parts_json(run, bubble));
  return out;
}

// Every MoE layer's statistics from the ranks that run it, counted once per tp group (its
// ranks route alike) and summed over dp.
MoeJobStats moe_job_stats(Run& run, comm::Group& world) {
  const model::GptConfig& c = run.config;
  if (!c.is_moe()) return {};
  MoeJobStats out;
  const int E = out.experts = c.moe.experts, fields = 3 + 2 * E;
  out.table.assign((size_t)c.layers * fields, 0.0);
  if (run.mesh->tp_rank() == 0)
    for (int l = 0; l < c.layers; l++) {
      const model::MoeRouteStats& s = run.gpt->moe_stats()[l];
      if (s.tokens.empty()) continue;  // dense, or not on this rank
      double* row = out.table.data() + (size_t)l * fields;
      row[0] = s.aux, row[1] = s.z, row[2] = (double)s.dropped;
      for (int e = 0; e < E; e++) row[3 + e] = (double)s.tokens[e], row[3 + E + e] = (double)s.chosen[e];
    }
  world.all_reduce_f64(out.table.data(), out.table.size(), comm::ReduceOp::kSum);
  return out;
}

// The balance losses as they enter the objective (means over sequences and tokens, summed
// over layers), the tokens per expert over all (layer, expert) pairs, and the share of
// assignments dropped.
json moe_json(Run& run, const MoeJobStats& stats) {
  const model::GptConfig& c = run.config;
  if (!c.is_moe()) return json::object();
  const int E = c.moe.experts;
  const double sequences = run.shape.G(), tokens = sequences * run.shape.T;
  double aux = 0, z = 0, dropped = 0, lo = INFINITY, hi = 0, cv = 0;
  for (int l = 0; l < c.layers; l++) {
    if (!c.is_moe_layer(l)) continue;
    const double* row = stats.at(l);
    aux += row[0] / sequences, z += row[1] / tokens, dropped += row[2];
    double mean = 0, var = 0;
    for (int e = 0; e < E; e++) mean += row[3 + e] / E, lo = std::min(lo, row[3 + e]), hi = std::max(hi, row[3 + e]);
    for (int e = 0; e < E; e++) var += (row[3 + e] - mean) * (row[3 + e] - mean) / E;
    cv = std::max(cv, mean > 0 ? std::sqrt(var) / mean : 0.0);
  }
  const double assignments = tokens * c.moe.top_k * c.moe_layers();
  int64_t sent = 0, received = 0;  // this rank's, as its comm bytes are
  for (const model::MoeRouteStats& s : run.gpt->moe_stats()) sent += s.sent_rows, received += s.received_rows;
  json moe = {{"aux_loss", aux}, {"z_loss", z}, {"dropped_fraction", dropped / assignments},
              {"tokens_per_expert", {{"min", lo}, {"max", hi}, {"cv", cv}}},
              {"sent_rows", sent}, {"received_rows", received}};
  if (run.gpt->moe_training().bias_speed > 0) {
    const std::vector<float>& bias = run.gpt->moe_bias();
    float blo = INFINITY, bhi = -INFINITY;
    for (int l = 0; l < c.layers; l++)
      for (int e = 0; e < E && c.is_moe_layer(l); e++) blo = std::min(blo, bias[(size_t)l * E + e]), bhi = std::max(bhi, bias[(size_t)l * E + e]);
    moe["expert_bias"] = {{"min", blo}, {"max", bhi}};
  }
  return {{"moe", moe}};
}

void update_expert_biases(Run& run, const MoeJobStats& stats) {
  const model::GptConfig& c = run.config;
  const float speed = run.gpt->moe_training().bias_speed;
  if (!c.is_moe() || speed <= 0) return;
  std::vector<float>& bias = run.gpt->moe_bias();
  for (int l = 0; l < c.layers; l++)
    if (c.is_moe_layer(l))
      model::update_expert_bias(stats.at(l) + 3 + c.moe.experts, c.moe.experts, speed,
                              bias.data() + (size_t)l * c.moe.experts);
}

// Collective: world rank 0 gets every rank's peak memory by category, and the pipeline's
// split and last measured bubble.
std::vector<std::string> summary_lines(Run& run, comm::Group& world, const json& pipeline) {
  constexpr int kFields = 8;
  const MemStats m = MemoryTracker::instance().stats();
  std::vector<double> all((size_t)world.size() * kFields, 0.0);
  double* mine = all.data() + (size_t)world.rank() * kFields;
  auto peak = [&](MemCategory c) { return (double)m.peak[(int)c]; };
  const double other = peak(MemCategory::kComm) + peak(MemCategory::kGathered) + peak(MemCategory::kWorkspace);
  const double row[kFields] = {(double)run.mesh->tp_rank(), (double)run.mesh->pp_rank(),
                               (double)run.mesh->dp_rank(), peak(MemCategory::kParams),
                               peak(MemCategory::kGrads), peak(MemCategory::kOptim),
                               peak(MemCategory::kActivations) + other, (double)m.total_peak};
  std::copy(row, row + kFields, mine);
  world.all_reduce_f64(all.data(), all.size(), comm::ReduceOp::kSum);
  if (!run.is_main) return {};
  const double mib = 1024.0 * 1024.0;
  std::vector<std::string> lines = {
      "peak memory per rank (MiB): params, grads, optimizer state, activations + buffers, total"};
  for (int r = 0; r < world.size(); r++) {
    const double* f = all.data() + (size_t)r * kFields;
    const std::string cp = run.mesh_shape.cp > 1
                               ? formatted(" cp %d", comm::Mesh::coordinates(r, run.mesh_shape).cp)
                               : std::string();
    lines.push_back(formatted(
        "  rank %2d %s(tp %d pp %d dp %d%s) | params %8.2f | grads %8.2f | optim %8.2f | acts+buf %8.2f | total %8.2f",
        r, run.hosts.size() > 1 && run.hosts.front() != run.hosts.back() ? ("on " + run.hosts[r] + " ").c_str() : "",
        (int)f[0], (int)f[1], (int)f[2], cp.c_str(), f[3] / mib, f[4] / mib, f[5] / mib, f[6] / mib, f[7] / mib));
  }
  if (!run.pipeline) return lines;
  std::string split;
  for (int n : run.stage_layers) {
    if (!split.empty()) split += ',';
    split += std::to_string(n);
  }
  const json parts = pipeline.value("bubble_parts", json::object());
  lines.push_back(formatted("pipeline: %s, %d stages of layers %s, m=%d micro-batches | bubble (last step) measured %.3f = "
                            "schedule %.3f + stage imbalance %.3f + overhead %.3f (at the measured stage costs; theory %.3f)",
                            parallel::pp::schedule_name(run.layout.schedule), (int)run.stage_layers.size(), split.c_str(),
                            run.shape.A, pipeline.value("bubble", 0.0), parts.value("schedule", 0.0),
                            parts.value("imbalance", 0.0), parts.value("overhead", 0.0),
                            pipeline.value("bubble_theory", 0.0)));
  return lines;
}

std::vector<std::string> gather_host_names(comm::Group& world) {
  constexpr size_t kChars = 64;  // a longer name is cut: it only labels reports
  std::vector<double> all((size_t)world.size() * kChars, 0.0);
  const std::string mine = host_name().substr(0, kChars);
  for (size_t i = 0; i < mine.size(); i++) all[(size_t)world.rank() * kChars + i] = (unsigned char)mine[i];
  world.all_reduce_f64(all.data(), all.size(), comm::ReduceOp::kSum);
  std::vector<std::string> names(world.size());
  for (int r = 0; r < world.size(); r++)
    for (size_t i = 0; i < kChars && all[r * kChars + i] != 0; i++) names[r] += (char)all[r * kChars + i];
  return names;
}

namespace {
// The axes whose links straggler_json compares, in a fixed order every rank shares.
constexpr const char* kLinkAxes[] = {"tp", "dp", "pp", "ep", "edp"};
constexpr int kLinkFields = 1 + (int)std::size(kLinkAxes);  // compute, then the best rate per axis
}  // namespace

json straggler_json(Run& run, comm::Group& world, double step_s, double wait_s,
                    const std::map<std::string, comm::AxisStats>& stats) {
  const int n = world.size();
  if (n < 2) return json::object();
  std::vector<double> all((size_t)n * kLinkFields, 0.0);
  double* mine = all.data() + (size_t)world.rank() * kLinkFields;
  mine[0] = std::max(0.0, step_s - wait_s);
  for (size_t a = 0; a < std::size(kLinkAxes); a++)
    if (auto it = stats.find(kLinkAxes[a]); it != stats.end())
      mine[1 + a] = it->second.best_bytes_per_s;
  world.all_reduce_f64(all.data(), all.size(), comm::ReduceOp::kSum);
  if (!run.is_main) return json::object();
  auto at = [&](int r, int f) { return all[(size_t)r * kLinkFields + f]; };
  std::vector<double> compute(n);
  for (int r = 0; r < n; r++) compute[r] = at(r, 0);
  const int slowest = (int)(std::max_element(compute.begin(), compute.end()) - compute.begin());
  std::vector<double> sorted = compute;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[n / 2];
  json out = {{"straggler",
               {{"rank", slowest}, {"host", run.hosts[slowest]}, {"compute_ms", compute[slowest] * 1e3},
                {"behind_ms", (compute[slowest] - median) * 1e3}}}};
  // The slowest link: the (rank, axis) whose best large call was the slowest.
  struct Link { int rank; size_t axis; double gbit_s; };
  std::vector<Link> links;
  for (int r = 0; r < n; r++)
    for (size_t a = 0; a < std::size(kLinkAxes); a++)
      if (at(r, 1 + (int)a) > 0) links.push_back({r, a, at(r, 1 + (int)a) * 8 / 1e9});
  if (links.empty()) return out;
  std::sort(links.begin(), links.end(), [](const Link& x, const Link& y) { return x.gbit_s < y.gbit_s; });
  const Link& worst = links.front();
  out["slowest_link"] = {{"rank", worst.rank}, {"host", run.hosts[worst.rank]}, {"axis", kLinkAxes[worst.axis]},
                         {"gbit_s", worst.gbit_s}, {"median_gbit_s", links[links.size() / 2].gbit_s},
                         {"fastest_gbit_s", links.back().gbit_s}};
  return out;
}

// Every rank writes FILE.rank<N>; world rank 0 merges them into FILE.
Status write_trace(const std::string& file, comm::Group& world) {
  auto& tracer = trace::Tracer::instance();
  const std::string part = file + ".rank" + std::to_string(world.rank());
  Status written = tracer.write(part);
  tracer.disable();
  world.barrier();
  if (world.rank() != 0 || !written.is_ok()) return written;
  std::vector<std::string> parts;
  for (int r = 0; r < world.size(); r++) parts.push_back(file + ".rank" + std::to_string(r));
  RETURN_IF_ERROR(trace::merge_rank_files(parts, file));
  for (const auto& p : parts) fs::remove(p);
  return Status::ok();
}

namespace {

// The banner's notes on how the run communicates and stores its state: compression,
// quantized communication, 2bw's weight versions, what is in files, the curriculum.
void add_layout_notes(const Run& run, std::vector<std::string>* lines) {
  const TrainOptions& o = run.opt;
  auto add = [&](std::string line) { lines->push_back(std::move(line)); };
  const int64_t plain = comm::comm_bytes(comm::CommOp::kAllReduce, run.gpt->layout().total(), run.mesh->dp().size(), 4);
  if (const parallel::CompressedReduction* c = run.dp->compression())
    add(formatted("compression: powersgd rank %d from step %lld: %zu matrices at rank r, %zu elements exact, "
                  "%.2f MB per rank and step (the plain all-reduce: %.2f MB)",
                  o.powersgd_rank, (long long)o.compress_start + 1, c->powersgd().compressed().size(),
                  c->powersgd().exact_elements(), c->wire_bytes() / 1e6, plain / 1e6));
  if (const parallel::OneBitAdam* c = run.dp->onebit_adam())
    add(formatted("compression: 1-bit Adam, variance frozen after step %d: momentum as signs and one scale per "
                  "%zu elements, in chunks of %zu, %.3f MB per rank and step (the plain all-reduce: %.2f MB)%s",
                  o.compress_start, c->scale_block(), c->chunk(), c->wire_bytes() / 1e6, plain / 1e6,
                  o.zero == 1 ? ", plus ZeRO-1's parameter all-gather" : ""));
  if (o.zero_quantized_weights || o.zero_quantized_gradients)
    add(formatted("quantized communication (ZeRO++): %s%s%s as int8 blocks of %zu values with an fp32 scale each%s",
                  o.zero_quantized_weights ? "ZeRO-3's parameter gathers (qwZ)" : "",
                  o.zero_quantized_weights && o.zero_quantized_gradients ? " and " : "",
                  o.zero_quantized_gradients ? "the gradient reduce-scatters (qgZ)" : "", parallel::DpConfig{}.quantized.block,
                  run.mesh->dp().size() == 1 ? " (one data-parallel rank: nothing is sent, nothing quantized)" : ""));
  if (run.start_step > 0 && (run.dp->compression() || run.dp->onebit_adam()))
    add(std::string("compression: ") + (run.rank_arrays_restored
                                            ? "error feedback (and PowerSGD's warm start) restored from the checkpoint"
                                            : "error feedback (and PowerSGD's warm start) restart from zero: the "
                                              "checkpoint holds none for this layout"));
  if (run.dp->keeps_weight_versions())
    add(std::string("2bw: each step computes with the weights before the last update (W(t+1) = W(t) - lr * "
                    "update(grad at W(t-1)))") +
        (run.start_step == 0              ? ""
         : run.previous_weights_restored ? "; the previous version restored from the checkpoint"
                                          : "; the checkpoint holds no previous version: the delay starts "
                                            "again (previous = current)"));
  // What --offload or --memory-budget put in files (rank 0's; every rank alike).
  const optim::ShardStore& store = run.dp->store();
  std::string in_files;
  bool direct = true;
  for (int a = 0; a < optim::kShardArrays; a++)
    if (store.in_file((optim::ShardArray)a)) {
      in_files += std::string(in_files.empty() ? "" : ", ") + optim::shard_array_name((optim::ShardArray)a);
      direct = direct && store.direct_io((optim::ShardArray)a);
    }
  if (!in_files.empty())
    add("in files under " + o.offload_dir + ": " + in_files + " (" + (direct ? "O_DIRECT" : "through the page cache") + ")");
  if (run.curriculum.on()) add("curriculum: " + run.curriculum.describe() + "; LR schedule by " + o.lr_unit);
  if (run.doc_separator >= 0)
    add("document masks: each packed document attends only to itself, positions restart after token " +
        std::to_string(run.doc_separator));
}

}  // namespace

std::vector<std::string> banner_lines(const Run& run) {
  const TrainOptions& o = run.opt;
  const BatchShape& shape = run.shape;
  std::vector<std::string> lines;
  lines.push_back(formatted("model: %s | %d layers, %d heads, dim %d, vocab %d, %.2fM parameters | T=%d B=%d A=%d "
                            "G=%d | %s zero=%d | %s GEMMs | %d threads/rank, peak %.0f GFLOP/s per rank",
                            model::describe_arch(run.config).c_str(), run.config.layers, run.config.heads,
                            run.config.dim, run.config.vocab, model::num_parameters(run.config) / 1e6, shape.T,
                            shape.B, shape.A, shape.G(), run.mesh->shape().to_string().c_str(), o.zero,
                            o.precision.c_str(), run.threads, run.peak_gflops));
  lines.push_back(formatted("machine: %s | %s | oneDNN ISA %s | %s", cpu_info().model.c_str(),
                            cpu_info().flags().c_str(), kernels::onednn_isa_name(),
                            machine::mfu_basis(run.layout.precision).c_str()));
  if (run.train_data.is_mixture())
    lines.push_back(formatted("data: a mixture of %s (by rows; realised over the run's %lld steps: %s)",
                              o.data_dir.c_str(), (long long)o.steps,
                              data::describe_shares(run.train_data, o.steps, shape.G()).c_str()));
  if (run.start_step > 0)
    lines.push_back(formatted("resumed at step %lld from a checkpoint written at %s (re-sliced to this layout where "
                              "it differs)%s",
                              (long long)run.start_step, run.resumed_layout.c_str(),
                              run.resume_note.empty() ? "" : ("; " + run.resume_note).c_str()));
  add_layout_notes(run, &lines);
  return lines;
}

json offload_json(optim::ShardStore& store) {
  // Every file-backed array of this rank's shard: the optimizer's streaming and ZeRO-3's
  // per-unit reads and writes. Exposed: what compute waited for; hidden: the rest.
  const optim::OffloadStats st = store.stats();
  bool direct = true;
  json arrays = json::array();
  for (int a = 0; a < optim::kShardArrays; a++)
    if (store.in_file((optim::ShardArray)a)) {
      arrays.push_back(optim::shard_array_name((optim::ShardArray)a));
      direct = direct && store.direct_io((optim::ShardArray)a);
    }
  auto io_json = [](const optim::IoStats& s) {
    return json{{"read_bytes", s.bytes_read}, {"written_bytes", s.bytes_written},
                {"io_ms", s.io_s * 1e3}, {"wait_ms", s.wait_s * 1e3},
                {"hidden_ms", std::max(0.0, s.io_s - s.wait_s) * 1e3}};
  };
  json off = io_json(st);
  off["units"] = io_json(st.by[(int)optim::Traffic::kUnits]);
  off["update"] = io_json(st.by[(int)optim::Traffic::kUpdate]);
  off["direct_io"] = direct;
  off["arrays"] = arrays;
  store.reset_stats();
  return off;
}

}  // namespace meshtrain::train
