"""Memory of published training runs: the configurations in experiments/data/memory_published.csv
(torchtitan's H100 benchmark tables and A100 runs, torchtitan's 70B preset, the Llama 3 405B
configuration) and Megatron-LM SC'21 Table 1 (experiments/data/megatron_sc21_table1.csv), each
costed as given by `planner.evaluate_3d` on the H100 or A100 profile with the run's device memory.

Per row: the predicted memory of the fullest GPU (its stage's parts plus the device's reserve, the
figure an engine's peak would show), its parts on that stage, the measured peak where the source
reports one and the relative error, and whether the model lets the run fit (every run here trained,
so every row should).

    python -m experiments.memory_fidelity [--smallest] [--out results/memory_fidelity.csv]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

import planner
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png
from planner.cluster.profiles import get_profile
from planner.cost.settings import RECOMPUTE_MODES

DATA = Path(__file__).resolve().parent / "data"
GIB = 2**30


def published() -> list[dict]:
    """The cited configurations: memory_published.csv, then Megatron-LM SC'21 Table 1."""
    rows = _read(DATA / "memory_published.csv")
    for ref in _read(DATA / "megatron_sc21_table1.csv"):
        rows.append(
            {
                "source": "megatron-sc21",
                "config": f"Table 1 {ref['params_b']}B",
                "model": f"gpt:layers={ref['layers']},hidden={ref['hidden']},"
                f"heads={ref['heads']},seq=2048,vocab=51200",
                "device_memory_gb": "80",
                "seq": "",
                "global_batch": ref["global_batch"],
                "tp": ref["tp"],
                "pp": ref["pp"],
                "dp": ref["dp"],
                "micro_batch": "1",
                "schedule": "1f1b",
                "recompute": "full",
                "zero": "0",
                "sequence_parallel": "0",
                "fp32_grads": "1",
                "measured_gib": "",
            }
        )
    return rows


def _read(path: Path) -> list[dict]:
    """A cited data table's rows as text (an empty cell stays ''), as experiments.fidelity reads
    its tables."""
    table = pd.read_csv(path, comment="#", dtype=str, keep_default_na=False)
    return table.to_dict("records")


def costed(ref: dict) -> dict:
    """One configuration costed as given, with the parts of its fullest stage; a recompute policy
    the planner does not express is reported as NOT_MODELLED, without figures."""
    if ref["recompute"] not in RECOMPUTE_MODES:
        return {
            **_config(ref),
            "status": "NOT_MODELLED",
            "measured_gib": float(ref["measured_gib"]) if ref["measured_gib"] else None,
            "notes": f"recompute {ref['recompute']}: a policy the planner does not express",
        }
    device = "h100-80g" if ref["model"].startswith("llama3") else "a100-80g"
    profile = get_profile(device)
    budget = float(ref["device_memory_gb"]) * 1e9 - profile.reserve_bytes
    settings = planner.TrainingSettings(
        recompute=ref["recompute"],
        zero=int(ref["zero"]),
        sequence_parallel=ref["sequence_parallel"] == "1",
        fp32_grads=ref["fp32_grads"] == "1",
        loss_kernel=loss_kernel(ref["source"]),
    )
    plan = planner.evaluate_3d(
        ref["model"],
        profile,
        tp=int(ref["tp"]),
        pp=int(ref["pp"]),
        dp=int(ref["dp"]),
        micro_batch=int(ref["micro_batch"]),
        batch=int(ref["global_batch"]),
        seq=int(ref["seq"]) if ref["seq"] else None,
        settings=settings,
        schedule=ref["schedule"],
        memory=budget,
        fit_required=False,
    )
    return _row(ref, plan, profile.reserve_bytes)


def loss_kernel(source: str) -> str:
    """The cross-entropy kernel of the engine a source trained with: torchtitan's (loss-parallel
    on vocabulary-sharded logits), Megatron-LM's fused vocabulary-parallel one; PyTorch's where
    the engine is not published (the Llama 3 paper's)."""
    if source.startswith("torchtitan"):
        return "loss-parallel"
    return "fused" if source.startswith("megatron") else "torch"


def _config(ref: dict) -> dict:
    return {
        "source": ref["source"],
        "config": ref["config"],
        "model": ref["model"],
        "gpus": int(ref["tp"]) * int(ref["pp"]) * int(ref["dp"]),
        "tp": int(ref["tp"]),
        "pp": int(ref["pp"]),
        "dp": int(ref["dp"]),
        "micro_batch": int(ref["micro_batch"]),
        "schedule": ref["schedule"],
        "recompute": ref["recompute"],
        "zero": int(ref["zero"]),
        "sequence_parallel": ref["sequence_parallel"] == "1",
        "loss_kernel": loss_kernel(ref["source"]),
        "device_memory_gb": float(ref["device_memory_gb"]),
        "trained": True,
    }


def _row(ref: dict, plan, reserve: float) -> dict:
    worst = max(plan.stage_details, key=lambda d: d.memory_bytes)
    predicted = (plan.pipeline.max_memory_bytes + reserve) / GIB
    measured = float(ref["measured_gib"]) if ref["measured_gib"] else None
    return {
        **_config(ref),
        "num_microbatches": plan.pipeline.num_microbatches,
        "status": plan.status,
        "fits": plan.fits_memory,
        "predicted_gib": predicted,
        "measured_gib": measured,
        "rel_error": None if measured is None else (predicted - measured) / measured,
        "worst_stage": worst.stage,
        "model_state_gib": (worst.params_bytes + worst.grads_bytes + worst.optimizer_bytes) / GIB,
        "activations_gib": worst.activations_bytes / GIB,
        "inflight_microbatches": worst.inflight_microbatches,
        "logits_gib": worst.logits_bytes / GIB,
        "working_gib": worst.working_bytes / GIB,
        "reserve_gib": reserve / GIB,
        "notes": "",
    }


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    rows = [r for r in rows if r["status"] != "NOT_MODELLED"]
    labels = [f"{r['source']}\n{r['config']}" for r in rows]
    x = range(len(rows))
    ax.bar(x, [r["predicted_gib"] for r in rows], label="predicted (parts + reserve)")
    measured = [(i, r["measured_gib"]) for i, r in enumerate(rows) if r["measured_gib"]]
    if measured:
        ax.scatter(*zip(*measured), color="black", zorder=3, label="measured peak (reserved)")
    ax.scatter(
        x,
        [r["device_memory_gb"] * 1e9 / GIB for r in rows],
        marker="_",
        s=200,
        color="red",
        label="device memory",
    )
    ax.set_xticks(list(x), labels, rotation=90, fontsize=6)
    ax.set_ylabel("GiB per GPU")
    ax.legend(fontsize=7)
    fig.tight_layout()
    write_png(path, fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--smallest", action="store_true", help="Megatron-LM's 1.7B row alone (tests)"
    )
    add_output_options(parser, "results/memory_fidelity.csv")
    args = parser.parse_args(argv)
    table = results_table(args, ("source", "config"))
    refs = published()
    if args.smallest:
        refs = [r for r in refs if r["config"] == "Table 1 1.7B"]
    for ref in refs:
        if not table.done(source=ref["source"], config=ref["config"]):
            row = costed(ref)
            print(row, flush=True)
            table.add([row])
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
