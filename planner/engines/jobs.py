"""Engine jobs, engine-neutral: the job description every worker reads, the result of a training
run, and the launcher: a temporary ``job.json``, a child process group, its ``out.json``.

Child processes die with the planner: each engine run starts in a process group of its own, and
any exception while it runs (Ctrl-C, SIGTERM raised as ``Terminated``, a time-out) ends the whole
group, so no rank of a torchrun job outlives the command that started it (SIGKILL of the
launcher alone would leave its ranks running). Imports neither torch nor JAX.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from planner.engines.hlo import parse_collectives
from planner.engines.predicted import (
    VERIFY_SETTINGS,
    compare,
    predicted_collectives,
    predicted_pipeline_collectives,
)
from planner.errors import PlannerError
from planner.ir.crossing import tied_copies
from planner.ir.graph_json import graph_to_dict
from planner.ir.graph_json import graph_from_dict
from planner.outputs import write_json


class EngineError(PlannerError):
    """An engine run could not be done (the engine is missing, a compilation or a rank failed)."""


@dataclass(frozen=True, slots=True)
class TrainRun:
    """Per-step losses of the sharded run and of the one-device reference."""

    losses: tuple[float, ...]
    reference: tuple[float, ...]
    devices: int
    platform: str
    hlo: str = ""
    # collectives counted by the engine (torch)
    transfers: tuple[tuple[str, tuple[str, ...], float], ...] = ()

    @property
    def max_rel_diff(self) -> float:
        """The largest relative loss difference; inf when a step's loss is not finite (NaN would
        compare below any tolerance and hide a diverged run)."""
        diffs = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference)]
        return max((d if math.isfinite(d) else math.inf for d in diffs), default=0.0)

    def collectives(self, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> list:
        return parse_collectives(self.hlo, mesh_shape, axis_names)

    def xla_comparison(self, graph, strategies: dict, mesh) -> tuple:
        """Bytes each device sends in the compiled step against the cost model's prediction, in
        total and per mesh axis (``planner.engines.predicted.compare``)."""
        compiled = [(c.kind, c.axes, c.nbytes) for c in self.collectives(mesh.shape, mesh.names)]
        return _compare(graph, strategies, mesh, compiled)

    def counted_comparison(self, graph, strategies: dict, mesh, zero: int = 0) -> tuple:
        """The same for the collectives the engine counted in the first step (PyTorch's
        CommDebugMode); ``zero`` 3: against the plan's ZeRO-3 collectives (an FSDP2 run)."""
        return _compare(graph, strategies, mesh, list(self.transfers), zero)

    def pipeline_comparison(
        self, micro, stage_of: dict, strategies: dict, mesh, stages: int, num_microbatches: int
    ) -> tuple:
        """A 3D run's counted bytes (one device of each stage, summed; ``mesh`` the stage mesh)
        against ``predicted.predicted_pipeline_collectives``: per stage-mesh axis, ``pp`` (the
        sends) and ``tied`` (the all-reduce of a tied parameter's copies)."""
        predicted = predicted_pipeline_collectives(
            micro, stage_of, strategies, mesh, stages, num_microbatches
        )
        copies = tied_copies(micro, stage_of)
        rows, _ = compare(
            predicted,
            list(self.transfers),
            {**dict(zip(mesh.names, mesh.shape)), "pp": stages, "tied": copies},
        )
        return rows


def _compare(graph, strategies: dict, mesh, observed: list, zero: int = 0) -> tuple:
    predicted = predicted_collectives(graph, strategies, mesh, replace(VERIFY_SETTINGS, zero=zero))
    rows, _ = compare(predicted, observed, dict(zip(mesh.names, mesh.shape)))
    return rows


def flat_job(
    graph, strategies: dict, axis_names, mesh_shape, steps: int, lr: float, seed: int
) -> dict:
    """The job file of a flat training run (the JAX and torchrun workers read the same fields)."""
    return {
        "graph": graph_to_dict(graph),
        "axis_names": list(axis_names),
        "mesh_shape": list(mesh_shape),
        "strategies": {k: list(v) for k, v in strategies.items()},
        "steps": steps,
        "lr": lr,
        "seed": seed,
    }


def pipeline_job(
    full,
    micro,
    stage_of: dict,
    strategies: dict,
    axis_names,
    stage_shape,
    stages: int,
    num_microbatches: int,
    steps: int,
    lr: float,
    seed: int,
) -> dict:
    """The job file of a 3D run: the flat fields on the whole-batch graph and the stage mesh, plus
    the micro-batch graph, each operator's stage and the pipeline's shape."""
    return {
        **flat_job(full, strategies, axis_names, stage_shape, steps, lr, seed),
        "micro_graph": graph_to_dict(micro),
        "stage_of": stage_of,
        "stages": stages,
        "num_microbatches": num_microbatches,
    }


