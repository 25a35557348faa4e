#include "data/brown.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/file_io.h"

namespace meshtrain::data {

namespace {

namespace fs = std::filesystem;

bool is_document_name(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && name[1] >= 'a' && name[1] <= 'r' &&
         std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}

std::vector<std::string_view> split_whitespace(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_space(s[i])) ++i;
    size_t start = i;
    while (i < s.size() && !is_space(s[i])) ++i;
    if (i > start) out.push_back(s.substr(start, i - start));
  }
  return out;
}

struct TaggedWord {
  std::string_view word;
  std::string_view tag;
};

// Splits at the LAST '/': words themselves may contain slashes ("and/or/cc", "//in").
TaggedWord split_token(std::string_view raw) {
  size_t slash = raw.rfind('/');
  if (slash == std::string_view::npos) return {raw, {}};
  return {raw.substr(0, slash), raw.substr(slash + 1)};
}

// Headline tags carry an "-hl" component (nn-hl, at-hl, ---hl for a headline "--").
bool is_headline_tag(std::string_view tag) {
  size_t pos = tag.find("-hl");
  while (pos != std::string_view::npos) {
    size_t after = pos + 3;
    if (after == tag.size() || tag[after] == '-') return true;
    pos = tag.find("-hl", pos + 1);
  }
  return false;
}

bool is_punctuation(std::string_view word) {
  return std::none_of(word.begin(), word.end(),
                      [](char c) { return std::isalnum(static_cast<unsigned char>(c)); });
}

// Quotes around a headline are not always tagged -hl ("'/' back/rb-hl with/in-hl"), so
// only the words decide.
bool is_headline(const std::vector<TaggedWord>& tokens) {
  bool any_word = false;
  for (const TaggedWord& t : tokens) {
    if (is_punctuation(t.word) && !is_headline_tag(t.tag)) continue;
    if (!is_headline_tag(t.tag)) return false;
    any_word = true;
  }
  return any_word;
}

// Tokens that attach to the preceding word (no space before them).
bool attaches_left(std::string_view w) {
  static constexpr std::array<std::string_view, 22> kWords = {
      ",",   ".",  ";",   ":",   "?",   "!",  ")",  "]",   "}",  "%",   "...",
      "n't", "'s", "'re", "'ve", "'ll", "'d", "'m", "N'T", "'S", "'RE", "'LL"};
  return std::find(kWords.begin(), kWords.end(), w) != kWords.end();
}

// Tokens after which the next word follows without a space.
bool attaches_right(std::string_view w) { return w == "(" || w == "[" || w == "{"; }

// Accumulates the words of one paragraph with prose spacing.
class ParagraphBuilder {
 public:
  void add(std::string_view word) {
    if (word.empty()) return;
    // Inch marks are tagged as a word ending in '' plus a stray '' token ("1/4''/nn ''/''").
    if (std::exchange(after_inch_mark_, false) && word == "''") return;
    if (word.size() > 2 && word.ends_with("''")) {
      after_inch_mark_ = true;
      return emit(std::string(word.substr(0, word.size() - 2)) + "\"", true, false);
    }
    if (word == "``") return emit("\"", /*space_before=*/true, /*glue_next=*/true);
    if (word == "''") {
      emit("\"", false, false);
      after_close_quote_ = true;
      return;
    }
    if ((word == "," || word == ".") && after_close_quote_) return move_inside_quote(word);
    if (word == "'") {
      // Brown marks single quotes with the same token on both sides; alternate.
      single_quote_open_ = !single_quote_open_;
      return emit("'", single_quote_open_, single_quote_open_);
    }
    // "Jr./np ./." : the sentence period after an abbreviation would read as "Jr. ."
    if (word == "." && !text_.empty() && text_.back() == '.') return;
    if (attaches_left(word)) return emit(word, false, false);
    emit(word, true, attaches_right(word));
  }

  bool empty() const { return text_.empty(); }

  std::string take() {
    std::string out = std::move(text_);
    *this = ParagraphBuilder();
    return out;
  }

