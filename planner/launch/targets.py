"""Launch configurations: a 3D plan as Megatron-LM arguments or a torchtitan config (checked by
re-costing the configuration read back), a Megatron-LM command line or torchtitan config costed as
given (``planner evaluate --from-megatron/--from-torchtitan``), and the whole-cluster search
restricted to what one engine runs (``plan_for``, ``planner plan --for``). The engines are the
registry ``TARGETS``; the flag mappings are in ``planner.launch.megatron`` and
``planner.launch.torchtitan``."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from planner import api3d
from planner.cluster.profiles import DEFAULT_HARDWARE_CSV, MachineProfile, get_profile
from planner.cost.settings import AUTO, RECOMPUTE, TrainingSettings
from planner.launch.run import LaunchRun
from planner.launch.megatron import megatron_args, shell_line
from planner.launch.megatron_read import read_megatron
from planner.launch.torchtitan import check_expressible, config_file, flavor
from planner.errors import SettingsError
from planner.pipeline.layout import ROLES, TENSOR, axis_roles
from planner.pipeline.plan3d import Plan3D
from planner.pipeline.schedule import parse_schedule
from planner.zoo import model_config
from planner.launch.torchtitan_read import read_torchtitan

# the exported line re-costed must give the plan's iteration time within this share
ROUND_TRIP_TOLERANCE = 1e-3


@dataclass(frozen=True, slots=True)
class LaunchExport:
    """A plan as an engine's launch configuration (``text``: a Megatron-LM line or a torchtitan
    config file), and that configuration costed as given."""

    run: LaunchRun
    text: str
    plan_time_s: float
    recosted: Plan3D

    @property
    def line(self) -> str:
        """The Megatron-LM launch line (``text`` of a Megatron export)."""
        return self.text

    @property
    def gap(self) -> float:
        return self.recosted.pipeline.iteration_time_s / self.plan_time_s - 1.0


# what a round trip that misses the plan's time says, per engine
MISSES = {
    "megatron": "the plan's stage plan is not Megatron-LM's pattern",
    "torchtitan": "the stage plan is not the tensor-parallel pattern torchtitan applies",
}


def _checked(target: str, export: LaunchExport) -> LaunchExport:
    """The export, refused when its configuration costed as given misses the plan's time."""
    if abs(export.gap) > ROUND_TRIP_TOLERANCE:
        raise SettingsError(
            f"--target {target}: {MISSES[target]}: its configuration costs "
            f"{export.recosted.pipeline.iteration_time_s:.4f} s per iteration as given, the plan "
            f"{export.plan_time_s:.4f} s ({export.gap:+.2%}); plan with --method megatron"
        )
    return export


def launch_run(data: dict) -> LaunchRun:
    """The configuration of a 3D plan JSON (``planner-3d``) to launch; SettingsError naming the
    field that no launch configuration expresses."""
    source = data.get("source") or {}
    cfg = model_config(str(data.get("model")), source.get("seq"))
    if cfg is None:
        raise SettingsError(
            f"--plan: model {data.get('model')!r} is not a GPT- or LLaMA-family decoder "
            "(what Megatron-LM's pretrain_gpt.py and torchtitan's llama3 train)"
        )
    pipe = data["pipeline"]
    tp, dp = _degrees(data)
    settings = TrainingSettings.from_dict(data.get("settings") or {})
    if settings.zero == AUTO or (settings.recompute == AUTO and not settings.layer_recompute):
        raise SettingsError(
            "--plan: field 'settings': per-layer recompute or ZeRO choices are not exported yet "
            "(one recompute granularity and one optimizer sharding for all layers)"
        )
    schedule, virtual = parse_schedule(str(pipe["schedule"]))
    if pipe["micro_batch"] % dp:
        raise SettingsError(
            f"--plan: field 'pipeline.micro_batch' ({pipe['micro_batch']}) is not divisible by "
            f"the data-parallel degree {dp}"
        )
    cuts = tuple(pipe["cuts"]) if virtual == 1 else None
    micro = pipe["micro_batch"] // dp
    batch = micro * dp * pipe["num_microbatches"]
    gpipe = schedule == "gpipe" and pipe["stages"] > 1  # one stage: no schedule to launch
    return LaunchRun(cfg, tp, pipe["stages"], dp, micro, batch, settings, virtual, cuts, gpipe)


