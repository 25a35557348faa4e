#include "checkpoint/checkpoint.h"
#include "model/config_json.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <atomic>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "checkpoint/byte_source.h"
#include "checkpoint/tp_reslice.h"
#include "core/check.h"
#include "core/file_io.h"
#include "core/memory.h"

namespace meshtrain::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The sections a rank's shard file holds: params, m, v, and the previous weight version
// when the run keeps one.
int sections_of(const RankState& st) { return st.with_previous ? kMaxSections : kNumSections; }

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", (long long)step);
  return buf;
}

json model_json(const model::GptConfig& c) { return model::config_json(c); }

// Whether a section's buffer is indexed by global offset (else by the shard's local one);
// the previous weight version is always whole.
bool section_full(const RankState& st, int kind) {
  return kind == 0 ? st.params_full : kind == kPreviousSection || st.moments_full;
}

// Where unit u's owned slice of one kind of state sits in its buffer (element offset).
size_t owned_offset(const RankState& st, const parallel::ShardLayout& shards, int kind, int u) {
  const bool full = section_full(st, kind);
  return full ? shards.own_begin(u) : shards.units()[u].local_offset;
}

// Offloaded sections move through a buffer of this many elements (4 MiB).
constexpr size_t kPieceElements = 1 << 20;

float* section_base(const RankState& st, int kind) {
  return kind == 0 ? st.params : kind == 1 ? st.m : kind == 2 ? st.v : st.previous;
}

// Writes this rank's shard file (owned slices of params, then m, then v, unit by unit)
// straight from the state's buffers, or through state.read in pieces of at most 4 MiB for
// sections that are not in memory, so a checkpoint needs no copy of the shard. Returns the
// file's byte count and checksum.
Status write_shard(const std::string& path, const RankState& state, const parallel::ShardLayout& shards,
                   uint64_t* bytes, uint64_t* checksum) {
  size_t elements = 0;
  for (int u = 0; u < (int)shards.units().size(); u++) elements += shards.own_end(u) - shards.own_begin(u);
  *bytes = (uint64_t)(sections_of(state) * elements * sizeof(float));
  Checksum64 sum(*bytes);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return Status::error("cannot create " + path + ": " + std::strerror(errno));
  constexpr size_t kPiece = kPieceElements;
  Buffer<float> piece;
  Status s;
  auto put = [&](const float* data, size_t n) {
    if (s.is_ok()) s = write_all(fd, data, n * sizeof(float));
    sum.update(data, n * sizeof(float));
  };
  for (int kind = 0; kind < sections_of(state) && s.is_ok(); kind++)
    for (int u = 0; u < (int)shards.units().size(); u++) {
      const size_t offset = owned_offset(state, shards, kind, u);
      const size_t n = shards.own_end(u) - shards.own_begin(u);
      if (float* base = section_base(state, kind)) {
        put(base + offset, n);
        continue;
      }
      CHECK_MSG(state.read, "checkpoint: a section has neither memory nor a reader");
      if (piece.empty()) piece.allocate(MemCategory::kWorkspace, kPiece);
      for (size_t i = 0; i < n; i += kPiece) {
        const size_t c = std::min(kPiece, n - i);
        state.read(kind, offset + i, c, piece.data());
        put(piece.data(), c);
      }
    }
  if (s.is_ok() && ::fsync(fd) != 0) s = Status::error("syncing " + path + ": " + std::strerror(errno));
  if (::close(fd) != 0 && s.is_ok()) s = Status::error("closing " + path + ": " + std::strerror(errno));
  *checksum = sum.finish();
  return s.is_ok() ? Status::ok() : Status::error("writing " + path + ": " + s.message());
}