def stage_plan(job: dict):
    """A 3D job's graphs (whole batch, micro-batch) and each operator's stage."""
    full, micro = graph_from_dict(job["graph"]), graph_from_dict(job["micro_graph"])
    stage_of = {name: int(k) for name, k in job["stage_of"].items()}
    return full, micro, stage_of


def micro_batch(micro, feeds: dict, m: int) -> dict:
    """The data of micro-batch ``m``: each data tensor that carries the batch (its first dim is the
    micro-batch graph's batch) cut to its m-th block; the others (position ids, a mask shared by the
    samples) whole."""
    b = micro.batch_size
    return {
        t.name: feeds[t.name][m * b : (m + 1) * b]
        if t.shape and t.shape[0] == b and feeds[t.name].shape[0] != b
        else feeds[t.name]
        for t in micro.tensors
        if t.role == "data"
    }


def run_job(job: dict, launch: Callable[[Path, Path], None]) -> dict:
    """Write ``job`` to a temporary ``job.json``, ``launch(job_path, out_path)`` (which runs the
    worker and raises ``EngineError`` if it fails) and return the worker's ``out.json``."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        write_json(job_path, job)
        launch(job_path, out_path)
        return json.loads(out_path.read_text())


def python_worker(
    module: str, job_path: Path, out_path: Path, timeout_s: float, env: dict, what: str
) -> None:
    """``python -m module JOB OUT`` in a process group of its own; a failure raises ``EngineError``
    naming ``what`` and the worker's own exception line."""
    proc = run_group(
        [sys.executable, "-m", module, str(job_path), str(out_path)],
        timeout_s,
        env=dict(os.environ, **env),
    )
    if proc.returncode != 0:
        raise EngineError(f"{what} failed ({exception_line(proc.stderr)})")


# a bare one: an assert
EXCEPTION = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception)\w*(: \S|\s*$)")


FRAME = re.compile(r'^(?:\[rank\d+\]: )?\s*File "([^"]+)", line (\d+), in (\S+)')


def _frame_before(lines: list[str], at: int) -> str:
    """`` (at FILE:LINE in FUNCTION)``: the innermost traceback frame above line ``at``, so a
    failure seen only in a log (CI's tail) says where it was raised; empty when there is none."""
    for line in reversed(lines[max(0, at - 40) : at]):
        match = FRAME.match(line)
        if match:
            path, number, function = match.groups()
            return f" (at {'/'.join(path.split('/')[-4:])}:{number} in {function})"
    return ""


ROOT_CAUSE = re.compile(
    r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+).*?traceback\s*:\s*([^\n]*)", re.S
)


def _root_cause(stderr: str) -> str:
    """torchrun's root-cause block when a rank died with no traceback of its own (a signal, a hard
    exit): its rank, exit code and signal."""
    match = ROOT_CAUSE.search(stderr)
    if not match:
        return ""
    rank, code, trace = match.groups()
    signal = f", {trace.strip()}" if trace.strip().startswith("Signal") else ""
    return f"rank {rank} exited with code {code}{signal} and printed no exception"


def exception_line(stderr: str) -> str:
    """A worker's own exception line (``RuntimeError: message``; under torchrun ``[rank0]: ...``),
    the last one (a chained exception's outermost); JAX ends its tracebacks with a note on filtered
    frames and torchrun with a ChildFailedError that names no cause. Else any line naming an error.
    """
    lines = stderr.strip().splitlines()
    own = [i for i, line in enumerate(lines) if EXCEPTION.match(line)]
    if own:
        return lines[own[-1]].strip() + _frame_before(lines, own[-1])
    died = _root_cause(stderr)
    if died:
        return died
    cause = (
        [line for line in lines if line.startswith("[rank") and "Error" in line]
        or [line for line in lines if "Error" in line]
        or lines
        or ["no output"]
    )
    return cause[0 if cause[0].startswith("[rank") else -1].strip()


GRACE_S = 3.0  # between SIGTERM and SIGKILL of a group


def run_group(
    cmd: Sequence[str], timeout_s: float, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)`` in a new session;
    raises ``subprocess.TimeoutExpired`` as it does, after the group is stopped."""
    proc = subprocess.Popen(
        list(cmd),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        stop_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after ``GRACE_S``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.communicate(timeout=GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
        except BaseException:  # a second interrupt while stopping: finish the stop, then leave
            continue
