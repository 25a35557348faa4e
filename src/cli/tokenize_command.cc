#include <charconv>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/commands.h"
#include "data/bpe.h"

namespace meshtrain::cli {

namespace {

int decode_stdin(const data::Gpt2Tokenizer& tok, const std::string& input) {
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
      "tokenize", "Print the GPT-2 token ids of stdin on one line (--decode: ids to text)");
  cmd->add_option("--tokenizer", *dir, "Folder with encoder.json and vocab.bpe")->capture_default_str();
  cmd->add_flag("--decode", *decode, "Read space-separated ids from stdin, print the text");
  return {cmd, [=] {
            data::Gpt2Tokenizer tok;
            Status s = data::Gpt2Tokenizer::load(*dir, &tok);
            if (!s.is_ok()) return fail(s);
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
