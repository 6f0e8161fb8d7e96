"""Plans that run: the numpy executor and XLA's compiled collectives against the cost model.

For mlp, transformer-block and a 2-layer GPT on 4, 8 and 2x4 emulated CPU devices, under the
exact, dp and megatron plans (a100-80g costs, float32, SGD): the largest relative error of the numpy
executor against the unsharded forward, and the bytes each device sends in the compiled training
step against the prediction, in total and per mesh axis (see `planner verify`). Needs JAX.

    python -m experiments.verify [--quick] [--models ...] [--meshes 4,8,2x4] [--methods
    exact,dp,megatron]
                                 [--batches 2,4,8] [--resume] [--out results/verify.csv]

With --batches each model is verified at those global batches instead of its own (the exact plan
changes with the batch). gpt2-small is the zoo's GPT-2 (12 layers, hidden 768, vocabulary 50,257)
at sequence 512, checked by XLA only: its numpy execution in float64 on 8 emulated devices needs
about 66 GB (the smaller models check the executor); numpy_max_rel_error is empty there. The checks
run under a fixed budget of 12 GB, so that the rows do not depend on the machine's free memory: a
plan whose checks the estimate of `planner verify --max-memory` puts above it (gpt2-small's megatron
plan replicates the 50,257-word logits) is written as REFUSED with the reason and no figures.
"""

from __future__ import annotations

import argparse
import sys
import time

from planner.engines.verify import estimate_memory
from planner.runs import plan_for_verification, verify_loaded
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

# model -> (zoo spec, global batch, sequence length): full and small settings
FULL = {
    "mlp": ("mlp:hidden=512", 4096, None),
    "transformer-block": ("transformer-block:hidden=1024,heads=16", 8, 256),
    "gpt-2layer": ("gpt:layers=2,hidden=512,heads=8,seq=256,vocab=2048", 8, None),
    "gpt2-small": ("gpt2-small", 8, 512),
}
SMALL = {
    "mlp": ("mlp:hidden=256", 1024, None),
    "transformer-block": ("transformer-block:hidden=256,heads=8", 4, 64),
    "gpt-2layer": ("gpt:layers=2,hidden=128,heads=4,seq=64,vocab=512", 8, None),
}
METHODS = ("exact", "dp", "megatron")
PRINTED = ("model", "batch", "mesh", "method", "status", "reason", "numpy_max_rel_error")
PRINTED += ("total_rel_error", "max_axis_rel_error", "wall_time_s")
XLA_ONLY = {"gpt2-small"}  # models whose numpy execution does not fit this machine's memory
BUDGET_BYTES = 12e9  # fixed, so that no row depends on the free memory


def run_one(name: str, model: tuple, mesh: str, method: str) -> dict:
    start = time.perf_counter()
    spec, batch, seq = model
    loaded = plan_for_verification(spec, mesh, method, batch=batch, seq=seq)
    head = {
        "model": name,
        "spec": spec,
        "batch": batch,
        "mesh": mesh,
        "method": method,
        "sharded_ops": sum(any(s) for s in loaded.strategies.values()),
        "operators": len(loaded.strategies),
    }
    run_numpy = name not in XLA_ONLY
    need, _ = estimate_memory(loaded.graph, loaded.strategies, loaded.mesh, run_numpy, True)
    if need > BUDGET_BYTES:  # no figures, the reason instead
        reason = f"the checks need about {need / 1e9:.1f} GB, above the "
        reason += f"{BUDGET_BYTES / 1e9:.0f} GB budget"
        return {**head, "status": "REFUSED", "reason": reason, "wall_time_s": _since(start)}
    report = verify_loaded(loaded, run_numpy=run_numpy, max_memory=BUDGET_BYTES)
    total = report.comparisons[0]
    axes = [c for c in report.comparisons[1:]]
    return {
        **head,
        "status": "OK" if report.ok else "MISMATCH",
        "reason": "",
        "numpy_max_rel_error": report.numpy_max_rel_error,
        "predicted_bytes": total.predicted,
        "compiled_bytes": total.compiled,
        "objective": total.rel_error,
        "total_rel_error": total.rel_error,
        "max_axis_rel_error": max((c.rel_error for c in axes), default=0.0),
        "per_axis": " ".join(f"{c.axes}:{c.predicted:.0f}/{c.compiled:.0f}" for c in axes),
        "compiled_collectives": report.compiled_count,
        "wall_time_s": _since(start),
    }


def _since(start: float) -> float:
    return time.perf_counter() - start


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 4))
    for method in METHODS:
        sel = [r for r in rows if r["method"] == method and (r.get("predicted_bytes") or 0) > 0]
        ax.loglog(
            [r["predicted_bytes"] for r in sel],
            [r["compiled_bytes"] for r in sel],
            "o",
            label=method,
        )
    values = [r["predicted_bytes"] for r in rows if (r.get("predicted_bytes") or 0) > 0]
    if values:
        ax.plot([min(values), max(values)], [min(values), max(values)], "k--", lw=0.8)
    ax.set(
        xlabel="predicted bytes sent per device",
        ylabel="compiled (XLA, CPU) bytes sent per device",
        title="Cost model vs compiled collectives",
    )
    ax.legend(fontsize=7)
    write_png(path, fig)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(FULL))
    parser.add_argument("--meshes", default="4,8,2x4")
    parser.add_argument("--quick", action="store_true", help="small sizes, meshes 4 and 2x4")
    parser.add_argument(
        "--smallest", action="store_true", help="small mlp on 2x4, megatron only (tests)"
    )
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="plans to verify (default: all three)"
    )
    parser.add_argument(
        "--batches",
        default=None,
        help="global batches to verify each model at (default: the model's own batch)",
    )
    add_output_options(parser, "results/verify.csv")
    return parser


def _checked(parser: argparse.ArgumentParser, args, specs: dict, methods: tuple) -> None:
    """Refuse an unknown model or method, or a malformed batch list, naming the option."""
    for name in args.models.split(","):
        if name not in specs:
            parser.error(f"--models: unknown model {name!r} (known: {', '.join(specs)})")
    for method in methods:
        if method not in METHODS:
            parser.error(f"--methods: unknown method {method!r} (known: {', '.join(METHODS)})")
    if args.batches and not all(b.isdigit() and int(b) > 0 for b in args.batches.split(",")):
        parser.error(f"--batches: {args.batches!r} is not a list of positive integers")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        import jax  # noqa: F401
    except ImportError:
        print("JAX is not installed (pip install -e '.[jax]'): nothing verified")
        return 0
    specs, methods, small = FULL, tuple(args.methods.split(",")), args.quick or args.smallest
    if small:
        specs, args.meshes = SMALL, "4,2x4"
    if args.smallest:
        args.models, args.meshes, methods = "mlp", "2x4", ("megatron",)
    _checked(parser, args, specs, methods)
    table = results_table(args, ("model", "mesh", "method", "batch"))
    for name in args.models.split(","):
        spec, own, seq = specs[name]
        for batch in [int(b) for b in args.batches.split(",")] if args.batches else [own]:
            for mesh in args.meshes.split(","):
                for method in methods:
                    if table.done(model=name, mesh=mesh, method=method, batch=batch):
                        continue
                    row = run_one(name, (spec, batch, seq), mesh, method)
                    print({k: row.get(k) for k in PRINTED}, flush=True)
                    table.add([row])
    table.finish()
    if png := png_path(args):
        plot(table.rows, png)
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
