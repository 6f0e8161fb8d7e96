"""Plans that train: GPT-2 imported from a ``transformers`` config trains under each plan on a JAX
device mesh and matches one device step by step.

GPT-2 with 2 layers, hidden 256, 4 heads, vocabulary 512 (``import-torch`` with a cross-entropy
loss, no weights), batch 8, sequence 64. Plans: exact, sapp (SMSG's D-Rec), megatron and dp, on
meshes 4, 8 and 2x4 (a100-80g costs). Each runs ``--steps`` SGD steps jitted over as many emulated
CPU devices with the plan's shardings (``planner run-jax``) and on as many gloo processes under
torchrun, every layout a DTensor placement (``planner run-torch``), and the same steps on one device
from the same initial weights: the largest relative difference of the per-step losses
(``objective``; float32; the issue asks 1e-4). The collectives each engine ran (XLA's compiled HLO;
PyTorch's, counted by CommDebugMode) are compared with the cost model's prediction (bytes each
device sends, in total and per mesh axis, as ``planner verify``). A 3D plan (2 stages of 2 devices
of the zoo GPT of the same shape, 2 micro-batches) runs on 4 gloo processes and on 4 JAX devices
(two sub-meshes). On torch its bytes are counted too, one device of each stage summed, against the
3D cost model (``verify.predicted_pipeline_collectives``: the stage mesh's axes, the sends on ``pp``
and the tied embedding's all-reduce on ``tied``); JAX's 3D run reports losses only. Engine
``torch-module``: the exact, Megatron and DP plans exported onto the ``transformers`` module itself
(``planner export --target torch``: parallelize_module styles and DTensor placements) and trained by
torchrun; DTensor's sharding propagation picks the activation layouts between the exported
placements, so its bytes are compared for information. ``dp+zero3`` / ``megatron+zero3``: the same
layouts under ZeRO-3, exported as FSDP2 (``fully_shard`` on the data-parallel axes, over DTensor on
the tensor-parallel one), its bytes against the plan's ZeRO-3 collectives.

    python -m experiments.train_check [--smallest] [--steps 5] [--out results/train_check.csv]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import planner
from planner.engines.jax.train import train_3d_on_jax
from planner.engines.torch.module import module_plan as torch_module_plan
from planner.engines.torch.train import train_3d_on_torch, train_module_plan
from planner.outputs import write_text
from planner.runs import plan_for_verification
from experiments.common import add_output_options, png_path, pyplot, results_table, run, write_png

SPEC = "hf:gpt2:layers=2,hidden=256,heads=4,seq=64,vocab=512,batch=8"
METHODS = ("exact", "sapp", "megatron", "dp")
ENGINES = ("jax", "torch")
MODULE_METHODS = ("exact", "megatron", "dp")  # exported onto the nn.Module (export --target torch)
# ZeRO-3 plans exported as FSDP2 (data parallel: on every axis; Megatron: on node, over DTensor on
# gpu)
FSDP_RUNS = (("4", "dp"), ("2x4", "dp"), ("2x4", "megatron"))
GPT_3D = "gpt:layers=2,hidden=256,heads=4,seq=64,vocab=512"
MESHES = ("4", "8", "2x4")
TOLERANCE = 1e-4


def run_one(graph, mesh: str, method: str, engine: str, steps: int, lr: float) -> dict:
    start = time.perf_counter()
    loaded = plan_for_verification(graph, mesh, method)
    train = planner.train_on_jax if engine == "jax" else planner.train_on_torch
    result = train(
        loaded.graph, loaded.strategies, loaded.mesh.names, loaded.mesh.shape, steps=steps, lr=lr
    )
    compare = result.xla_comparison if engine == "jax" else result.counted_comparison
    rows = compare(loaded.graph, loaded.strategies, loaded.mesh)
    return {
        "model": "gpt2-torch-2l-h256",
        "spec": SPEC,
        "mesh": loaded.mesh.spec,
        "plan_source": method,
        "engine": engine,
        **_trained(result, steps, lr),
        **_counted(rows),
        "wall_time_s": time.perf_counter() - start,
    }


def _trained(result, steps: int, lr: float) -> dict:
    """A training run's row fields: where it ran, its steps, and its losses against one device."""
    return {
        "backend": result.platform,
        "devices": result.devices,
        "steps": steps,
        "lr": lr,
        "status": "OK" if result.max_rel_diff <= TOLERANCE else "MISMATCH",
        "objective": result.max_rel_diff,
        "max_loss_rel_diff": result.max_rel_diff,
        "first_loss": result.losses[0],
        "last_loss": result.losses[-1],
    }


