"""The plan: a strategy per operator, its cost breakdown, memory per device and the search status.

``plan_from_strategies`` costs any assignment of strategies (found by a search or given by a
user), so every method is compared by the same cost model and the same integer objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, runtime_checkable

from planner.cost.records import CostRecord, accumulated, breakdown, seconds, sum_records
from planner.cost.terms import plan_terms
from planner.errors import PlannerError
from planner.cost.problem import Problem
from planner.cost.strategy import Strategy, enumerate_strategies

FAILED = ("INFEASIBLE", "UNKNOWN")  # statuses of a search that found no plan


@runtime_checkable
class PlanResult(Protocol):
    """What every plan answers, flat (``Plan``) or 3D (``pipeline.plan3d.Plan3D``): a script
    compares them through these names. ``status`` is the search's word (OPTIMAL, FEASIBLE or
    HEURISTIC for a flat plan, OK for a 3D one; INFEASIBLE or UNKNOWN when none was found),
    ``found`` whether there is a plan, ``step_time_s`` the predicted time of one training step (a 3D
    plan's iteration) and ``memory_per_device_bytes`` the largest memory on one device (a 3D plan's
    worst stage)."""

    model: str
    mesh: str
    device: str
    memory_limit_bytes: float | None
    search_time_s: float

    @property
    def status(self) -> str: ...

    @property
    def found(self) -> bool: ...

    @property
    def step_time_s(self) -> float | None: ...

    @property
    def memory_per_device_bytes(self) -> float | None: ...

    @property
    def fits_memory(self) -> bool | None: ...

    def to_dict(self, timings: bool = True) -> dict: ...

    def summary_row(self, timings: bool = True) -> dict: ...


@dataclass(frozen=True, slots=True)
class OpAssignment:
    name: str
    kind: str
    strategy: tuple[tuple[str, str | None], ...]  # (mesh axis, dim it splits or None)
    layer: int | None = None  # the operator's layer (None outside the layers)


@dataclass(frozen=True, slots=True)
class Plan:
    """A costed plan. ``objective`` is in integer units of ``unit_s`` seconds.

    A failed search (``INFEASIBLE``, ``UNKNOWN``: see ``failed``) has no plan: its objective, times
    and memory are ``None`` (null in JSON, empty in CSV) and it has no operators; only the status
    and the ``explanation`` say what happened."""

    model: str
    method: str
    status: str
    objective: int | None
    unit_s: float
    estimated_step_time_s: float | None
    compute_s: float | None
    comm_s: float | None
    comm_by_kind_s: tuple[tuple[str, float], ...]
    comm_by_axis_s: tuple[tuple[str, float], ...]
    memory_per_device_bytes: float | None
    memory_breakdown: tuple[tuple[str, float], ...]
    memory_limit_bytes: float | None
    mesh: str
    device: str
    settings: tuple[tuple[str, object], ...]
    operators: tuple[OpAssignment, ...]
    search_time_s: float = 0.0
    notes: tuple[str, ...] = ()
    explanation: str = ""
    choice: tuple[int, ...] = field(default=(), compare=False, repr=False)
    bound: int | None = None  # proven lower bound on the objective (exact methods)
    # communication behind compute (step time = compute + comm - hidden)
    hidden_s: float | None = 0.0
    # (collective kind, mesh axis, seconds)
    comm_by_kind_axis_s: tuple[tuple[str, str, float], ...] = ()
    # the device's memory outside the plan's tensors (CUDA context, NCCL buffers, workspaces): not
    # in memory_per_device_bytes; the default limit is the device's memory less it
    reserve_bytes: float = 0.0
    num_microbatches: int = 1  # micro-batches a step accumulates (gradient accumulation)

    @property
    def gap_percent(self) -> float | None:
        """Proven optimality gap: (objective - bound) / bound; 0 when OPTIMAL, None when no bound is
        known."""
        if self.status == "OPTIMAL":
            return 0.0
        if self.bound is None or self.status in ("INFEASIBLE", "UNKNOWN"):
            return None
        return 100.0 * (self.objective - self.bound) / max(1, self.bound)

    @property
    def found(self) -> bool:
        """Whether the search found a plan (a failed one carries only its status and reason)."""
        return self.status not in FAILED

    @property
    def step_time_s(self) -> float | None:
        """The predicted step time (``estimated_step_time_s``; None without a plan)."""
        return self.estimated_step_time_s

    @property
    def fits_memory(self) -> bool | None:
        if self.memory_per_device_bytes is None:
            return None
        return (
            self.memory_limit_bytes is None
            or self.memory_per_device_bytes <= self.memory_limit_bytes
        )

    def strategy_of(self, op_name: str) -> dict[str, str | None]:
        for a in self.operators:
            if a.name == op_name:
                return dict(a.strategy)
        raise KeyError(op_name)

    def to_dict(self, timings: bool = True) -> dict:
        data = {
            "model": self.model,
            "method": self.method,
            "status": self.status,
            "objective": self.objective,
            "objective_unit_s": self.unit_s,
            "estimated_step_time_s": self.estimated_step_time_s,
            "compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "hidden_s": self.hidden_s,
            "comm_by_kind_s": dict(self.comm_by_kind_s),
            "comm_by_axis_s": dict(self.comm_by_axis_s),
            "comm_by_kind_axis_s": [
                {"kind": k, "axis": a, "seconds": t} for k, a, t in self.comm_by_kind_axis_s
            ],
            "memory_per_device_bytes": self.memory_per_device_bytes,
            "memory_breakdown_bytes": dict(self.memory_breakdown),
            "memory_limit_bytes": self.memory_limit_bytes,
            "reserve_bytes": self.reserve_bytes,
            "num_microbatches": self.num_microbatches,
            "fits_memory": self.fits_memory,
            "mesh": self.mesh,
            "device": self.device,
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "explanation": self.explanation,
            "bound": self.bound,
            "gap_percent": self.gap_percent,
            "operators": [
                {"name": a.name, "kind": a.kind, "layer": a.layer, "strategy": dict(a.strategy)}
                for a in self.operators
            ],
        }
        if timings:
            data["search_time_s"] = self.search_time_s
        return data

    def summary_row(self, timings: bool = True) -> dict:
        """One flat CSV row: configuration and headline figures."""
        row = {k: v for k, v in self.to_dict(timings).items() if not isinstance(v, (dict, list))}
        row.update({f"setting_{k}": v for k, v in self.settings})
        row.update({f"comm_{k}_s": v for k, v in self.comm_by_kind_s})
        row.update({f"memory_{k}_bytes": v for k, v in self.memory_breakdown})
        return row


def limit_field(memory_limit: float) -> float | None:
    """A memory limit as a result field (JSON null for none: JSON has no inf)."""
    return None if math.isinf(memory_limit) else float(memory_limit)


def failed(
    problem: Problem,
    *,
    method: str,
    status: str,
    search_time_s: float,
    memory_limit: float,
    explanation: str,
    notes: Sequence[str] = (),
) -> Plan:
    """The result of a search that found no plan: no objective, time, memory or operators."""
    if status not in FAILED:
        raise ValueError(f"failed: status must be one of {', '.join(FAILED)}, got {status!r}")
    return Plan(
        model=problem.graph.name,
        method=method,
        status=status,
        objective=None,
        unit_s=problem.unit_s,
        estimated_step_time_s=None,
        compute_s=None,
        comm_s=None,
        comm_by_kind_s=(),
        comm_by_axis_s=(),
        hidden_s=None,
        memory_per_device_bytes=None,
        memory_breakdown=(),
        memory_limit_bytes=limit_field(memory_limit),
        mesh=problem.mesh.spec,
        device=problem.profile.name,
        settings=tuple(problem.settings.to_dict().items()),
        operators=(),
        search_time_s=search_time_s,
        notes=tuple(notes),
        explanation=explanation,
    )


def strategies_from_choice(problem: Problem, choice: Sequence[int]) -> tuple[Strategy, ...]:
    return tuple(t.strategies[c] for t, c in zip(problem.ops, choice))


def integer_objective(problem: Problem, strategies: Sequence[Strategy]) -> tuple[int, CostRecord]:
    """The integer objective (each term rounded once, as in the problem) and the summed record,
    both for a step of the problem's micro-batches."""
    known = []
    for table, strategy in zip(problem.ops, strategies):
        # a strategy pruned as dominated (or given by a user) is costed afresh by the walk
        known.append(
            table.records[table.strategies.index(strategy)]
            if strategy in table.strategies
            else None
        )
    terms = plan_terms(
        problem.graph, problem.mesh, problem.profile, problem.settings, strategies, known
    )
    records, passes = terms.records(), problem.num_microbatches
    units: dict[int, int] = {}  # identical terms share one record object
    objective = 0
    for record in records:
        if id(record) not in units:
            step = accumulated(record, passes)
            units[id(record)] = int(
                round(seconds(step, problem.mesh, problem.profile) / problem.unit_s)
            )
        objective += units[id(record)]
    return objective, accumulated(sum_records(records), passes)


