"""The practitioner's 3D grid: the Megatron-LM / FSDP configurations people write by hand, each
costed as given (``evaluate_3d``: even cuts, Megatron-LM's stage plan or data parallelism, 1F1B
unless another schedule is given), the fastest that fits kept.

    grid = { (t, p, d, b, r, z) :  t | g and t | W       tensor parallel inside a node (g GPUs)
                                   p | W, p <= L          pipeline stages (L layers)
                                   d = W / (t p)          data parallel
                                   b in micro_batches, d b | batch
                                   r in recompute modes, z in ZeRO stages 0..3 (3: FSDP)
                                   sequence parallelism exactly when t > 1 }
    best = argmin over the grid of the iteration time, among the points that fit

The 3D search (``plan --pipeline auto``) holds every point of this grid in its space (the degrees,
the stage plans, the micro-batch counts, the settings menu and the even cuts), so a point faster
than its answer is a defect of the search; ``tests/test_grid3d.py`` checks that on generated
cases and ``benchmarks/threed.py`` on the published ones.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from planner.api3d import evaluate_3d
from planner.cost.settings import RECOMPUTE, TrainingSettings
from planner.errors import InfeasibleError, SettingsError
from planner.pipeline.plan3d import Plan3D


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One hand-written configuration: degrees, micro-batch per replica, recompute, ZeRO."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    recompute: str
    zero: int
    # fp32 main gradients, as Megatron-LM runs every bf16 line (validate_args sets
    # accumulate_allreduce_grads_in_fp32 under --bf16)
    fp32_grads: bool = False
    loss_kernel: str = "torch"  # the engine's cross-entropy (settings.LOSS_KERNELS)

    @property
    def settings(self) -> TrainingSettings:
        return TrainingSettings(
            recompute=self.recompute,
            zero=self.zero,
            sequence_parallel=self.tp > 1,
            fp32_grads=self.fp32_grads,
            loss_kernel=self.loss_kernel,
        )

    @property
    def flags(self) -> str:
        """The point as ``planner evaluate`` flags."""
        return (
            f"--tp {self.tp} --pp {self.pp} --dp {self.dp} --micro-batch {self.micro_batch} "
            f"--recompute {self.recompute} --zero {self.zero}"
            + (" --sequence-parallel" if self.tp > 1 else "")
            + (" --fp32-grads" if self.fp32_grads else "")
            + (f" --loss-kernel {self.loss_kernel}" if self.loss_kernel != "torch" else "")
        )


def grid_points(
    world: int,
    gpus_per_node: int,
    layers: int,
    batch: int,
    micro_batches: tuple[int, ...] = (1, 2),
    zeros: tuple[int, ...] = (0, 1, 2, 3),
    fp32_grads: bool = False,
    loss_kernel: str = "torch",
) -> list[GridPoint]:
    """Every point of the grid (see the module docstring), in a fixed order."""
    node = min(world, gpus_per_node)
    tps = [t for t in range(1, node + 1) if node % t == 0 and world % t == 0]
    pps = [p for p in range(1, min(world, layers) + 1) if world % p == 0]
    points = []
    for tp, pp, b, r, z in itertools.product(tps, pps, micro_batches, RECOMPUTE, zeros):
        dp, rest = divmod(world, tp * pp)
        if rest == 0 and batch % (dp * b) == 0:
            points.append(GridPoint(tp, pp, dp, b, r, z, fp32_grads, loss_kernel))
    return points


def grid_best(
    model: str, device: str, points: list[GridPoint], batch: int, seq: int | None = None, **kw
) -> tuple[Plan3D | None, GridPoint | None, int]:
    """The fastest point that fits (None, None when none does) and how many points fit; ``kw``
    goes to ``evaluate_3d`` (memory, schedule, hardware_csv)."""
    best, chosen, fitting = None, None, 0
    for point in points:
        try:
            plan = evaluate_3d(
                model,
                device,
                tp=point.tp,
                pp=point.pp,
                dp=point.dp,
                micro_batch=point.micro_batch,
                batch=batch,
                seq=seq,
                settings=point.settings,
                **kw,
            )
        except (InfeasibleError, SettingsError):
            continue  # does not fit, or a degree splits nothing in this model
        fitting += 1
        if best is None or plan.pipeline.iteration_time_s < best.pipeline.iteration_time_s:
            best, chosen = plan, point
    return best, chosen, fitting
