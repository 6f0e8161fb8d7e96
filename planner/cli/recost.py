"""A plan file re-costed on its model: the settings it records (options given override them) and
the ``Plan`` / ``Plan3D`` that ``evaluate --plan``, ``show`` and the runners check it against."""

from __future__ import annotations

import argparse

from planner import api, api3d
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV
from planner.cost.settings import AUTO, TrainingSettings, flag_message, parse_layer_modes
from planner.errors import SettingsError
from planner.plan_files import check_recorded
from planner.cli.parser import SETTINGS_DEFAULTS


def settings_from_args(args: argparse.Namespace, base: dict | None = None) -> TrainingSettings:
    """Settings from the options; an option not given takes ``base`` (a plan file's) or the
    default."""
    values = {
        k: getattr(args, k, None)
        if getattr(args, k, None) is not None
        else (base or SETTINGS_DEFAULTS).get(k, v)
        for k, v in SETTINGS_DEFAULTS.items()
    }
    recompute = values["recompute"]  # plan files before 'selective' wrote booleans
    recompute = (
        {True: "full", False: "none"}.get(recompute, recompute)
        if isinstance(recompute, bool)
        else recompute
    )
    zero = AUTO if values["zero"] == AUTO else int(values["zero"])
    # a plan file's per-layer choices under 'auto' are kept unless the option overrides them
    layers = (
        parse_layer_modes((base or {}).get("layer_recompute", ""))
        if recompute == AUTO and getattr(args, "recompute", None) is None
        else ()
    )
    stages = (
        parse_layer_modes((base or {}).get("layer_zero", ""), "layer_zero")
        if zero == AUTO and getattr(args, "zero", None) is None
        else ()
    )
    try:
        return _settings(values, zero, recompute, layers, stages)
    except SettingsError as error:  # the library names the field; the user gave its option
        raise SettingsError(flag_message(str(error))) from None


def _settings(values: dict, zero, recompute, layers, stages) -> TrainingSettings:
    return TrainingSettings(
        dtype=values["dtype"],
        optimizer=values["optimizer"],
        zero=zero,
        recompute=recompute,
        overlap=values["overlap"],
        bucket_bytes=float(values["bucket_mb"]) * 2**20,
        fp32_grads=bool(values["fp32_grads"]),
        sequence_parallel=bool(values["sequence_parallel"]),
        loss_kernel=values["loss_kernel"],
        layer_recompute=layers,
        layer_zero=stages,
    )


def recost(args: argparse.Namespace, data: dict, path: str):
    """A plan file's dict re-costed on its model (the options of ``args`` that are given override
    the file's; ``show`` passes none): a ``Plan`` or, for a 3D plan, a ``Plan3D``."""
    source = data.get("source") or {}
    model = getattr(args, "model", None) or source.get("model")
    if not model or not isinstance(model, str):
        raise SettingsError(f"--model: {path} has no 'source' model; pass --model")
    batch = getattr(args, "batch", None) or _source_int(source, "batch", path)
    seq = getattr(args, "seq", None) or _source_int(source, "seq", path)
    device = (
        getattr(args, "device", None) or source.get("device") or data.get("device") or "a100-80g"
    )
    if not isinstance(device, str):
        raise SettingsError(f"--plan: {path}: field 'device' must be a device name")
    given = getattr(args, "memory", None)
    memory = given if given is not None else (data.get("memory_limit_bytes") or float("inf"))
    settings = settings_from_args(args, data.get("settings"))
    hardware = getattr(args, "hardware", None) or source.get("hardware") or DEFAULT_HARDWARE_CSV
    if hardware is not None and not isinstance(hardware, str):
        raise SettingsError(
            f"--plan: {path}: field 'source.hardware' must be the path of a datasheet table"
        )
    if "pipeline" in data:
        return api3d.evaluate_3d_file(
            data,
            model,
            device,
            batch=batch,
            seq=seq,
            settings=settings,
            memory=memory,
            hardware_csv=hardware,
            where=f"--plan {path}",
        )
    assignment = {o["name"]: o["strategy"] for o in data["operators"]}
    count = data.get("num_microbatches", 1)
    if type(count) is not int or count < 1:
        raise SettingsError(f"--plan: {path}: field 'num_microbatches' must be a positive integer")
    return api.evaluate(
        model,
        data["mesh"],
        device,
        num_microbatches=count,
        assignment=assignment,
        batch=batch,
        seq=seq,
        memory=memory,
        settings=settings,
        hardware_csv=hardware,
    )


def _source_int(source: dict, key: str, path: str) -> int | None:
    value = source.get(key)
    if value is not None and (type(value) is not int or value < 1):
        raise SettingsError(
            f"--plan: {path}: field 'source.{key}' must be a positive integer or null"
        )
    return value


def checked(args: argparse.Namespace, data: dict, path: str) -> tuple:
    """The plan re-costed on its model (``recost``) and its dict, after the figures the file records
    were checked against it (``planner.plan_files.check_recorded``): what every consumer of a plan
    file (show, export, verify, run-torch, run-jax) uses: an edited or foreign file is refused."""
    plan = recost(args, data, path)
    again = plan.to_dict(timings=False)
    check_recorded(data, again, path)
    return plan, again
