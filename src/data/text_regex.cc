#include "data/text_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/byte_text.h"

namespace meshtrain::data {

struct TextRegex::Code {
  pcre2_code* code;
};

namespace {

// Match data sized for the whole match only (ovector pair 0), one per thread and reused by
// every pattern: creating it per call would be an allocation per piece.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

}  // namespace

Status TextRegex::compile(std::string_view pattern, std::shared_ptr<const TextRegex>* out) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return Status::error("regex /" + std::string(pattern) + "/ does not compile: " +
                         reinterpret_cast<const char*>(message) + " at offset " + std::to_string(error_offset));
  }
  std::shared_ptr<TextRegex> regex(new TextRegex());
  regex->pattern_ = std::string(pattern);
  regex->code_ = new Code{code};
  // Without JIT (a platform PCRE2 lacks it for) the interpreter gives the same matches.
  regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  *out = std::move(regex);
  return Status::ok();
}

TextRegex::~TextRegex() {
  if (code_ != nullptr) pcre2_code_free(code_->code);
  delete code_;
}

bool TextRegex::find(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  pcre2_match_data* data = thread_match_data();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const int rc = jit_ ? pcre2_jit_match(code_->code, subject, text.size(), from, 0, data, nullptr)
                      : pcre2_match(code_->code, subject, text.size(), from, 0, data, nullptr);
  if (rc < 0) return false;  // no match (invalid UTF-8 cannot fail under MATCH_INVALID_UTF)
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

size_t TextRegex::char_length_at(std::string_view text, size_t i) {
  if (i >= text.size()) return 1;
  char32_t cp = 0;
  const size_t n = decode_utf8(text, i, &cp);
  return n == 0 ? 1 : n;
}

}  // namespace meshtrain::data
