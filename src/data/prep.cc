#include "data/prep.h"

#include <omp.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "data/brown.h"
#include "data/dataset.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/tokenizer_files.h"

namespace meshtrain::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------
// Documents, read in order without holding the corpus in memory

struct InputFile {
  std::string path;
  enum Kind { kBrown, kText, kJsonLines } kind;
  size_t documents = 0;
  uint64_t bytes = 0;
};

Status count_json_lines(InputFile* f) {
  std::ifstream in(f->path, std::ios::binary);
  if (!in) return Status::error("cannot read " + f->path + ": " + errno_text());
  std::string line;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) f->documents++;
  return Status::ok();
}

Status list_inputs(const PrepOptions& o, std::vector<InputFile>* files) {
  if (!o.brown_dir.empty() == !o.inputs.empty()) return Status::error("give exactly one of --brown or --input FILE...");
  std::vector<std::string> paths;
  if (!o.brown_dir.empty()) {
    RETURN_IF_ERROR(list_brown_files(o.brown_dir, &paths));
    RETURN_IF_ERROR(filter_brown_categories(o.brown_dir, o.brown_categories, &paths));
  } else {
    paths = o.inputs;
  }
  for (const std::string& p : paths) {
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    if (ec) return Status::error("--input " + p + ": " + ec.message());
    InputFile f{p, !o.brown_dir.empty() ? InputFile::kBrown : p.ends_with(".jsonl") ? InputFile::kJsonLines : InputFile::kText,
                1, uint64_t(size)};
    if (f.kind == InputFile::kJsonLines) {
      f.documents = 0;
      RETURN_IF_ERROR(count_json_lines(&f));
    }
    files->push_back(std::move(f));
  }
  return Status::ok();
}

// Reads the documents of a list of inputs one after another.
class DocumentReader {
 public:
  explicit DocumentReader(const std::vector<InputFile>& files) : files_(files) {}

  // The next document's text; false at the end.
  Status next(std::string* text, bool* got) {
    *got = false;
    while (file_ < files_.size()) {
      const InputFile& f = files_[file_];
      if (f.kind != InputFile::kJsonLines) {
        std::string raw;
        RETURN_IF_ERROR(read_file(f.path, &raw));
        *text = f.kind == InputFile::kBrown ? brown_to_text(raw) : std::move(raw);
        bytes_done_ += f.bytes;
        file_++;
        return *got = true, Status::ok();
      }
      if (!lines_) lines_ = std::make_unique<std::ifstream>(f.path, std::ios::binary), line_ = 0;
      std::string line;
      while (std::getline(*lines_, line)) {
        line_++;
        bytes_done_ += line.size() + 1;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
          return Status::error(f.path + ":" + std::to_string(line_) +
                               ": not a JSON object with a \"text\" string (JSON Lines: one document per line)");
        *text = j["text"].get<std::string>();
        return *got = true, Status::ok();
      }
      lines_.reset();
      file_++;
    }
    return Status::ok();
  }
  uint64_t bytes_done() const { return bytes_done_; }

 private:
  const std::vector<InputFile>& files_;
  size_t file_ = 0;
  std::unique_ptr<std::ifstream> lines_;
  size_t line_ = 0;
  uint64_t bytes_done_ = 0;
};

// ---------------------------------------------------------------------------------
// Writing a split: shards of shard_tokens, each with its documents' offsets

std::string shard_name(const std::string& split, uint64_t shard_tokens, size_t index, const char* ext) {
  if (shard_tokens == 0) return split + ext;
  char name[64];
  std::snprintf(name, sizeof(name), "%s_%06zu%s", split.c_str(), index, ext);
  return name;
}

// Where a prep stands: the next token to write is token `skip` of document `doc`'s pieces.
struct ResumePoint {
  size_t doc = 0;
  uint64_t skip = 0;
};

