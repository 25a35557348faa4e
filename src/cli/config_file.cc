#include "cli/config_file.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/toml_parse.h"
#include "core/file_io.h"
#include "core/text.h"

namespace meshtrain::cli {

namespace {

std::string normalise(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return key;
}

CLI::Option* find_option(CLI::App* cmd, const std::string& key) {
  for (CLI::Option* opt : cmd->get_options())
    for (const auto& n : opt->get_lnames())
      if (n == key) return opt;
  return nullptr;
}

// The dash-separated words of a key, sorted: "lr-min" and "min-lr" are the same words.
std::vector<std::string> sorted_words(const std::string& key) {
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t i = 0; i <= key.size(); i++)
    if (i == key.size() || key[i] == '-') words.push_back(key.substr(start, i - start)), start = i + 1;
  std::sort(words.begin(), words.end());
  return words;
}

Status unknown_key(CLI::App* cmd, const std::string& name, const std::string& path) {
  // Suggest the nearest flag when it is close enough to be a typo or a word swap.
  const std::string key = normalise(name);
  std::string best;
  size_t best_d = std::max<size_t>(2, key.size() / 3) + 1;
  for (const CLI::Option* opt : cmd->get_options())
    for (const auto& n : opt->get_lnames()) {
      size_t d = sorted_words(key) == sorted_words(n) ? 0 : edit_distance(key, n);
      if (d < best_d) best = n, best_d = d;
    }
  return Status::error("unknown key '" + name + "' in " + path +
                       (best.empty() ? "" : " (did you mean '" + best + "'?)"));
}

bool given_on_command_line(const std::vector<std::string>& args, size_t from, const std::string& key) {
  for (size_t i = from; i < args.size(); i++)
    if (args[i] == "--" + key || args[i].starts_with("--" + key + "=")) return true;
  return false;
}

// Finds "--config FILE" / "--config=FILE" after position `from`, removes it.
bool take_config_path(std::vector<std::string>* args, size_t from, std::string* path) {
  for (size_t i = from; i < args->size(); i++) {
    if ((*args)[i] == "--config" && i + 1 < args->size()) {
      *path = (*args)[i + 1];
      args->erase(args->begin() + i, args->begin() + i + 2);
      return true;
    }
    if ((*args)[i].starts_with("--config=")) {
      *path = (*args)[i].substr(9);
      args->erase(args->begin() + i);
      return true;
    }
  }
  return false;
}

// Converts the values through the option itself (its type, arity and validators: what
// parsing the same flag would do), then forgets them, so that a bad value is reported with
// the file's name rather than later as a bare flag error. The option's variable is
// assigned on success; the real parse assigns it again from the same tokens.
Status check_values(CLI::Option* opt, const std::vector<std::string>& values, const std::string& where) {
  Status s;
  try {
    for (const auto& v : values) opt->add_result(v);
    opt->run_callback();
  } catch (const CLI::ParseError& e) {
    s = Status::error(where + ": " + e.what());
  }
  opt->clear();
  return s;
}

// "--key value..." tokens for one file entry.
Status entry_tokens(CLI::Option* opt, const std::string& key, const CLI::ConfigItem& item,
                    const std::string& path, std::vector<std::string>* out) {
  const std::string where = "key '" + item.name + "' in " + path;
  if (item.inputs.empty() || std::any_of(item.inputs.begin(), item.inputs.end(),
                                         [](const std::string& v) { return v.empty(); }))
    return Status::error(where + " has no value");
  if (item.inputs.size() > 1 && opt->get_expected_max() == 1)
    return Status::error(where + " takes one value, got " + std::to_string(item.inputs.size()));
  if (opt->get_expected_max() == 0) {  // a flag: true sets it, false leaves it off
    if (item.inputs.size() != 1 || (item.inputs[0] != "true" && item.inputs[0] != "false"))
      return Status::error(where + " must be true or false");
    if (item.inputs[0] == "true") out->push_back("--" + key);
    return Status::ok();
  }
  RETURN_IF_ERROR(check_values(opt, item.inputs, where));
  // "--key=value" keeps a value that starts with a dash from reading as a flag.
  if (item.inputs.size() == 1) return out->push_back("--" + key + "=" + item.inputs[0]), Status::ok();
  out->push_back("--" + key);
  for (const auto& v : item.inputs) out->push_back(v);
  return Status::ok();
}

bool earlier(const toml::node& a, const toml::node& b) {
  const auto &x = a.source().begin, &y = b.source().begin;
  return x.line != y.line ? x.line < y.line : x.column < y.column;
}

// A float as it is written in `text` (less TOML's digit separators), so that "lr = 2e-3"
// gives the flag "2e-3" as it always did; printed from the value, shortest first, when the
// text cannot be found or does not read as the same number.
std::string float_text(const toml::node& node, double v, const std::string& text) {
  size_t at = 0;
  for (size_t line = 1; line < node.source().begin.line && at != std::string::npos; line++)
    if ((at = text.find('\n', at)) != std::string::npos) at++;
  std::string written;
  // Columns count characters, not bytes: after a non-ASCII key the slice is off, and the
  // comparison below falls back to printing.
  if (at != std::string::npos) at += node.source().begin.column - 1;
  for (; at < text.size() && (std::isalnum((unsigned char)text[at]) || std::strchr("+-._", text[at])); at++)
    if (text[at] != '_') written += text[at];
  const double back = written.empty() ? NAN : std::strtod(written.c_str(), nullptr);
  if (back == v || (std::isnan(back) && std::isnan(v))) return written;
  char buf[40];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
}

// A value as flag text: strings as they are, numbers and booleans as written; an array
// gives one value per element. Dates, times and nested arrays or tables are no flag's value.
Status node_inputs(const toml::node& node, const std::string& text, const std::string& where,
                   std::vector<std::string>* out) {
  if (const toml::array* a = node.as_array()) {
    for (const toml::node& e : *a) {
      if (e.is_array() || e.is_table()) return Status::error(where + ": an array holds numbers, strings or booleans");
      RETURN_IF_ERROR(node_inputs(e, text, where, out));
    }
    return Status::ok();
  }
  if (auto v = node.value_exact<std::string>()) return out->push_back(*v), Status::ok();
  if (auto v = node.value_exact<int64_t>()) return out->push_back(std::to_string(*v)), Status::ok();
  if (auto v = node.value_exact<double>()) return out->push_back(float_text(node, *v, text)), Status::ok();
  if (auto v = node.value_exact<bool>()) return out->push_back(*v ? "true" : "false"), Status::ok();
  return Status::error(where + " (line " + std::to_string(node.source().begin.line) +
                       ") is a date or time, which no flag takes; quote it to pass it as text");
}

// What the TOML reader makes of the line `key = value`.
std::vector<std::string> read_back(const std::string& key, const std::string& value) {
  std::vector<CLI::ConfigItem> items;
  if (!parse_config_toml(key + " = " + value + "\n", "resolved options", &items).is_ok() || items.size() != 1)
    return {};
  return items[0].inputs;
}

// `v` as a TOML basic string: quote marks, backslashes and control characters escaped.
std::string quoted(const std::string& v) {
  std::string q = "\"";
  for (unsigned char c : v) {
    if (c == '"' || c == '\\') {
      q += '\\', q += (char)c;
    } else if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04X", c);
      q += esc;
    } else {
      q += (char)c;
    }
  }
  return q + "\"";
}

