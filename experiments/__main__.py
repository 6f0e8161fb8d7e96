"""Regenerate every results table and plot: ``python -m experiments all [--quick] [--resume]``.

``python -m experiments NAME [options]`` runs one script (same as ``python -m experiments.NAME``);
``python -m experiments check`` re-runs a slice of each and compares it with the committed rows.
The quick setting finishes in under 10 minutes on 2 cores; the full setting is what results/ holds.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from experiments.common import run
import time

SCRIPTS = (
    "fidelity",
    "memory_fidelity",
    "portability",
    "smsg_models",
    "symbolic",
    "verify",
    "exact_vs_heuristic",
    "pipeline",
    "scaling",
    "memory_bound",
    "sapp_scaling",
    "llama",
    "pictures",
    "train_check",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SCRIPTS + ("check",):
        return importlib.import_module(f"experiments.{argv[0]}").main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="python -m experiments",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "what", choices=["all"], help="'all', or one script name: " + ", ".join(SCRIPTS)
    )
    parser.add_argument("--quick", action="store_true", help="each script's quick setting")
    parser.add_argument(
        "--resume", action="store_true", help="skip configurations already in the CSVs"
    )
    parser.add_argument("--results", default="results", help="output folder (default results/)")
    args = parser.parse_args(argv)
    for name in SCRIPTS:
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        options = (
            ["--out", f"{args.results}/{name}.csv"]
            + ["--quick"] * args.quick
            + ["--resume"] * args.resume
        )
        code = importlib.import_module(f"experiments.{name}").main(options)
        print(f"== {name}: exit {code}, {time.perf_counter() - start:.1f} s", flush=True)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