void remove_old_checkpoints(const fs::path& root, int keep) {
  if (keep <= 0) return;
  std::vector<fs::path> dirs;
  for (auto& e : fs::directory_iterator(root)) {
    auto name = e.path().filename().string();
    if (e.is_directory() && name.starts_with("step_") && !name.ends_with(".tmp"))
      dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  for (size_t i = 0; i + keep < dirs.size(); i++) fs::remove_all(dirs[i]);
}

// Every rank learns every shard's size and checksum (64-bit checksums travel as four
// exact 16-bit pieces in doubles).
std::vector<std::pair<uint64_t, uint64_t>> exchange_file_info(comm::Group& dp, uint64_t bytes,
                                                              uint64_t checksum) {
  const int n = dp.size();
  std::vector<double> info((size_t)n * 5, 0.0);
  double* mine = info.data() + (size_t)dp.rank() * 5;
  mine[0] = (double)bytes;
  for (int i = 0; i < 4; i++) mine[1 + i] = (double)((checksum >> (16 * i)) & 0xFFFF);
  dp.all_reduce_f64(info.data(), info.size(), comm::ReduceOp::kSum);
  std::vector<std::pair<uint64_t, uint64_t>> out(n);
  for (int r = 0; r < n; r++) {
    uint64_t c = 0;
    for (int i = 0; i < 4; i++) c |= (uint64_t)info[(size_t)r * 5 + 1 + i] << (16 * i);
    out[r] = {(uint64_t)info[(size_t)r * 5], c};
  }
  return out;
}

json units_json(const WriterLayout& shards) {
  json out = json::array();
  for (const auto& u : shards.units())
    out.push_back({{"offset", u.global_offset}, {"numel", u.numel}, {"shard", u.shard}});
  return out;
}

// A failed save's error: what failed, and which checkpoint a --resume would now use.
Status not_saved(int64_t step, const std::string& out_dir, const Status& why) {
  std::string newest;
  const Status found = find_latest_checkpoint(out_dir, &newest);
  return Status::error("checkpoint of step " + std::to_string(step) + " not saved: " + why.message() +
                       (found.is_ok() ? "; the newest complete checkpoint, " + newest + ", is intact"
                                      : "; there is no earlier checkpoint"));
}

// Copies this rank's shard, in write_shard's order, into memory: the snapshot an
// asynchronous save writes while training changes the state.
Buffer<float> snapshot_shard(const RankState& state, const parallel::ShardLayout& shards) {
  size_t elements = 0;
  for (int u = 0; u < (int)shards.units().size(); u++) elements += shards.own_end(u) - shards.own_begin(u);
  Buffer<float> out(MemCategory::kWorkspace, sections_of(state) * elements);
  float* at = out.data();
  for (int kind = 0; kind < sections_of(state); kind++)
    for (int u = 0; u < (int)shards.units().size(); u++) {
      const size_t offset = owned_offset(state, shards, kind, u);
      const size_t n = shards.own_end(u) - shards.own_begin(u);
      if (const float* base = section_base(state, kind))
        std::copy(base + offset, base + offset + n, at);
      else
        state.read(kind, offset, n, at);
      at += n;
    }
  return out;
}

}  // namespace

// A save between its start (every rank together) and its commit: the staged folder, what
// every rank holds, this rank's write (done at once, or by `writer` from `snapshot`).
struct PendingSave {
  std::string out_dir;
  int64_t step = 0;
  int keep = 2;
  fs::path root, tmp_dir, final_dir;
  int tp_size = 1, pp_size = 1, stride = 0, n_units = 0;
  std::vector<double> where;  // per world rank: tp, pp, dp rank, then a flag per unit
  json index;                 // everything but "files"
  Buffer<float> snapshot;
  std::thread writer;
  std::atomic<bool> written{false};
  Status write_status;
  Status rank_arrays_status;  // rank_WWWWW.bin, written before begin_save returns
  uint64_t bytes = 0, checksum = 0;

  ~PendingSave() {
    if (writer.joinable()) writer.join();
  }
};

void PendingSaveDeleter::operator()(PendingSave* p) const { delete p; }