// `values` as TOML that reads back exactly as `values`: bare (not for text) or quoted, the
// first that does. False when neither does: an empty value, or one that is not UTF-8.
bool toml_value(const std::string& key, const std::vector<std::string>& values, bool text, std::string* out) {
  if (std::any_of(values.begin(), values.end(), [](const std::string& v) { return v.empty(); })) return false;
  for (const bool quote : {false, true}) {
    if (text && !quote) continue;
    std::string v = values.size() == 1 ? "" : "[";
    for (size_t i = 0; i < values.size(); i++) v += (i ? ", " : "") + (quote ? quoted(values[i]) : values[i]);
    if (values.size() > 1) v += "]";
    if (read_back(key, v) == values) return *out = v, true;
  }
  return false;
}

// A binary file would reach the TOML reader, whose message stops at the first NUL and
// carries the raw bytes after it: text is checked first, and the message shows the
// offending byte escaped, with its line and column.
Status check_config_text(const std::string& text, const std::string& path) {
  const size_t at = first_non_text_byte(text);
  if (at == std::string::npos) return Status::ok();
  const size_t line = 1 + (size_t)std::count(text.begin(), text.begin() + (long)at, '\n');
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = at + 1 - (line_start == std::string::npos || at == 0 ? 0 : line_start + 1);
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", (unsigned char)text[at]);
  return Status::error("config file " + path + " is not a UTF-8 text TOML file: byte " + byte + " at line " +
                       std::to_string(line) + ", column " + std::to_string(column) + " (offset " +
                       std::to_string(at) + "), near \"" + escaped_excerpt(text, at) + "\"");
}

}  // namespace

void add_config_option(CLI::App* cmd) {
  static std::string unused;  // expand_config_args() consumes the flag before parsing
  cmd->add_option("--config", unused,
                  "TOML file whose keys are this command's flags (flags given here win)");
}

