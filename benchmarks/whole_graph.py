"""Benchmark: the whole-graph integer program on gpt2-small (batch 8) on meshes 8 and 2x4.

Prints status, objective and search time; writes results/bench_whole_graph.csv.
Usage: python benchmarks/whole_graph.py [--time-limit S] [--meshes 8,2x4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
import time

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the experiments package
from experiments.common import with_provenance  # noqa: E402
from planner import make_cluster, make_problem
from planner.outputs import write_csv
from planner.search.solver import solve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--meshes", default="8,2x4")
    parser.add_argument("--device", default="a100-80g")
    parser.add_argument("--time-limit", type=float, default=300.0)
    parser.add_argument("--out", default="results/bench_whole_graph.csv")
    args = parser.parse_args(argv)
    rows = []
    for mesh in args.meshes.split(","):
        cluster = make_cluster(mesh, args.device)
        start = time.perf_counter()
        problem = make_problem(args.model, cluster, batch=8)
        build_s = time.perf_counter() - start
        result = solve(problem, cluster.memory_limit, args.time_limit)
        rows.append(
            {
                "model": args.model,
                "mesh": mesh,
                "device": args.device,
                "method": "whole",
                "status": result.status,
                "objective": result.objective,
                "bound": result.bound,
                "booleans": result.num_booleans,
                "build_time_s": round(build_s, 3),
                "search_time_s": round(result.search_time_s, 3),
            }
        )
        print(rows[-1], flush=True)
    write_csv(args.out, with_provenance(rows, "benchmarks/whole_graph.py", args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
