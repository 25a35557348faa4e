#include "planner/cluster.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <type_traits>

#include "core/text.h"
#include "planner/cluster_file.h"

namespace meshtrain::planner {

double GemmEfficiency::at(double m, double n, double k) const {
  const double d = std::min({m, n, k});
  return d <= 0 ? 0 : max_fraction * d / (d + half_dim);
}

namespace {

constexpr double kGB = 1e9, kTFLOPS = 1e12, kUs = 1e-6;

// One entry per file key: the field it sets (an lvalue expression on a Cluster), and the
// file's unit as a factor to SI.
struct FieldSpec {
  ClusterField doc;
  double scale;
  bool whole;  // an integer field
  double (*get)(const Cluster&);
  void (*set)(Cluster*, double);
  bool optional = false;  // doc.optional
};

#define FIELD(key, unit, help, scale, field)                                              \
  FieldSpec {                                                                             \
    {key, unit, help}, scale, std::is_integral_v<decltype(Cluster::field)>,               \
        [](const Cluster& c) { return (double)c.field; },                                 \
        [](Cluster* c, double v) { c->field = static_cast<decltype(Cluster::field)>(v); } \
  }

FieldSpec optional_field(FieldSpec s) {
  s.optional = s.doc.optional = true;
  return s;
}

const std::vector<FieldSpec>& specs() {
  // clang-format off
  static const std::vector<FieldSpec> s = {
      FIELD("peak_tflops_bf16", "TFLOP/s", "dense bf16/fp16 tensor-core peak per GPU", kTFLOPS, peak_flops_16),
      FIELD("peak_tflops_fp32", "TFLOP/s", "fp32 peak per GPU", kTFLOPS, peak_flops_32),
      FIELD("memory_gb", "GB", "HBM per GPU", kGB, memory_bytes),
      FIELD("hbm_gbps", "GB/s", "HBM bandwidth per GPU", kGB, hbm_bandwidth),
      FIELD("gpus_per_node", "", "GPUs sharing the intra-node link", 1, gpus_per_node),
      FIELD("intra_node_gbps", "GB/s", "intra-node (NVLink) bandwidth per GPU, one direction", kGB, intra.bandwidth),
      FIELD("intra_node_latency_us", "us", "intra-node latency per ring step", kUs, intra.latency),
      FIELD("inter_node_gbps", "GB/s", "inter-node (InfiniBand) bandwidth per GPU, one direction", kGB, inter.bandwidth),
      FIELD("inter_node_latency_us", "us", "inter-node latency per ring step", kUs, inter.latency),
      FIELD("gemm_max_fraction", "", "GEMM efficiency: asymptotic fraction of peak", 1, gemm.max_fraction),
      FIELD("gemm_half_dim", "", "GEMM efficiency: smallest dimension at half of gemm_max_fraction", 1, gemm.half_dim),
      FIELD("hbm_efficiency", "", "achieved fraction of HBM bandwidth in memory-bound kernels", 1, hbm_efficiency),
      FIELD("link_efficiency", "", "achieved fraction of link bandwidth in collectives", 1, link_efficiency),
      FIELD("reserved_gb", "GB", "memory per GPU not available to the model", kGB, reserved_bytes),
      optional_field(FIELD("nics_per_node", "", "NICs per node sharing the inter-node traffic (0: one per GPU)", 1, nics_per_node)),
      optional_field(FIELD("nodes", "", "nodes (hosts) in the cluster (0: as many as a layout needs)", 1, nodes)),
      optional_field(FIELD("inter_node_reduce_scatter_gbps", "GB/s", "inter-node reduce-scatter bus bandwidth, where it differs (0: inter_node_gbps)", kGB, inter.reduce_scatter_bandwidth)),
      optional_field(FIELD("inter_node_all_gather_gbps", "GB/s", "inter-node all-gather bus bandwidth, where it differs (0: inter_node_gbps)", kGB, inter.all_gather_bandwidth)),
      // The local predictor's calibration ([calibration] in a file; SI seconds per element).
      optional_field(FIELD("cpu_memory_gbps", "GB/s", "CPU: bytes read + written per second by one thread", kGB, cpu.memory_bandwidth)),
      optional_field(FIELD("cpu_gelu_forward_s", "s", "CPU: GELU forward per element", 1, cpu.gelu_forward_s)),
      optional_field(FIELD("cpu_gelu_backward_s", "s", "CPU: GELU backward per element", 1, cpu.gelu_backward_s)),
      optional_field(FIELD("cpu_cross_entropy_forward_s", "s", "CPU: cross-entropy forward per logit", 1, cpu.cross_entropy_forward_s)),
      optional_field(FIELD("cpu_cross_entropy_backward_s", "s", "CPU: cross-entropy backward per logit", 1, cpu.cross_entropy_backward_s)),
      optional_field(FIELD("cpu_sum_of_squares_s", "s", "CPU: the gradient norm's fp64 sum per element", 1, cpu.sum_of_squares_s)),
      optional_field(FIELD("cpu_onebit_compress_s", "s", "CPU: 1-bit compression per element", 1, cpu.onebit_compress_s)),
      optional_field(FIELD("cpu_onebit_decompress_s", "s", "CPU: 1-bit expansion per element", 1, cpu.onebit_decompress_s)),
      optional_field(FIELD("cpu_int8_quantize_s", "s", "CPU: int8-block quantization per element", 1, cpu.int8_quantize_s)),
      optional_field(FIELD("cpu_int8_dequantize_s", "s", "CPU: int8-block decoding per element", 1, cpu.int8_dequantize_s)),
      optional_field(FIELD("cpu_attention_forward_element_s", "s", "CPU: fused attention forward per score element", 1, cpu.attention_forward_element_s)),
      optional_field(FIELD("cpu_attention_backward_element_s", "s", "CPU: fused attention backward per score element", 1, cpu.attention_backward_element_s)),
      optional_field(FIELD("cpu_attention_backward_block_s", "s", "CPU: fused attention backward per query block", 1, cpu.attention_backward_block_s)),
      optional_field(FIELD("cpu_cached_all_reduce_gbps", "GB/s", "CPU ranks: shared-memory all-reduce bus bandwidth, cached data", kGB, cpu.cached.all_reduce)),
      optional_field(FIELD("cpu_cached_reduce_scatter_gbps", "GB/s", "CPU ranks: shared-memory reduce-scatter bus bandwidth, cached data", kGB, cpu.cached.reduce_scatter)),
      optional_field(FIELD("cpu_cached_all_gather_gbps", "GB/s", "CPU ranks: shared-memory all-gather bus bandwidth, cached data", kGB, cpu.cached.all_gather)),
      optional_field(FIELD("cpu_cold_all_reduce_gbps", "GB/s", "CPU ranks: shared-memory all-reduce bus bandwidth, cold buffers", kGB, cpu.cold.all_reduce)),
      optional_field(FIELD("cpu_cold_reduce_scatter_gbps", "GB/s", "CPU ranks: shared-memory reduce-scatter bus bandwidth, cold buffers", kGB, cpu.cold.reduce_scatter)),
      optional_field(FIELD("cpu_cold_all_gather_gbps", "GB/s", "CPU ranks: shared-memory all-gather bus bandwidth, cold buffers", kGB, cpu.cold.all_gather)),
  };
  // clang-format on
  return s;
}
#undef FIELD

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

// The range of one field's value (SI units): an error naming the key, or OK.
Status check_field(const FieldSpec& s, double v) {
  const std::string key = s.doc.key;
  const bool fraction = key == "gemm_max_fraction" || key == "hbm_efficiency" || key == "link_efficiency";
  const bool may_be_zero = key.ends_with("latency_us") || key == "reserved_gb" || s.optional;
  if (!std::isfinite(v) || v < 0 || (v == 0 && !may_be_zero))
    return Status::error("'" + key + "' must be " + (may_be_zero ? ">= 0" : "> 0") + ", got " + num(v / s.scale));
  if (fraction && v > 1) return Status::error("'" + key + "' is a fraction in (0, 1], got " + num(v));
  if (s.whole && v > 1e6) return Status::error("'" + key + "' must be at most 1e6, got " + num(v));
  return Status::ok();
}

}  // namespace

Status builtin_cluster_text(const std::string& name, std::string* text) {
  std::string known;
  for (const BuiltinClusterFile& f : builtin_cluster_files()) {
    if (name == f.name) return *text = f.text, Status::ok();
    known += (known.empty() ? "" : ", ") + std::string(f.name);
  }
  return Status::error("no built-in cluster file '" + name + "' (known: " + known + ")");
}

namespace {

// A preset read from its built-in file, its `base` another preset (no cache: a base is
// parsed as the file that names it is).
Status parse_preset(const std::string& name, Cluster* out) {
  const std::vector<std::string> names = cluster_preset_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    return Status::error("unknown cluster preset '" + name + "' (known: " + known + ")");
  }
  std::string text;
  RETURN_IF_ERROR(builtin_cluster_text(name, &text));
  return parse_cluster_toml(text, "configs/clusters/presets/" + name + ".toml (built in)", out, parse_preset);
}

}  // namespace