def run_module(
    graph, mesh: str, method: str, steps: int, lr: float, folder: str, zero: int = 0
) -> dict:
    """The plan exported onto the nn.Module (parallelize_module file; ``zero`` 3: FSDP2) and trained
    by torchrun: DTensor propagates the activations between the exported placements, so its bytes
    are DTensor's choice."""
    start = time.perf_counter()
    # dp / megatron: the same layouts under ZeRO-3
    loaded = plan_for_verification(graph, mesh, method)
    source = f"{method}+zero3" if zero == 3 else method
    exported = torch_module_plan(
        loaded.graph,
        loaded.strategies,
        loaded.mesh,
        SPEC,
        "cross_entropy",
        f"{source} on {loaded.mesh.spec}",
        zero=zero,
    )
    path = f"{folder}/plan_{source}_{mesh}.py"
    write_text(path, exported.render())
    result = train_module_plan(path, loaded.mesh.num_devices, steps=steps, lr=lr)
    rows = result.counted_comparison(loaded.graph, loaded.strategies, loaded.mesh, zero)
    fsdp = f"; fully_shard on {'+'.join(exported.fully_shard_dims)}" if zero == 3 else ""
    return {
        "model": "gpt2-torch-2l-h256",
        "spec": SPEC,
        "mesh": loaded.mesh.spec,
        "plan_source": source,
        "engine": "torch-module",
        **_trained(result, steps, lr),
        **_counted(rows),
        "wall_time_s": time.perf_counter() - start,
        "notes": (
            f"{len(exported.styles)} parallelize_module styles, {len(exported.placements)} "
            f"placements{fsdp}"
        ),
    }


def run_3d(steps: int, lr: float, engine: str) -> dict:
    """The zoo GPT of the same shape, a 3D plan of 2 stages x 2-way data parallelism on 4
    processes."""
    start = time.perf_counter()
    found = planner.plan_pipeline(
        GPT_3D,
        "2x2",
        batch=8,
        degrees=[2],
        counts=[2],
        settings=planner.TrainingSettings(dtype="fp32", optimizer="sgd"),
    )
    plan = found.to_dict()
    pipe, operators = plan["pipeline"], plan["operators"]
    axes = tuple(operators[0]["strategy"])
    shape = tuple(int(part.split("=")[1]) for part in pipe["stage_mesh"].split(","))
    count, micro = pipe["num_microbatches"], pipe["micro_batch"]
    train = train_3d_on_jax if engine == "jax" else train_3d_on_torch
    micro_graph = planner.load_model(GPT_3D, micro)
    stage_of = {o["name"]: o["stage"] for o in operators}
    strategies = {o["name"]: tuple(o["strategy"][a] for a in axes) for o in operators}
    result = train(
        planner.load_model(GPT_3D, micro * count),
        micro_graph,
        stage_of,
        strategies,
        axes,
        shape,
        pipe["stages"],
        count,
        steps=steps,
        lr=lr,
    )
    counted = _pipeline_counts(result, micro_graph, stage_of, strategies, pipe)
    return {
        **counted,
        "model": "gpt-zoo-2l-h256",
        "spec": GPT_3D,
        "mesh": plan["mesh"],
        "plan_source": (
            f"3d: {pipe['stages']} stages of {pipe['stage_mesh']}, {count} micro-batches"
        ),
        "engine": engine,
        **_trained(result, steps, lr),
        "wall_time_s": time.perf_counter() - start,
    }


def _pipeline_counts(result, micro_graph, stage_of, strategies, pipe: dict) -> dict:
    """The engine's counted stage-boundary bytes beside the prediction, in total and per axis."""
    if not result.transfers:
        return {}
    rows = result.pipeline_comparison(
        micro_graph,
        stage_of,
        strategies,
        planner.make_cluster(pipe["stage_mesh"]).mesh,
        pipe["stages"],
        pipe["num_microbatches"],
    )
    return _counted(rows) if rows else {}


