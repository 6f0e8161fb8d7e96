"""Train a plan on JAX (``planner run-jax``): K SGD steps of the graph jitted over a device mesh
with the plan's shardings, against the same K steps on one device from the same initial weights.

As for ``planner verify``, the parent never imports JAX: ``train_on_jax`` runs ``python -m
planner.engines.train_jax JOB OUT`` with ``XLA_FLAGS=--xla_force_host_platform_device_count=N``
(N emulated CPU devices; real accelerators are used where JAX finds as many). The step is
``planner.engines.xla.training_step`` (the graph through the JAX interpreter in float32, a sharding
constraint on every edge as the plan lays it out, loss + ``jax.grad`` + SGD); the reference is the
same step unsharded. Both start from ``random_feeds(graph, seed)`` and see the same batch each step.
The compiled step's HLO comes back too, so its collectives can be compared with the cost model.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from planner.engines.hlo import parse_collectives
from planner.engines.xla import VerifyError
from planner.engines.processes import run_group


@dataclass(frozen=True, slots=True)
class TrainRun:
    """Per-step losses of the sharded run and of the one-device reference."""

    losses: tuple[float, ...]
    reference: tuple[float, ...]
    devices: int
    platform: str
    hlo: str = ""
    transfers: tuple[tuple[str, tuple[str, ...], float], ...] = ()  # collectives counted by the engine (torch)

    @property
    def max_rel_diff(self) -> float:
        """The largest relative loss difference; inf when a step's loss is not finite (NaN would
        compare below any tolerance and hide a diverged run)."""
        diffs = [abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference)]
        return max((d if math.isfinite(d) else math.inf for d in diffs), default=0.0)

    def collectives(self, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]) -> list:
        return parse_collectives(self.hlo, mesh_shape, axis_names)

    def xla_comparison(self, graph, strategies: dict, mesh) -> tuple:
        """Bytes each device sends in the compiled step against the cost model's prediction, in total
        and per mesh axis (``planner.engines.verify.compare``)."""
        compiled = [(c.kind, c.axes, c.nbytes) for c in self.collectives(mesh.shape, mesh.names)]
        return _compare(graph, strategies, mesh, compiled)

    def counted_comparison(self, graph, strategies: dict, mesh, zero: int = 0) -> tuple:
        """The same for the collectives the engine counted in the first step (PyTorch's CommDebugMode);
        ``zero`` 3: against the plan's ZeRO-3 collectives (an FSDP2 run)."""
        return _compare(graph, strategies, mesh, list(self.transfers), zero)

    def pipeline_comparison(self, micro, stage_of: dict, strategies: dict, mesh, stages: int,
                            num_microbatches: int) -> tuple:
        """A 3D run's counted bytes (one device of each stage, summed; ``mesh`` the stage mesh)
        against ``verify.predicted_pipeline_collectives``: per stage-mesh axis, ``pp`` (the sends)
        and ``tied`` (the all-reduce of a tied parameter's copies)."""
        from planner.engines.torch_pipeline import stages_reading
        from planner.engines.verify import compare, predicted_pipeline_collectives
        predicted = predicted_pipeline_collectives(micro, stage_of, strategies, mesh, stages, num_microbatches)
        copies = max((len(s) for s in stages_reading(micro, stage_of).values()), default=1)
        rows, _ = compare(predicted, list(self.transfers), {**dict(zip(mesh.names, mesh.shape)), "pp": stages,
                                                             "tied": copies})
        return rows


def _compare(graph, strategies: dict, mesh, observed: list, zero: int = 0) -> tuple:
    from dataclasses import replace

    from planner.engines.verify import VERIFY_SETTINGS, compare, predicted_collectives
    predicted = predicted_collectives(graph, strategies, mesh, replace(VERIFY_SETTINGS, zero=zero))
    rows, _ = compare(predicted, observed, dict(zip(mesh.names, mesh.shape)))
    return rows


def flat_job(graph, strategies: dict, axis_names, mesh_shape, steps: int, lr: float, seed: int) -> dict:
    """The job file of a flat training run (the JAX and torchrun workers read the same fields)."""
    from planner.ir.graph_json import graph_to_dict
    return {"graph": graph_to_dict(graph), "axis_names": list(axis_names), "mesh_shape": list(mesh_shape),
            "strategies": {k: list(v) for k, v in strategies.items()}, "steps": steps, "lr": lr, "seed": seed}


def pipeline_job(full, micro, stage_of: dict, strategies: dict, axis_names, stage_shape, stages: int,
                 num_microbatches: int, steps: int, lr: float, seed: int) -> dict:
    """The job file of a 3D run: the flat fields on the whole-batch graph and the stage mesh, plus the
    micro-batch graph, each operator's stage and the pipeline's shape."""
    from planner.ir.graph_json import graph_to_dict
    return {**flat_job(full, strategies, axis_names, stage_shape, steps, lr, seed),
            "micro_graph": graph_to_dict(micro), "stage_of": stage_of, "stages": stages,
            "num_microbatches": num_microbatches}


def train_on_jax(graph, strategies: dict, axis_names: tuple[str, ...], mesh_shape: tuple[int, ...], *,
                 steps: int = 5, lr: float = 1e-3, seed: int = 0, timeout_s: float = 1200.0) -> TrainRun:
    """Run ``steps`` SGD steps of a plan on ``prod(mesh_shape)`` devices and on one (subprocess)."""
    from planner.outputs import write_json
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        write_json(job, flat_job(graph, strategies, axis_names, mesh_shape, steps, lr, seed))
        _worker("planner.engines.train_jax", job, out, math.prod(mesh_shape), timeout_s)
        result = json.loads(out.read_text())
    return TrainRun(tuple(result["losses"]), tuple(result["reference"]), result["devices"], result["platform"],
                    result["hlo"])


def train_3d_on_jax(full, micro, stage_of: dict, strategies: dict, axis_names: tuple[str, ...],
                    stage_shape: tuple[int, ...], stages: int, num_microbatches: int, *, steps: int = 5,
                    lr: float = 1e-4, seed: int = 0, timeout_s: float = 1800.0) -> TrainRun:
    """A 3D plan on ``stages x prod(stage_shape)`` devices (``planner.engines.jax_pipeline``), arguments
    as ``planner.engines.train_torch.train_3d_on_torch``."""
    from planner.outputs import write_json
    devices = stages * math.prod(stage_shape)
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        write_json(job, pipeline_job(full, micro, stage_of, strategies, axis_names, stage_shape, stages,
                                     num_microbatches, steps, lr, seed))
        _worker("planner.engines.jax_pipeline", job, out, devices, timeout_s)
        result = json.loads(out.read_text())
    return TrainRun(tuple(result["losses"]), tuple(result["reference"]), result["devices"], result["platform"])


def _worker(module: str, job: Path, out: Path, devices: int, timeout_s: float) -> None:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    proc = run_group([sys.executable, "-m", module, str(job), str(out)], timeout_s, env=env)
    if proc.returncode != 0:
        raise VerifyError(f"run-jax: the training run failed ({exception_line(proc.stderr)})")


EXCEPTION = re.compile(r"^(\[rank\d+\]: )?[\w.]*(Error|Exception)\w*(: \S|\s*$)")  # a bare one: an assert


ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+).*?traceback\s*:\s*([^\n]*)", re.S)