Status cluster_preset(const std::string& name, Cluster* out) {
  // Parsed once each: a search asks for its cluster once, tests many times.
  static const std::map<std::string, std::pair<Status, Cluster>> presets = [] {
    std::map<std::string, std::pair<Status, Cluster>> all;
    for (const std::string& n : cluster_preset_names()) {
      Cluster c;
      Status s = parse_preset(n, &c);
      all.emplace(n, std::make_pair(s, c));
    }
    return all;
  }();
  const auto it = presets.find(name);
  if (it == presets.end()) return parse_preset(name, out);  // its error
  RETURN_IF_ERROR(it->second.first);
  *out = it->second.second;
  return Status::ok();
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  for (const BuiltinClusterFile& f : builtin_cluster_files())
    if (std::string(f.name) != "local") names.push_back(f.name);
  return names;
}

const std::vector<ClusterField>& cluster_fields() {
  static const std::vector<ClusterField> fields = [] {
    std::vector<ClusterField> f;
    for (const FieldSpec& s : specs()) f.push_back(s.doc);
    return f;
  }();
  return fields;
}

Status set_cluster_field(const std::string& key, const std::string& value, const std::string& where, Cluster* c) {
  const std::string at = "'" + key + "' in " + where;
  if (key == "name") {
    if (value.empty()) return Status::error(at + " must not be empty");
    c->name = value;
    return Status::ok();
  }
  const FieldSpec* spec = nullptr;
  for (const FieldSpec& s : specs())
    if (key == s.doc.key) spec = &s;
  if (!spec) {
    std::string best;
    size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
    for (const FieldSpec& s : specs())
      if (size_t d = edit_distance(key, s.doc.key); d < best_d) best = s.doc.key, best_d = d;
    return Status::error("unknown key '" + key + "' in " + where +
                         (best.empty() ? "" : " (did you mean '" + best + "'?)"));
  }
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || errno != 0 || !std::isfinite(v))
    return Status::error(at + " must be a number" +
                         (spec->doc.unit[0] ? std::string(" (") + spec->doc.unit + ")" : "") + ", got '" + value + "'");
  if (spec->whole && v != std::floor(v)) return Status::error(at + " must be a whole number, got '" + value + "'");
  RETURN_IF_ERROR(check_field(*spec, v * spec->scale).with_context(where));
  spec->set(c, v * spec->scale);
  return Status::ok();
}