def _counted(rows) -> dict:
    """Predicted against observed bytes: the total row, then the worst and every mesh axis."""
    total, axes = rows[0], rows[1:]
    return {
        "predicted_bytes": total.predicted,
        "observed_bytes": total.compiled,
        "total_rel_error": total.rel_error,
        "max_axis_rel_error": max((c.rel_error for c in axes), default=0.0),
        "per_axis": " ".join(f"{c.axes}:{c.predicted:.0f}/{c.compiled:.0f}" for c in axes),
    }


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    labels = [f"{r['plan_source']}\n{r['mesh']}\n{r['engine']}" for r in rows]
    ax.bar(range(len(rows)), [max(r["max_loss_rel_diff"], 1e-9) for r in rows])
    ax.axhline(TOLERANCE, color="black", linestyle="--", linewidth=1, label="tolerance 1e-4")
    ax.set(
        yscale="log",
        ylabel="max relative loss difference",
        title="GPT-2 (2 layers) trained on JAX and PyTorch",
    )
    ax.set_xticks(range(len(rows)), labels, fontsize=6)
    ax.legend(fontsize=7)
    write_png(path, fig)


FLAT_KEYS = (
    "mesh",
    "plan_source",
    "engine",
    "status",
    "max_loss_rel_diff",
    "total_rel_error",
    "wall_time_s",
)
FSDP_KEYS = (
    "mesh",
    "plan_source",
    "engine",
    "status",
    "max_loss_rel_diff",
    "per_axis",
    "wall_time_s",
)


def _show(row: dict, keys: tuple[str, ...]) -> None:
    print({k: row[k] for k in keys}, flush=True)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5, help="SGD steps per run (default 5)")
    parser.add_argument(
        "--lr", type=float, default=1e-4, help="SGD learning rate on the summed loss (default 1e-4)"
    )
    parser.add_argument(
        "--smallest", action="store_true", help="exact plan on 4 devices, 2 steps (tests)"
    )
    add_output_options(parser, "results/train_check.csv")
    return parser.parse_args(argv)


def _flat_runs(table, graph, meshes, methods, engines, steps: int, lr: float) -> None:
    """Exported flat plans trained on each engine, against one device."""
    for mesh in meshes:
        for method in methods:
            for engine in engines:
                spec = planner.make_cluster(mesh).mesh.spec
                if not table.done(mesh=spec, plan_source=method, engine=engine):
                    row = run_one(graph, mesh, method, engine, steps, lr)
                    table.add([row])
                    _show(row, FLAT_KEYS)


def _three_d_runs(table, steps: int, lr: float) -> None:
    """A two-stage 3D plan trained on each engine."""
    for engine in ENGINES:
        if not table.done(mesh="node=2,gpu=2", plan_source="3d", engine=engine):
            row = run_3d(steps, lr, engine)
            table.add([{**row, "plan_source": "3d", "notes": row["plan_source"]}])
            _show(row, ("mesh", "plan_source", "engine", "status", "max_loss_rel_diff"))


def _module_runs(table, graph, meshes, steps: int, lr: float, folder: str) -> None:
    """Plans applied to the nn.Module itself (DTensor, then FSDP2 with ZeRO-3)."""
    for mesh in meshes:
        for method in MODULE_METHODS:
            spec = planner.make_cluster(mesh).mesh.spec
            if not table.done(mesh=spec, plan_source=method, engine="torch-module"):
                row = run_module(graph, mesh, method, steps, lr, folder)
                table.add([row])
                _show(row, FLAT_KEYS)
    for mesh, method in FSDP_RUNS:
        spec = planner.make_cluster(mesh).mesh.spec
        if not table.done(mesh=spec, plan_source=f"{method}+zero3", engine="torch-module"):
            row = run_module(graph, mesh, method, steps, lr, folder, zero=3)
            table.add([row])
            _show(row, FSDP_KEYS)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    methods, meshes, steps = (
        (("exact",), ("4",), 2) if args.smallest else (METHODS, MESHES, args.steps)
    )
    engines = ("jax",) if args.smallest else ENGINES
    try:
        import jax  # noqa: F401

        graph = planner.import_torch(SPEC, loss="cross_entropy")
    except ImportError as exc:
        print(f"needs JAX and PyTorch (pip install -e '.[jax,torch]'): {exc}")
        return 0
    table = results_table(args, ("mesh", "plan_source", "engine"))

    def body() -> int:
        _flat_runs(table, graph, meshes, methods, engines, steps, args.lr)
        if not args.smallest:
            _three_d_runs(table, steps, args.lr)
            with tempfile.TemporaryDirectory() as folder:
                _module_runs(table, graph, meshes, steps, args.lr, folder)
        table.finish()
        path = png_path(args)
        if path:
            plot(table.rows, path)
        return 0

    return run(body)


if __name__ == "__main__":
    raise SystemExit(main())