def _memory_parts(mem) -> tuple[tuple[str, float], ...]:
    return (
        ("params", mem.params),
        ("grads", mem.grads),
        ("optimizer", mem.optimizer),
        ("activations", mem.activations),
    )


def make_plan(
    problem: Problem,
    strategies: Sequence[Strategy],
    *,
    method: str,
    status: str,
    search_time_s: float = 0.0,
    memory_limit: float = math.inf,
    notes: Sequence[str] = (),
    explanation: str = "",
    bound: int | None = None,
) -> Plan:
    """Cost an assignment of strategies (one per operator, in the problem's order) into a Plan."""
    if status in FAILED:
        raise ValueError(f"make_plan: a {status} search has no plan to cost (use plans.failed)")
    objective, record = integer_objective(problem, strategies)
    notes = tuple(notes) + _unused_mesh_note(problem, strategies, status == "OPTIMAL")
    times = breakdown(record, problem.mesh, problem.profile)
    mem, axes = record.memory, problem.mesh.names
    ops = tuple(
        OpAssignment(t.op.name, t.op.kind, tuple(zip(axes, s)), t.op.layer)
        for t, s in zip(problem.ops, strategies)
    )
    return Plan(
        model=problem.graph.name,
        method=method,
        status=status,
        objective=objective,
        unit_s=problem.unit_s,
        estimated_step_time_s=times.total_s,
        compute_s=times.compute_s,
        comm_s=times.comm_s,
        comm_by_kind_s=times.comm_by_kind_s,
        comm_by_axis_s=times.comm_by_axis_s,
        hidden_s=times.hidden_s,
        comm_by_kind_axis_s=times.comm_by_kind_axis_s,
        memory_per_device_bytes=mem.total,
        memory_breakdown=_memory_parts(mem),
        memory_limit_bytes=limit_field(memory_limit),
        mesh=problem.mesh.spec,
        device=problem.profile.name,
        settings=tuple(problem.settings.to_dict().items()),
        operators=ops,
        search_time_s=search_time_s,
        notes=tuple(notes),
        explanation=explanation,
        bound=None if bound is None else int(bound),
        reserve_bytes=problem.profile.reserve_bytes,
        num_microbatches=problem.num_microbatches,
    )