namespace {

double fixed_rate(const Link& l, Link::Collective c) {
  switch (c) {
    case Link::Collective::kReduceScatter: return l.reduce_scatter();
    case Link::Collective::kAllGather: return l.all_gather();
    default: return l.bandwidth;
  }
}

double point_rate(const LinkRate& p, Link::Collective c) {
  const double r = c == Link::Collective::kReduceScatter ? p.reduce_scatter
                   : c == Link::Collective::kAllGather   ? p.all_gather
                                                         : 0;
  return r > 0 ? r : p.all_reduce;
}

Status check_rate_curve(const std::vector<LinkRate>& curve) {
  for (size_t i = 0; i < curve.size(); i++) {
    const LinkRate& p = curve[i];
    const std::string at = "[[links.inter_host.by_size]] entry " + std::to_string(i + 1);
    if (!std::isfinite(p.bytes) || p.bytes < 1)
      return Status::error(at + ": 'bytes' must be a message size of at least 1, got " + num(p.bytes));
    if (i > 0 && p.bytes <= curve[i - 1].bytes)
      return Status::error(at + ": sizes must be ascending, but " + num(p.bytes) + " follows " + num(curve[i - 1].bytes));
    if (!std::isfinite(p.all_reduce) || p.all_reduce <= 0)
      return Status::error(at + ": 'all_reduce_gbs' must be > 0, got " + num(p.all_reduce / kGB));
    for (double r : {p.reduce_scatter, p.all_gather})
      if (!std::isfinite(r) || r < 0)
        return Status::error(at + ": 'reduce_scatter_gbs' and 'all_gather_gbs' must be >= 0 (0: all_reduce_gbs), got " +
                             num(r / kGB));
  }
  return Status::ok();
}

}  // namespace

double Link::rate(Collective c, double message_bytes) const {
  if (by_size.empty()) return fixed_rate(*this, c);
  if (message_bytes <= by_size.front().bytes) return point_rate(by_size.front(), c);
  if (message_bytes >= by_size.back().bytes) return point_rate(by_size.back(), c);
  size_t i = 1;
  while (by_size[i].bytes < message_bytes) i++;
  const LinkRate &a = by_size[i - 1], &b = by_size[i];
  const double f = std::log(message_bytes / a.bytes) / std::log(b.bytes / a.bytes);
  return point_rate(a, c) + f * (point_rate(b, c) - point_rate(a, c));
}

Status validate(const Cluster& c) {
  for (const FieldSpec& s : specs()) RETURN_IF_ERROR(check_field(s, s.get(c)));
  RETURN_IF_ERROR(check_rate_curve(c.inter.by_size));
  if (c.reserved_bytes >= c.memory_bytes)
    return Status::error("'reserved_gb' (" + num(c.reserved_bytes / kGB) + ") must be below 'memory_gb' (" +
                         num(c.memory_bytes / kGB) + ")");
  return Status::ok();
}

}  // namespace meshtrain::planner