 private:
  void emit(std::string_view s, bool space_before, bool glue_next) {
    if (space_before && !glue_ && !text_.empty()) text_ += ' ';
    text_ += s;
    glue_ = glue_next;
    after_close_quote_ = false;
  }

  // Brown puts commas and periods after closing quotes ('' ,) where American prose puts
  // them inside; after a quoted "?", "!" or "." they are dropped ("Why?" he asked).
  void move_inside_quote(std::string_view punct) {
    char before = text_.size() >= 2 ? text_[text_.size() - 2] : ' ';
    if (before != '.' && before != '?' && before != '!') {
      text_.insert(text_.size() - 1, punct);
    }
  }

  std::string text_;
  bool glue_ = false;  // last token was an opening bracket or quote
  bool single_quote_open_ = false;
  bool after_inch_mark_ = false;
  bool after_close_quote_ = false;  // last token was a closing double quote
};

// Collects finished paragraphs and joins them.
class DocumentBuilder {
 public:
  void add_line(const std::vector<TaggedWord>& tokens) {
    for (const TaggedWord& t : tokens) paragraph_.add(t.word);
  }
  void end_paragraph() {
    if (paragraph_.empty()) return;
    if (!text_.empty()) text_ += "\n\n";
    text_ += paragraph_.take();
  }
  std::string take() {
    end_paragraph();
    return std::move(text_);
  }

 private:
  ParagraphBuilder paragraph_;
  std::string text_;
};

}  // namespace

Status list_brown_files(const std::string& dir, std::vector<std::string>* paths) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return Status::error("Brown corpus dir " + dir + ": " + ec.message());
  paths->clear();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return Status::error("Brown corpus dir " + dir + ": " + ec.message());
    if (is_document_name(it->path().filename().string()) && it->is_regular_file(ec)) {
      paths->push_back(it->path().string());
    }
  }
  if (paths->empty()) {
    return Status::error("Brown corpus dir " + dir + ": no document files (ca01 .. cr09) found");
  }
  std::sort(paths->begin(), paths->end());
  return Status::ok();
}

Status filter_brown_categories(const std::string& dir, const std::vector<std::string>& categories,
                               std::vector<std::string>* paths) {
  if (categories.empty()) return Status::ok();
  const std::string cats_path = (fs::path(dir) / "cats.txt").string();
  std::string text;
  RETURN_IF_ERROR(read_file(cats_path, &text));
  std::map<std::string, std::string> category_of;  // document name -> category
  std::set<std::string> known;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::istringstream line(text.substr(pos, nl - pos));
    pos = nl + 1;
    std::string name, category;
    if (line >> name >> category) category_of[name] = category, known.insert(category);
  }
  for (const std::string& c : categories)
    if (!known.count(c)) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      return Status::error("--brown-categories: unknown category '" + c + "' (" + cats_path + " has " + list + ")");
    }
  const std::set<std::string> wanted(categories.begin(), categories.end());
  std::erase_if(*paths, [&](const std::string& p) {
    auto it = category_of.find(fs::path(p).filename().string());
    return it == category_of.end() || !wanted.count(it->second);
  });
  return Status::ok();
}

std::string brown_to_text(std::string_view tagged) {
  DocumentBuilder doc;
  size_t pos = 0;
  while (pos <= tagged.size()) {
    size_t nl = tagged.find('\n', pos);
    if (nl == std::string_view::npos) nl = tagged.size();
    std::string_view line = tagged.substr(pos, nl - pos);
    pos = nl + 1;

    std::vector<TaggedWord> tokens;
    for (std::string_view raw : split_whitespace(line)) tokens.push_back(split_token(raw));
    // Blank lines end a paragraph; a tab indent starts one.
    if (tokens.empty() || line.front() == '\t') doc.end_paragraph();
    if (is_headline(tokens)) {
      doc.end_paragraph();
      doc.add_line(tokens);
      doc.end_paragraph();
      continue;
    }
    doc.add_line(tokens);
  }
  return doc.take();
}

}  // namespace meshtrain::data
