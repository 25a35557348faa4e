#include "checkpoint/checkpoint_index.h"
#include "model/config_json.h"

#include <climits>
#include <cstdio>
#include <set>
#include <tuple>

#include "parallel/shard_layout.h"

namespace meshtrain::checkpoint {

namespace {

using nlohmann::json;

// Far beyond any model, and small enough that every element count and byte count derived
// from the shape fits in 64 bits.
constexpr __int128 kMaxParameters = (__int128)1 << 48;

// ---- Typed fields ------------------------------------------------------------------------
// `where` names a value by its path in the document ("files[2].bytes") in messages.

// A value for a message: its JSON text, cut short.
std::string shown(const json& j) {
  std::string s = j.dump();
  return s.size() <= 40 ? s : s.substr(0, 37) + "...";
}

std::string field(const std::string& where, const char* key) { return where.empty() ? key : where + "." + key; }

Status need_object(const json& j, const std::string& where) {
  if (j.is_object()) return Status::ok();
  return Status::error((where.empty() ? std::string("the index") : where) + " is not an object: " + shown(j));
}

Status need_array(const json& j, const std::string& where) {
  if (j.is_array()) return Status::ok();
  return Status::error(where + " is not an array: " + shown(j));
}

// The member `key` of object `obj` (which the caller checked is an object).
Status member(const json& obj, const std::string& where, const char* key, const json** out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::error(field(where, key) + " is missing");
  *out = &*it;
  return Status::ok();
}

// The integer j holds, when it is one within [lo, hi] (JSON floats, strings and booleans
// are not integers here).
bool as_int(const json& j, int64_t lo, int64_t hi, int64_t* out) {
  int64_t v = 0;
  if (j.is_number_unsigned()) {
    const uint64_t u = j.get<uint64_t>();
    if (u > (uint64_t)INT64_MAX) return false;
    v = (int64_t)u;
  } else if (j.is_number_integer()) {
    v = j.get<int64_t>();
  } else {
    return false;
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

Status int_value(const json& j, const std::string& where, int64_t lo, int64_t hi, int64_t* out) {
  if (as_int(j, lo, hi, out)) return Status::ok();
  return Status::error(where + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                       "], got " + shown(j));
}

Status int_field(const json& obj, const std::string& where, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  const json* v = nullptr;
  RETURN_IF_ERROR(member(obj, where, key, &v));
  return int_value(*v, field(where, key), lo, hi, out);
}

Status int_field(const json& obj, const std::string& where, const char* key, int lo, int hi, int* out) {
  int64_t v = 0;
  RETURN_IF_ERROR(int_field(obj, where, key, (int64_t)lo, (int64_t)hi, &v));
  *out = (int)v;
  return Status::ok();
}

// A field older writers left out, read as `fallback` when absent.
Status optional_int_field(const json& obj, const std::string& where, const char* key, int fallback, int lo, int hi,
                          int* out) {
  if (!obj.contains(key)) return *out = fallback, Status::ok();
  return int_field(obj, where, key, lo, hi, out);
}

Status uint_field(const json& obj, const std::string& where, const char* key, uint64_t* out) {
  const json* v = nullptr;
  RETURN_IF_ERROR(member(obj, where, key, &v));
  if (!v->is_number_unsigned())
    return Status::error(field(where, key) + " must be a non-negative integer, got " + shown(*v));
  *out = v->get<uint64_t>();
  return Status::ok();
}

Status string_field(const json& obj, const std::string& where, const char* key, std::string* out) {
  const json* v = nullptr;
  RETURN_IF_ERROR(member(obj, where, key, &v));
  if (!v->is_string()) return Status::error(field(where, key) + " must be a string, got " + shown(*v));
  *out = v->get<std::string>();
  return Status::ok();
}

Status expect_equal(const std::string& where, uint64_t got, uint64_t want, const char* what) {
  if (got == want) return Status::ok();
  return Status::error(where + " is " + std::to_string(got) + ", but " + what + " " + std::to_string(want));
}

// ---- The document ------------------------------------------------------------------------

Status check_format(const json& root, const std::string& path, int* version) {
  const auto format = root.find("format");
  if (format == root.end() || *format != "meshtrain-checkpoint")
    return Status::error(path + " is not a meshtrain checkpoint index");
  const auto v = root.find("version");
  int64_t got = 0;
  if (v == root.end() || !as_int(*v, 2, kCheckpointFormatVersion, &got))
    return Status::error(path + " has checkpoint format version " + (v == root.end() ? "(none)" : shown(*v)) +
                         ", this build reads version " + std::to_string(kCheckpointFormatVersion));
  *version = (int)got;
  return Status::ok();
}

// The parameters the layout would hold, padded vocabulary included, without overflow.
__int128 parameter_count(const model::GptConfig& c) {
  const __int128 C = c.dim, L = c.layers, Q = (__int128)c.dim + 2 * (__int128)c.kv_head_count() * c.head_dim();
  const __int128 F = c.ffn(), Fc = c.mlp == model::Mlp::kSwiGlu ? 2 * F : F;
  const __int128 per_layer = Q * C + C * C + Fc * C + F * C + 4 * C + Q + Fc + 2 * C;  // biases and norms at most
  // Every layer counted as an MoE layer too (at most): the router and every expert.
  const __int128 Fe = c.expert_ffn(), Fce = c.mlp == model::Mlp::kSwiGlu ? 2 * Fe : Fe;
  const __int128 moe = c.is_moe() ? ((__int128)c.moe.experts + c.moe.shared_experts) * (Fce + Fe) * C + c.moe.experts * C : 0;
  return (__int128)c.padded_vocab() * C * 2 + (__int128)c.max_seq_len * C + L * (per_layer + moe) + 2 * C;
}

Status parse_layout_axes(const json& root, const CheckpointIndex& idx, int* tp, int* pp, int* dp) {
  RETURN_IF_ERROR(optional_int_field(root, "", "tp_size", 1, 1, INT_MAX, tp));
  RETURN_IF_ERROR(optional_int_field(root, "", "pp_size", 1, 1, INT_MAX, pp));
  RETURN_IF_ERROR(int_field(root, "", "dp_size", 1, INT_MAX, dp));
  RETURN_IF_ERROR(model::validate_tp(idx.model, *tp).with_context("tp_size " + std::to_string(*tp)));
  const json* files = nullptr;
  RETURN_IF_ERROR(member(root, "", "files", &files));
  RETURN_IF_ERROR(need_array(*files, "files"));
  const __int128 slices = (__int128)*tp * *pp * *dp;
  if (slices != (__int128)files->size())
    return Status::error("files lists " + std::to_string(files->size()) + " shard files, but dp_size " +
                         std::to_string(*dp) + " x tp_size " + std::to_string(*tp) + " x pp_size " +
                         std::to_string(*pp) + " slices need one each");
  return Status::ok();
}

// The unit table: each entry the model's unit split over dp_size ranks (an expert's over
// dp_size / ep_size).
Status check_units(const json& root, const WriterLayout& writers) {
  const json* units = nullptr;
  RETURN_IF_ERROR(member(root, "", "units", &units));
  RETURN_IF_ERROR(need_array(*units, "units"));
  if (units->size() != writers.units().size())
    return Status::error("units has " + std::to_string(units->size()) + " entries, but the model has " +
                         std::to_string(writers.units().size()) + " units (layers + 2, and an MoE layer's experts)");
  for (size_t u = 0; u < units->size(); u++) {
    const std::string where = "units[" + std::to_string(u) + "]";
    const json& j = (*units)[u];
    const parallel::UnitShard& want = writers.units()[u];
    uint64_t offset = 0, numel = 0, shard = 0;
    RETURN_IF_ERROR(need_object(j, where));
    RETURN_IF_ERROR(uint_field(j, where, "offset", &offset));
    RETURN_IF_ERROR(uint_field(j, where, "numel", &numel));
    RETURN_IF_ERROR(uint_field(j, where, "shard", &shard));
    RETURN_IF_ERROR(expect_equal(where + ".offset", offset, want.global_offset, "the model's unit starts at"));
    RETURN_IF_ERROR(expect_equal(where + ".numel", numel, want.numel, "the model's unit has"));
    RETURN_IF_ERROR(expect_equal(where + ".shard", shard, want.shard, "split over dp_size ranks it is"));
  }
  return Status::ok();
}

Status check_tensor(const json& j, const std::string& where, const model::ParamTensor& want) {
  RETURN_IF_ERROR(need_object(j, where));
  std::string name;
  RETURN_IF_ERROR(string_field(j, where, "name", &name));
  if (name != want.name)
    return Status::error(where + ".name is \"" + name + "\", but the model's tensor there is \"" + want.name + "\"");
  const json* shape = nullptr;
  RETURN_IF_ERROR(member(j, where, "shape", &shape));
  RETURN_IF_ERROR(need_array(*shape, where + ".shape"));
  std::vector<int64_t> dims;
  for (size_t d = 0; d < shape->size(); d++) {
    int64_t v = 0;
    RETURN_IF_ERROR(int_value((*shape)[d], where + ".shape[" + std::to_string(d) + "]", 0, INT64_MAX, &v));
    dims.push_back(v);
  }
  if (dims != want.shape)
    return Status::error(where + ".shape " + shown(*shape) + " is not the model's " + json(want.shape).dump());
  uint64_t offset = 0;
  RETURN_IF_ERROR(uint_field(j, where, "offset", &offset));
  return expect_equal(where + ".offset", offset, want.offset, "the model's tensor starts at");
}

Status check_tensors(const json& root, const model::ParamLayout& layout) {
  uint64_t total = 0;
  RETURN_IF_ERROR(uint_field(root, "", "total_elements", &total));
  RETURN_IF_ERROR(expect_equal("total_elements", total, layout.total(), "the model has"));
  const json* tensors = nullptr;
  RETURN_IF_ERROR(member(root, "", "tensors", &tensors));
  RETURN_IF_ERROR(need_array(*tensors, "tensors"));
  if (tensors->size() != layout.tensors().size())
    return Status::error("tensors has " + std::to_string(tensors->size()) + " entries, but the model has " +
                         std::to_string(layout.tensors().size()));
  for (size_t i = 0; i < tensors->size(); i++)
    RETURN_IF_ERROR(check_tensor((*tensors)[i], "tensors[" + std::to_string(i) + "]", layout.tensors()[i]));
  return Status::ok();
}

// The loader reads every shard as params, then m, then v, then (when written) the
// previous weight version.
Status check_sections(const json& root, int* count) {
  const json* sections = nullptr;
  RETURN_IF_ERROR(member(root, "", "shard_sections", &sections));
  for (int n = kNumSections; n <= kMaxSections; n++)
    if (*sections == json(std::vector<std::string>(kSectionNames, kSectionNames + n))) {
      *count = n;
      return Status::ok();
    }
  const json want = json(std::vector<std::string>(kSectionNames, kSectionNames + kNumSections));
  return Status::error("shard_sections is " + shown(*sections) + ", but the loader reads " + want.dump() +
                       ", optionally followed by \"" + kSectionNames[kPreviousSection] + "\"");
}

// ---- Shard files -------------------------------------------------------------------------

Status parse_file_units(const json& j, const std::string& where, int version, int num_units, IndexFile* f) {
  const auto units = j.find("units");
  if (units == j.end()) {
    if (version >= 3) return Status::error(where + ".units is missing");
    for (int u = 0; u < num_units; u++) f->units.push_back(u);  // version 2: every unit
    return Status::ok();
  }
  RETURN_IF_ERROR(need_array(*units, where + ".units"));
  for (size_t i = 0; i < units->size(); i++) {
    const int lo = f->units.empty() ? 0 : f->units.back() + 1;  // ascending, as written
    int64_t u = 0;
    if (!as_int((*units)[i], lo, num_units - 1, &u))
      return Status::error(where + ".units[" + std::to_string(i) + "] must be a unit id in [" + std::to_string(lo) +
                           ", " + std::to_string(num_units - 1) + "] (ascending), got " + shown((*units)[i]));
    f->units.push_back((int)u);
  }
  return Status::ok();
}

Status check_checksum(const std::string& where, const std::string& checksum) {
  bool hex = checksum.size() == 16;
  for (char c : checksum) hex = hex && ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'));
  if (hex) return Status::ok();
  return Status::error(where + ".checksum \"" + checksum + "\" is not 16 hex digits");
}

// The writer's coordinates; version 2 files may lack tp and pp (0) and call dp "rank".
Status parse_file_coordinates(const json& j, const std::string& where, const CheckpointIndex& idx, IndexFile* f) {
  const bool old = idx.version < 3;
  if (old) {
    RETURN_IF_ERROR(optional_int_field(j, where, "tp", 0, 0, idx.tp_size - 1, &f->tp));
    RETURN_IF_ERROR(optional_int_field(j, where, "pp", 0, 0, idx.pp_size - 1, &f->pp));
    return int_field(j, where, j.contains("dp") || !j.contains("rank") ? "dp" : "rank", 0, idx.dp_size - 1, &f->dp);
  }
  RETURN_IF_ERROR(int_field(j, where, "tp", 0, idx.tp_size - 1, &f->tp));
  RETURN_IF_ERROR(int_field(j, where, "pp", 0, idx.pp_size - 1, &f->pp));
  return int_field(j, where, "dp", 0, idx.dp_size - 1, &f->dp);
}

Status parse_file(const json& j, const std::string& where, const CheckpointIndex& idx,
                  const WriterLayout& writers, IndexFile* f) {
  RETURN_IF_ERROR(need_object(j, where));
  RETURN_IF_ERROR(parse_file_coordinates(j, where, idx, f));
  // The name the writer gives: also keeps a corrupt index from pointing outside the folder.
  RETURN_IF_ERROR(string_field(j, where, "name", &f->name));
  const std::string want = shard_file_name(idx.tp_size, f->tp, idx.pp_size, f->pp, f->dp);
  if (f->name != want)
    return Status::error(where + ".name \"" + f->name + "\" is not the writer's \"" + want + "\"");
  RETURN_IF_ERROR(parse_file_units(j, where, idx.version, (int)writers.units().size(), f));
  RETURN_IF_ERROR(uint_field(j, where, "bytes", &f->bytes));
  uint64_t elements = 0;
  for (int u : f->units) elements += writers.own_end(u, f->dp) - writers.own_begin(u, f->dp);
  const std::string what = "its units' owned elements in " + std::to_string(idx.sections) + " fp32 sections take";
  RETURN_IF_ERROR(expect_equal(where + ".bytes", f->bytes, elements * idx.sections * sizeof(float), what.c_str()));
  RETURN_IF_ERROR(string_field(j, where, "checksum", &f->checksum));
  return check_checksum(where, f->checksum);
}

// Every element has a file: each (tp, dp) slice's files together hold every unit that
// has elements at that dp rank.
Status check_coverage(const CheckpointIndex& idx, const WriterLayout& writers) {
  const size_t n_units = writers.units().size();
  std::vector<std::vector<bool>> held((size_t)idx.tp_size * idx.dp_size, std::vector<bool>(n_units, false));
  for (const IndexFile& f : idx.files)
    for (int u : f.units) held[(size_t)f.tp * idx.dp_size + f.dp][u] = true;
  for (int t = 0; t < idx.tp_size; t++)
    for (int d = 0; d < idx.dp_size; d++)
      for (size_t u = 0; u < n_units; u++)
        if (!held[(size_t)t * idx.dp_size + d][u] && writers.own_end((int)u, d) > writers.own_begin((int)u, d))
          return Status::error("no file holds unit " + std::to_string(u) + " of tp rank " + std::to_string(t) +
                               ", dp rank " + std::to_string(d));
  return Status::ok();
}

Status parse_files(const json& root, const WriterLayout& writers, CheckpointIndex* idx) {
  const json& files = root.at("files");  // an array of the right length: parse_layout_axes
  std::set<std::tuple<int, int, int>> seen;
  for (size_t i = 0; i < files.size(); i++) {
    IndexFile f;
    const std::string where = "files[" + std::to_string(i) + "]";
    RETURN_IF_ERROR(parse_file(files[i], where, *idx, writers, &f));
    if (!seen.insert({f.tp, f.pp, f.dp}).second)
      return Status::error(where + " repeats the slice tp " + std::to_string(f.tp) + ", pp " + std::to_string(f.pp) +
                           ", dp " + std::to_string(f.dp));
    idx->files.push_back(std::move(f));
  }
  return check_coverage(*idx, writers);
}

Status check_train_state(const json& root) {
  const auto ts = root.find("train_state");
  if (ts == root.end() || ts->is_object()) return Status::ok();
  return Status::error("train_state is not an object: " + shown(*ts));
}

// Everything after the format and version: the problem, without the file's name.
Status parse_fields(const json& root, CheckpointIndex* idx) {
  RETURN_IF_ERROR(int_field(root, "", "step", 0, INT64_MAX, &idx->step));
  RETURN_IF_ERROR(index_model_config(root, "", &idx->model));
  RETURN_IF_ERROR(parse_layout_axes(root, *idx, &idx->tp_size, &idx->pp_size, &idx->dp_size));
  RETURN_IF_ERROR(optional_int_field(root, "", "ep_size", 1, 1, idx->dp_size, &idx->ep_size));
  // The writers' layout against the model: the engine's own rules (parallel/layout.h).
  for (const auto& e : parallel::validate(idx->writers(), parallel::layout_model(idx->model), parallel::LayoutReader::kEngine))
    return Status::error("the writers' layout (tp_size " + std::to_string(idx->tp_size) + ", pp_size " +
                         std::to_string(idx->pp_size) + ", dp_size " + std::to_string(idx->dp_size) + ", ep_size " +
                         std::to_string(idx->ep_size) + ") is not one: " + e.reason);
  // The layout below has `layers` blocks: the unit table's length bounds them first.
  const json* units = nullptr;
  RETURN_IF_ERROR(member(root, "", "units", &units));
  RETURN_IF_ERROR(need_array(*units, "units"));
  const size_t n_units = (size_t)idx->model.layers + 2 + (size_t)idx->model.moe_layers() * idx->model.moe.experts;
  if (units->size() != n_units)
    return Status::error("units has " + std::to_string(units->size()) + " entries, but the model has " +
                         std::to_string(n_units) + " units (layers + 2, and an MoE layer's experts)");
  RETURN_IF_ERROR(optional_int_field(root, "", "expert_tp", idx->tp_size, 1, idx->tp_size, &idx->expert_tp));
  if (idx->expert_tp != 1 && idx->expert_tp != idx->tp_size)
    return Status::error("expert_tp " + std::to_string(idx->expert_tp) + " must be 1 or tp_size " +
                         std::to_string(idx->tp_size));
  const model::ParamLayout whole(idx->model, idx->tp_size, 0, {}, 1, 0, idx->expert_layout());
  const WriterLayout writers(whole, idx->dp_size, idx->ep_size);
  RETURN_IF_ERROR(check_units(root, writers));
  RETURN_IF_ERROR(check_tensors(root, whole));
  RETURN_IF_ERROR(check_sections(root, &idx->sections));
  RETURN_IF_ERROR(parse_files(root, writers, idx));
  return check_train_state(root);
}

}  // namespace

WriterLayout::WriterLayout(const model::ParamLayout& whole, int dp, int ep)
    : dp_(dp), ep_(ep), experts_per_rank_(1),
      shards_(whole, dp, 0, 1, [dp, ep](const model::ParamUnit& u) {
        return u.expert >= 0 ? parallel::UnitPartition{dp / ep, 0} : parallel::UnitPartition{dp, 0};
      }) {
  int experts = 0;
  for (const auto& u : whole.units()) expert_.push_back(u.expert), experts = std::max(experts, u.expert + 1);
  experts_per_rank_ = std::max(1, experts / ep);
}

int WriterLayout::shard_of(int u, int d) const {
  if (expert_[u] < 0) return d;
  return d % ep_ == expert_[u] / experts_per_rank_ ? d / ep_ : -1;
}

size_t WriterLayout::own_begin(int u, int d) const {
  const int s = shard_of(u, d);
  return s < 0 ? shards_.units()[u].global_offset : shards_.own_begin(u, s);
}

size_t WriterLayout::own_end(int u, int d) const {
  const int s = shard_of(u, d);
  return s < 0 ? shards_.units()[u].global_offset : shards_.own_end(u, s);
}

std::string shard_file_name(int tp, int tp_rank, int pp, int pp_rank, int dp_rank) {
  std::string name = "shard_";
  char buf[32];
  if (tp > 1) std::snprintf(buf, sizeof buf, "tp%02d_", tp_rank), name += buf;
  if (pp > 1) std::snprintf(buf, sizeof buf, "pp%02d_", pp_rank), name += buf;
  std::snprintf(buf, sizeof buf, "%05d.bin", dp_rank);
  return name + buf;
}

Status index_model_config(const json& index, const std::string& where, model::GptConfig* config) {
  RETURN_IF_ERROR(need_object(index, where));
  const json* m = nullptr;
  RETURN_IF_ERROR(member(index, where, "model", &m));
  const std::string at = field(where, "model");
  RETURN_IF_ERROR(need_object(*m, at));
  model::GptConfig c;
  RETURN_IF_ERROR(int_field(*m, at, "layers", 1, INT_MAX, &c.layers));
  RETURN_IF_ERROR(int_field(*m, at, "heads", 1, INT_MAX, &c.heads));
  RETURN_IF_ERROR(int_field(*m, at, "dim", 1, INT_MAX, &c.dim));
  RETURN_IF_ERROR(int_field(*m, at, "max_seq_len", 1, INT_MAX, &c.max_seq_len));
  RETURN_IF_ERROR(int_field(*m, at, "vocab", 1, INT_MAX, &c.vocab));
  RETURN_IF_ERROR(model::read_architecture(*m, at, &c));  // absent parts: GPT-2's (older indexes)
  RETURN_IF_ERROR(model::validate(c).with_context(at));
  if (parameter_count(c) > kMaxParameters) return Status::error(at + " " + index.at("model").dump() + " is implausibly large");
  *config = c;
  return Status::ok();
}

Status parse_checkpoint_index(const std::string& text, const std::string& path, CheckpointIndex* out) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::error(path + " is corrupt: not valid JSON");
  if (!root.is_object()) return Status::error(path + " is corrupt: not a JSON object");
  CheckpointIndex idx;
  RETURN_IF_ERROR(check_format(root, path, &idx.version));
  Status s = parse_fields(root, &idx);
  if (!s.is_ok()) return Status::error(path + " is corrupt: " + s.message());
  idx.json = std::move(root);
  *out = std::move(idx);
  return Status::ok();
}

}  // namespace meshtrain::checkpoint