namespace {

// Rank 0: the index (with every shard's size and checksum) into the staged folder, then the
// folder into place; older checkpoints beyond `keep` go.
Status write_index_and_rename(PendingSave& p, const std::vector<std::pair<uint64_t, uint64_t>>& info) {
  std::map<std::tuple<int, int, int>, json> by_slice;  // by tp rank, then pp rank, then dp rank
  for (size_t r = 0; r < info.size(); r++) {
    const double* w = p.where.data() + r * p.stride;
    const int t = (int)w[0], pr = (int)w[1], d = (int)w[2];
    json units = json::array();
    for (int u = 0; u < p.n_units; u++)
      if (w[3 + u] > 0) units.push_back(u);
    by_slice.emplace(std::tuple{t, pr, d}, json{{"name", shard_file_name(p.tp_size, t, p.pp_size, pr, d)},
                                                {"tp", t}, {"pp", pr}, {"dp", d}, {"units", units},
                                                {"bytes", info[r].first}, {"checksum", to_hex(info[r].second)}});
  }
  json files = json::array();
  for (auto& [key, f] : by_slice) files.push_back(f);
  json index = p.index;
  index["files"] = files;
  const std::string text = index.dump(1);
  Status result = write_file_synced((p.tmp_dir / "index.json").string(), text.data(), text.size());
  std::error_code ec;
  if (result.is_ok()) {
    fs::remove_all(p.final_dir, ec);
    fs::rename(p.tmp_dir, p.final_dir, ec);
    if (ec) result = Status::error("cannot move checkpoint into place at " + p.final_dir.string());
  }
  if (result.is_ok()) result = fsync_dir(p.root.string());
  if (result.is_ok()) remove_old_checkpoints(p.root, p.keep);
  return result;
}

}  // namespace

namespace {

// rank_WWWWW.bin: a header (magic, element count, checksum of the floats), then the arrays
// back to back.
constexpr uint64_t kRankArraysMagic = 0x3130594152524b52ull;  // "RKRRAY01"

std::string rank_arrays_name(int world_rank) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.bin", world_rank);
  return name;
}

Status write_rank_arrays(const fs::path& dir, int world_rank, const std::vector<std::pair<const float*, size_t>>& arrays) {
  size_t n = 0;
  for (const auto& a : arrays) n += a.second;
  std::vector<uint64_t> blob(3 + (n * sizeof(float) + 7) / 8, 0);
  float* values = reinterpret_cast<float*>(blob.data() + 3);
  for (const auto& [data, count] : arrays) values = std::copy(data, data + count, values);
  blob[0] = kRankArraysMagic, blob[1] = n, blob[2] = checksum64(blob.data() + 3, n * sizeof(float));
  return write_file_synced((dir / rank_arrays_name(world_rank)).string(), blob.data(), 24 + n * sizeof(float));
}

}  // namespace

Status load_rank_arrays(const std::string& dir, int world_rank, const std::vector<std::pair<float*, size_t>>& arrays,
                        bool* loaded) {
  *loaded = false;
  const std::string path = (fs::path(dir) / rank_arrays_name(world_rank)).string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::ok();
  size_t n = 0;
  for (const auto& a : arrays) n += a.second;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec || size != 24 + n * sizeof(float))
    return Status::error(path + ": " + std::to_string(ec ? 0 : size) + " bytes, this rank's state takes " +
                         std::to_string(24 + n * sizeof(float)) + " (written by another layout or model?)");
  std::vector<uint64_t> blob(3 + (n * sizeof(float) + 7) / 8, 0);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::error("cannot open " + path);
  const size_t got = std::fread(blob.data(), 1, 24 + n * sizeof(float), f);
  std::fclose(f);
  if (got != 24 + n * sizeof(float) || blob[0] != kRankArraysMagic || blob[1] != n ||
      blob[2] != checksum64(blob.data() + 3, n * sizeof(float)))
    return Status::error(path + " is damaged (header or checksum)");
  const float* values = reinterpret_cast<const float*>(blob.data() + 3);
  for (const auto& [data, count] : arrays) {
    std::copy(values, values + count, data);
    values += count;
  }
  *loaded = true;
  return Status::ok();
}

