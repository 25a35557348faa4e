#!/usr/bin/env python3
"""Fails on an include that runs against src/layers.txt: a file of folder A including
"B/..." where A does not build on B, directly or through another folder. Also fails when a
folder of src/ is missing from the file or the file names a folder that does not exist.

Usage: check_layers.py SRC_DIR
"""
import os
import re
import sys


def read_layers(path):
    deps = {}
    for number, line in enumerate(open(path), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep:
            sys.exit("%s:%d: expected 'folder: folders it builds on'" % (path, number))
        for d in rest.split():
            if d not in deps:
                sys.exit("%s:%d: %s builds on %s, which is not declared above it" % (path, number, name, d))
        deps[name.strip()] = rest.split()
    return deps


def closure(deps):
    below = {}
    for name in deps:  # in file order: every dependency is already closed
        s = set(deps[name])
        for d in deps[name]:
            s |= below[d]
        below[name] = s
    return below


def main():
    src = sys.argv[1]
    deps = read_layers(os.path.join(src, "layers.txt"))
    below = closure(deps)
    folders = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    errors = []
    for f in folders:
        if f not in deps:
            errors.append("src/%s is not in src/layers.txt" % f)
    for f in deps:
        if f not in folders:
            errors.append("src/layers.txt names %s, which is not a folder of src/" % f)
    include = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')
    for f in folders:
        for root, _, files in os.walk(os.path.join(src, f)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.join(root, name)
                for number, line in enumerate(open(path, errors="replace"), 1):
                    m = include.match(line)
                    if not m or m.group(1) == f or m.group(1) not in deps:
                        continue
                    if m.group(1) not in below.get(f, set()):
                        errors.append("%s:%d includes %s/..., but %s does not build on %s (src/layers.txt)"
                                      % (os.path.relpath(path, os.path.dirname(src)), number, m.group(1), f,
                                         m.group(1)))
    for e in errors:
        print(e)
    if errors:
        sys.exit(1)
    print("layers: %d folders, every include runs down" % len(folders))


if __name__ == "__main__":
    main()