class SplitWriter {
 public:
  SplitWriter(std::string dir, std::string split, uint64_t shard_tokens)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens) {}

  // Restores the shards an interrupted prep wrote.
  void restore(std::vector<ShardEntry> shards) {
    shards_ = std::move(shards);
    for (const ShardEntry& s : shards_) written_ += s.tokens;
  }
  // Appends a piece of a document (its first token starts the document when `starts`).
  // `on_shard` runs after each full shard with how many of the piece's tokens it holds.
  Status add(const std::vector<int>& ids, size_t from, bool starts,
             const std::function<Status(size_t used)>& on_shard) {
    if (starts) doc_starts_.push_back(written_ + buffer_.size());
    for (size_t i = from; i < ids.size(); i++) {
      buffer_.push_back(Token(ids[i]));
      if (shard_tokens_ > 0 && buffer_.size() == shard_tokens_) {
        RETURN_IF_ERROR(flush());
        RETURN_IF_ERROR(on_shard(i + 1));
      }
    }
    return Status::ok();
  }
  // Writes what is left as the last (shorter) shard.
  Status finish() { return buffer_.empty() && !(shard_tokens_ == 0 && shards_.empty()) ? Status::ok() : flush(); }
  const std::vector<ShardEntry>& shards() const { return shards_; }
  uint64_t tokens() const { return written_ + buffer_.size(); }

 private:
  Status flush() {
    ShardEntry e;
    e.file = shard_name(split_, shard_tokens_, shards_.size(), ".bin");
    e.docs_file = shard_name(split_, shard_tokens_, shards_.size(), ".docs");
    e.tokens = buffer_.size();
    e.documents = doc_starts_.size();
    for (Token t : buffer_) e.max_token = std::max(e.max_token, t);
    const std::string path = (fs::path(dir_) / e.file).string();
    RETURN_IF_ERROR(write_token_file(path, buffer_));
    RETURN_IF_ERROR(shard_checksum(path, &e.checksum));
    const size_t doc_bytes = doc_starts_.size() * sizeof(uint64_t);
    RETURN_IF_ERROR(write_file_synced((fs::path(dir_) / e.docs_file).string(), doc_starts_.data(), doc_bytes));
    e.docs_checksum = to_hex(checksum64(doc_starts_.data(), doc_bytes));
    written_ += buffer_.size();
    buffer_.clear();
    doc_starts_.clear();
    shards_.push_back(std::move(e));
    return Status::ok();
  }

  std::string dir_, split_;
  uint64_t shard_tokens_;
  std::vector<Token> buffer_;
  std::vector<uint64_t> doc_starts_;  // split-wide offsets of documents starting in buffer_
  std::vector<ShardEntry> shards_;
  uint64_t written_ = 0;
};

// ---------------------------------------------------------------------------------
// Resume state

json shards_json(const std::vector<ShardEntry>& shards) {
  json list = json::array();
  for (const ShardEntry& s : shards)
    list.push_back({{"file", s.file}, {"tokens", s.tokens}, {"documents", s.documents}, {"max_token", s.max_token},
                    {"checksum64", s.checksum}, {"docs_file", s.docs_file}, {"docs_checksum64", s.docs_checksum}});
  return list;
}

std::vector<ShardEntry> shards_from(const json& list) {
  std::vector<ShardEntry> shards;
  for (const json& e : list)
    shards.push_back({e.value("file", ""), e.value("tokens", uint64_t(0)), e.value("documents", uint64_t(0)),
                      e.value("max_token", 0u), e.value("checksum64", ""), e.value("docs_file", ""),
                      e.value("docs_checksum64", "")});
  return shards;
}

// What must be equal for a prep to go on from another's state: inputs, tokenizer, options.
json prep_identity(const PrepOptions& o, const std::vector<InputFile>& files, const std::string& tokenizer_fp) {
  json inputs = json::array();
  for (const InputFile& f : files) {
    std::error_code ec;
    const auto mtime = fs::last_write_time(f.path, ec).time_since_epoch().count();
    inputs.push_back({fs::absolute(f.path).lexically_normal().string(), f.bytes, int64_t(mtime)});
  }
  return {{"inputs", inputs},
          {"tokenizer", tokenizer_fp},
          {"shard_tokens", o.shard_tokens},
          {"val_fraction", o.val_fraction}};
}