Status begin_save(const std::string& out_dir, int64_t step, const model::ParamLayout& layout,
                  const model::GptConfig& config, const parallel::ShardLayout& shards, const RankState& state,
                  comm::Group& world, const json& run_config, int keep, int pp_size, int pp_rank,
                  const json& train_state, bool async, PendingSavePtr* out) {
  PendingSavePtr p(new PendingSave);
  p->out_dir = out_dir, p->step = step, p->keep = keep, p->tp_size = layout.tp(), p->pp_size = pp_size;
  p->root = fs::path(out_dir) / "checkpoints";
  p->final_dir = p->root / step_dir_name(step);
  p->tmp_dir = p->root / (step_dir_name(step) + ".tmp");
  std::error_code ec;
  if (world.rank() == 0) {
    fs::create_directories(p->root, ec);
    fs::remove_all(p->tmp_dir, ec);
    fs::create_directories(p->tmp_dir, ec);
  }
  world.barrier();
  if (!fs::is_directory(p->tmp_dir)) {
    // Rank 0 could not make it: each rank asks the file system itself for the reason.
    fs::create_directories(p->tmp_dir, ec);
    return Status::error("cannot create checkpoint directory " + p->tmp_dir.string() +
                         (ec ? ": " + ec.message() : std::string()));
  }

  // Which slice each world rank writes: (tp rank, pp rank, dp rank) and its units.
  const model::ParamLayout whole(config, layout.tp(), layout.tp_rank(), {}, 1, 0, layout.expert_tp());
  p->n_units = whole.num_units();
  p->stride = 3 + p->n_units;
  p->where.assign((size_t)world.size() * p->stride, 0.0);
  double* mine = p->where.data() + (size_t)world.rank() * p->stride;
  mine[0] = layout.tp_rank(), mine[1] = pp_rank, mine[2] = shards.rank();
  for (const auto& u : layout.units()) mine[3 + u.id] = 1;
  world.all_reduce_f64(p->where.data(), p->where.size(), comm::ReduceOp::kSum);
  json tensors = json::array();
  for (const auto& t : whole.tensors()) tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
  p->index = {{"format", "meshtrain-checkpoint"},
              {"version", kCheckpointFormatVersion},
              {"step", step},
              {"model", model_json(config)},
              {"total_elements", whole.total()},
              {"tensors", tensors},
              {"tp_size", layout.tp()},
              {"pp_size", pp_size},
              {"dp_size", shards.world()},
              {"ep_size", layout.ep()},
              {"expert_tp", layout.experts_replicated() ? 1 : layout.tp()},
              {"units", units_json(WriterLayout(whole, shards.world(), layout.ep()))},
              {"shard_sections", std::vector<std::string>(kSectionNames, kSectionNames + sections_of(state))},
              {"run_config", run_config},
              {"train_state", train_state}};

  if (!state.rank_arrays.empty()) p->rank_arrays_status = write_rank_arrays(p->tmp_dir, world.rank(), state.rank_arrays);
  const std::string path = (p->tmp_dir / shard_file_name(layout.tp(), layout.tp_rank(), pp_size, pp_rank, shards.rank())).string();
  if (!async) {
    p->write_status = write_shard(path, state, shards, &p->bytes, &p->checksum);
    p->written = true;
  } else {
    p->snapshot = snapshot_shard(state, shards);
    PendingSave* raw = p.get();
    p->writer = std::thread([raw, path] {
      const size_t n = raw->snapshot.size();
      raw->bytes = (uint64_t)(n * sizeof(float));
      raw->checksum = checksum64(raw->snapshot.data(), raw->bytes);
      raw->write_status = write_file_synced(path, raw->snapshot.data(), raw->bytes);
      raw->written.store(true, std::memory_order_release);
    });
  }
  *out = std::move(p);
  return Status::ok();
}

