#!/usr/bin/env python3
"""Fails on a function in src/ longer than 80 lines (issue 44), counted from the line that
starts its definition to its closing brace.

A definition is found the way this code base writes them: it starts in column 0 (not a
namespace, type, template, directive, comment or variable), has a '(' and opens its body
with '{' before any ';'; the body ends at the next '}' in column 0. Class bodies are not
looked into (member functions defined in headers are short by the same convention).

Two lists name the exceptions, by file and function name:
  TABLES: a function that is a table (one entry per line: every flag of a command, every
          field of a record), which the issue exempts;
  OWED:   a function still over the limit, with the work that will split it. The check also
          fails when an OWED function has come under the limit, so the list only shrinks.

Usage: check_function_length.py SRC_DIR
"""
import os
import re
import sys

LIMIT = 80

TABLES = {
    ("cli/train_command.cc", "add_train_command"),  # every flag of train
    ("train/options.cc", "to_json"),                 # every field of the run's record
}

OWED: set = set()

SKIP = re.compile(r"(namespace|struct|class|enum|union|template|#|//|}|using|extern|static_assert|typedef|"
                  r"inline constexpr|constexpr \w+ \w+ *=|const \w+.*=)")
NAME = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(")


def functions(path):
    """(name, first line, length) of each top-level function definition in the file."""
    lines = open(path, errors="replace").read().split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and "(" in line and not SKIP.match(line):
            j = i
            while j < len(lines) and "{" not in lines[j] and ";" not in lines[j]:
                j += 1
            if j < len(lines) and "{" in lines[j] and not lines[j].rstrip().endswith("};"):
                if lines[j].count("{") == lines[j].count("}"):  # a one-line body
                    i = j + 1
                    continue
                k = j + 1
                while k < len(lines) and not lines[k].startswith("}"):
                    k += 1
                name = NAME.search(line.split("(")[0] + "(")
                yield (name.group(1) if name else line.strip()), i + 1, k - i + 1
                i = k + 1
                continue
        i += 1


def main():
    src = sys.argv[1]
    over, seen = [], set()
    for folder, _, files in sorted(os.walk(src)):
        for f in sorted(files):
            if not f.endswith((".cc", ".h")):
                continue
            path = os.path.join(folder, f)
            rel = os.path.relpath(path, src)
            for name, line, length in functions(path):
                key = (rel, name)
                if length <= LIMIT or key in TABLES:
                    continue
                seen.add(key)
                if key not in OWED:
                    over.append(f"{rel}:{line}: {name} is {length} lines (at most {LIMIT}: split it)")
    for key in sorted(OWED - seen):
        over.append(f"{key[0]}: {key[1]} is no longer over {LIMIT} lines: take it off OWED")
    for message in over:
        print(message)
    print(f"check_function_length: {len(over)} problem(s); {len(seen)} owed function(s) still over {LIMIT} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