def _unused_mesh_note(
    problem: Problem, strategies: Sequence[Strategy], optimal: bool
) -> tuple[str, ...]:
    """A plan that splits nothing leaves the mesh idle: say so, and why (only a proven optimum says
    that replication is cheapest; a heuristic or a time-limited plan just split nothing)."""
    if problem.mesh.num_devices == 1 or any(d is not None for s in strategies for d in s):
        return ()
    if all(all(d is None for d in s) for t in problem.ops for s in t.strategies):
        return (
            "the mesh is unused: no operator has a dim divisible by an axis size of "
            f"{problem.mesh.spec}; choose a mesh whose axis sizes divide the model's dims",
        )
    if optimal:
        return (
            f"the mesh is unused: replicating every operator is cheapest on {problem.mesh.spec} "
            "under this cost model (communication would cost more than the compute it saves)",
        )
    return (f"the mesh is unused: this plan splits no operator over {problem.mesh.spec}",)


def strategies_from_mapping(
    problem: Problem, assignment: Mapping[str, Mapping[str, str | None]], where: str = "plan"
) -> tuple[Strategy, ...]:
    """Turn ``{op: {axis: dim}}`` (e.g. a plan JSON) into validated strategies, one per operator.

    Every operator of the model must be named (a plan of another model is refused, not padded)."""
    axes = problem.mesh.names
    unknown_ops = set(assignment) - {t.op.name for t in problem.ops}
    if unknown_ops:
        raise PlannerError(
            f"{where}: field 'operators' names unknown operator {sorted(unknown_ops)[0]!r}"
        )
    missing = [t.op.name for t in problem.ops if t.op.name not in assignment]
    if missing:
        raise PlannerError(
            f"{where}: field 'operators' lacks {len(missing)} operator(s) of the model, first "
            f"{missing[0]!r} (a plan of another model or size?)"
        )
    out = []
    for table in problem.ops:
        given = assignment[table.op.name]
        if not isinstance(given, Mapping):
            raise PlannerError(
                f"{where}: operator {table.op.name}: field 'strategy' must map mesh axes to dims"
            )
        bad_axes = set(given) - set(axes)
        if bad_axes:
            raise PlannerError(
                f"{where}: operator {table.op.name}: field 'strategy' names unknown mesh axis "
                f"{sorted(bad_axes)[0]!r}"
            )
        strategy = tuple(given.get(axis) for axis in axes)
        if strategy not in enumerate_strategies(table.op, problem.mesh):
            raise PlannerError(
                f"{where}: operator {table.op.name}: field 'strategy' {dict(zip(axes, strategy))} "
                "is not a valid strategy"
            )
        out.append(strategy)
    return tuple(out)
