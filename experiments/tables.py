"""Print the README's markdown tables from the CSVs under results/ (nothing is recomputed).

    python -m experiments.tables
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd


def markdown(frame: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (index included), without optional dependencies."""
    frame = frame.reset_index()
    cols = [" ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join("-" if pd.isna(v) else (f"{v:.4g}" if isinstance(v, float) else str(v))
                                       for v in row) + " |")
    return "\n".join(lines)


def scaling(path: Path) -> str:
    d = pd.read_csv(path)
    d = d[d["memory"] == "none"]
    rows = ["| mesh | layers | exact status | exact search s | whole-graph status | whole-graph s | speed-up |",
            "|---|---|---|---|---|---|---|"]
    for _, r in d.iterrows():
        speed = "-" if pd.isna(r.get("speedup")) else f"{r['speedup']:.0f}x"
        rows.append(f"| {r['mesh']} | {r['layers']} | {r['status']} | {r['search_time_s']:.2f} | {r['whole_status']} | "
                    f"{r['whole_search_time_s']:.1f} | {speed} |")
    return "\n".join(rows)


def heuristics(path: Path) -> str:
    d = pd.read_csv(path)
    g = d.groupby("method")
    table = pd.DataFrame({"median gap %": g["gap_percent"].median(), "worst gap %": g["gap_percent"].max(),
                          "rows with a gap": g["gap_percent"].count(),
                          "median search s": g["search_time_s"].median(), "worst search s": g["search_time_s"].max()})
    order = [m for m in ("exact", "whole", "drec", "megatron", "dp", "zero", "greedy") if m in table.index]
    return markdown(table.loc[order].round(2))


def pipeline(path: Path) -> str:
    d = pd.read_csv(path)
    rnd = d[(d["source"] == "random") & (d["method"] == "csimd")]
    within = (rnd["gap_percent"] <= 1.0).sum()
    lines = [f"CSIMD within 1% of the exact DP on {within} of {len(rnd)} random chains "
             f"(median gap {rnd['gap_percent'].median():.3f}%, worst {rnd['gap_percent'].max():.3f}%).", ""]
    other = d[d["source"] != "random"]
    pivot = other.pivot_table(index=["source", "layers"], columns="method", values=["gap_percent", "search_time_s"])
    lines.append(markdown(pivot))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default="results")
    args = parser.parse_args(argv)
    base = Path(args.results)
    for title, fn, name in (("Scaling", scaling, "scaling.csv"), ("Exact vs heuristics", heuristics,
                            "exact_vs_heuristic.csv"), ("Pipeline", pipeline, "pipeline.csv")):
        if (base / name).is_file():
            print(f"### {title}\n\n{fn(base / name)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
