#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/commands.h"
#include "data/tokenizer.h"
#include "data/tokenizer_files.h"

namespace meshtrain::cli {

namespace {

int decode_stdin(const data::Tokenizer& tok, const std::string& input) {
  std::vector<int> ids;
  std::istringstream in(input);
  std::string word;
  while (in >> word) {
    int id = 0;
    auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || end != word.data() + word.size())
      return fail(Status::error("--decode expects integer token ids, got '" + word + "'"));
    ids.push_back(id);
  }
  std::string text;
  Status s = tok.decode_checked(ids, &text);
  if (!s.is_ok()) return fail(s);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>(default_tokenizer_dir());
  auto decode = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "tokenize", "Print the token ids of stdin on one line (--decode: ids to text)");
  cmd->add_option("--tokenizer", *dir,
                  "Tokenizer folder or file: tokenizer.json, tokenizer.model or another *.model (SentencePiece), "
                  "*.tiktoken, encoder.json + vocab.bpe, or a copy prep or train made (checked against its "
                  "manifest)")
      ->capture_default_str();
  cmd->add_flag("--decode", *decode, "Read space-separated ids from stdin, print the text");
  return {cmd, [=] {
            std::unique_ptr<data::Tokenizer> loaded;
            Status s = data::has_tokenizer_copy(*dir) ? data::verify_tokenizer_copy(*dir) : Status::ok();
            if (s.is_ok()) s = data::load_tokenizer(*dir, &loaded);
            if (!s.is_ok()) return fail(s);
            const data::Tokenizer& tok = *loaded;
            std::string input((std::istreambuf_iterator<char>(std::cin)),
                              std::istreambuf_iterator<char>());
            if (*decode) return decode_stdin(tok, input);
            auto ids = tok.encode(input);
            for (size_t i = 0; i < ids.size(); i++) std::printf(i ? " %d" : "%d", ids[i]);
            std::printf("\n");
            return 0;
          }};
}

}  // namespace meshtrain::cli
