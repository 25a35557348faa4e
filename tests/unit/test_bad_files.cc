// Every bad input file is a clear error, never an abort: checkpoint indexes, safetensors,
// llm.c model and token files, --config and cluster TOML, GPT-2 tokenizer files. Each case
// checks that the input is refused and that the message names the file and the problem;
// the last tests run the binary on a corrupt checkpoint (exit 1, "meshtrain: error:").
// The fuzz targets (tests/fuzz) search for the cases nobody thought of.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/byte_source.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_index.h"
#include "checkpoint/hf_gpt2_config.h"
#include "checkpoint/llmc.h"
#include "checkpoint/llmc_format.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_model.h"
#include "cli_test_util.h"
#include "comm/self_group.h"
#include "data/bpe.h"
#include "data/token_file.h"
#include "model/gpt.h"

namespace meshtrain::test_bad_files {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using cli_test::read_file;
using cli_test::write_file;

// The message of a refused input; a failure when it was accepted.
std::string refused(const Status& s, const std::string& input) {
  EXPECT_FALSE(s.is_ok()) << input << " was accepted";
  return s.message();
}

// `message` contains every one of `parts`.
void expect_names(const std::string& message, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' in: " << message;
}

class BadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = cli_test::fresh_dir(fs::temp_directory_path() /
                               ("meshtrain_bad_files_" + cli_test::kPid + "_" + info->name()));
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

// ---- Checkpoint index ----------------------------------------------------------------

model::GptConfig tiny_config() {
  model::GptConfig c;
  c.layers = 1, c.heads = 2, c.dim = 16, c.max_seq_len = 16, c.vocab = 128;
  return c;
}

// A real checkpoint of a tiny model, written by save_checkpoint on one rank; returns its
// folder. `vocab` > 0: that many rows instead of 128.
std::string save_tiny_checkpoint(const std::string& out, int vocab = 0) {
  model::GptConfig c = tiny_config();
  if (vocab > 0) c.vocab = vocab;
  const model::ParamLayout layout(c);
  const parallel::ShardLayout shards(layout, 1, 0);
  std::vector<float> params(layout.total(), 0.5f), m(layout.total(), 0.0f), v(layout.total(), 0.0f);
  checkpoint::RankState state{params.data(), true, m.data(), v.data(), true, {}, {}};
  comm::SelfGroup world;
  const Status s = checkpoint::save_checkpoint(out, 3, layout, c, shards, state, world, json::object());
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out + "/checkpoints/step_00000003";
}

class BadCheckpointIndex : public BadFiles {
 protected:
  void SetUp() override {
    BadFiles::SetUp();
    ckpt_ = save_tiny_checkpoint(path("run"));
    good_ = json::parse(read_file(ckpt_ + "/index.json"));
  }
  // The message parse_checkpoint_index gives for the saved index edited by `edit`.
  std::string parse_error(const std::function<void(json&)>& edit) {
    json j = good_;
    edit(j);
    checkpoint::CheckpointIndex index;
    return refused(checkpoint::parse_checkpoint_index(j.dump(), "ckpt/index.json", &index), j.dump());
  }

