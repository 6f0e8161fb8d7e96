"""The 3D search's settings menu: every combination of sequence parallelism, recompute and ZeRO
stage (at least the given ones) per pipeline degree, the fastest that fits kept
(planner/pipeline/variants.py)."""

from __future__ import annotations

import math

import pytest

from planner.api3d import plan_pipeline
from planner.cluster.mesh import parse_mesh
from planner.cluster.profiles import get_profile
from planner.cost.settings import RECOMPUTE, TrainingSettings
from planner.errors import InfeasibleError
from planner.pipeline.variants import variants

MODEL = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024"
MESH = "node=2,gpu=2"


def _pinned(settings: TrainingSettings, degree: int, memory: float) -> float:
    """The iteration time of one variant at one degree (inf when it does not fit)."""
    try:
        plan = plan_pipeline(
            MODEL,
            MESH,
            "a100-80g",
            batch=16,
            memory=memory,
            settings=settings,
            degrees=[degree],
            escalate=False,
        )
    except InfeasibleError:
        return math.inf
    return plan.pipeline.iteration_time_s


def test_the_menu_holds_every_combination_at_least_the_given_settings():
    stage = parse_mesh("4", get_profile("a100-80g"))
    menu = variants(TrainingSettings(), stage)
    assert len(menu) == 2 * 3 * 4 and len(set(menu)) == 24
    assert menu[0] == TrainingSettings()
    given = TrainingSettings(recompute="selective", zero=2, sequence_parallel=True)
    narrower = variants(given, stage)
    assert {(v.recompute, v.zero) for v in narrower} == {
        (r, z) for r in ("selective", "full") for z in (2, 3)
    }
    assert all(v.sequence_parallel for v in narrower)
    single = parse_mesh("1", get_profile("a100-80g"))
    assert not any(v.sequence_parallel for v in variants(TrainingSettings(), single))


def test_an_engine_climbs_its_own_recompute_ladder():
    """torchtitan's ladder holds its operator policy in place of Megatron-LM's selective
    recompute; a given mode off the ladder is tried first, then the modes that save more."""
    stage = parse_mesh("1", get_profile("a100-80g"))
    torchtitan = ("none", "selective-op", "full")

    def modes(recompute, ladder=RECOMPUTE):
        given = TrainingSettings(recompute=recompute, zero=3)
        return [v.recompute for v in variants(given, stage, ladder)]

    assert modes("none", torchtitan) == ["none", "selective-op", "full"]
    assert modes("selective", torchtitan) == ["selective", "selective-op", "full"]
    assert modes("selective-op") == ["selective-op", "full"]
    assert modes("none") == ["none", "selective", "full"]


# memory limits: none binding, then tight enough that recompute or ZeRO must help
@pytest.mark.parametrize("memory", [math.inf, 45e6, 30e6])
def test_auto_is_the_fastest_fitting_variant_at_any_degree(memory):
    """`plan --pipeline auto` equals the minimum, over degrees and every variant of the menu, of
    the pinned searches' fitting iteration times. With the limit at 45 MB full recompute beats no
    recompute at degree 1 (its activations fit in fewer micro-batches), so no variant may be
    skipped because a cheaper-looking one fits."""
    stage_meshes = {1: "4", 2: "2"}
    times = {
        (degree, v): _pinned(v, degree, memory)
        for degree, stage in stage_meshes.items()
        for v in variants(TrainingSettings(), parse_mesh(stage, get_profile("a100-80g")))
    }
    if memory == 45e6:
        assert times[(1, TrainingSettings(recompute="full"))] < times[(1, TrainingSettings())]
    best = min(times.values())
    assert math.isfinite(best)
    auto = plan_pipeline(MODEL, MESH, "a100-80g", batch=16, memory=memory, degrees=[1, 2])
    assert auto.pipeline.iteration_time_s == pytest.approx(best, rel=1e-12)


LLAMA = "llama:layers=4,hidden=256,heads=4,kv_heads=2,ffn=512,seq=128,vocab=1024"


def test_selective_recompute_is_not_tried_again_where_it_costs_as_none():
    """A model with fused attention has no attention core: selective recompute re-runs nothing,
    so its layer chain is the one of no recompute, value for value; the 3D search tries it only
    when it is the given setting, and the plan is the same either way."""
    from planner.api import resolve_model
    from planner.cost.recompute import attention_core
    from planner.pipeline.layer_costs import cost_layers
    from planner.search.baselines import data_parallel
    from planner.cost.problem import build_problem

    graph = resolve_model(LLAMA, batch=4)
    assert not attention_core(graph)
    profile = get_profile("a100-80g")
    mesh = parse_mesh("2x2", profile)
    plain, selective = TrainingSettings(zero=1), TrainingSettings(zero=1, recompute="selective")
    problem = build_problem(graph, mesh, profile, plain)
    strategies = {t.op.name: s for t, s in zip(problem.ops, data_parallel(problem))}
    a = cost_layers(graph, mesh, profile, plain, strategies)
    b = cost_layers(graph, mesh, profile, selective, strategies)
    for key in ("time", "sync", "activation_memory", "static_memory", "working_memory"):
        assert (a[key] == b[key]).all(), key

    def search(settings):
        return plan_pipeline(
            LLAMA, MESH, "a100-80g", batch=16, memory=0.03 * 2**30, settings=settings
        )

    default, given = search(TrainingSettings()), search(TrainingSettings(recompute="selective"))
    assert "selective" not in {row["recompute"] for row in default.candidates}
    assert "selective" in {row["recompute"] for row in given.candidates}
    assert default.pipeline.iteration_time_s == given.pipeline.iteration_time_s


def test_data_parallel_stage_plans_run_without_sequence_parallelism():
    """Sequence parallelism splits what tensor parallelism leaves replicated: beside data
    parallelism alone it is off (Megatron-LM's validate_args turns it off at tp 1), so the
    data-parallel stage plans are tried without it, and with it only when it is given."""

    def rows(settings):
        plan = plan_pipeline(
            MODEL, MESH, "a100-80g", batch=16, memory=0.05 * 2**30, settings=settings
        )
        return [row for row in plan.candidates if row["stage_plan"] == "dp"]

    default, given = rows(TrainingSettings()), rows(TrainingSettings(sequence_parallel=True))
    assert default and not any(row["sequence_parallel"] for row in default)
    assert given and all(row["sequence_parallel"] for row in given)