def _degrees(data: dict) -> tuple[int, int]:
    """(tensor, data) parallel degrees of the plan's ``layout`` (``pipeline.layout``); a file
    written before plans carried one gets its layout's roles from its operators, by the same
    rule (``layout.axis_roles``)."""
    layout = data.get("layout")
    if layout is not None:
        axes = _layout_axes(layout)
    else:
        sizes = []
        for part in str(data["pipeline"]["stage_mesh"]).split(","):
            name, _, size = part.rpartition("=")
            sizes.append((name or "gpu", int(size)))
        linears = [
            tuple(op["strategy"].get(name) for name, _ in sizes)
            for op in data["operators"]
            if op["kind"] == "linear" and op.get("layer") is not None
        ]
        roles = axis_roles([name for name, _ in sizes], linears)
        axes = [(name, size, role) for (name, size), role in zip(sizes, roles)]
    split = [(name, size) for name, size, role in axes if role == TENSOR]
    if len(split) > 1:
        raise SettingsError(
            f"--plan: field 'operators': the layers' linears split model dims on {len(split)} "
            f"mesh axes ({', '.join(sorted(name for name, _ in split))}); Megatron-LM's tensor "
            "parallelism is one axis (plan with --method megatron)"
        )
    tp = split[0][1] if split else 1
    return tp, math.prod(size for _, size, _ in axes) // tp


def _layout_axes(layout) -> list[tuple[str, int, str]]:
    """(name, size, role) of each axis of a plan file's ``layout.mesh_axes``, checked."""
    axes = layout.get("mesh_axes") if isinstance(layout, dict) else None
    try:
        found = [(str(a["name"]), a["size"], a["role"]) for a in axes]
    except (TypeError, KeyError):
        found = []
    if not found or any(
        isinstance(size, bool) or not isinstance(size, int) or size < 1 or role not in ROLES
        for _, size, role in found
    ):
        raise SettingsError(
            "--plan: field 'layout.mesh_axes': a list of {name, size, level, role} (a positive "
            f"size, role one of {', '.join(ROLES)})"
        )
    return found