  std::string ckpt_;
  json good_;
};

TEST_F(BadCheckpointIndex, TheSavedIndexParses) {
  checkpoint::CheckpointIndex index;
  const Status s = checkpoint::read_checkpoint_index(ckpt_, &index);
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_EQ(index.step, 3);
  EXPECT_EQ(index.model.dim, 16);
  ASSERT_EQ(index.files.size(), 1u);
  EXPECT_EQ(index.files[0].units, (std::vector<int>{0, 1, 2}));
}

// The issue's three files: a unit that is not one (it aborted generate with an uncaught
// type_error), and a negative tensor shape and a string shard_sections (both accepted).
TEST_F(BadCheckpointIndex, IssueCasesAreRefusedByName) {
  std::string msg = parse_error([](json& j) { j["units"][0] = {{"x", 1}}; });
  expect_names(msg, {"ckpt/index.json", "corrupt", "units[0].offset", "missing"});
  msg = parse_error([](json& j) { j["tensors"][0]["shape"] = {-128, 16}; });
  expect_names(msg, {"ckpt/index.json", "tensors[0].shape[0]", "-128"});
  msg = parse_error([](json& j) { j["shard_sections"] = "params"; });
  expect_names(msg, {"ckpt/index.json", "shard_sections", "\"params\""});
}

TEST_F(BadCheckpointIndex, WrongTypesAndRangesAreNamed) {
  expect_names(parse_error([](json& j) { j["step"] = "3"; }), {"step must be an integer", "\"3\""});
  expect_names(parse_error([](json& j) { j["step"] = -1; }), {"step must be an integer in [0,"});
  expect_names(parse_error([](json& j) { j["model"]["dim"] = 16.5; }), {"model.dim", "16.5"});
  expect_names(parse_error([](json& j) { j["model"]["heads"] = 3; }), {"model", "does not divide"});
  expect_names(parse_error([](json& j) { j["model"]["dim"] = 1 << 30; }), {"model", "implausibly large"});
  expect_names(parse_error([](json& j) { j["tp_size"] = 3; }), {"tp_size 3"});
  expect_names(parse_error([](json& j) { j["dp_size"] = 2; }), {"files lists 1 shard files", "dp_size 2"});
  expect_names(parse_error([](json& j) { j["train_state"] = 7; }), {"train_state is not an object"});
  // A model claiming a million layers is refused by the unit table's length, before any
  // layout of that size exists.
  expect_names(parse_error([](json& j) { j["model"]["layers"] = 1000000; }), {"units has 3 entries", "1000002"});
}

TEST_F(BadCheckpointIndex, InconsistentTablesAreNamed) {
  expect_names(parse_error([](json& j) { j["units"][1]["numel"] = 5; }), {"units[1].numel is 5"});
  expect_names(parse_error([](json& j) { j["total_elements"] = 1; }), {"total_elements is 1"});
  expect_names(parse_error([](json& j) { j["tensors"][2]["name"] = "h.0.ln1.weight"; }),
               {"tensors[2].name", "h.0.ln1.weight", "h.0.ln_1.weight"});
  expect_names(parse_error([](json& j) { j["files"][0]["bytes"] = 64; }), {"files[0].bytes is 64"});
  expect_names(parse_error([](json& j) { j["files"][0]["units"] = {0, 2, 1}; }), {"files[0].units[2]", "ascending"});
  expect_names(parse_error([](json& j) { j["files"][0]["units"] = {0, 9}; }), {"files[0].units[1]", "9"});
  expect_names(parse_error([](json& j) { j["files"][0]["checksum"] = "xyz"; }), {"checksum", "16 hex digits"});
  expect_names(parse_error([](json& j) { j["files"][0].erase("dp"); }), {"files[0].dp is missing"});
  // A unit no file holds: the bytes are then consistent, the coverage is not.
  const std::string missing = parse_error([](json& j) {
    j["files"][0]["units"] = {0, 1};
    j["files"][0]["bytes"] = j["files"][0]["bytes"].get<uint64_t>() - 12 * j["units"][2]["numel"].get<uint64_t>();
  });
  expect_names(missing, {"no file holds unit 2"});
}

TEST_F(BadCheckpointIndex, FileNamesCannotLeaveTheFolder) {
  expect_names(parse_error([](json& j) { j["files"][0]["name"] = "../../etc/passwd"; }),
               {"files[0].name", "../../etc/passwd", "shard_00000.bin"});
}

TEST_F(BadCheckpointIndex, ShardFilesAreCheckedBeforeAnyModelIsBuilt) {
  write_file(ckpt_ + "/shard_00000.bin", read_file(ckpt_ + "/shard_00000.bin").substr(0, 100));
  json index;
  std::string msg = refused(checkpoint::read_checkpoint_index(ckpt_, &index), "a cut shard");
  expect_names(msg, {"shard_00000.bin", "truncated", "100 bytes"});
  fs::remove(ckpt_ + "/shard_00000.bin");
  msg = refused(checkpoint::read_checkpoint_index(ckpt_, &index), "a missing shard");
  expect_names(msg, {"shard_00000.bin", "cannot be read"});
}

TEST_F(BadCheckpointIndex, NotJsonOrAnotherFormat) {
  checkpoint::CheckpointIndex index;
  expect_names(refused(checkpoint::parse_checkpoint_index("{\"units\": [", "a/index.json", &index), "cut"),
               {"a/index.json is corrupt", "not valid JSON"});
  expect_names(parse_error([](json& j) { j["version"] = 9; }), {"format version 9", "reads version 3"});
  expect_names(parse_error([](json& j) { j["format"] = "other"; }), {"not a meshtrain checkpoint index"});
}

// ---- safetensors -----------------------------------------------------------------------

// A safetensors file's bytes: the length prefix, the header as given, the data.
std::string safetensors_bytes(const std::string& header, const std::string& data, uint64_t length = 0) {
  const uint64_t n = length ? length : header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

std::string open_error(const std::string& header, const std::string& data, uint64_t length = 0) {
  checkpoint::SafetensorsFile f;
  return refused(checkpoint::SafetensorsFile::from_bytes(safetensors_bytes(header, data, length), "x.safetensors", &f),
                 header);
}

TEST(BadSafetensors, SpansOutOfRangeOrOverlappingAreNamed) {
  const std::string data(16, '\0');
  expect_names(open_error(R"({"w":{"dtype":"F32","shape":[100],"data_offsets":[0,400]}})", data),
               {"x.safetensors", "'w'", "out of range", "16 bytes"});
  expect_names(open_error(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                              "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", data),
               {"'a'", "'b'", "overlap"});
  expect_names(open_error(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", data),
               {"'w'", "do not match"});
}

TEST(BadSafetensors, DtypesMetadataAndRepeatsAreNamed) {
  const std::string data(8, '\0');
  expect_names(open_error(R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", data),
               {"'w'", "unsupported dtype \"F7\""});
  expect_names(open_error(R"({"__metadata__":["a"]})", data), {"\"__metadata__\" is not an object"});
  expect_names(open_error(R"({"__metadata__":{"n_head":12}})", data), {"__metadata__", "'n_head'", "not a string"});
  expect_names(open_error(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                              "w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data),
               {"'w' twice"});
}

TEST(BadSafetensors, HeaderLengthPastTheEndIsTruncation) {
  expect_names(open_error("{}", "", 4096), {"x.safetensors", "truncated", "header length 4096", "2 bytes follow"});
  checkpoint::SafetensorsFile f;
  expect_names(refused(checkpoint::SafetensorsFile::from_bytes("abc", "x.safetensors", &f), "3 bytes"),
               {"truncated", "8-byte header length"});
}

// A file that parses as safetensors but is not a GPT-2 a model can be built from.
TEST(BadSafetensors, Gpt2ShapesAndMetadataAreChecked) {
  const std::string wte = R"("wte.weight":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},)";
  const std::string wpe = R"("wpe.weight":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]})";
  auto infer_error = [](const std::string& header, const std::string& data) {
    checkpoint::SafetensorsFile f;
    EXPECT_TRUE(checkpoint::SafetensorsFile::from_bytes(safetensors_bytes(header, data), "m.safetensors", &f).is_ok());
    model::GptConfig c;
    return refused(checkpoint::infer_hf_config(checkpoint::SafetensorsModel::single(f), 0, &c), header);
  };
  // Block 5 named, one block tensor held: refused before a 6-layer layout is built.
  expect_names(infer_error("{" + wte + wpe +
                               R"(,"h.5.ln_1.weight":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                           std::string(16, '\0')),
               {"m.safetensors", "names block h.5", "only 1 block tensors"});
  expect_names(infer_error("{" + wte + wpe + R"(,"__metadata__":{"n_head":"twelve"}})", std::string(12, '\0')),
               {"m.safetensors", "\"n_head\"", "twelve", "not a positive integer"});
  expect_names(infer_error("{" + wte + wpe + "}", std::string(12, '\0')), {"m.safetensors", "--layers must be >= 1"});
}

// ---- llm.c model and token files -----------------------------------------------------

// A valid llm.c file of the tiny model, exported by the engine.
std::string llmc_bytes(const std::string& path) {
  model::Gpt gpt(tiny_config());
  gpt.init_weights(1);
  EXPECT_TRUE(checkpoint::export_llmc_model(gpt, path).is_ok());
  return read_file(path);
}

std::string llmc_error(const std::string& bytes) {
  checkpoint::LlmcHeader h;
  return refused(checkpoint::parse_llmc_header(*checkpoint::memory_source(bytes), &h), "llm.c bytes");
}

TEST_F(BadFiles, LlmcTruncatedOrBadMagicIsNamed) {
  const std::string good = llmc_bytes(path("m.bin"));
  checkpoint::LlmcHeader h;
  ASSERT_TRUE(checkpoint::parse_llmc_header(*checkpoint::memory_source(good), &h).is_ok());
  expect_names(llmc_error(good.substr(0, good.size() - 4)), {"truncated", std::to_string(good.size() - 4)});
  expect_names(llmc_error(good.substr(0, 100)), {"truncated", "1024-byte header"});
  std::string bad = good;
  bad[0] ^= 1;
  expect_names(llmc_error(bad), {"bad magic", "not an llm.c model file"});
  // Through the file, the message names it.
  write_file(path("cut.bin"), good.substr(0, good.size() / 2));
  model::GptConfig c;
  expect_names(refused(checkpoint::infer_llmc_config(path("cut.bin"), &c), "cut.bin"), {"cut.bin", "truncated"});
}

TEST_F(BadFiles, TokenFileWithAWrongHeaderIsNamed) {
  std::vector<data::Token> tokens = {1, 2, 3};
  ASSERT_TRUE(data::write_token_file(path("t.bin"), tokens).is_ok());
  const std::string good = read_file(path("t.bin"));
  auto header_error = [&](size_t slot, int32_t value) {
    std::string bad = good;
    std::memcpy(bad.data() + 4 * slot, &value, 4);
    std::vector<data::Token> got = {9};
    std::string msg = refused(data::parse_token_file(bad, &got), "slot " + std::to_string(slot));
    EXPECT_TRUE(got.empty());
    return msg;
  };
  expect_names(header_error(0, 20240326), {"bad magic 20240326", "20240520"});
  expect_names(header_error(1, 3), {"unsupported version 3", "uint16", "uint32"});
  expect_names(header_error(1, 2), {"truncated"});  // version 2 reads 4 bytes a token
  expect_names(header_error(2, -5), {"negative token count -5"});
  expect_names(header_error(2, 4), {"truncated", "4 tokens"});
  write_file(path("t.bin"), good.substr(0, 1000));
  expect_names(refused(data::read_token_file(path("t.bin"), &tokens), "short"), {"t.bin", "1024-byte header"});
}

// ---- TOML ----------------------------------------------------------------------------
// The command line's parsers are not in the engine library, so these run the binary.

// `meshtrain ARGS` fails with exit code 1 and one error line naming every one of `parts`.
void expect_cli_error(const std::string& args, const std::vector<std::string>& parts) {
  const cli_test::RunResult r = cli_test::run(cli_test::kBinary + " " + args);
  EXPECT_EQ(r.exit_code, 1) << cli_test::describe(r);
  EXPECT_TRUE(r.err.starts_with("meshtrain: error: ")) << cli_test::describe(r);
  expect_names(r.err, parts);
}

TEST_F(BadFiles, ConfigValuesOfTheWrongTypeAreNamed) {
  const std::string toml = path("run.toml");
  auto with = [&](const std::string& command, const std::string& text, const std::vector<std::string>& parts) {
    write_file(toml, text);
    std::vector<std::string> all = {toml};
    all.insert(all.end(), parts.begin(), parts.end());
    expect_cli_error(command + " --config " + toml + " --out " + path("never"), all);
  };
  with("train", "steps = \"ten\"\n", {"'steps'", "ten"});
  with("train", "steps = 2.5\n", {"'steps'", "2.5"});
  with("train", "lr = true\n", {"'lr'", "true"});
  with("train", "steps = [1, 2]\n", {"'steps'", "takes one value"});
  with("train", "quiet = 1\n", {"'quiet'", "true or false"});
  // A key repeated is the TOML parser's error (toml++), naming the line and the column.
  with("train", "steps = 1\nsteps = 2\n", {"'steps'", "line 2, column", "redefine"});
  with("train", "steps = 1\nlr = 1\nsteps = 2\n", {"'steps'", "line 3, column", "redefine"});
  with("train", "seq_len = 8\nseq-len = 16\n", {"'seq-len'", "set twice"});
  with("train", "steps = 1\n[section]\nlr = 1\n", {"sections"});
  // Non-ASCII only inside strings and comments (toml++ is not given the rest: it reaches
  // an "unreachable" point on some of them).
  with("train", "steps = 1\n\xC2\xA1 = 2\n", {"line 2, column 1", "non-ASCII character outside a quoted string"});
  with("train", "# caf\xC3\xA9\nsteps = 1 \xEF\xB6\xBF\n", {"line 2, column 11", "non-ASCII"});
  // The option's own check runs too, with the file named.
  with("export", "format = \"onnx\"\n", {"'format'", "onnx"});
  EXPECT_FALSE(fs::exists(path("never")));
}

// A '#' inside a quoted value is part of it (a real TOML parser reads the file); an
// unterminated string is named by its line and column, with no talk of a '#' that is not
// there; and a run folder's config.toml gives back a value with a quote mark and a space in
// it (before, it wrote data = "d"a ta", which the reader split into three values).
TEST_F(BadFiles, ConfigStringsSurviveTheRoundTrip) {
  const std::string toml = path("run.toml");
  write_file(toml, "out = \"runs/abc\n");
  expect_cli_error("train --config " + toml, {toml, "line 1, column", "out = \"runs/abc"});
  EXPECT_EQ(cli_test::run(cli_test::kBinary + " train --config " + toml).err.find('#'), std::string::npos);

  const std::string data = path("d\"a ta");
  fs::create_directories(data);
  std::vector<data::Token> tokens(600);
  for (size_t i = 0; i < tokens.size(); i++) tokens[i] = (data::Token)(i * 7 % 100);
  ASSERT_TRUE(data::write_token_file(data + "/train.bin", tokens).is_ok());
  const std::string tiny = " --model tiny --layers 1 --heads 2 --dim 16 --seq-len 16 --vocab 128 --micro-batch 2"
                           " --steps 1 --threads 1 --peak-gflops 100 --quiet";
  cli_test::RunResult r = cli_test::run(cli_test::kBinary + " train --data '" + data + "' --out " + path("a") + tiny);
  ASSERT_EQ(r.exit_code, 0) << cli_test::describe(r);
  const std::string config = read_file(path("a/config.toml"));
  // A TOML basic string, its quote mark escaped.
  std::string escaped = data;
  escaped.replace(escaped.find('"'), 1, "\\\"");
  EXPECT_NE(config.find("data = \"" + escaped + "\"\n"), std::string::npos) << config;
  // The data folder comes from the file: the run finds it only if the value came back whole.
  r = cli_test::run(cli_test::kBinary + " train --config " + path("a/config.toml") + " --out " + path("b"));
  EXPECT_EQ(r.exit_code, 0) << cli_test::describe(r);
}

TEST_F(BadFiles, ClusterFileWithANegativeBandwidthIsNamed) {
  const std::string toml = path("cluster.toml");
  write_file(toml, "base = \"a100-80g\"\ninter_node_gbps = -5\n");
  expect_cli_error("plan --cluster " + toml, {toml, "'inter_node_gbps'", "> 0", "-5"});
  write_file(toml, "base = \"a100-80g\"\nmemory_gb = \"lots\"\n");
  expect_cli_error("plan --cluster " + toml, {toml, "'memory_gb'", "must be a number", "lots"});
  write_file(toml, "base = \"a100-80g\"\nhbm_efficiency = 1.5\n");
  expect_cli_error("plan --cluster " + toml, {toml, "'hbm_efficiency'", "fraction"});
  write_file(toml, "base = \"a100-80g\"\nmemory_gb = 40\nhbm_gbps = 9\nmemory_gb = 80\n");
  // toml++ refuses a key defined twice itself, naming the line.
  expect_cli_error("plan --cluster " + toml, {toml, "line 4", "redefine", "'memory_gb'"});
  write_file(toml, "base = \"a100-80g\"\ninter_node_gbps = 5\n[links.inter_host]\nbandwidth_gbs = 6\n");
  expect_cli_error("plan --cluster " + toml, {toml, "'inter_node_gbps' is set twice", "[links.inter_host] bandwidth_gbs"});
}

// ---- Tokenizer files -------------------------------------------------------------------

// GPT-2's 256 byte tokens (bytes_to_unicode) and <|endoftext|>, as an encoder.json object.
json byte_level_encoder() {
  json enc = json::object();
  int extra = 256, id = 0;
  for (int b = 0; b < 256; b++) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const char32_t cp = printable ? b : extra++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, (char)cp);
    } else {
      utf8 = {(char)(0xC0 | (cp >> 6)), (char)(0x80 | (cp & 0x3F))};
    }
    enc[utf8] = id++;
  }
  enc["<|endoftext|>"] = id++;
  enc["ab"] = id++;
  return enc;
}

std::string tokenizer_error(const std::string& encoder, const std::string& vocab) {
  data::Gpt2Tokenizer tok;
  return refused(data::Gpt2Tokenizer::from_strings(encoder, vocab, "dir/encoder.json", "dir/vocab.bpe", &tok),
                 encoder.substr(0, 40) + " / " + vocab);
}

TEST(BadTokenizerFiles, EncoderAndMergeErrorsNameTheFile) {
  const std::string encoder = byte_level_encoder().dump();
  data::Gpt2Tokenizer tok;
  ASSERT_TRUE(data::Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\na b\n", "e", "v", &tok).is_ok());
  EXPECT_EQ(tok.encode("ab"), std::vector<int>{257});  // the merge applies

  expect_names(tokenizer_error("[1, 2]", "a b\n"), {"dir/encoder.json", "non-empty object"});
  json enc = byte_level_encoder();
  enc["ab"] = 257.5;
  expect_names(tokenizer_error(enc.dump(), "a b\n"), {"dir/encoder.json", "'ab'", "not an integer"});
  enc["ab"] = "257";
  expect_names(tokenizer_error(enc.dump(), "a b\n"), {"dir/encoder.json", "'ab'", "not an integer"});
  expect_names(tokenizer_error(encoder, "#version: 0.2\na b\na  b\n"), {"dir/vocab.bpe:3", "expected two tokens"});
  expect_names(tokenizer_error(encoder, "#version: 0.2\na b c\n"), {"dir/vocab.bpe:2", "expected two tokens"});
  expect_names(tokenizer_error(encoder, "a q\n"), {"dir/vocab.bpe:1", "missing from encoder.json"});
}

// ---- The binary ------------------------------------------------------------------------

// `meshtrain generate` on a checkpoint whose index.json is corrupt: before this change the
// first case aborted (exit 134, an uncaught nlohmann::type_error) and the other two generated
// text. Now each is a one-line error and exit code 1.
TEST_F(BadFiles, GenerateOnACorruptIndexExitsWithAnError) {
  // (GPT-2's vocabulary: generate refuses a model smaller than its tokenizer.)
  const std::string ckpt = save_tiny_checkpoint(path("run"), 50257);
  const json good = json::parse(read_file(ckpt + "/index.json"));
  const std::string generate =
      cli_test::kBinary + " generate --checkpoint " + path("run") + " --prompt a --max-new-tokens 2 --threads 1";
  cli_test::RunResult r = cli_test::run(generate);
  ASSERT_EQ(r.exit_code, 0) << "the uncorrupted checkpoint must generate\n" << cli_test::describe(r);

  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["units"][0] = {{"x", 1}}; }, "units[0]"},
      {[](json& j) { j["tensors"][0]["shape"] = {-128, 16}; }, "tensors[0].shape"},
      {[](json& j) { j["shard_sections"] = "params"; }, "shard_sections"}};
  for (const auto& [edit, named] : cases) {
    json bad = good;
    edit(bad);
    write_file(ckpt + "/index.json", bad.dump(1));
    r = cli_test::run(generate);
    EXPECT_EQ(r.exit_code, 1) << cli_test::describe(r);
    EXPECT_TRUE(r.err.starts_with("meshtrain: error: ")) << cli_test::describe(r);
    expect_names(r.err, {"index.json", "corrupt", named});
    EXPECT_EQ(r.out, "") << "no text from a corrupt checkpoint";
  }
}

}  // namespace
}  // namespace meshtrain::test_bad_files