def _root_cause(stderr: str) -> str:
    """torchrun's root-cause block when a rank died with no traceback of its own (a signal, a hard exit):
    its rank, exit code and signal."""
    match = ROOT_CAUSE.search(stderr)
    if not match:
        return ""
    rank, code, trace = match.groups()
    signal = f", {trace.strip()}" if trace.strip().startswith("Signal") else ""
    return f"rank {rank} exited with code {code}{signal} and printed no exception"


def exception_line(stderr: str) -> str:
    """A worker's own exception line (``RuntimeError: message``; under torchrun ``[rank0]: ...``), the
    last one (a chained exception's outermost); JAX ends its tracebacks with a note on filtered frames
    and torchrun with a ChildFailedError that names no cause. Else any line naming an error."""
    lines = stderr.strip().splitlines()
    own = [line for line in lines if EXCEPTION.match(line)]
    if own:
        return own[-1].strip()
    died = _root_cause(stderr)
    if died:
        return died
    cause = [line for line in lines if line.startswith("[rank") and "Error" in line] or \
        [line for line in lines if "Error" in line] or lines or ["no output"]
    return cause[0 if cause[0].startswith("[rank") else -1].strip()


def main(argv: list[str] | None = None) -> int:
    """Worker: ``python -m planner.engines.train_jax JOB.json OUT.json`` (run by ``train_on_jax``)."""
    from planner.engines.xla import load_job, plain_step, training_step
    from planner.outputs import write_json

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
    write_json(out_path, {"losses": losses, "reference": reference, "devices": mesh.devices.size,
                          "platform": mesh.devices.flat[0].platform, "hlo": hlo})
    return 0


if __name__ == "__main__":
    sys.exit(main())