Status expand_config_args(CLI::App& app, std::vector<std::string>* args) {
  // The innermost subcommand named on the command line ("bench step" -> step).
  size_t sub_at = 0;
  CLI::App* cmd = nullptr;
  for (CLI::App* parent = &app; sub_at < args->size(); sub_at++) {
    CLI::App* found = nullptr;
    for (CLI::App* sub : parent->get_subcommands({}))
      if (sub->get_name() == (*args)[sub_at]) found = sub;
    if (!found) {
      if (cmd) break;
      continue;
    }
    cmd = parent = found;
  }
  std::string path;
  if (!cmd || !take_config_path(args, sub_at, &path)) return Status::ok();
  if (!std::filesystem::exists(path)) return Status::error("config file not found: " + path);
  std::string text;
  RETURN_IF_ERROR(read_file(path, &text));
  RETURN_IF_ERROR(check_config_text(text, path));
  std::vector<CLI::ConfigItem> items;
  RETURN_IF_ERROR(parse_config_toml(text, path, &items));
  std::vector<std::string> tokens;
  RETURN_IF_ERROR(config_tokens(cmd, items, *args, sub_at, path, &tokens));
  args->insert(args->begin() + sub_at, tokens.begin(), tokens.end());
  return Status::ok();
}

Status parse_config_toml(const std::string& text, const std::string& path, std::vector<CLI::ConfigItem>* items) {
  toml::table table;
  RETURN_IF_ERROR(parse_toml(text, path, &table));
  // In the file's order (a table iterates by name), so the first bad key is the one reported.
  std::vector<std::pair<std::string, const toml::node*>> entries;
  for (const auto& [key, node] : table) entries.emplace_back(std::string(key.str()), &node);
  std::stable_sort(entries.begin(), entries.end(),
                   [](const auto& a, const auto& b) { return earlier(*a.second, *b.second); });
  items->clear();
  for (const auto& [key, node] : entries) {
    CLI::ConfigItem item;
    item.name = key;
    if (const toml::table* t = node->as_table()) {  // [section] or dotted.key: refused by config_tokens
      item.parents = {key};
      if (!t->empty()) item.name = std::string(t->cbegin()->first.str());
    } else {
      RETURN_IF_ERROR(node_inputs(*node, text, "key '" + key + "' in " + path, &item.inputs));
    }
    items->push_back(std::move(item));
  }
  return Status::ok();
}

Status config_tokens(CLI::App* cmd, const std::vector<CLI::ConfigItem>& items, const std::vector<std::string>& args,
                     size_t from, const std::string& path, std::vector<std::string>* tokens) {
  std::set<const CLI::Option*> seen;  // "seq_len" and "seq-len" are one key
  for (const auto& item : items) {
    if (item.name == "++" || item.name == "--") continue;  // section markers
    if (!item.parents.empty())
      return Status::error("config " + path + ": sections are not used; put '" + item.name +
                           "' at the top level");
    const std::string key = normalise(item.name);
    CLI::Option* opt = find_option(cmd, key);
    if (key == "config" || key == "help")
      return Status::error("'" + item.name + "' cannot be set inside a config file (" + path + ")");
    if (!opt) return unknown_key(cmd, item.name, path);
    if (!seen.insert(opt).second) return Status::error("key '" + item.name + "' is set twice in " + path);
    if (given_on_command_line(args, from, key)) continue;
    RETURN_IF_ERROR(entry_tokens(opt, key, item, path, tokens));
  }
  return Status::ok();
}

std::string resolved_config_toml(CLI::App* cmd, const std::vector<std::string>& skip) {
  std::string out = "# Resolved options of this run: meshtrain " + cmd->get_name() +
                    " --config config.toml\n";
  for (const CLI::Option* opt : cmd->get_options()) {
    if (opt->get_lnames().empty()) continue;
    const std::string key = opt->get_lnames()[0];
    if (key == "help" || key == "config" ||
        std::find(skip.begin(), skip.end(), key) != skip.end())
      continue;
    if (opt->get_expected_max() == 0) {  // a flag: written only when set
      if (opt->count() > 0) out += key + " = true\n";
      continue;
    }
    std::vector<std::string> values = opt->count() ? opt->results() : std::vector<std::string>{};
    if (values.empty() && !opt->get_default_str().empty()) values = {opt->get_default_str()};
    if (values.empty()) continue;  // unset
    std::string value;
    if (toml_value(key, values, opt->get_type_name() == "TEXT", &value))
      out += key + " = " + value + "\n";
    else
      out += "# " + key + ": not written (an empty value, or one that is not UTF-8 text); pass --" + key +
             " on the command line\n";
  }
  return out;
}

}  // namespace meshtrain::cli
