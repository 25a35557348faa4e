#include "planner/cluster_file.h"

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <map>
#include <string_view>
#include <vector>

#include "core/toml_parse.h"

namespace meshtrain::planner {

namespace {

// The nested tables and the field each of their keys sets (cluster_fields() names).
struct TableKey {
  const char* table;  // dotted path of the table
  const char* key;
  const char* field;
};
constexpr TableKey kTableKeys[] = {
    {"hosts", "count", "nodes"},
    {"hosts", "ranks_per_host", "gpus_per_node"},
    {"hosts", "nics_per_host", "nics_per_node"},
    {"links.intra_host", "bandwidth_gbs", "intra_node_gbps"},
    {"links.intra_host", "latency_us", "intra_node_latency_us"},
    {"links.inter_host", "bandwidth_gbs", "inter_node_gbps"},
    {"links.inter_host", "latency_us", "inter_node_latency_us"},
    {"links.inter_host", "reduce_scatter_gbs", "inter_node_reduce_scatter_gbps"},
    {"links.inter_host", "all_gather_gbs", "inter_node_all_gather_gbps"},
    // The local predictor's calibration (configs/clusters/presets/local.toml).
    {"calibration", "memory_gbps", "cpu_memory_gbps"},
    {"calibration", "gelu_forward_s", "cpu_gelu_forward_s"},
    {"calibration", "gelu_backward_s", "cpu_gelu_backward_s"},
    {"calibration", "cross_entropy_forward_s", "cpu_cross_entropy_forward_s"},
    {"calibration", "cross_entropy_backward_s", "cpu_cross_entropy_backward_s"},
    {"calibration", "sum_of_squares_s", "cpu_sum_of_squares_s"},
    {"calibration", "onebit_compress_s", "cpu_onebit_compress_s"},
    {"calibration", "onebit_decompress_s", "cpu_onebit_decompress_s"},
    {"calibration", "int8_quantize_s", "cpu_int8_quantize_s"},
    {"calibration", "int8_dequantize_s", "cpu_int8_dequantize_s"},
    {"calibration", "attention_forward_element_s", "cpu_attention_forward_element_s"},
    {"calibration", "attention_backward_element_s", "cpu_attention_backward_element_s"},
    {"calibration", "attention_backward_block_s", "cpu_attention_backward_block_s"},
    {"calibration.cached", "all_reduce_gbps", "cpu_cached_all_reduce_gbps"},
    {"calibration.cached", "reduce_scatter_gbps", "cpu_cached_reduce_scatter_gbps"},
    {"calibration.cached", "all_gather_gbps", "cpu_cached_all_gather_gbps"},
    {"calibration.cold", "all_reduce_gbps", "cpu_cold_all_reduce_gbps"},
    {"calibration.cold", "reduce_scatter_gbps", "cpu_cold_reduce_scatter_gbps"},
    {"calibration.cold", "all_gather_gbps", "cpu_cold_all_gather_gbps"},
};

// One value the file sets: the field, its text, and where it was written ("memory_gb",
// "[links.inter_host] latency_us").
struct Item {
  std::string field, value, written;
};

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// A value as the field setter takes it: numbers as text, strings as they are; anything else
// (booleans, arrays, tables, dates) is an error naming where it was written.
Status value_text(const toml::node& node, const std::string& written, const std::string& path, std::string* out) {
  if (auto v = node.value_exact<int64_t>()) return *out = std::to_string(*v), Status::ok();
  if (auto v = node.value_exact<double>()) return *out = number_text(*v), Status::ok();
  if (auto v = node.value_exact<std::string>()) return *out = *v, Status::ok();
  return Status::error("key " + written + " in " + path + " takes one number or string");
}

std::string known_tables() {
  std::string s;
  for (const TableKey& k : kTableKeys)
    if (s.find(std::string("[") + k.table + "]") == std::string::npos) s += (s.empty() ? "" : ", ") + std::string("[") + k.table + "]";
  return s;
}

// The inter-host link's rates by message size, an array of tables:
//   [[links.inter_host.by_size]]
//   bytes = 262144
//   all_reduce_gbs = 0.109
//   reduce_scatter_gbs = 0.076   # optional (0 or absent: all_reduce_gbs)
//   all_gather_gbs = 0.074       # optional
// Each entry's keys are checked here; the curve's order and ranges by validate().
Status read_rate_curve(const toml::array& entries, const std::string& path, std::vector<LinkRate>* out) {
  const std::string where = "cluster file " + path + ": [[links.inter_host.by_size]]";
  for (size_t i = 0; i < entries.size(); i++) {
    const toml::table* entry = entries[i].as_table();
    const std::string at = where + " entry " + std::to_string(i + 1);
    if (!entry) return Status::error(at + " is not a table");
    LinkRate rate;
    for (const auto& [key_node, node] : *entry) {
      const std::string key(key_node.str());
      double* field = key == "bytes"                ? &rate.bytes
                      : key == "all_reduce_gbs"     ? &rate.all_reduce
                      : key == "reduce_scatter_gbs" ? &rate.reduce_scatter
                      : key == "all_gather_gbs"     ? &rate.all_gather
                                                    : nullptr;
      if (!field)
        return Status::error(at + ": unknown key '" + key + "' (known: bytes, all_reduce_gbs, reduce_scatter_gbs, all_gather_gbs)");
      const auto v = node.value<double>();  // integers too
      if (!v) return Status::error(at + ": '" + key + "' takes a number");
      *field = key == "bytes" ? *v : *v * 1e9;
    }
    if (rate.bytes == 0 || rate.all_reduce == 0) return Status::error(at + " needs 'bytes' and 'all_reduce_gbs'");
    out->push_back(rate);
  }
  return Status::ok();
}

// Flattens the file into items: top-level keys as they are, the nested tables' keys to their
// fields (the inter-host rate curve into `curve`). Unknown tables and table keys are errors
// naming them.
Status flatten(const toml::table& table, const std::string& prefix, const std::string& path, std::vector<Item>* out,
               std::vector<LinkRate>* curve) {
  for (const auto& [key_node, node] : table) {
    const std::string key(key_node.str());
    if (const toml::table* sub = node.as_table()) {
      const std::string name = prefix.empty() ? key : prefix + "." + key;
      bool known = false;
      for (const TableKey& k : kTableKeys)
        known |= name == k.table || std::string_view(k.table).starts_with(name + ".");
      if (!known) return Status::error("cluster file " + path + ": unknown table [" + name + "] (known: " + known_tables() + ")");
      RETURN_IF_ERROR(flatten(*sub, name, path, out, curve));
      continue;
    }
    if (prefix == "links.inter_host" && key == "by_size") {
      const toml::array* entries = node.as_array();
      if (!entries) return Status::error("cluster file " + path + ": [links.inter_host] by_size must be an array of tables ([[links.inter_host.by_size]])");
      RETURN_IF_ERROR(read_rate_curve(*entries, path, curve));
      continue;
    }
    Item item{key, "", key};
    if (!prefix.empty()) {
      const TableKey* found = nullptr;
      std::string keys;
      for (const TableKey& k : kTableKeys)
        if (prefix == k.table) {
          if (key == k.key) found = &k;
          keys += (keys.empty() ? "" : ", ") + std::string(k.key);
        }
      if (prefix == "links.inter_host") keys += ", by_size";
      item.written = "[" + prefix + "] " + key;
      if (!found)
        return Status::error("cluster file " + path + ": unknown key '" + key + "' in [" + prefix + "]" +
                             (keys.empty() ? "" : " (known: " + keys + ")"));
      item.field = found->field;
    }
    RETURN_IF_ERROR(value_text(node, "'" + item.written + "'", path, &item.value));
    out->push_back(item);
  }
  return Status::ok();
}

// Cluster files are ASCII text: toml++ 3.3.0 reaches unreachable branches (undefined
// behaviour) on some control characters (a NUL after a value) and on some non-ASCII code
// points (its whitespace table), both found by fuzz_cluster_file, so both are refused here,
// by line, before it sees them. TOML forbids the control characters anyway (tab excepted).
Status check_characters(const std::string& text, const std::string& path) {
  int line = 1;
  for (unsigned char ch : text) {
    if (ch == '\n') line++;
    if ((ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch >= 0x7f) {
      char code[8];
      std::snprintf(code, sizeof code, "0x%02x", ch);
      return Status::error("cluster file " + path + " (line " + std::to_string(line) + "): byte " + code +
                           (ch >= 0x80 ? " is not ASCII (cluster files are ASCII text)" : " is a control character"));
    }
  }
  return Status::ok();
}

Status no_local_base(const std::string& name, Cluster* out) { return cluster_preset(name, out); }

// A file's items, checked for keys set twice, and its rate curve.
struct FileItems {
  std::vector<Item> items;
  std::vector<LinkRate> curve;
  std::map<std::string, std::string> written;  // field -> where it was set
};

Status read_items(const std::string& text, const std::string& path, FileItems* out) {
  RETURN_IF_ERROR(check_characters(text, path));
  toml::table table;
  RETURN_IF_ERROR(parse_toml(text, "cluster file " + path, &table));
  RETURN_IF_ERROR(flatten(table, "", path, &out->items, &out->curve));
  for (const Item& item : out->items)
    if (auto [it, fresh] = out->written.emplace(item.field, item.written); !fresh)
      return Status::error(it->second == item.written
                               ? "key '" + item.written + "' is set twice in " + path
                               : "'" + item.field + "' is set twice in " + path + ": as '" + it->second + "' and as '" +
                                     item.written + "'");
  return Status::ok();
}

// Sets every item but `base` on *c, then the rate curve.
Status apply_items(const FileItems& f, const std::string& path, Cluster* c) {
  for (const Item& item : f.items) {
    if (item.field == "base") continue;
    const std::string where = item.written == item.field ? path : path + " (" + item.written + ")";
    RETURN_IF_ERROR(set_cluster_field(item.field, item.value, where, c));
  }
  if (!f.curve.empty()) c->inter.by_size = f.curve;
  return Status::ok();
}

}  // namespace

Status parse_cluster_toml(const std::string& text, const std::string& path, Cluster* out, const BaseLookup& lookup) {
  FileItems f;
  RETURN_IF_ERROR(read_items(text, path, &f));
  // The base first, whatever its position in the file.
  Cluster c;
  const auto base = std::find_if(f.items.begin(), f.items.end(), [](const Item& i) { return i.field == "base"; });
  if (base != f.items.end()) {
    RETURN_IF_ERROR((lookup ? lookup : no_local_base)(base->value, &c).with_context(path + ": 'base'"));
  } else {
    c.name = std::filesystem::path(path).stem().string();
  }
  RETURN_IF_ERROR(apply_items(f, path, &c));
  if (base == f.items.end()) {
    std::string missing;
    for (const ClusterField& field : cluster_fields())
      if (!field.optional && !f.written.count(field.key)) missing += (missing.empty() ? "" : ", ") + std::string(field.key);
    if (!missing.empty()) return Status::error("cluster file " + path + " has no 'base' preset and lacks: " + missing);
  }
  RETURN_IF_ERROR(validate(c).with_context(path));
  *out = c;
  return Status::ok();
}

Status apply_cluster_toml(const std::string& text, const std::string& path, Cluster* c) {
  FileItems f;
  RETURN_IF_ERROR(read_items(text, path, &f));
  for (const Item& item : f.items)
    if (item.field == "base") return Status::error("cluster file " + path + " sets 'base', which it cannot here");
  Cluster updated = *c;
  RETURN_IF_ERROR(apply_items(f, path, &updated));
  *c = updated;
  return Status::ok();
}

}  // namespace meshtrain::planner
