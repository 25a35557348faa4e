"""The Brown corpus's GPT-2 tokens folded mod 256, as llm.c token files: a 256-token
vocabulary for benchmarks whose head must stay small next to the blocks (bench/pp.sh,
bench/cp.sh).

Usage: brown_mod256.py SRC_DIR DST_DIR   (SRC_DIR holds train.bin and val.bin)
llm.c token files: a 256 x int32 header (magic, version, count, ...), then uint16 tokens.
"""
import os
import struct
import sys


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    for name in ("train.bin", "val.bin"):
        raw = open(os.path.join(src, name), "rb").read()
        count = struct.unpack_from("<i", raw, 8)[0]
        tokens = struct.unpack_from("<%dH" % count, raw, 1024)
        header = struct.pack("<3i", 20240520, 1, count) + bytes(1024 - 12)
        with open(os.path.join(dst, name), "wb") as f:
            f.write(header + struct.pack("<%dH" % count, *(t % 256 for t in tokens)))


if __name__ == "__main__":
    main()
