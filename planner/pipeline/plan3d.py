"""The 3D plan: a pipeline (cuts, micro-batches, schedule) with the plan of every stage, its time
and memory per stage, and the candidates the search compared (``planner.pipeline.threed`` finds
it)."""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.settings import TrainingSettings
from planner.pipeline.layout import ParallelLayout
from planner.pipeline.schedule import PipelinePlan
from planner.pipeline.timeline import StageDetail
from planner.plans import FAILED

STAGE_FIELDS = (
    "first_layer",
    "end_layer",
    "forward_s",
    "backward_s",
    "recompute_s",
    "forward_comm_s",
    "backward_comm_s",
    "hidden_s",
    "send_s",
    "grad_sync_s",
    "params_bytes",
    "grads_bytes",
    "optimizer_bytes",
    "activations_bytes",
    "working_bytes",
    "tied_bytes",
    "inflight_microbatches",
    "logits_bytes",
)


@dataclass(frozen=True, slots=True)
class Plan3D:
    """A 3D plan: the pipeline (cuts, micro-batches, schedule), the stage plan, time and memory per
    stage."""

    model: str
    mesh: str
    device: str
    pipeline: PipelinePlan
    stage_mesh: str
    settings: TrainingSettings
    intra_method: str
    intra_status: str
    # per mesh axis: most common dim of linears
    tensor_parallel_dims: tuple[tuple[str, str | None], ...]
    # (name, kind, stage, dim per stage-mesh axis)
    operators: tuple[tuple[str, str, int, tuple[str | None, ...]], ...]
    stage_times_s: tuple[float, ...]  # per micro-batch, forward + backward + send
    stage_memory_bytes: tuple[float, ...]
    memory_limit_bytes: float | None
    candidates: tuple[dict, ...] = ()
    search_time_s: float = 0.0
    stage_details: tuple[StageDetail, ...] = ()  # the stage times and memory term by term
    tied_sync_s: float = 0.0  # all-reduce of a parameter kept on two stages, per step
    operator_layers: tuple[int | None, ...] = ()  # each operator's layer (None outside the layers)
    notes: tuple[str, ...] = ()  # what the plan leaves undone that its options asked for
    # the device's memory outside the plan's tensors (CUDA context, NCCL buffers, workspaces),
    # not in stage_memory_bytes: the default budget is the device's memory less it
    reserve_bytes: float = 0.0
    # the configuration as one value: degrees, stage mesh axes, micro-batches, ZeRO, SP, recompute
    layout: ParallelLayout | None = None
    # seconds no configuration of the whole 3D space beats on this model and cluster
    # (``planner.pipeline.bound``); None: not computed
    lower_bound_s: float | None = None
    # found by the certified search and proven optimal over its stated space (threed.certified)
    certified: bool = False

    @property
    def status(self) -> str:
        """The flat plans' words (``plans.PlanResult``): INFEASIBLE when no candidate fits; GIVEN
        for a plan costed as given (cuts, count and stage plan: ``evaluate_3d``, a plan file);
        OPTIMAL for a certified search proven over its stated space (``threed.certified``);
        otherwise HEURISTIC: the stage plans and the cuts may each be exact, but the search over
        degrees, micro-batches and settings that composes them proves no optimum."""
        if self.pipeline.status in FAILED:
            return self.pipeline.status
        if self.pipeline.status == "GIVEN" and self.intra_status == "GIVEN":
            return "GIVEN"
        return "OPTIMAL" if self.certified else "HEURISTIC"

    @property
    def found(self) -> bool:
        """Whether the search found a plan (``plans.PlanResult``)."""
        return self.status not in FAILED

    @property
    def step_time_s(self) -> float | None:
        """One iteration's predicted time; None without a plan (``plans.PlanResult``)."""
        return self.pipeline.iteration_time_s if self.found else None

    @property
    def memory_per_device_bytes(self) -> float:
        """The worst stage's memory per device (``plans.PlanResult``)."""
        return self.pipeline.max_memory_bytes

    @property
    def fits_memory(self) -> bool:
        return self.pipeline.fits_memory

    @property
    def gap(self) -> float | None:
        """How far above the lower bound the plan is (0.03: within 3% of the optimum of the whole
        space); None without a plan or a bound."""
        if not self.found or not self.lower_bound_s:
            return None
        return self.pipeline.iteration_time_s / self.lower_bound_s - 1

    def summary_row(self, timings: bool = True) -> dict:
        """One flat CSV row: configuration, pipeline shape and headline figures."""
        pipe, settings = self.pipeline, self.settings
        row = {
            "model": self.model,
            "mesh": self.mesh,
            "device": self.device,
            "stages": pipe.stages,
            "stage_mesh": self.stage_mesh,
            "num_microbatches": pipe.num_microbatches,
            "micro_batch": pipe.micro_batch,
            "schedule": pipe.schedule,
            "method": pipe.method,
            "intra_method": self.intra_method,
            "intra_status": self.intra_status,
            "status": self.status,
            "pipeline_status": pipe.status,
            "iteration_time_s": pipe.iteration_time_s,
            "max_memory_bytes": pipe.max_memory_bytes,
            "fits_memory": pipe.fits_memory,
            "cuts": " ".join(map(str, pipe.cuts)),
            "recompute": settings.recompute,
            "zero": settings.zero,
            "sequence_parallel": settings.sequence_parallel,
        }
        if timings:
            row["search_time_s"] = self.search_time_s
        return row

    def to_dict(self, timings: bool = True) -> dict:
        """The 3D plan JSON (schema ``planner-3d/2``, documented in the README)."""
        pipe, axes = self.pipeline, self.stage_mesh_names
        data = {
            "format": "planner-3d/2",
            "model": self.model,
            "mesh": self.mesh,
            "device": self.device,
            "status": self.status,
            "pipeline_status": pipe.status,
            "intra_method": self.intra_method,
            "intra_status": self.intra_status,
            "iteration_time_s": pipe.iteration_time_s,
            "bottleneck_s": pipe.bottleneck_s,
            "lower_bound_s": self.lower_bound_s,
            "gap": self.gap,
            "max_memory_bytes": pipe.max_memory_bytes,
            "memory_limit_bytes": self.memory_limit_bytes,
            "reserve_bytes": self.reserve_bytes,
            "fits_memory": pipe.fits_memory,
            "pipeline": {
                "stages": pipe.stages,
                "cuts": list(pipe.cuts),
                "num_microbatches": pipe.num_microbatches,
                "micro_batch": pipe.micro_batch,
                "schedule": pipe.schedule,
                "method": pipe.method,
                "stage_mesh": self.stage_mesh,
            },
            "settings": self.settings.to_dict(),
            "layout": self.layout.to_dict() if self.layout is not None else None,
            "stages": [
                {"stage": k, "time_per_microbatch_s": t, "memory_bytes": m}
                for k, (t, m) in enumerate(zip(self.stage_times_s, self.stage_memory_bytes))
            ],
            "tied_sync_s": self.tied_sync_s,
            "operators": [
                {"name": n, "kind": kind, "stage": k, "strategy": dict(zip(axes, s))}
                for n, kind, k, s in self.operators
            ],
        }
        for row, detail in zip(data["stages"], self.stage_details):
            row.update({name: getattr(detail, name) for name in STAGE_FIELDS})
        for row, layer in zip(data["operators"], self.operator_layers):
            row["layer"] = layer
        if self.notes:
            data["notes"] = list(self.notes)
        if timings:
            data["search_time_s"] = self.search_time_s
        return data

    @property
    def stage_mesh_names(self) -> tuple[str, ...]:
        return tuple(part.split("=")[0] for part in self.stage_mesh.split(","))


def replicated_linears(result: Plan3D, tp: int) -> tuple[str, ...]:
    """A note when Megatron's pattern left linear layers whole on the tensor-parallel axis (tp
    divides none of their dims, e.g. 12 attention heads on tp 8): they run replicated there."""
    if tp <= 1 or "tp" not in result.stage_mesh_names:
        return ()
    axis = result.stage_mesh_names.index("tp")
    whole = [
        name
        for name, kind, _, strategy in result.operators
        if kind == "linear" and strategy[axis] is None
    ]
    if not whole:
        return ()
    linears = sum(kind == "linear" for _, kind, _, _ in result.operators)
    return (
        f"--tp {tp}: {len(whole)} of {linears} linear layers (first {whole[0]}) are replicated on "
        f"the tensor-parallel axis: {tp} divides none of their split dims (heads, ffn); each tp "
        "rank computes them whole",
    )
