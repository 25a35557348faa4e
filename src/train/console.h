// Where a run's text goes. Nothing in src/train/ writes to stdout or stderr itself: the
// command line passes a Console over them (cli::stdio_console), and a test or a binding
// passes its own, so an embedding process decides what reaches a terminal.
#pragma once
#include <functional>
#include <string>

namespace meshtrain::train {

struct Console {
  // Text as it is to appear: lines end in "\n", and a live progress line rewrites itself
  // with "\r". It may be held back until flush(), as stdout holds it.
  std::function<void(const std::string&)> out;
  std::function<void()> flush;
  // What a stopped run says about its end, apart from its output (stderr's role).
  std::function<void(const std::string&)> err;
  // out is a terminal: progress is one live line rewritten in place.
  bool terminal = false;

  void line(const std::string& text) const { out(text + "\n"); }
};

// A Console that drops everything (an in-process caller that wants none of the text).
Console silent_console();

// printf's formatting into a string: the console's lines keep their printf formats.
std::string formatted(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace meshtrain::train
