"""Benchmark: D-Rec (SMSG recursive bisection) search time per operator from 12 to 96 GPT layers.

Prints time per operator and the 96/12 ratio (linear time means a ratio near 1; the target is <= 2).
Usage: python benchmarks/drec_scaling.py [--mesh 8x8]
"""

from __future__ import annotations

import argparse
import sys
import time

from planner import make_cluster, make_problem
from planner.search.baselines import drec

MODEL = "gpt:layers={},hidden=12288,heads=96,seq=2048,vocab=51200"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mesh", default="8x8")
    parser.add_argument("--layers", default="12,96")
    args = parser.parse_args(argv)
    per_op = {}
    for layers in (int(x) for x in args.layers.split(",")):
        problem = make_problem(MODEL.format(layers), make_cluster(args.mesh, "a100-80g"))
        start = time.perf_counter()
        drec(problem)
        elapsed = time.perf_counter() - start
        per_op[layers] = elapsed / len(problem.ops)
        print(
            f"layers {layers:4d}: {len(problem.ops)} operators, drec {elapsed:.3f} s, "
            f"{per_op[layers] * 1e3:.3f} ms per operator"
        )
    first, last = min(per_op), max(per_op)
    print(f"time per operator, {last} vs {first} layers: ratio {per_op[last] / per_op[first]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