Status finish_save(PendingSavePtr* pending, comm::Group& world, bool wait, bool* finished) {
  PendingSave& p = **pending;
  // Every rank decides alike whether the save is ready to commit: all shards written.
  double not_written = p.written.load(std::memory_order_acquire) ? 0.0 : 1.0;
  if (wait && p.writer.joinable()) p.writer.join(), not_written = 0;
  world.all_reduce_f64(&not_written, 1, comm::ReduceOp::kSum);
  *finished = not_written == 0;
  if (!*finished) return Status::ok();
  if (p.writer.joinable()) p.writer.join();
  p.snapshot.release();
  // Taken out of *pending (which is reset, the save being over either way) and freed on
  // return; `p` refers to it until then.
  const PendingSavePtr done = std::move(*pending);
  std::error_code ec;
  // A failed write on any rank fails the checkpoint on every rank (no one waits forever).
  const Status& mine = !p.write_status.is_ok() ? p.write_status : p.rank_arrays_status;
  double failed = mine.is_ok() ? 0.0 : 1.0;
  world.all_reduce_f64(&failed, 1, comm::ReduceOp::kSum);
  if (failed > 0) {
    // The staged folder goes (a full disk gets its space back); the newest complete
    // checkpoint was never touched.
    if (world.rank() == 0) fs::remove_all(p.tmp_dir, ec);
    return not_saved(p.step, p.out_dir, mine.is_ok() ? Status::error("the write failed on another rank") : mine);
  }
  const auto info = exchange_file_info(world, p.bytes, p.checksum);
  Status result = world.rank() == 0 ? write_index_and_rename(p, info) : Status::ok();
  double failed_index = result.is_ok() ? 0.0 : 1.0;
  world.all_reduce_f64(&failed_index, 1, comm::ReduceOp::kSum);
  if (failed_index == 0) return Status::ok();
  if (world.rank() == 0) fs::remove_all(p.tmp_dir, ec);
  return not_saved(p.step, p.out_dir, result.is_ok() ? Status::error("rank 0 could not finish the index") : result);
}

Status save_checkpoint(const std::string& out_dir, int64_t step, const model::ParamLayout& layout,
                       const model::GptConfig& config, const parallel::ShardLayout& shards,
                       const RankState& state, comm::Group& world, const json& run_config,
                       int keep, int pp_size, int pp_rank, const json& train_state) {
  PendingSavePtr pending;
  RETURN_IF_ERROR(begin_save(out_dir, step, layout, config, shards, state, world, run_config, keep, pp_size,
                             pp_rank, train_state, /*async=*/false, &pending));
  bool finished = false;
  return finish_save(&pending, world, /*wait=*/true, &finished);
}

std::vector<std::string> list_checkpoints(const std::string& out_dir) {
  const fs::path root = fs::path(out_dir) / "checkpoints";
  std::vector<std::string> dirs;
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (auto& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (e.is_directory(ec) && name.starts_with("step_") && !name.ends_with(".tmp")) dirs.push_back(e.path().string());
    }
  // step_NNNNNNNN: zero-padded, so the names sort as the steps do.
  std::sort(dirs.begin(), dirs.end(), std::greater<>());
  return dirs;
}

Status find_latest_checkpoint(const std::string& out_dir, std::string* dir, std::string* passed_over) {
  std::string skipped;
  for (const std::string& candidate : list_checkpoints(out_dir)) {
    CheckpointIndex index;
    if (Status s = read_checkpoint_index(candidate, &index); !s.is_ok()) {
      skipped += (skipped.empty() ? "" : "; ") + fs::path(candidate).filename().string() + " is not a complete checkpoint (" +
                 s.message() + ")";
      continue;
    }
    *dir = candidate;
    if (passed_over) *passed_over = skipped;
    return Status::ok();
  }
  return Status::error("no checkpoint found under " + (fs::path(out_dir) / "checkpoints").string() +
                       (skipped.empty() ? "" : " (" + skipped + ")"));
}

Status verify_checkpoint(const std::string& dir, int part, int parts, uint64_t* bytes) {
  CheckpointIndex index;
  RETURN_IF_ERROR(read_checkpoint_index(dir, &index));
  if (bytes) {
    *bytes = 0;
    for (const IndexFile& f : index.files) *bytes += f.bytes;
  }
  for (size_t i = (size_t)part; i < index.files.size(); i += (size_t)parts) {
    const std::string path = (fs::path(dir) / index.files[i].name).string();
    std::shared_ptr<const ByteSource> source;
    RETURN_IF_ERROR(open_file_source(path, &source));
    RETURN_IF_ERROR(check_checksum(*source, index.files[i].checksum, path));
  }
  return Status::ok();
}

