"""Train a plan on JAX (``planner run-jax``): K SGD steps of the graph jitted over a device mesh
with the plan's shardings, against the same K steps on one device from the same initial weights.

As for ``planner verify``, the parent never imports JAX: ``train_on_jax`` runs ``python -m
planner.engines.jax.train JOB OUT`` with ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (N
emulated CPU devices; real accelerators are used where JAX finds as many). The step is
``planner.engines.jax.xla.training_step`` (the graph through the JAX interpreter in float32, a
sharding constraint on every edge as the plan lays it out, loss + ``jax.grad`` + SGD); the reference
is the same step unsharded. Both start from ``random_feeds(graph, seed)`` and see the same batch
each step. The compiled step's HLO comes back too, so its collectives can be compared with the cost
model.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from planner.engines.jobs import TrainRun, flat_job, pipeline_job, python_worker, run_job
from planner.engines.jax.xla import load_job, plain_step, training_step
from planner.outputs import write_json


def train_on_jax(
    graph,
    strategies: dict,
    axis_names: tuple[str, ...],
    mesh_shape: tuple[int, ...],
    *,
    steps: int = 5,
    lr: float = 1e-3,
    seed: int = 0,
    timeout_s: float = 1200.0,
) -> TrainRun:
    """Run ``steps`` SGD steps of a plan on ``prod(mesh_shape)`` devices and on one (subprocess)."""
    job = flat_job(graph, strategies, axis_names, mesh_shape, steps, lr, seed)
    result = run_job(job, _worker("planner.engines.jax.train", math.prod(mesh_shape), timeout_s))
    return TrainRun(
        tuple(result["losses"]),
        tuple(result["reference"]),
        result["devices"],
        result["platform"],
        result["hlo"],
    )


def train_3d_on_jax(
    full,
    micro,
    stage_of: dict,
    strategies: dict,
    axis_names: tuple[str, ...],
    stage_shape: tuple[int, ...],
    stages: int,
    num_microbatches: int,
    *,
    steps: int = 5,
    lr: float = 1e-4,
    seed: int = 0,
    timeout_s: float = 1800.0,
) -> TrainRun:
    """A 3D plan on ``stages x prod(stage_shape)`` devices (``planner.engines.jax.pipeline``),
    arguments as ``planner.engines.torch.train.train_3d_on_torch``."""
    job = pipeline_job(
        full,
        micro,
        stage_of,
        strategies,
        axis_names,
        stage_shape,
        stages,
        num_microbatches,
        steps,
        lr,
        seed,
    )
    result = run_job(
        job, _worker("planner.engines.jax.pipeline", stages * math.prod(stage_shape), timeout_s)
    )
    return TrainRun(
        tuple(result["losses"]), tuple(result["reference"]), result["devices"], result["platform"]
    )


def _worker(module: str, devices: int, timeout_s: float):
    """The launcher of a JAX worker on ``devices`` emulated CPU devices (``jobs.run_job``)."""
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    return lambda job, out: python_worker(
        module, job, out, timeout_s, env, "run-jax: the training run"
    )


def main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m planner.engines.jax.train JOB.json OUT.json`` (run by
    ``train_on_jax``)."""
    job_path, out_path = (argv if argv is not None else sys.argv[1:])[:2]
    job = json.loads(Path(job_path).read_text())
    graph, exported, mesh, feeds, params, data = load_job(job, job["seed"])
    sharded = training_step(graph, exported, mesh, job["lr"])
    plain = plain_step(graph, job["lr"])
    hlo = sharded.lower(params, data).compile().as_text()
    losses, reference, p, q = [], [], params, params
    for _ in range(job["steps"]):
        loss, p = sharded(p, data)
        ref, q = plain(q, feeds)
        losses.append(float(loss))
        reference.append(float(ref))
    write_json(
        out_path,
        {
            "losses": losses,
            "reference": reference,
            "devices": mesh.devices.size,
            "platform": mesh.devices.flat[0].platform,
            "hlo": hlo,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
