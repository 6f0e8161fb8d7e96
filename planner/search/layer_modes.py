"""Recompute and ZeRO chosen per layer (``--recompute auto`` / ``--zero auto``): the problem costed
with every layer in each (recompute mode, ZeRO stage) pair, for the Pareto master to choose one pair
per unit of segments (``planner.search.exact``)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Sequence

from planner.cost.recompute import attention_core
from planner.cost.problem import Problem, rebuilt
from planner.cost.settings import AUTO, RECOMPUTE, ZERO_STAGES
from planner.search.decompose import Segment
from planner.search.ties import conditioned
from planner.errors import SettingsError


@dataclass(frozen=True, slots=True)
class LayerOptions:
    """Under recompute and/or zero 'auto': the (recompute mode, ZeRO stage) pairs a layer may take,
    the problem costed with every layer in each pair but the first (the problem's own: no
    recompute, stage 0), and the units of consecutive segments that share a layer (one pair
    each)."""

    modes: tuple[tuple[str, int], ...] = (("none", 0),)
    variants: tuple[Problem, ...] = ()
    units: tuple[int, ...] = ()

    def describe(self) -> str:
        recompute = sorted({r for r, _ in self.modes}, key=RECOMPUTE.index)
        zero = sorted({z for _, z in self.modes})
        return "; chosen per layer: " + ", ".join(
            ([f"recompute among {'/'.join(recompute)}"] if len(recompute) > 1 else [])
            + ([f"ZeRO stage among {'/'.join(map(str, zero))}"] if len(zero) > 1 else [])
        )


def layer_options(
    problem: Problem, segments: Sequence[Segment], built: dict | None = None
) -> LayerOptions:
    """The variants for recompute / zero 'auto' (none otherwise); selective recompute only where
    there is an attention core to drop. ``built`` (mode -> problem) keeps the unconditioned
    variants across tied-layout conditions; it is filled in place."""
    settings, graph = problem.settings, problem.graph
    recompute = (
        ("none",) + (("selective",) if attention_core(graph) else ()) + ("full",)
        if settings.recompute == AUTO
        else ("none",)
    )
    zero = ZERO_STAGES if settings.zero == AUTO else (0,)
    if len(recompute) * len(zero) == 1:
        return LayerOptions()
    layers = sorted({op.layer for op in graph.operators if op.layer is not None})
    modes = tuple(itertools.product(recompute, zero))
    built = built if built is not None else {}
    for mode in modes[1:]:
        if mode not in built:
            built[mode] = rebuilt(problem, pinned_settings(settings, layers, mode))
    variants = tuple(built[mode] for mode in modes[1:])
    # a problem conditioned on tied layouts: its variants are conditioned alike
    if problem.conditions:
        variants = tuple(conditioned(v, dict(problem.conditions)) for v in variants)
    units, seen = [], set()
    for k, seg in enumerate(segments):
        own = {graph.operators[op].layer for op in seg.ops} - {None}
        units.append(units[-1] if k and own & seen else k)
        seen = own | seen if k and own & seen else own
    return LayerOptions(modes, variants, tuple(units))


def pinned_settings(settings, layers: Sequence[int], mode: tuple[str, int]):
    """The settings with every layer in ``mode`` (only the decided settings get per-layer
    values)."""
    recompute, zero = mode
    return replace(
        settings,
        layer_recompute=tuple((layer, recompute) for layer in layers)
        if settings.recompute == AUTO
        else (),
        layer_zero=tuple((layer, zero) for layer in layers) if settings.zero == AUTO else (),
    )


def least_memory(problem: Problem, options: LayerOptions) -> int:
    """A lower bound on any plan's memory: per operator, its least memory under any mode."""
    return sum(
        min(int(p.ops[i].memory.min()) for p in (problem, *options.variants))
        for i in range(len(problem.ops))
    )


def layer_modes(
    problem: Problem, segments: Sequence[Segment], chosen: Sequence[int], options: LayerOptions
) -> tuple[tuple[tuple[int, str], ...], tuple[tuple[int, int], ...]]:
    """The chosen (layer, recompute mode) and (layer, ZeRO stage) pairs, each only when decided."""
    if not options.variants:
        return (), ()
    modes = {
        problem.graph.operators[op].layer: options.modes[mode]
        for seg, mode in zip(segments, chosen)
        for op in seg.ops
        if problem.graph.operators[op].layer is not None
    }
    settings = problem.settings
    recompute = (
        tuple((layer, r) for layer, (r, _) in sorted(modes.items()))
        if settings.recompute == AUTO
        else ()
    )
    zero = (
        tuple((layer, z) for layer, (_, z) in sorted(modes.items()))
        if settings.zero == AUTO
        else ()
    )
    return recompute, zero


def auto_options(settings) -> list[str]:
    """The settings left to the search per layer (``recompute``, ``zero``: ``auto`` without
    per-layer values given: given ones, as Megatron-LM's block recompute, are fixed)."""
    given = {"recompute": settings.layer_recompute, "zero": settings.layer_zero}
    return [name for name in given if getattr(settings, name) == AUTO and not given[name]]


def refuse_auto_without_layers(problem: Problem) -> None:
    """``auto`` chooses per layer: refused on a graph whose operators belong to no layer."""
    if all(op.layer is None for op in problem.graph.operators):
        for option in auto_options(problem.settings):
            raise SettingsError(
                f"--{option} auto: chooses one mode per layer, and model {problem.graph.name} "
                f"has no layers (its operators name no 'layer'); give a fixed --{option}"
            )