namespace {

// The shard files an index lists, against the folder: each present with its recorded size.
Status check_shard_files(const std::string& dir, const CheckpointIndex& index) {
  for (const IndexFile& f : index.files) {
    const std::string path = (fs::path(dir) / f.name).string();
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return Status::error(path + " (listed in index.json) cannot be read: " + ec.message());
    if (size != f.bytes)
      return Status::error(path + " is truncated or has the wrong size (" + std::to_string(size) +
                           " bytes, index says " + std::to_string(f.bytes) + ")");
  }
  return Status::ok();
}

}  // namespace

Status read_checkpoint_index(const std::string& dir, CheckpointIndex* index) {
  std::string text;
  const std::string path = (fs::path(dir) / "index.json").string();
  RETURN_IF_ERROR(read_file(path, &text));
  RETURN_IF_ERROR(parse_checkpoint_index(text, path, index));
  return check_shard_files(dir, *index);
}

Status read_checkpoint_index(const std::string& dir, json* index) {
  CheckpointIndex parsed;
  RETURN_IF_ERROR(read_checkpoint_index(dir, &parsed));
  *index = std::move(parsed.json);
  return Status::ok();
}

Status checkpoint_model_config(const json& index, model::GptConfig* config) {
  return index_model_config(index, "", config).with_context("checkpoint index has no valid model shape");
}

Status load_checkpoint(const std::string& dir, const model::ParamLayout& layout,
                       const model::GptConfig& config, const parallel::ShardLayout& shards,
                       const RankState& state, int64_t* step) {
  CheckpointIndex index;
  RETURN_IF_ERROR(read_checkpoint_index(dir, &index));
  const model::GptConfig& saved = index.model;
  const auto& c = config;
  if (!model::same_model(saved, c)) {
    std::string lines;  // one per field, named by its flag: "--dim 96 differs from the checkpoint's 64"
    for (const std::string& d : model::model_differences(c, saved)) lines += "\n  " + d;
    return Status::error(dir + " holds a model of another shape than this run's:" + lines);
  }
  // The index's unit table matches this model (parse_checkpoint_index compared it); a
  // checkpoint of another tp size or expert layout is re-sliced unit by unit.
  const model::ParamLayout whole(config, layout.tp(), layout.tp_rank(), {}, 1, 0, layout.expert_tp());
  TpResliceReader reader(dir, index, config, whole);
  Buffer<float> piece;  // sections filled through state.write
  const bool previous = state.with_previous && index.sections > kPreviousSection;
  if (state.previous_loaded) *state.previous_loaded = previous;
  for (int kind = 0; kind < (previous ? kMaxSections : kNumSections); kind++) {
    float* base = section_base(state, kind);
    if ((!base && !state.write) || (kind > 0 && state.params_only)) continue;
    const bool full = section_full(state, kind);
    for (int u = 0; u < layout.num_units(); u++) {
      const auto& unit = layout.units()[u];
      // Unit u's elements [begin, end) (all, or the owned shard) go to element `at` onward.
      const size_t begin = full ? 0 : shards.own_begin(u) - unit.offset;
      const size_t end = full ? unit.numel : shards.own_end(u) - unit.offset;
      const size_t at = full ? unit.offset : shards.units()[u].local_offset;
      if (base) {
        RETURN_IF_ERROR(reader.copy(kind, unit.id, begin, end, base + at));
        continue;
      }
      if (piece.empty()) piece.allocate(MemCategory::kWorkspace, kPieceElements);
      for (size_t i = begin; i < end; i += kPieceElements) {
        const size_t c = std::min(kPieceElements, end - i);
        RETURN_IF_ERROR(reader.copy(kind, unit.id, i, i + c, piece.data()));
        state.write(kind, at + (i - begin), c, piece.data());
      }
    }
  }
  *step = index.step;
  return Status::ok();
}

Status load_checkpoint(const std::string& dir, model::Gpt* gpt, float* m, float* v, int64_t* step) {
  CheckpointIndex index;
  RETURN_IF_ERROR(read_checkpoint_index(dir, &index));
  parallel::ShardLayout whole(gpt->layout(), 1, 0);
  RankState st{gpt->params(), true, m, v, true, {}, {}};
  return load_checkpoint(dir, gpt->layout(), gpt->config(), whole, st, step);
}

}  // namespace meshtrain::checkpoint
