"""The README's exact-against-practice table: per model, how much slower the Megatron grid and
SAPP's D-Rec are than the exact plan (``results/exact_vs_heuristic.csv``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def exact_grid_sapp(path: Path) -> str:
    """Per model: the meshes where exact is OPTIMAL, and the median and worst gap of the Megatron
    grid and of SAPP to it (a gap: how much longer their step is, same cost model)."""
    d = pd.read_csv(path)
    gaps = d[d["method"].isin(["megatron-grid", "sapp"])].dropna(subset=["gap_to_exact_percent"])
    rows = []
    for model, group in gaps.groupby("model", sort=False):
        row = {"model": model, "meshes": group["mesh"].nunique()}
        for method, name in (("megatron-grid", "Megatron grid"), ("sapp", "SAPP")):
            gap = group[group["method"] == method]["gap_to_exact_percent"]
            row[f"{name}: median gap %"] = round(float(gap.median()), 1)
            row[f"{name}: worst gap %"] = round(float(gap.max()), 1)
        rows.append(row)
    table = pd.DataFrame(rows)
    header = "| " + " | ".join(table.columns) + " |"
    lines = [header, "|" + "---|" * len(table.columns)]
    lines += [
        "| " + " | ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in r) + " |"
        for r in table.itertuples(index=False)
    ]
    return "\n".join(lines)


def threed(path: Path) -> str:
    """benchmarks/threed.py: the 3D search beside the best point of a Megatron-style grid."""
    d = pd.read_csv(path)
    engine = "for_megatron_s" in d.columns  # results written before `plan --for` have none
    bound = "lower_bound_s" in d.columns  # nor before the lower bound
    certified = "certified_status" in d.columns  # nor before --certify
    lines = [
        "| case | `plan --pipeline auto` (s) | its configuration | search wall (s) | best grid "
        "point (s) | its flags | search / grid |"
        + (
            " `plan --for megatron` (s) | its wall (s) | --for / the grid with fp32 main "
            "gradients |"
            if engine
            else ""
        )
        + (" lower bound (s) | search gap | grid gap |" if bound else "")
        + (
            " `--certify` (s) | its status | its wall (s) | search / certified |"
            if certified
            else ""
        ),
        "| --- | ---: | --- | ---: | ---: | --- | ---: |"
        + (" ---: | ---: | ---: |" if engine else "")
        + (" ---: | ---: | ---: |" if bound else "")
        + (" ---: | --- | ---: | ---: |" if certified else ""),
    ]
    for r in d.itertuples():
        lines.append(
            f"| {r.case} | {r.search_iteration_s:.3f} | {r.search_config} | "
            f"{r.search_wall_s:.1f} | {r.grid_best_s:.3f} | `{r.grid_best_flags}` | "
            f"{r.ratio:.3f} |"
            + (
                f" {r.for_megatron_s:.3f} | {r.for_megatron_wall_s:.1f} | "
                f"{r.for_megatron_ratio:.3f} |"
                if engine
                else ""
            )
            + (f" {r.lower_bound_s:.3f} | {r.search_gap:.1%} | {r.grid_gap:.1%} |" if bound else "")
            + (_certified_cells(r) if certified else "")
        )
    return "\n".join(lines)


def _certified_cells(r) -> str:
    """The certified search's cells of a threed row (blank where it was not run)."""
    if not isinstance(r.certified_status, str):
        return " - | not run | - | - |"
    return (
        f" {r.certified_iteration_s:.3f} | {r.certified_status} | {r.certified_wall_s:.1f} | "
        f"{r.search_over_certified:.3f} |"
    )


def symbolic(path: Path) -> str:
    """Per mesh: how many operators the symbolic plan shares with the datasheet plan, and how much
    slower the symbolic plan runs on the datasheet device (``results/symbolic.csv``)."""
    d = pd.read_csv(path)
    rows = [
        "| mesh | models | operators | same strategy | median slowdown on a100-80g | worst |",
        "|---|---|---|---|---|---|",
    ]
    for mesh, g in list(d.groupby("mesh", sort=False)) + [("all", d)]:
        rows.append(
            f"| {mesh} | {g['model'].nunique()} | {g['operators'].sum()} | "
            f"{g['agree'].sum() / g['operators'].sum():.0%} | {g['slowdown'].median():.3f} | "
            f"{g['slowdown'].max():.2f} ({g.loc[g['slowdown'].idxmax(), 'model']}) |"
        )
    return "\n".join(rows)
