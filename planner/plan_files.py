"""Plan files read back: the required fields of a plan JSON (flat or 3D), its recorded settings and
pipeline fields checked, each error one line naming the field."""

from __future__ import annotations

import math
from pathlib import Path

from planner.cost.settings import AUTO, LOSS_KERNELS, RECOMPUTE_MODES
from planner.errors import SettingsError
from planner.jsonfile import read_json


def read_plan_file(path: Path | str) -> dict:
    """A plan JSON (flat or 3D) with its required fields checked; one-line errors name the field."""
    return check_plan_data(read_json(path, "--plan", SettingsError), str(path))


def check_plan_data(data: object, where: str) -> dict:
    """A plan's dict (flat or 3D) with its required fields checked; one-line errors name the
    field."""
    if not isinstance(data, dict):
        raise SettingsError(f"--plan: {where} must hold a JSON object")
    collection = {"planner-top-k/1": "plans", "planner-front/1": "points"}.get(data.get("format"))
    if collection is not None:
        raise SettingsError(
            f"--plan: {where} is a {data['format']} file of several plans, not one plan: save "
            f"one entry of its '{collection}' list as its own file"
        )
    for key, kind in (("mesh", str), ("operators", list)) + (
        (("pipeline", dict),) if "pipeline" in data else ()
    ):
        if not isinstance(data.get(key), kind):
            raise SettingsError(
                f"--plan: {where}: field '{key}' is missing or not a {kind.__name__}"
            )
    if "settings" in data:
        check_plan_settings(data["settings"], where)
    limit = data.get("memory_limit_bytes")
    if limit is not None and not (_is_number(limit) and 0 < limit):
        raise SettingsError(
            f"--plan: {where}: field 'memory_limit_bytes' must be a positive number of bytes or "
            "null (no limit)"
        )
    names = []
    for i, entry in enumerate(data["operators"]):
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or "strategy" not in entry
        ):
            raise SettingsError(f"--plan: {where}: operators #{i} needs 'name' and 'strategy'")
        names.append(entry["name"])
    seen: set[str] = set()
    for name in names:  # linear: a 50k-operator plan with a duplicate took a minute
        if name in seen:
            raise SettingsError(f"--plan: {where}: field 'operators' names {name!r} twice")
        seen.add(name)
    return data


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# the settings a plan file records, each with what it may hold (read back by ``evaluate --plan``)
_SETTING_CHECKS = {
    "dtype": (lambda v: v in ("bf16", "fp16", "fp32"), "one of bf16, fp16, fp32"),
    "optimizer": (lambda v: v in ("adam", "sgd"), "one of adam, sgd"),
    "zero": (
        lambda v: v == "auto" or (type(v) is int and v in (0, 1, 2, 3)),
        '0, 1, 2, 3 or "auto"',
    ),
    "recompute": (
        lambda v: v in RECOMPUTE_MODES + (AUTO,) or type(v) is bool,
        f"one of {', '.join(RECOMPUTE_MODES + (AUTO,))}",
    ),
    "overlap": (lambda v: v in ("none", "grad", "full"), "one of none, grad, full"),
    "bucket_mb": (lambda v: _is_number(v) and 0 <= v < 2**30, "a non-negative number of MiB"),
    "fp32_grads": (lambda v: type(v) is bool, "true or false"),
    "sequence_parallel": (lambda v: type(v) is bool, "true or false"),
    "loss_kernel": (lambda v: v in LOSS_KERNELS, ", ".join(LOSS_KERNELS)),
    "layer_recompute": (lambda v: isinstance(v, str), 'a string such as "full:0-11"'),
    "layer_zero": (lambda v: isinstance(v, str), 'a string such as "3:0-11"'),
}


def check_plan_settings(settings: object, where: str) -> None:
    """A plan file's ``settings``: known keys only, each of its own type (no coercion: the string
    "false" is no boolean, 2.7 no ZeRO stage)."""
    if not isinstance(settings, dict):
        raise SettingsError(f"--plan: {where}: field 'settings' must be a JSON object")
    for key, value in settings.items():
        if key not in _SETTING_CHECKS:
            raise SettingsError(
                f"--plan: {where}: field 'settings' has unknown key {_short(key)} (known: "
                f"{', '.join(_SETTING_CHECKS)})"
            )
        valid, wanted = _SETTING_CHECKS[key]
        try:
            ok = bool(valid(value))
        except TypeError:  # unhashable values (lists, objects)
            ok = False
        if not ok:
            raise SettingsError(
                f"--plan: {where}: field 'settings.{key}' must be {wanted}, got {_short(value)}"
            )


def _short(value: object, width: int = 40) -> str:
    """A value for a one-line error: repr, newlines escaped, cut to ``width`` characters."""
    if isinstance(value, int) and value.bit_length() > 100:  # str() of a 5000-digit int raises
        return f"<an integer of about {int(value.bit_length() * 0.30103)} digits>"
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# what a plan file records that its re-costing must reproduce: (field path, exact or float)
_RECORDED_FLAT = (
    ("objective",),
    ("estimated_step_time_s",),
    ("memory_per_device_bytes",),
    ("fits_memory",),
)
_RECORDED_3D = (
    ("iteration_time_s",),
    ("bottleneck_s",),
    ("max_memory_bytes",),
    ("fits_memory",),
    ("pipeline", "stages"),
    ("pipeline", "num_microbatches"),
    ("pipeline", "micro_batch"),
    ("pipeline", "cuts"),
    ("pipeline", "schedule"),
)


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
            raise SettingsError(
                f"--plan: {where}: field 'stages' must hold one row per pipeline stage "
                f"({len(again['stages'])})"
            )
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
        raise SettingsError(
            f"--plan: {where}: field '{prefix}{'.'.join(path)}' is {_short(recorded)}, the plan "
            f"re-costed on its model gives {_short(fresh)} (an edited file, or one of another "
            "model or release?)"
        )


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
