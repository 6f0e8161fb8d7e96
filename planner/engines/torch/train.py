"""Train a plan on PyTorch's distributed engine (``planner run-torch``): one process per device
under torchrun (gloo, on CPU), every layout of the plan a DTensor placement.

Each rank runs the graph's operators in order through the interpreter (``torch_xp``: its kernels
on torch tensors, under autograd) on its local blocks, with the local sizes and offsets of its mesh
coordinate, as the numpy executor does. Every edge is a DTensor moved by the cost model's own
redistribution steps, one ``redistribute`` per mesh axis, forward and backward
(``planner.engines.torch.edges``), so every collective of the step is DTensor's own and follows the
plan, and ``CommDebugMode`` (extended here with each collective's bytes and mesh axis) counts them:
the second referee beside XLA. Parameters are local blocks in their first consumer's layout; each
read wraps them again, so a parameter's gradient reaches its block reduced to that layout (the
data-parallel all-reduce) and the reads' gradients add up locally; SGD updates the blocks. Data are
given to each consumer in the layout it reads (as the XLA check feeds them): no collective for data.

The reference is the same steps in one process on whole tensors, from the same initial weights.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path

from planner.engines.jobs import (
    EngineError,
    TrainRun,
    exception_line,
    flat_job,
    pipeline_job,
    run_group,
    run_job,
)
from planner.engines.torch.reference import reference_losses
from planner.engines.torch.module_worker import module_reference_losses


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _counted(result: dict) -> tuple:
    return tuple((k, tuple(a), n) for k, a, n in result["transfers"])


def train_on_torch(
    graph,
    strategies: dict,
    axis_names: tuple[str, ...],
    mesh_shape: tuple[int, ...],
    *,
    steps: int = 5,
    lr: float = 1e-4,
    seed: int = 0,
    timeout_s: float = 1800.0,
) -> TrainRun:
    """Run ``steps`` SGD steps of a plan on ``prod(mesh_shape)`` torchrun processes and in one
    process."""
    nproc = math.prod(mesh_shape)
    job = flat_job(graph, strategies, axis_names, mesh_shape, steps, lr, seed)
    result = run_job(job, _torchrun(nproc, "planner.engines.torch.worker", timeout_s))
    return TrainRun(
        tuple(result["losses"]),
        tuple(reference_losses(graph, steps, lr, seed)),
        nproc,
        result["backend"],
        "",
        _counted(result),
    )


def train_3d_on_torch(
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
    """A 3D plan on ``stages x prod(stage_shape)`` torchrun processes
    (``planner.engines.torch.pipeline``): ``micro`` is the graph at the micro-batch size, ``full``
    at the whole batch (its initial values and the one-process reference), ``stage_of`` each
    operator's stage."""
    nproc = stages * math.prod(stage_shape)
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
    result = run_job(job, _torchrun(nproc, "planner.engines.torch.pipeline", timeout_s))
    return TrainRun(
        tuple(result["losses"]),
        tuple(reference_losses(full, steps, lr, seed)),
        nproc,
        result["backend"],
        "",
        _counted(result),
    )


def train_module_plan(
    path: str,
    nproc: int,
    *,
    steps: int = 5,
    lr: float = 1e-4,
    seed: int = 0,
    timeout_s: float = 1800.0,
) -> TrainRun:
    """An exported PyTorch plan file (``planner export --target torch``) on ``nproc`` torchrun
    processes against its module in this process (``planner.engines.torch.module_worker``)."""
    job = {"plan": str(Path(path).resolve()), "steps": steps, "lr": lr, "seed": seed}
    result = run_job(job, _torchrun(nproc, "planner.engines.torch.module_worker", timeout_s))
    return TrainRun(
        tuple(result["losses"]),
        tuple(module_reference_losses(str(path), steps, lr, seed)),
        nproc,
        result["backend"],
        "",
        _counted(result),
    )


def _torchrun(nproc: int, module: str, timeout_s: float):
    """The launcher of ``module`` on ``nproc`` torchrun processes (``jobs.run_job``)."""
    return lambda job, out: _launch(nproc, module, job, out, timeout_s)


PORT_TAKEN = ("EADDRINUSE", "address already in use", "Address already in use")


def _launch(
    nproc: int, module: str, job: Path, out: Path, timeout_s: float, attempts: int = 3
) -> None:
    """torchrun ``module`` on ``nproc`` processes. The free port is found by binding and releasing
    it, so another process can take it before torchrun does: a launch that fails on a taken port is
    tried again on a new one (up to ``attempts``); any other failure names the rank's error."""
    for _ in range(attempts):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(nproc),
            "--master-port",
            str(_free_port()),
            "-m",
            module,
            str(job),
            str(out),
        ]
        proc = run_group(
            cmd, timeout_s, env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
        )
        if proc.returncode == 0:
            return
        if not any(text in proc.stderr for text in PORT_TAKEN):
            break
    raise EngineError(f"run-torch: the training run failed ({exception_line(proc.stderr)})")
