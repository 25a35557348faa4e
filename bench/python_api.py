#!/usr/bin/python3
"""What the Python module costs, against the command line on the same machine in the same run:
`import meshtrain` (beyond NumPy's import, which it needs), and a `plan` call against the same
`meshtrain plan --json` as a process. Medians of REPEATS runs, each import in a fresh interpreter.

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/python_api.py [REPEATS]
"""

import os
import statistics
import subprocess
import sys
import time

REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
PLANS = [  # (what, flags)
    ("llama3-70b, 512 x h100-80g, tp 1", ["--model", "llama3-70b", "--cluster", "h100-80g", "--gpus", "512",
                                         "--global-batch", "512", "--tp", "1", "--top", "1"]),
    ("gpt3-175b, 1024 x a100-80g, searched", ["--model", "gpt3-175b", "--cluster", "a100-80g", "--gpus", "1024",
                                             "--global-batch", "1536", "--top", "1"]),
]


def import_seconds(statement):
    """Seconds `statement` takes in a fresh interpreter (timed inside it, without its start)."""
    code = "import time; t = time.perf_counter(); %s; print(time.perf_counter() - t)" % statement
    return float(subprocess.check_output([sys.executable, "-c", code], text=True))


def median_time(fn):
    times = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    import meshtrain

    print("bench/python_api: %s, %d cores, Python %s, median of %d" % (cpu_model(), os.cpu_count(),
                                                                     sys.version.split()[0], REPEATS))
    numpy_s = statistics.median(import_seconds("import numpy") for _ in range(REPEATS))
    both_s = statistics.median(import_seconds("import numpy, meshtrain") for _ in range(REPEATS))
    print("import numpy            %.3f s" % numpy_s)
    print("import numpy, meshtrain %.3f s  (meshtrain's own share %.3f s)" % (both_s, both_s - numpy_s))
    for what, flags in PLANS:
        cli_s = median_time(lambda: subprocess.check_output([meshtrain._meshtrain.binary, "plan", "--json"] + flags))
        py_s = median_time(lambda: meshtrain._meshtrain.run_command(["plan", "--json"] + flags))
        print("plan %-38s python %.3f s   meshtrain plan (a process) %.3f s   ratio %.2f" % (what, py_s, cli_s,
                                                                                          cli_s / py_s))


if __name__ == "__main__":
    main()
