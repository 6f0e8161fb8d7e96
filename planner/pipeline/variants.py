"""What a 3D search tries beside the degrees and counts (``check_choices`` checks the pinned ones):
the settings it plans each pipeline degree under, every combination of sequence
parallelism, recompute and ZeRO stage at least the given ones, least recompute first. The search
skips more recompute only where the same sequence parallelism and ZeRO stage fit with the memory
limit not binding (when it binds, more recompute can be faster: fewer micro-batches fit). ZeRO
stages are not ordered in time (ZeRO-1's optimizer step is 1/d as heavy as none's; ZeRO-2 shards
the tied copy's gradient that ZeRO-1 all-reduces whole between stages; ZeRO-3's gathers hide
behind the passes' compute where the all-gather after the step cannot)."""

from __future__ import annotations

from dataclasses import replace

from planner.cluster.mesh import Mesh
from planner.cost.settings import RECOMPUTE, RECOMPUTE_MODES, TrainingSettings
from planner.errors import SettingsError


def variants(
    settings: TrainingSettings, stage: Mesh, ladder: tuple[str, ...] = RECOMPUTE
) -> list[TrainingSettings]:
    """The settings a stage may run under, the given ones first: every combination of sequence
    parallelism (when the stage mesh can split operators), a recompute mode of ``ladder`` that
    saves at least the given one's memory (``RECOMPUTE_MODES`` order; the given one first) and a
    ZeRO stage at least the given one (ZeRO-1 to 3, 3 being FSDP), as practitioners combine them;
    the search keeps the fastest that fits (a cheaper-looking one may not fit, and ZeRO-1 can be
    faster than none: its optimizer step is 1/d as heavy). An engine climbs its own ladder
    (torchtitan's has its operator policy in place of Megatron-LM's selective recompute)."""
    parallel = [settings.sequence_parallel]
    if not settings.sequence_parallel and stage.num_devices > 1:
        parallel.append(True)
    order = RECOMPUTE_MODES.index
    recomputes = [settings.recompute]
    if settings.recompute in RECOMPUTE_MODES:  # not given per layer
        recomputes += [r for r in ladder if order(r) > order(settings.recompute)]
    zeros = range(settings.zero, 4)
    return [
        replace(settings, sequence_parallel=sp, recompute=r, zero=z)
        for r in recomputes
        for z in zeros
        for sp in parallel
    ]


def check_choices(
    degrees, counts, known: list[int], layers: int, batch: int, cuts, chunks: int = 1
) -> None:
    """The pinned pipeline degrees, micro-batch counts and cuts against the mesh (``known``: its
    pipeline degrees), the layers and the batch (one line naming the option when they do not fit
    together)."""
    for p in degrees:
        if p not in known or p > layers:
            raise SettingsError(
                f"--pp: {p} stages must be an outer part of the mesh (whole outer axes times a "
                f"divisor of the next: {', '.join(map(str, known))}) and at most the number of "
                f"layers ({layers})"
            )
        if p * chunks > layers:
            raise SettingsError(
                f"--schedule: interleaved:{chunks} on {p} stages needs at least {chunks} layers "
                f"per stage ({p * chunks} > {layers} layers); choose a smaller v or fewer stages"
            )
    if not degrees:
        raise SettingsError(
            f"--schedule: interleaved:{chunks} leaves no pipeline degree: it needs at least "
            f"{chunks} layers per stage ({layers} layers)"
        )
    for count in counts or ():
        if batch % count:
            raise SettingsError(f"--num-microbatches: {count} does not divide the batch {batch}")
    if cuts is not None and len(degrees) != 1:
        raise SettingsError("--cuts: fixed cuts need one pipeline degree (--pp)")
