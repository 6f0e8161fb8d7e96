"""The lower bound behind a 3D plan's gap (``planner.pipeline.bound``): hand-computed on a linear
layer, below every configuration of the practitioner's grid and every searched plan on generated
cases, and a gap that says how far the plan can be from the optimum."""

import dataclasses

import pytest

from planner import api3d
from planner.cluster.profiles import get_profile
from planner.cost.settings import TrainingSettings
from planner.errors import InfeasibleError, SettingsError
from planner.grid3d import grid_points
from planner.ir.ops import GraphBuilder
from planner.pipeline.bound import compute_bound


def _linear(rows: int, k: int, n: int):
    gb = GraphBuilder("one_linear", batch_dim="r")
    x = gb.data("x", (rows, k))
    gb.op("linear", "mm", "rk,kn->rn", [x, gb.param("w", (k, n))])
    return gb.build()


def test_one_linear_by_hand_with_and_without_the_roofline():
    # a 4096 x 4096 x 4096 GEMM: forward 2 r k n FLOPs, backward twice that; on 8 devices
    rows = k = n = 4096
    flops = 2 * rows * k * n
    plain = dataclasses.replace(get_profile("a100-80g"), roofline=False)
    expected = flops * 3 / (plain.peak_flops * plain.efficiency) / 8
    assert compute_bound(_linear(rows, k, n), 8, plain, TrainingSettings()) == pytest.approx(
        expected, rel=1e-12
    )
    # the roofline: 32 x 32 tiles of 128 fill 1024 tiles on 108 SMs in 10 waves (q = 1024 / 1080),
    # K = 4096 a multiple of 64; the same shape for the two backward GEMMs; plus the launches
    a100 = get_profile("a100-80g")
    rate = a100.peak_flops * a100.gemm_efficiency * (1024 / 1080)
    launch = a100.kernel_launch_s
    by_hand = (flops / rate + launch + 2 * flops / rate + 2 * launch) / 8
    assert a100.sm_count == 108
    assert compute_bound(_linear(rows, k, n), 8, a100, TrainingSettings()) == pytest.approx(
        by_hand, rel=1e-12
    )


def test_the_bound_scales_with_the_devices_and_ignores_recompute_and_zero():
    graph = _linear(1024, 2048, 2048)
    profile = get_profile("h100-80g")
    one = compute_bound(graph, 1, profile, TrainingSettings())
    assert compute_bound(graph, 16, profile, TrainingSettings()) == pytest.approx(one / 16)
    heavy = TrainingSettings(recompute="full", zero=3, sequence_parallel=True)
    assert compute_bound(graph, 1, profile, heavy) == pytest.approx(one)


# (model spec, world, gpus per node, batch): small decoders on 4 to 16 devices
CASES = [
    ("gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024", 4, 4, 16),
    # compute-bound: the searched plan is within 3% of the bound, so a bound set too high fails
    ("gpt:layers=4,hidden=4096,heads=32,seq=2048,vocab=8192", 8, 8, 64),
    ("llama:layers=4,hidden=512,heads=8,kv_heads=2,ffn=1536,seq=256,vocab=2048", 16, 8, 32),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_no_grid_configuration_and_no_searched_plan_beats_the_bound(case):
    spec, world, node, batch = CASES[case]
    device = "h100-80g"
    plans = []
    for point in grid_points(world, node, 4, batch, micro_batches=(1, 2), zeros=(0, 3)):
        try:
            plans.append(
                api3d.evaluate_3d(
                    spec, device, tp=point.tp, pp=point.pp, dp=point.dp,
                    micro_batch=point.micro_batch, batch=batch, settings=point.settings,
                )
            )  # fmt: skip
        except (InfeasibleError, SettingsError):
            continue
    mesh = f"node={world // node},gpu={node}" if world > node else f"gpu={world}"
    plans.append(api3d.plan_pipeline(spec, mesh, device, batch=batch))
    assert len(plans) > 10
    bounds = {round(plan.lower_bound_s, 15) for plan in plans}
    assert len(bounds) == 1  # one bound for the model and the device count, whatever the plan
    for plan in plans:
        assert plan.pipeline.iteration_time_s >= plan.lower_bound_s * (1 - 1e-12), plan.layout
        assert plan.gap >= -1e-12
    if case == 1:
        assert plans[-1].gap < 0.03


def test_the_plan_file_and_the_report_carry_the_bound():
    from planner.cli.report import format_3d

    plan = api3d.plan_pipeline(CASES[0][0], "gpu=4", "a100-80g", batch=16)
    data = plan.to_dict(timings=False)
    assert data["lower_bound_s"] == plan.lower_bound_s > 0
    assert data["gap"] == pytest.approx(plan.pipeline.iteration_time_s / plan.lower_bound_s - 1)
    assert f"at most {plan.gap:.1%} from the optimum" in format_3d(plan)


def test_the_branch_bound_prunes_without_changing_the_plan():
    """A settings variant whose bound (its re-runs included, the least pipeline bubble) is not below
    the fastest plan so far is skipped: the same plan, fewer candidates costed (8 GiB: the plan runs
    no recompute; without the bound every degree also costs its recompute variants)."""
    from unittest import mock

    import planner.pipeline.threed as threed

    spec = "gpt:layers=8,hidden=2048,heads=16,seq=2048,vocab=8192"
    kw = dict(batch=64, memory=8 * 2**30)
    pruned = api3d.plan_pipeline(spec, "node=2,gpu=4", "a100-80g", **kw)
    with mock.patch.object(threed, "_branch_bound", lambda *args: None):
        full = api3d.plan_pipeline(spec, "node=2,gpu=4", "a100-80g", **kw)
    assert pruned.pipeline.iteration_time_s == full.pipeline.iteration_time_s
    assert pruned.layout == full.layout
    assert len(pruned.candidates) < len(full.candidates) / 2
    assert {c["recompute"] for c in full.candidates} > {c["recompute"] for c in pruned.candidates}
