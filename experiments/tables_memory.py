"""Generated text for the memory-bound results (``results/memory_bound.csv``, the memory-limited
rows of ``results/scaling.csv``), the whole-graph benchmark and the regression benchmark's 3D
cases, so that the documentation quotes no figure by hand (``experiments.tables --readme``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

SHORT = {"gpt:layers={n},hidden=12288,heads=96,seq=2048,vocab=51200": "GPT-3 shapes, {n} layers"}


def _name(model: str) -> str:
    for pattern, short in SHORT.items():
        head, _, tail = pattern.partition("{n}")
        if model.startswith(head) and model.endswith(tail):
            return short.format(n=model[len(head) : len(model) - len(tail)])
    return model


def memory_bound(path: Path) -> str:
    """The default rows' outcome in counts and times, then each row where per-layer choices were
    run: the step time of every choice."""
    d = pd.read_csv(path)
    plain = d[d["decide"] == "none"]
    counts = ", ".join(f"{n} {s}" for s, n in plain["status"].value_counts().items())
    binds = plain[plain["memory_binds"] == True]  # noqa: E712 (a pandas column)
    optimal = binds[binds["status"] == "OPTIMAL"]
    slowest = plain.loc[plain["wall_time_s"].idxmax()]
    both = binds[(binds["status"] == "OPTIMAL") & (binds["whole_status"] == "OPTIMAL")]
    agree = int((both["objective"] == both["whole_objective"]).sum())
    lines = [
        f"{len(plain)} rows at the default settings: {counts}. Memory binds in {len(binds)}; "
        f"{len(optimal)} of them are certified OPTIMAL by the Pareto master in "
        f"{optimal['search_time_s'].min():.2f}-{optimal['search_time_s'].max():.2f} s (fronts of "
        f"up to {optimal['front_points'].max():.0f} points, up to {optimal['labels'].max():,.0f} "
        f"labels per boundary layout). The slowest default row takes {slowest['wall_time_s']:.1f} "
        f"s, costing included ({_name(slowest['model'])} on {slowest['mesh']}, "
        f"{slowest['status']}). The whole-program CP-SAT beside the binding rows: "
        + ", ".join(f"{n} {s}" for s, n in binds["whole_status"].value_counts().items())
        + f"; of the {len(both)} rows where both are OPTIMAL, {agree} have equal objectives.",
        "",
    ]
    return "\n".join(lines + _choices(d))


def _choices(d: pd.DataFrame) -> list[str]:
    lines = [
        "| binding row | default | recompute auto | ZeRO auto | both | search s (both) |",
        "|---|---|---|---|---|---|",
    ]
    decided = d[d["decide"] != "none"][["model", "mesh"]].drop_duplicates()
    for _, key in decided.iterrows():
        rows = d[(d["model"] == key["model"]) & (d["mesh"] == key["mesh"])]
        cell = {r["decide"]: _cell(r) for _, r in rows.iterrows()}
        if all(c == "INFEASIBLE" for c in cell.values()):
            continue
        both = rows[rows["decide"] == "both"]
        search = f"{both['search_time_s'].iloc[0]:.1f}" if len(both) else "-"
        lines.append(
            f"| {_name(key['model'])}, {key['mesh']} | {cell.get('none', '-')} | "
            f"{cell.get('recompute', '-')} | {cell.get('zero', '-')} | {cell.get('both', '-')} | "
            f"{search} |"
        )
    return lines


def _cell(r) -> str:
    if pd.isna(r["estimated_step_time_s"]):
        return str(r["status"])
    chosen = [str(r[c]) for c in ("layer_recompute", "layer_zero") if isinstance(r[c], str)]
    detail = f" ({'; '.join(chosen)})" if chosen else ""
    status = "" if r["status"] == "OPTIMAL" else f" {r['status']}"
    return f"{r['estimated_step_time_s']:.3f} s{status}{detail}"


def scaling_limited(path: Path) -> str:
    """The scaling rows under the device's memory limit."""
    d = pd.read_csv(path)
    d = d[d["memory"] == "device"]
    lines = ["| mesh | layers | status | search s |", "|---|---|---|---|"]
    for _, r in d.iterrows():
        lines.append(f"| {r['mesh']} | {r['layers']} | {r['status']} | {r['search_time_s']:.2f} |")
    return "\n".join(lines)


def whole_graph(path: Path) -> str:
    """The whole-graph program alone (``benchmarks/whole_graph.py``)."""
    d = pd.read_csv(path)
    return (
        "; ".join(
            f"{r['model']} on {r['mesh']}: {r['status']} in {r['search_time_s']:.2f} s "
            f"({int(r['booleans']):,} Booleans, objective {int(r['objective']):,} ns)"
            for _, r in d.iterrows()
        )
        + "."
    )


def regress_3d(path: Path) -> str:
    """The 3D cases of the regression benchmark (``benchmarks/regress.py``)."""
    d = pd.read_csv(path).set_index("case")
    out = []
    for case, what in (
        ("3d-175b-1024", "GPT-3 175B on 1,024 A100 (batch 1536)"),
        ("3d-1t-3072", "the 1T GPT on 3,072 A100 (batch 3072)"),
        ("zero3-384", "GPT-3 175B as ZeRO-3 on 384 A100 (evaluated)"),
    ):
        if case in d.index:
            r = d.loc[case]
            out.append(
                f"{what}: {r['status']}, {float(r['figure']):.2f} s per iteration, {r['detail']} "
                f"({r['wall_s']} s wall)"
            )
    return "; ".join(out) + "."


def memory_fidelity(path: Path) -> str:
    """Published runs: predicted memory of the fullest GPU (its parts and the reserve), the measured
    peak where reported, and whether the model lets the run fit."""
    d = pd.read_csv(path)
    lines = [
        "| source | configuration | GPUs | tp/pp/dp | recompute | predicted GiB (state + "
        "activations x in flight + working + reserve) | measured GiB | error | fits |",
        "| --- | --- | ---: | --- | --- | --- | ---: | ---: | --- |",
    ]
    for r in d.itertuples():
        measured = "" if pd.isna(r.measured_gib) else f"{r.measured_gib:.1f}"
        if r.status == "NOT_MODELLED":
            lines.append(
                f"| {r.source} | {r.config} | {r.gpus} | {r.tp}/{r.pp}/{r.dp} | {r.recompute} | "
                f"not modelled | {measured} | | |"
            )
            continue
        parts = (
            f"{r.predicted_gib:.1f} ({r.model_state_gib:.1f} + {r.activations_gib:.1f} x"
            f"{r.inflight_microbatches:g} + {r.working_gib:.1f} + {r.reserve_gib:.1f})"
        )
        error = "" if pd.isna(r.rel_error) else f"{100 * r.rel_error:+.0f}%"
        lines.append(
            f"| {r.source} | {r.config} | {r.gpus} | {r.tp}/{r.pp}/{r.dp} | {r.recompute} | "
            f"{parts} | {measured} | {error} | {'yes' if r.fits else 'no'} |"
        )
    costed = d[d["status"] != "NOT_MODELLED"]
    lines.append("")
    lines.append(
        f"{int(costed['fits'].sum())} of {len(costed)} costed runs fit (every one trained); "
        f"{len(d) - len(costed)} not modelled."
    )
    return "\n".join(lines)