def export_megatron(
    data: dict,
    device: str | MachineProfile | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> LaunchExport:
    """The Megatron-LM launch line of a 3D plan, refused unless the line, read back and costed as
    given, gives the plan's iteration time (within ``ROUND_TRIP_TOLERANCE``)."""
    run = launch_run(data)
    _megatron_check(run)
    profile = get_profile(device or data.get("device") or "a100-80g", hardware_csv)
    line = shell_line(run, profile.gpus_per_node)
    recosted, _, _ = evaluate_megatron(line, profile, hardware_csv=hardware_csv)
    return _checked("megatron", LaunchExport(run, line, float(data["iteration_time_s"]), recosted))


def evaluate_megatron(
    text: str,
    device: str | MachineProfile = "a100-80g",
    dp: int | None = None,
    memory: float | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> tuple[Plan3D, LaunchRun, tuple[str, ...]]:
    """A Megatron-LM line (or argument file text) costed as given, through ``evaluate_3d``; the run
    it describes and the flags it ignored (they change no step time or memory)."""
    run, ignored = read_megatron(text, dp)
    return recost(run, device, memory, hardware_csv), run, ignored


def recost(
    run: LaunchRun,
    device: str | MachineProfile = "a100-80g",
    memory: float | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> Plan3D:
    """A launch configuration costed as given (``api3d.evaluate_3d`` on its degrees)."""
    return api3d.evaluate_3d(
        run.model_spec,
        device,
        tp=run.tensor_parallel,
        pp=run.pipeline_parallel,
        dp=run.data_parallel,
        micro_batch=run.micro_batch,
        batch=run.global_batch,
        settings=run.settings,
        schedule=run.schedule,
        memory=memory,
        cuts=run.cuts,
        fit_required=False,
        hardware_csv=hardware_csv,
    )


def export_torchtitan(
    data: dict,
    device: str | MachineProfile | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
    title: str = "",
) -> LaunchExport:
    """The torchtitan 0.3 config file of a 3D plan (``planner.launch.torchtitan``), refused unless
    its configuration costed as given gives the plan's iteration time (``ROUND_TRIP_TOLERANCE``)."""
    run = launch_run(data)
    text = config_file(run, title or f"{data.get('model')} on {data.get('mesh')}")
    profile = get_profile(device or data.get("device") or "a100-80g", hardware_csv)
    recosted = recost(run, profile, hardware_csv=hardware_csv)
    return _checked(
        "torchtitan", LaunchExport(run, text, float(data["iteration_time_s"]), recosted)
    )


def evaluate_torchtitan(
    path: str,
    config: str = "planner_plan",
    device: str | MachineProfile = "a100-80g",
    dp: int | None = None,
    memory: float | None = None,
    hardware_csv: Path | str | None = DEFAULT_HARDWARE_CSV,
) -> tuple[Plan3D, LaunchRun]:
    """A torchtitan config_registry file costed as given (read by torchtitan's own config
    manager: needs torchtitan)."""
    run = read_torchtitan(path, config, dp)
    return recost(run, device, memory, hardware_csv), run


def _megatron_check(run: LaunchRun) -> None:
    """SettingsError naming what Megatron-LM cannot launch of ``run``."""
    if run.gpipe:
        raise SettingsError(
            "--plan: field 'pipeline.schedule': Megatron-LM has no GPipe schedule (plan with "
            "--schedule 1f1b or interleaved)"
        )
    megatron_args(run)


def _torchtitan_check(run: LaunchRun) -> None:
    """SettingsError naming what torchtitan cannot launch of ``run``."""
    check_expressible(run)
    flavor(run.model)


@dataclass(frozen=True, slots=True)
class Target:
    """An engine a plan launches on: ``check`` raises SettingsError for a configuration the engine
    cannot run as the plan costs it; ``export`` writes a plan JSON's configuration, re-costed;
    ``runs`` the training settings as the engine runs them (its kernels); ``recompute_ladder``
    the recompute modes it offers, least memory saved first."""

    name: str
    check: Callable[[LaunchRun], None]
    export: Callable[..., LaunchExport]
    runs: Callable[[TrainingSettings], TrainingSettings] = lambda settings: settings
    recompute_ladder: tuple[str, ...] = RECOMPUTE


def _torchtitan_runs(settings: TrainingSettings) -> TrainingSettings:
    """torchtitan's loss: its loss-parallel kernel (torchtitan/components/loss.py)."""
    return replace(settings, loss_kernel="loss-parallel")


def _megatron_runs(settings: TrainingSettings) -> TrainingSettings:
    """Megatron-LM's loss: megatron-core's vocabulary-parallel cross-entropy, which writes the
    gradient into its saved softmax (megatron/core/tensor_parallel/cross_entropy.py)."""
    return replace(settings, loss_kernel="fused")


TARGETS = {
    "megatron": Target("megatron", _megatron_check, export_megatron, _megatron_runs),
    # torchtitan's activation checkpointing: none, SelectiveAC (its operator policy) or FullAC
    "torchtitan": Target(
        "torchtitan",
        _torchtitan_check,
        export_torchtitan,
        _torchtitan_runs,
        ("none", "selective-op", "full"),
    ),
}


def target(name: str) -> Target:
    """The registered engine ``name`` (SettingsError naming the known ones)."""
    if name not in TARGETS:
        raise SettingsError(f"--for: unknown engine {name!r} (known: {', '.join(TARGETS)})")
    return TARGETS[name]


def plan_data(plan: Plan3D, model: str, seq: int | None) -> dict:
    """A 3D plan as the JSON an export reads (``source`` names the model's sequence length)."""
    data = plan.to_dict(timings=False)
    data["source"] = {"model": model, "seq": seq, "device": plan.device}
    return data


def admits(engine: Target, model: str, seq: int | None) -> Callable[[Plan3D], bool]:
    """Whether ``engine`` runs a plan of ``model`` as the plan costs it."""

    def runs(plan: Plan3D) -> bool:
        try:
            engine.check(launch_run(plan_data(plan, model, seq)))
        except SettingsError:
            return False
        return True

    return runs


def plan_for(engine: str, model: str, mesh=None, device="a100-80g", **options) -> Plan3D:
    """The whole-cluster search (``api3d.plan_pipeline`` over Megatron-LM's stage plans at every
    tensor degree of a node) restricted to the configurations ``engine`` runs as the plan costs
    them, so the answer exports. ``options``: those of ``plan_pipeline`` but ``intra`` and
    ``admits``. bf16 plans reduce gradients in fp32, as both engines do by default (Megatron-LM's
    main gradients, torchtitan's ``mixed_precision_reduce``)."""
    chosen = target(engine)
    for name in ("intra", "admits", "recompute_ladder"):
        if name in options:
            raise SettingsError(f"{name}: set by the engine's search (plan_for)")
    given = options.pop("settings", None) or TrainingSettings()
    settings = chosen.runs(given)
    if given.loss_kernel not in (TrainingSettings().loss_kernel, settings.loss_kernel):
        raise SettingsError(
            f"--loss-kernel: {engine} runs its own loss kernel ({settings.loss_kernel}), "
            f"got {given.loss_kernel!r}"
        )
    if settings.dtype == "bf16" and not settings.fp32_grads:
        settings = replace(settings, fp32_grads=True)
    found = api3d.plan_pipeline(
        model,
        mesh,
        device,
        settings=settings,
        intra="megatron-grid",
        admits=admits(chosen, str(model), options.get("seq")),
        recompute_ladder=chosen.recompute_ladder,
        **options,
    )
    said = (
        f"searched for {engine}: every candidate kept is one it runs as costed (export "
        f"--target {engine})"
    )
    return replace(found, notes=(*found.notes, said))