Status save_state(const std::string& dir, const json& identity, const ResumePoint& at, const SplitWriter& train,
                  const SplitWriter& val) {
  const json state = {{"identity", identity},
                      {"next_document", at.doc},
                      {"skip_tokens", at.skip},
                      {"train", shards_json(train.shards())},
                      {"val", shards_json(val.shards())}};
  const std::string text = state.dump(1) + "\n", path = (fs::path(dir) / kPrepStateFile).string();
  RETURN_IF_ERROR(write_file_synced(path + ".tmp", text.data(), text.size()));
  std::error_code ec;
  fs::rename(path + ".tmp", path, ec);
  if (ec) return Status::error("rename to " + path + " failed: " + ec.message());
  return Status::ok();
}

// The state of an interrupted prep of the same inputs and options, if there is one.
bool load_state(const std::string& dir, const json& identity, json* state) {
  std::string text;
  if (!read_file((fs::path(dir) / kPrepStateFile).string(), &text).is_ok()) return false;
  *state = json::parse(text, nullptr, /*allow_exceptions=*/false);
  return state->is_object() && state->value("identity", json()) == identity;
}

// ---------------------------------------------------------------------------------
// Progress

class Progress {
 public:
  Progress(int mode, uint64_t total_bytes, size_t total_docs)
      : on_(mode == 1 || (mode < 0 && isatty(STDERR_FILENO))), tty_(isatty(STDERR_FILENO)),
        total_bytes_(total_bytes), total_docs_(total_docs), start_(now()) {}
  void update(size_t docs, uint64_t bytes, uint64_t tokens, bool last = false) {
    if (!on_) return;
    const double t = now() - start_;
    if (!last && t - shown_ < (tty_ ? 0.2 : 5.0)) return;
    shown_ = t;
    const double rate = t > 0 ? double(bytes) / t : 0, left = rate > 0 ? double(total_bytes_ - std::min(bytes, total_bytes_)) / rate : 0;
    std::fprintf(stderr, "%sprep: %5.1f%%  %zu/%zu documents  %.1f M tokens  %.1f MB/s  ETA %d:%02d%s",
                 tty_ ? "\r" : "", total_bytes_ ? 100.0 * double(bytes) / double(total_bytes_) : 100.0, docs,
                 total_docs_, double(tokens) / 1e6, rate / 1e6, int(left) / 60, int(left) % 60,
                 tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  bool on_, tty_;
  uint64_t total_bytes_;
  size_t total_docs_;
  double start_, shown_ = -1e9;
};

// A test hook: stop as if killed after this many shards of this run (0: never).
size_t debug_stop_after_shards() {
  const char* v = std::getenv("MESHTRAIN_PREP_STOP_AFTER_SHARDS");
  return v ? size_t(std::strtoull(v, nullptr, 10)) : 0;
}

// The pieces of document d: (split, ids) in order. One document is split by tokens.
struct Piece {
  bool val;
  std::vector<int> ids;
};
std::vector<Piece> pieces_of(std::vector<int> ids, size_t d, size_t n_docs, size_t n_val, double val_fraction) {
  if (n_docs != 1) return {{d + n_val >= n_docs, std::move(ids)}};
  // Tokens after the leading separator, split: train keeps the first part, val the rest
  // behind a separator of its own.
  const size_t body = ids.size() - 1, split = body - size_t(std::floor(double(body) * val_fraction));
  std::vector<Piece> out{{false, std::vector<int>(ids.begin(), ids.begin() + 1 + int64_t(split))}};
  if (split < body) {
    std::vector<int> val{ids[0]};
    val.insert(val.end(), ids.begin() + 1 + int64_t(split), ids.end());
    out.push_back({true, std::move(val)});
  }
  return out;
}

// One prep: the documents read in order, tokenized in batches on the workers, and written
// in order to the two splits.
class Prep {
 public:
  Prep(const PrepOptions& o, const Tokenizer& tok, const std::vector<InputFile>& files, size_t n_docs,
       uint64_t total_bytes, json identity)
      : o_(o), tok_(tok), n_docs_(n_docs), identity_(std::move(identity)), reader_(files),
        progress_(o.progress, total_bytes, n_docs), workers_(o.workers > 0 ? o.workers : omp_get_num_procs()),
        stop_after_(debug_stop_after_shards()), train_(o.out_dir, "train", o.shard_tokens),
        val_(o.out_dir, "val", o.shard_tokens) {
    n_val_ = size_t(std::round(double(n_docs) * o.val_fraction));
    if (o.val_fraction > 0 && n_val_ == 0) n_val_ = 1;
    if (n_docs == 1) n_val_ = 0;
  }

  // Takes up an interrupted prep of the same inputs and options, if the folder holds one.
  bool resume() {
    json state;
    if (o_.shard_tokens == 0 || !load_state(o_.out_dir, identity_, &state)) return false;
    from_ = {state.value("next_document", size_t(0)), state.value("skip_tokens", uint64_t(0))};
    train_.restore(shards_from(state.value("train", json::array())));
    val_.restore(shards_from(state.value("val", json::array())));
    return true;
  }

  Status run() {
    std::vector<std::string> texts;
    for (bool more = true; more;) {
      RETURN_IF_ERROR(read_batch(&texts, &more));
      std::vector<std::vector<int>> ids = tokenize(texts);
      for (size_t i = 0; i < ids.size(); i++, d_++)
        if (d_ >= from_.doc) RETURN_IF_ERROR(write_document(std::move(ids[i])));
      progress_.update(d_, reader_.bytes_done(), train_.tokens() + val_.tokens());
    }
    RETURN_IF_ERROR(train_.finish());
    RETURN_IF_ERROR(val_.finish());
    progress_.update(d_, reader_.bytes_done(), train_.tokens() + val_.tokens(), /*last=*/true);
    return Status::ok();
  }

  const SplitWriter& train() const { return train_; }
  const SplitWriter& val() const { return val_; }
  size_t resumed_at() const { return from_.doc; }

 private:
  // The next documents, up to a batch. Those before the resume point are read (to keep the
  // order) but left empty: they are not tokenized again.
  Status read_batch(std::vector<std::string>* texts, bool* more) {
    constexpr size_t kBatchDocs = 256;
    constexpr uint64_t kBatchBytes = 64ull << 20;
    texts->clear();
    uint64_t bytes = 0;
    while (texts->size() < kBatchDocs && bytes < kBatchBytes) {
      std::string text;
      RETURN_IF_ERROR(reader_.next(&text, more));
      if (!*more) break;
      if (d_ + texts->size() < from_.doc) text.clear();
      bytes += text.size();
      texts->push_back(std::move(text));
    }
    return Status::ok();
  }

  std::vector<std::vector<int>> tokenize(const std::vector<std::string>& texts) const {
    std::vector<std::vector<int>> ids(texts.size());
#pragma omp parallel for schedule(dynamic) num_threads(workers_)
    for (size_t i = 0; i < texts.size(); i++)
      if (d_ + i >= from_.doc) ids[i] = tok_.encode_document(texts[i]);
    return ids;
  }

  // Document d_'s pieces, less the tokens an interrupted prep already wrote.
  Status write_document(std::vector<int> ids) {
    uint64_t skip = d_ == from_.doc ? from_.skip : 0, offset = 0;
    for (Piece& p : pieces_of(std::move(ids), d_, n_docs_, n_val_, o_.val_fraction)) {
      SplitWriter& out = p.val ? val_ : train_;
      // Val starts once train is whole: its last, shorter shard is written first.
      if (p.val) RETURN_IF_ERROR(train_.finish());
      const uint64_t here = std::min<uint64_t>(skip, p.ids.size()), piece_offset = offset;
      auto on_shard = [&](size_t used) { return shard_written({d_, piece_offset + used}); };
      RETURN_IF_ERROR(out.add(p.ids, here, here == 0, on_shard));
      skip -= here;
      offset += p.ids.size();
    }
    return Status::ok();
  }

  // After each full shard: where the next one starts, so that a rerun goes on from it.
  Status shard_written(const ResumePoint& next) {
    RETURN_IF_ERROR(save_state(o_.out_dir, identity_, next, train_, val_));
    if (stop_after_ > 0 && ++shards_this_run_ >= stop_after_)
      return Status::error("prep stopped after " + std::to_string(stop_after_) +
                           " shards (MESHTRAIN_PREP_STOP_AFTER_SHARDS); run it again to go on");
    return Status::ok();
  }

  const PrepOptions& o_;
  const Tokenizer& tok_;
  size_t n_docs_, n_val_ = 0;
  json identity_;
  DocumentReader reader_;
  Progress progress_;
  int workers_;
  size_t stop_after_, shards_this_run_ = 0;
  SplitWriter train_, val_;
  ResumePoint from_;
  size_t d_ = 0;  // the next document's index
};

Status write_dataset_manifest(const PrepOptions& o, const Tokenizer& tok, const std::string& fingerprint,
                              const Prep& prep) {
  DatasetManifest m;
  m.tokenizer_format = tok.info().format;
  m.tokenizer_name = tok.info().name;
  m.tokenizer_fingerprint = fingerprint;
  m.tokenizer_vocab = tok.vocab_size();
  m.shard_tokens = o.shard_tokens;
  m.train = prep.train().shards();
  m.val = prep.val().shards();
  return write_manifest(o.out_dir, m);
}

}  // namespace

Status prepare_corpus(const PrepOptions& o, PrepStats* stats) {
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) return Status::error("--val-fraction must be in [0, 1)");
  if (o.out_dir.empty()) return Status::error("--out DIR is required");
  if (o.workers < 0) return Status::error("--workers must be 0 (one per core) or more");
  std::unique_ptr<Tokenizer> tok;
  RETURN_IF_ERROR(load_tokenizer(o.tokenizer_dir, &tok));
  std::vector<InputFile> files;
  RETURN_IF_ERROR(list_inputs(o, &files));
  size_t n_docs = 0;
  uint64_t total_bytes = 0;
  for (const InputFile& f : files) n_docs += f.documents, total_bytes += f.bytes;
  if (n_docs == 0) return Status::error("no documents in the inputs");

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Status::error("cannot create " + o.out_dir + ": " + ec.message());
  // The tokens mean nothing without their tokenizer: it goes with them.
  const std::string tokenizer_copy = (fs::path(o.out_dir) / kTokenizerFolder).string();
  RETURN_IF_ERROR(save_tokenizer_copy(*tok, tokenizer_copy));
  std::string fingerprint;
  RETURN_IF_ERROR(verify_tokenizer_copy(tokenizer_copy, &fingerprint));

  Prep prep(o, *tok, files, n_docs, total_bytes, prep_identity(o, files, fingerprint));
  stats->resumed = prep.resume();
  stats->resumed_at_document = prep.resumed_at();
  RETURN_IF_ERROR(prep.run());
  RETURN_IF_ERROR(write_dataset_manifest(o, *tok, fingerprint, prep));
  fs::remove(fs::path(o.out_dir) / kPrepStateFile, ec);
  stats->documents = n_docs;
  stats->train_tokens = prep.train().tokens();
  stats->val_tokens = prep.val().tokens();
  stats->train_shards = prep.train().shards().size();
  stats->val_shards = prep.val().shards().size();
  return Status::ok();
}

}  // namespace meshtrain::data
