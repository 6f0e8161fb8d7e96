"""The plan: a strategy per operator, its cost breakdown, memory per device and the search status.

``plan_from_strategies`` costs any assignment of strategies (found by a search or given by a
user), so every method is compared by the same cost model and the same integer objective.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence, runtime_checkable

from planner.cost.records import CostRecord, breakdown, seconds, sum_records
from planner.cost.terms import plan_terms
from planner.errors import PlannerError, SettingsError
from planner.jsonfile import read_json
from planner.cost.problem import Problem
from planner.cost.strategy import Strategy, enumerate_strategies

FAILED = ("INFEASIBLE", "UNKNOWN")  # statuses of a search that found no plan


@runtime_checkable
class PlanResult(Protocol):
    """What every plan answers, flat (``Plan``) or 3D (``pipeline.threed.Plan3D``): a script compares
    them through these names. ``status`` is the search's word (OPTIMAL, FEASIBLE or HEURISTIC for a
    flat plan, OK for a 3D one; INFEASIBLE or UNKNOWN when none was found), ``found`` whether there is
    a plan, ``step_time_s`` the predicted time of one training step (a 3D plan's iteration) and
    ``memory_per_device_bytes`` the largest memory on one device (a 3D plan's worst stage)."""

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
    hidden_s: float | None = 0.0  # communication behind compute (step time = compute + comm - hidden)
    comm_by_kind_axis_s: tuple[tuple[str, str, float], ...] = ()  # (collective kind, mesh axis, seconds)

    @property
    def gap_percent(self) -> float | None:
        """Proven optimality gap: (objective - bound) / bound; 0 when OPTIMAL, None when no bound is known."""
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
        return self.memory_limit_bytes is None or self.memory_per_device_bytes <= self.memory_limit_bytes

    def strategy_of(self, op_name: str) -> dict[str, str | None]:
        for a in self.operators:
            if a.name == op_name:
                return dict(a.strategy)
        raise KeyError(op_name)

    def to_dict(self, timings: bool = True) -> dict:
        data = {
            "model": self.model, "method": self.method, "status": self.status, "objective": self.objective,
            "objective_unit_s": self.unit_s, "estimated_step_time_s": self.estimated_step_time_s,
            "compute_s": self.compute_s, "comm_s": self.comm_s, "hidden_s": self.hidden_s, "comm_by_kind_s": dict(self.comm_by_kind_s),
            "comm_by_axis_s": dict(self.comm_by_axis_s),
            "comm_by_kind_axis_s": [{"kind": k, "axis": a, "seconds": t} for k, a, t in self.comm_by_kind_axis_s],
            "memory_per_device_bytes": self.memory_per_device_bytes,
            "memory_breakdown_bytes": dict(self.memory_breakdown), "memory_limit_bytes": self.memory_limit_bytes,
            "fits_memory": self.fits_memory, "mesh": self.mesh, "device": self.device,
            "settings": dict(self.settings), "notes": list(self.notes), "explanation": self.explanation,
            "bound": self.bound, "gap_percent": self.gap_percent,
            "operators": [{"name": a.name, "kind": a.kind, "layer": a.layer, "strategy": dict(a.strategy)}
                          for a in self.operators],
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


def failed(problem: Problem, *, method: str, status: str, search_time_s: float, memory_limit: float | None,
           explanation: str, notes: Sequence[str] = ()) -> Plan:
    """The result of a search that found no plan: no objective, time, memory or operators."""
    if status not in FAILED:
        raise ValueError(f"failed: status must be one of {', '.join(FAILED)}, got {status!r}")
    return Plan(model=problem.graph.name, method=method, status=status, objective=None, unit_s=problem.unit_s,
                estimated_step_time_s=None, compute_s=None, comm_s=None, comm_by_kind_s=(), comm_by_axis_s=(),
                hidden_s=None, memory_per_device_bytes=None, memory_breakdown=(), memory_limit_bytes=memory_limit,
                mesh=problem.mesh.spec, device=problem.profile.name,
                settings=tuple(problem.settings.to_dict().items()), operators=(), search_time_s=search_time_s,
                notes=tuple(notes), explanation=explanation)


def strategies_from_choice(problem: Problem, choice: Sequence[int]) -> tuple[Strategy, ...]:
    return tuple(t.strategies[c] for t, c in zip(problem.ops, choice))


def integer_objective(problem: Problem, strategies: Sequence[Strategy]) -> tuple[int, CostRecord]:
    """The integer objective (each term rounded once, as in the problem) and the summed record."""
    known = []
    for table, strategy in zip(problem.ops, strategies):
        # a strategy pruned as dominated (or given by a user) is costed afresh by the walk
        known.append(table.records[table.strategies.index(strategy)] if strategy in table.strategies else None)
    terms = plan_terms(problem.graph, problem.mesh, problem.profile, problem.settings, strategies, known)
    records = terms.records()
    units: dict[int, int] = {}  # identical terms share one record object
    objective = 0
    for record in records:
        if id(record) not in units:
            units[id(record)] = int(round(seconds(record, problem.mesh, problem.profile) / problem.unit_s))
        objective += units[id(record)]
    return objective, sum_records(records)


def make_plan(problem: Problem, strategies: Sequence[Strategy], *, method: str, status: str,
              search_time_s: float = 0.0, memory_limit: float | None = None, notes: Sequence[str] = (),
              explanation: str = "", bound: int | None = None) -> Plan:
    """Cost an assignment of strategies (one per operator, in the problem's order) into a Plan."""
    if status in FAILED:
        raise ValueError(f"make_plan: a {status} search has no plan to cost (use plans.failed)")
    objective, record = integer_objective(problem, strategies)
    notes = tuple(notes) + _unused_mesh_note(problem, strategies, status == "OPTIMAL")
    times = breakdown(record, problem.mesh, problem.profile)
    mem = record.memory
    axes = problem.mesh.names
    ops = tuple(OpAssignment(t.op.name, t.op.kind, tuple(zip(axes, s)), t.op.layer) for t, s in zip(problem.ops, strategies))
    settings = problem.settings
    return Plan(
        model=problem.graph.name, method=method, status=status, objective=objective, unit_s=problem.unit_s,
        estimated_step_time_s=times.total_s, compute_s=times.compute_s, comm_s=times.comm_s,
        comm_by_kind_s=times.comm_by_kind_s, comm_by_axis_s=times.comm_by_axis_s, hidden_s=times.hidden_s,
        comm_by_kind_axis_s=times.comm_by_kind_axis_s,
        memory_per_device_bytes=mem.total,
        memory_breakdown=(("params", mem.params), ("grads", mem.grads), ("optimizer", mem.optimizer),
                          ("activations", mem.activations)),
        memory_limit_bytes=memory_limit, mesh=problem.mesh.spec, device=problem.profile.name,
        settings=tuple(settings.to_dict().items()),
        operators=ops, search_time_s=search_time_s, notes=tuple(notes), explanation=explanation,
        bound=None if bound is None else int(bound))


def _unused_mesh_note(problem: Problem, strategies: Sequence[Strategy], optimal: bool) -> tuple[str, ...]:
    """A plan that splits nothing leaves the mesh idle: say so, and why (only a proven optimum says
    that replication is cheapest; a heuristic or a time-limited plan just split nothing)."""
    if problem.mesh.num_devices == 1 or any(d is not None for s in strategies for d in s):
        return ()
    if all(all(d is None for d in s) for t in problem.ops for s in t.strategies):
        return (f"the mesh is unused: no operator has a dim divisible by an axis size of {problem.mesh.spec}; "
                "choose a mesh whose axis sizes divide the model's dims",)
    if optimal:
        return (f"the mesh is unused: replicating every operator is cheapest on {problem.mesh.spec} under this cost "
                "model (communication would cost more than the compute it saves)",)
    return (f"the mesh is unused: this plan splits no operator over {problem.mesh.spec}",)


def strategies_from_mapping(problem: Problem, assignment: Mapping[str, Mapping[str, str | None]],
                            where: str = "plan") -> tuple[Strategy, ...]:
    """Turn ``{op: {axis: dim}}`` (e.g. a plan JSON) into validated strategies, one per operator.

    Every operator of the model must be named (a plan of another model is refused, not padded)."""
    axes = problem.mesh.names
    unknown_ops = set(assignment) - {t.op.name for t in problem.ops}
    if unknown_ops:
        raise PlannerError(f"{where}: field 'operators' names unknown operator {sorted(unknown_ops)[0]!r}")
    missing = [t.op.name for t in problem.ops if t.op.name not in assignment]
    if missing:
        raise PlannerError(f"{where}: field 'operators' lacks {len(missing)} operator(s) of the model, "
                           f"first {missing[0]!r} (a plan of another model or size?)")
    out = []
    for table in problem.ops:
        given = assignment[table.op.name]
        if not isinstance(given, Mapping):
            raise PlannerError(f"{where}: operator {table.op.name}: field 'strategy' must map mesh axes to dims")
        bad_axes = set(given) - set(axes)
        if bad_axes:
            raise PlannerError(f"{where}: operator {table.op.name}: field 'strategy' names unknown mesh axis {sorted(bad_axes)[0]!r}")
        strategy = tuple(given.get(axis) for axis in axes)
        if strategy not in enumerate_strategies(table.op, problem.mesh):
            raise PlannerError(f"{where}: operator {table.op.name}: field 'strategy' {dict(zip(axes, strategy))} is not a valid strategy")
        out.append(strategy)
    return tuple(out)


def read_plan_file(path: Path | str) -> dict:
    """A plan JSON (flat or 3D) with its required fields checked; one-line errors name the field."""
    return check_plan_data(read_json(path, "--plan", SettingsError), str(path))


def check_plan_data(data: object, where: str) -> dict:
    """A plan's dict (flat or 3D) with its required fields checked; one-line errors name the field."""
    if not isinstance(data, dict):
        raise SettingsError(f"--plan: {where} must hold a JSON object")
    for key, kind in (("mesh", str), ("operators", list)) + ((("pipeline", dict),) if "pipeline" in data else ()):
        if not isinstance(data.get(key), kind):
            raise SettingsError(f"--plan: {where}: field '{key}' is missing or not a {kind.__name__}")
    if "settings" in data:
        check_plan_settings(data["settings"], where)
    limit = data.get("memory_limit_bytes")
    if limit is not None and not (_is_number(limit) and 0 < limit):
        raise SettingsError(f"--plan: {where}: field 'memory_limit_bytes' must be a positive number of bytes "
                            "or null (no limit)")
    names = []
    for i, entry in enumerate(data["operators"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or "strategy" not in entry:
            raise SettingsError(f"--plan: {where}: operators #{i} needs 'name' and 'strategy'")
        names.append(entry["name"])
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise SettingsError(f"--plan: {where}: field 'operators' names {dup!r} twice")
    return data


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# the settings a plan file records, each with what it may hold (read back by ``evaluate --plan``)
_SETTING_CHECKS = {
    "dtype": (lambda v: v in ("bf16", "fp16", "fp32"), "one of bf16, fp16, fp32"),
    "optimizer": (lambda v: v in ("adam", "sgd"), "one of adam, sgd"),
    "zero": (lambda v: v == "auto" or (type(v) is int and v in (0, 1, 2, 3)), "0, 1, 2, 3 or \"auto\""),
    "recompute": (lambda v: v in ("none", "selective", "full", "auto") or type(v) is bool,
                  "one of none, selective, full, auto"),
    "overlap": (lambda v: v in ("none", "grad", "full"), "one of none, grad, full"),
    "bucket_mb": (lambda v: _is_number(v) and 0 <= v < 2**30, "a non-negative number of MiB"),
    "fp32_grads": (lambda v: type(v) is bool, "true or false"),
    "sequence_parallel": (lambda v: type(v) is bool, "true or false"),
    "layer_recompute": (lambda v: isinstance(v, str), "a string such as \"full:0-11\""),
    "layer_zero": (lambda v: isinstance(v, str), "a string such as \"3:0-11\""),
}


def check_plan_settings(settings: object, where: str) -> None:
    """A plan file's ``settings``: known keys only, each of its own type (no coercion: the string
    "false" is no boolean, 2.7 no ZeRO stage)."""
    if not isinstance(settings, dict):
        raise SettingsError(f"--plan: {where}: field 'settings' must be a JSON object")
    for key, value in settings.items():
        if key not in _SETTING_CHECKS:
            raise SettingsError(f"--plan: {where}: field 'settings' has unknown key {_short(key)} "
                                f"(known: {', '.join(_SETTING_CHECKS)})")
        valid, wanted = _SETTING_CHECKS[key]
        try:
            ok = bool(valid(value))
        except TypeError:  # unhashable values (lists, objects)
            ok = False
        if not ok:
            raise SettingsError(f"--plan: {where}: field 'settings.{key}' must be {wanted}, got {_short(value)}")


def _short(value: object, width: int = 40) -> str:
    """A value for a one-line error: repr, newlines escaped, cut to ``width`` characters."""
    if isinstance(value, int) and value.bit_length() > 100:  # str() of a 5000-digit int raises
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# what a plan file records that its re-costing must reproduce: (field path, exact or float)
_RECORDED_FLAT = (("objective",), ("estimated_step_time_s",), ("memory_per_device_bytes",), ("fits_memory",))
_RECORDED_3D = (("iteration_time_s",), ("bottleneck_s",), ("max_memory_bytes",), ("fits_memory",),
                ("pipeline", "stages"), ("pipeline", "num_microbatches"), ("pipeline", "micro_batch"),
                ("pipeline", "cuts"), ("pipeline", "schedule"))


def check_recorded(data: dict, again: dict, where: str) -> None:
    """A plan file against the same plan re-costed on its model (``again``, a ``to_dict()``): every
    recorded figure and the stage rows must agree (floats to 1e-9 relative), or the file was edited
    or belongs to another model or release. One line names the first field that differs; a field
    the file does not record is not compared."""
    paths = _RECORDED_3D if "pipeline" in data else _RECORDED_FLAT
    for path in paths:
        _same(data, again, path, where)
    if "pipeline" in data:
        rows = data.get("stages", again["stages"])
        if not isinstance(rows, list) or len(rows) != len(again["stages"]):
            raise SettingsError(f"--plan: {where}: field 'stages' must hold one row per pipeline stage "
                                f"({len(again['stages'])})")
        for k, (row, fresh) in enumerate(zip(rows, again["stages"])):
            if not isinstance(row, dict):
                raise SettingsError(f"--plan: {where}: field 'stages[{k}]' must be an object")
            for key in ("time_per_microbatch_s", "memory_bytes"):
                _same(row, fresh, (key,), where, f"stages[{k}].")
        for k, (entry, fresh) in enumerate(zip(data["operators"], again["operators"])):
            _same(entry, fresh, ("stage",), where, f"operators[{k}].")


def _same(data: dict, again: dict, path: tuple[str, ...], where: str, prefix: str = "") -> None:
    recorded, fresh = data, again
    for key in path:
        if not isinstance(recorded, dict) or key not in recorded:
            return  # not recorded (an earlier release's file): nothing to contradict
        recorded = recorded[key]
        fresh = fresh.get(key) if isinstance(fresh, dict) else None
    if _is_number(fresh) and _is_number(recorded):
        agree = math.isclose(recorded, fresh, rel_tol=1e-9, abs_tol=1e-12)
    else:
        agree = recorded == fresh and type(recorded) is type(fresh)
    if not agree:
        raise SettingsError(f"--plan: {where}: field '{prefix}{'.'.join(path)}' is {_short(recorded)}, the plan "
                            f"re-costed on its model gives {_short(fresh)} (an edited file, or one of another "
                            "model or release?)")


def pipeline_fields(pipe: dict, where: str) -> tuple[int, int, str, tuple[int, ...]]:
    """(stages, micro-batch count, schedule, cuts) of a 3D plan's 'pipeline', each checked by type
    (no coercion: 2.5 stages or "8" micro-batches are refused)."""
    def count(key: str) -> int:
        value = pipe.get(key)
        if type(value) is not int or value < 1:
            raise SettingsError(f"{where}: field 'pipeline.{key}' must be a positive integer")
        return value
    schedule = pipe.get("schedule")
    if not isinstance(schedule, str):
        raise SettingsError(f"{where}: field 'pipeline.schedule' must be a schedule name")
    cuts = pipe.get("cuts")
    if not isinstance(cuts, list) or any(type(c) is not int for c in cuts):
        raise SettingsError(f"{where}: field 'pipeline.cuts' must be a list of layer indices")
    return count("stages"), count("num_microbatches"), schedule, tuple(cuts)
