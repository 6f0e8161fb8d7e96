"""Print the README's markdown tables from the CSVs under results/ (nothing is recomputed).

python -m experiments.tables [--readme README.md docs/*.md]
"""

from __future__ import annotations

import argparse
import sys

from experiments import tables_grid, tables_memory
from experiments.common import run
from pathlib import Path

import pandas as pd


def markdown(frame: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (index included), without optional dependencies."""
    frame = frame.reset_index()
    cols = [" ".join(map(str, c)) if isinstance(c, tuple) else str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in frame.itertuples(index=False):
        lines.append(
            "| "
            + " | ".join(
                "-" if pd.isna(v) else (f"{v:.4g}" if isinstance(v, float) else str(v)) for v in row
            )
            + " |"
        )
    return "\n".join(lines)


def scaling(path: Path) -> str:
    d = pd.read_csv(path)
    d = d[d["memory"] == "none"]
    rows = [
        "| mesh | layers | exact status | exact search s | whole-graph status | whole-graph s | "
        "speed-up |",
        "|---|---|---|---|---|---|---|",
    ]
    for _, r in d.iterrows():
        speed = "-" if pd.isna(r.get("speedup")) else f"{r['speedup']:.0f}x"
        rows.append(
            f"| {r['mesh']} | {r['layers']} | {r['status']} | {r['search_time_s']:.2f} | "
            f"{r['whole_status']} | {r['whole_search_time_s']:.1f} | {speed} |"
        )
    return "\n".join(rows)


def heuristics(path: Path) -> str:
    d = pd.read_csv(path)
    g = d.groupby("method")
    table = pd.DataFrame(
        {
            "median gap %": g["gap_to_exact_percent"].median(),
            "worst gap %": g["gap_to_exact_percent"].max(),
            "rows with a gap": g["gap_to_exact_percent"].count(),
            "median search s": g["search_time_s"].median(),
            "worst search s": g["search_time_s"].max(),
        }
    )
    order = [
        m
        for m in (
            "exact",
            "whole",
            "sapp",
            "drec-cost",
            "megatron-grid",
            "megatron",
            "dp",
            "zero",
            "greedy",
        )
        if m in table.index
    ]
    return markdown(table.loc[order].round(2))


def pipeline(path: Path) -> str:
    d = pd.read_csv(path)
    rnd = d[(d["source"] == "random") & (d["method"] == "csimd")]
    gaps = rnd["gap_to_exact_percent"]
    within = (gaps <= 1.0).sum()
    lines = [
        f"CSIMD within 1% of the exact DP on {within} of {len(rnd)} random chains (median gap "
        f"{gaps.median():.3f}%, worst {gaps.max():.3f}%).",
        "",
    ]
    other = d[d["source"] != "random"]
    pivot = other.pivot_table(
        index=["source", "layers"],
        columns="method",
        values=["gap_to_exact_percent", "search_time_s"],
    )
    lines.append(markdown(pivot))
    return "\n".join(lines)


def fidelity(path: Path) -> str:
    d = pd.read_csv(path)
    summary = dict(zip(d[d["source"] == "summary"]["config"], d[d["source"] == "summary"]["value"]))
    lines = _fidelity_table1(d, summary) + _fidelity_fig13(d, summary)
    return "\n".join(lines + _fidelity_ablation(d) + _fidelity_sweep(d))


def _fidelity_table1(d: pd.DataFrame, summary: dict) -> list[str]:
    lines = [
        "| config | tp | pp | dp | batch | measured s | predicted s | rel. error | split |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in d[d["source"] == "table1"].iterrows():
        lines.append(
            f"| {r['config']} | {int(r['tp'])} | {int(r['pp'])} | {int(r['dp'])} | "
            f"{int(r['global_batch'])} | {r['measured_s']:.2f} | {r['predicted_s']:.2f} | "
            f"{100 * r['rel_error']:.1f}% | {r['split']} |"
        )
    pct = lambda key: f"{100 * float(summary[key]):.1f}%"
    return lines + [
        "",
        f"Table 1: mean relative error {pct('table1_mean_rel_error_all_raw')} (max "
        f"{pct('table1_max_rel_error_all_raw')}) with the datasheet profile as is; with one "
        f"efficiency factor fitted on the fit rows ({float(summary['table1_fitted_factor']):.3f}), "
        f"held-out rows: mean {pct('table1_mean_rel_error_test_fitted')}, max "
        f"{pct('table1_max_rel_error_test_fitted')} (raw on the same rows: mean "
        f"{pct('table1_mean_rel_error_test_raw')}).",
        "",
    ]


def _fidelity_fig13(d: pd.DataFrame, summary: dict) -> list[str]:
    lines = [
        "| (pipeline, tensor) | predicted s/iteration | predicted rank | measured TFLOP/s per GPU "
        "|",
        "|---|---|---|---|",
    ]
    f13 = d[d["source"] == "fig13"].sort_values("predicted_s")
    for rank, (_, r) in enumerate(f13.iterrows(), 1):
        lines.append(
            f"| ({int(r['pp'])}, {int(r['tp'])}) | {r['predicted_s']:.1f} | {rank} | "
            f"{r['measured_tflops']:.0f} |"
        )
    for key in sorted(k for k in summary if k.startswith("fig13") and k.endswith("spearman")):
        batch = key.split("_")[1]
        lines += [
            "",
            f"Figure 13 ({batch}): Spearman {float(summary[key]):.2f}, Kendall "
            f"{float(summary[key.replace('spearman', 'kendall')]):.2f}; predicted best "
            f"{summary[key.replace('spearman', 'predicted_best')]}.",
        ]
    return lines


def _fidelity_ablation(d: pd.DataFrame) -> list[str]:
    ablation = d[d["source"] == "ablation"]
    if not len(ablation):
        return []
    lines = [
        "",
        "| cost model (terms added in turn) | Table 1 mean error | max error |",
        "|---|---|---|",
    ]
    values = dict(zip(ablation["config"], ablation["value"].astype(float)))
    for variant in dict.fromkeys(ablation["variant"]):
        lines.append(
            f"| {variant} | {100 * values[f'{variant} mean']:.1f}% | "
            f"{100 * values[f'{variant} max']:.1f}% |"
        )
    return lines


def _fidelity_sweep(d: pd.DataFrame) -> list[str]:
    sweep = d[d["source"] == "microbatch"]
    if not len(sweep):
        return []
    lines = [
        "",
        "| micro-batch (91B GPT, t=8, p=8, 64 GPUs, batch 512) | predicted s/iteration | "
        "samples/s |",
        "|---|---|---|",
    ]
    for _, r in sweep.iterrows():
        lines.append(f"| {r['config'][1:]} | {r['predicted_s']:.2f} | {float(r['value']):.2f} |")
    return lines


def portability(path: Path) -> str:
    d = pd.read_csv(path)
    cols = [
        "model",
        "changed",
        "devices",
        "device",
        "inter_node_bandwidth_gbps",
        "batch",
        "pipeline_degree",
        "data_parallel_degree",
        "tensor_parallel_intra_node",
        "tensor_parallel_inter_node",
        "iteration_time_s",
        "replan_time_s",
    ]
    frame = d[cols].copy()
    frame["inter_node_bandwidth_gbps"] = frame["inter_node_bandwidth_gbps"].round(1)
    return markdown(frame.set_index("model").round(3))


def smsg_models(path: Path) -> str:
    d = pd.read_csv(path)
    d["step_ms"] = 1e3 * d["estimated_step_time_s"]
    step = d.pivot_table(index=["model", "devices"], columns="method", values="step_ms")
    eff = d.pivot_table(index=["model", "devices"], columns="method", values="scaling_efficiency")
    table = step.round(2).astype(str) + " (" + eff.round(2).astype(str) + ")"
    return (
        "Estimated step time in ms (scaling efficiency against the exact plan at the smallest "
        "device count where it fits; nan: does not fit in 80 GB):\n\n" + markdown(table)
    )


def verify(path: Path) -> str:
    d = pd.read_csv(path)
    lines = [
        "| model | batch | mesh | method | sharded ops | numpy max rel. error | predicted bytes | "
        "compiled bytes | total error | worst axis error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_verify_row(r) for _, r in d.iterrows()]
    ok, refused = (d["status"] == "OK").sum(), (d["status"] == "REFUSED").sum()
    tail = f"; {refused} refused by the 12 GB memory budget of the checks" if refused else ""
    return "\n".join(lines) + (
        f"\n\n{ok} of {len(d) - refused} checked plans within 5% in total and on every mesh "
        f"axis{tail}."
    )


def _verify_row(r: pd.Series) -> str:
    head = f"| {r['model']} | {r['batch']} | {r['mesh']} | {r['method']} | "
    head += f"{r['sharded_ops']}/{r['operators']} | "
    if r["status"] == "REFUSED":
        return head + f"refused: {r['reason']} | | | | |"
    error = r["numpy_max_rel_error"]
    numpy = "XLA only" if pd.isna(error) else f"{error:.1e}"
    return head + (
        f"{numpy} | {r['predicted_bytes']:,.0f} | {r['compiled_bytes']:,.0f} | "
        f"{100 * r['total_rel_error']:.2f}% | {100 * r['max_axis_rel_error']:.2f}% |"
    )


def sapp_scaling(path: Path) -> str:
    d = pd.read_csv(path)
    lines = [
        "| devices (order) | layers | operators | search ms | us per operator | x of the fewest "
        "layers |",
        "|---|---|---|---|---|---|",
    ]
    for devices, group in d.groupby("devices"):
        group = group.sort_values("layers")
        first = group["us_per_operator"].iloc[0]
        for _, r in group.iterrows():
            lines.append(
                f"| {devices} ({r['order']}) | {r['layers']} | {r['operators']} | "
                f"{1e3 * r['search_time_s']:.1f} | {r['us_per_operator']:.1f} | "
                f"{r['us_per_operator'] / first:.2f} |"
            )
    return "\n".join(lines)


def llama(path: Path) -> str:
    d = pd.read_csv(path)
    intra = d[d["part"] == "intra"]
    lines = [
        "| llama3-8b mesh | method | status | step s | gap % | GiB per device | fits | search s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in intra.iterrows():
        gap = "-" if pd.isna(r["gap_to_exact_percent"]) else f"{r['gap_to_exact_percent']:.1f}"
        lines.append(
            f"| {r['mesh']} | {r['method']} | {r['status']} | {r['iteration_time_s']:.3f} | {gap} "
            f"| {r['max_memory_gib']:.1f} | {r['fits_memory']} | {r['search_time_s']:.2f} |"
        )
    lines += [
        "",
        "| model | H100s | pp | tp | dp | micro-batches | recompute | seq. parallel | ZeRO | s / "
        "iteration | GiB | search s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in d[d["part"] == "3d"].iterrows():
        lines.append(
            f"| {r['model']} | {int(r['devices'])} | {int(r['pipeline_degree'])} | "
            f"{int(r['tensor_parallel_degree'])} | {int(r['data_parallel_degree'])} | "
            f"{int(r['num_microbatches'])} | {r['recompute']} | {r['sequence_parallel']} | "
            f"{int(r['zero'])} | {r['iteration_time_s']:.2f} | {r['max_memory_gib']:.1f} | "
            f"{r['search_time_s']:.1f} |"
        )
    return "\n".join(lines)


def train_check(path: Path) -> str:
    d = pd.read_csv(path)
    lines = [
        "| mesh | plan | engine | steps | first loss | last loss | max rel. loss difference | "
        "predicted bytes | engine's bytes | worst axis error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    # the 3D row counts no bytes
    number = lambda v, fmt: "-" if pd.isna(v) else format(v, fmt)  # noqa: E731
    for _, r in d.iterrows():
        plan = r["plan_source"] if r["plan_source"] != "3d" else f"3D ({r.get('notes', '')})"
        lines.append(
            f"| {r['mesh']} | {plan} | {r['engine']} | {r['steps']} | {r['first_loss']:.3f} | "
            f"{r['last_loss']:.3f} | {r['max_loss_rel_diff']:.1e} | "
            f"{number(r['predicted_bytes'], ',.0f')} | {number(r['observed_bytes'], ',.0f')} | "
            f"{number(100 * r['max_axis_rel_error'], '.2f')}% |"
        )
    counted = d[d["max_axis_rel_error"].notna()]
    close = {
        engine: f"{(rows['max_axis_rel_error'] <= 0.05).sum()} of {len(rows)}"
        for engine, rows in counted.groupby("engine")
    }
    what = {
        "jax": "JAX (XLA's compiled collectives)",
        "torch": "torch (CommDebugMode's count, the plan's edges)",
        "torch-module": (
            "torch-module (DTensor's propagation between the exported layouts: for information)"
        ),
    }
    return "\n".join(lines) + (
        f"\n\n{(d['status'] == 'OK').sum()} of {len(d)} runs match one device within 1e-4 at every "
        "step. Within 5% of the predicted bytes on every mesh axis: "
        + "; ".join(f"{what.get(e, e)} {c}" for e, c in sorted(close.items()))
        + "."
    )


def pictures(path: Path) -> str:
    """The pictures' checks and the 175B 3D plan's headline figures, as one paragraph."""
    d = pd.read_csv(path).set_index("case")
    big, small = d.loc["gpt3-175b-3d"], d.loc["gpt2-small-2x4"]
    return (
        f"`results/pictures.csv`: GPT-3 175B on `{big['mesh']}`, {int(big['gantt_blocks'])} of "
        f"{int(big['expected_blocks'])} blocks, drawn peak memory "
        f"{big['drawn_memory_bytes'] / 2**30:.2f} GiB against the plan's "
        f"{big['memory_bytes'] / 2**30:.2f} GiB ({int(big['stages'])} stages, "
        f"{int(big['num_microbatches'])} micro-batches, {big['schedule']}, "
        f"{big['step_time_s']:.2f} s per iteration); gpt2-small on 2x4: drawn step "
        f"{small['drawn_step_time_s'] * 1e3:.3f} ms against the plan's "
        f"{small['step_time_s'] * 1e3:.3f} ms."
    )


TABLES = (
    ("MEMORY_BOUND_TEXT", tables_memory.memory_bound, "memory_bound.csv"),
    ("MEMORY_FIDELITY_TABLE", tables_memory.memory_fidelity, "memory_fidelity.csv"),
    ("SCALING_LIMITED_TABLE", tables_memory.scaling_limited, "scaling.csv"),
    ("WHOLE_GRAPH_TEXT", tables_memory.whole_graph, "bench_whole_graph.csv"),
    ("REGRESS_3D_TEXT", tables_memory.regress_3d, "bench_regress.csv"),
    ("PICTURES_TEXT", pictures, "pictures.csv"),
    ("TRAIN_CHECK_TABLE", train_check, "train_check.csv"),
    ("SCALING_TABLE", scaling, "scaling.csv"),
    ("LLAMA_TABLE", llama, "llama.csv"),
    ("SAPP_SCALING_TABLE", sapp_scaling, "sapp_scaling.csv"),
    ("HEURISTIC_TABLE", heuristics, "exact_vs_heuristic.csv"),
    ("GRID_TABLE", tables_grid.exact_grid_sapp, "exact_vs_heuristic.csv"),
    ("THREED_TABLE", tables_grid.threed, "threed.csv"),
    ("PIPELINE_TABLE", pipeline, "pipeline.csv"),
    ("FIDELITY_TABLE", fidelity, "fidelity.csv"),
    ("PORTABILITY_TABLE", portability, "portability.csv"),
    ("SMSG_TABLE", smsg_models, "smsg_models.csv"),
    ("SYMBOLIC_TABLE", tables_grid.symbolic, "symbolic.csv"),
    ("VERIFY_TABLE", verify, "verify.csv"),
)


def fill(readme: str, base: Path) -> str:
    """The README text with every <!-- NAME --> ... <!-- /NAME --> block replaced by its table."""
    for marker, fn, name in TABLES:
        start, end = f"<!-- {marker} -->", f"<!-- /{marker} -->"
        if start in readme and (base / name).is_file():
            head, rest = readme.split(start, 1)
            readme = head + start + "\n" + fn(base / name) + "\n" + end + rest.split(end, 1)[1]
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--results", default="results")
    parser.add_argument(
        "--readme",
        nargs="+",
        metavar="FILE",
        help="rewrite the marked tables of these markdown files in place (README.md docs/*.md)",
    )
    args = parser.parse_args(argv)
    base = Path(args.results)
    if args.readme:
        from planner.outputs import write_text

        for path in args.readme:
            write_text(path, fill(Path(path).read_text(), base))
        return 0
    for marker, fn, name in TABLES:
        if (base / name).is_file():
            print(f"### {marker}\n\n{fn(base / name)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
