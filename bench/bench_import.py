"""What a command costs before it does anything: CPU seconds to import the package and to answer ``--help``.

Each measurement is a fresh interpreter (``python -c ...``), so nothing is cached in-process; the CPU time of the
child (user + system) is counted, not wall time, so other work on the machine does not inflate it. The baseline,
in the same run and alternating with the others, is ``import torch, transformers``: what every command paid before
the package's names were imported on first use. Results: the ``import`` section of bench/RESULTS.md.

    python bench/bench_import.py [--repeats 7] [--quick] [--results PATH]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from _results import results_file, update_table  # bench/ is the script's directory, first on sys.path

_HELP = "import sys\nfrom inactive_heads.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
COMMANDS = {
    "import torch, transformers (baseline)": "import torch, transformers",
    "import inactive_heads": "import inactive_heads",
    "inactive-heads --help": _HELP,
    "import inactive_heads; ih.SCORE_FUNCTIONS": "import inactive_heads as ih; ih.SCORE_FUNCTIONS",
}


def child_cpu_seconds(code: str) -> float:
    """User + system CPU seconds of a fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="one repeat each, into a temporary copy of RESULTS.md")
    parser.add_argument("--results", type=Path, default=None, help="default: bench/RESULTS.md")
    args = parser.parse_args()
    args.results = results_file(args.results, args.quick)
    repeats = 1 if args.quick else args.repeats
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(repeats):  # alternating, so a change in machine load hits every command alike
        for name, code in COMMANDS.items():
            seconds[name].append(child_cpu_seconds(code))
    base = statistics.median(seconds["import torch, transformers (baseline)"])
    rows = []
    for name, values in seconds.items():
        median = statistics.median(values)
        rows.append([name, f"{median:.3f}", f"{min(values):.3f}-{max(values):.3f}", f"{median / base:.3f}"])
        print(f"{name:45s} {median:.3f} s CPU ({median / base:.3f}x the baseline)")
    update_table("import", ["command", "CPU s (median)", "range", "vs baseline"], rows, key=1, path=args.results)


if __name__ == "__main__":
    main()
