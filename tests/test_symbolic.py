"""The symbolic profile is SMSG's premise: per-device computation and communication volumes in one
unit (a byte moved = 1 ns = SYMBOLIC_FLOPS_PER_BYTE FLOPs computed), every byte charged; so the
exact plan shards wherever sharding lowers the per-device volume."""

from __future__ import annotations

import pytest

from planner import api
from planner.cluster.profiles import SYMBOLIC, SYMBOLIC_FLOPS_PER_BYTE


def test_a_replicated_plan_costs_its_flops_in_the_one_unit():
    """Replicated on 8 devices, nothing moves: the objective is every operator's forward and
    backward FLOPs over 1,000 (one unit, 1 ns, per 1,000 FLOPs), by hand."""
    graph = api.resolve_model("mlp", 8, None)
    replicated = api.evaluate(
        "mlp", "8", "symbolic", assignment={op.name: {} for op in graph.operators}, batch=8
    )
    flops = sum(op.flops * (1 + op.backward_factor) for op in graph.operators)
    assert replicated.comm_s == 0
    assert replicated.objective == pytest.approx(
        flops / SYMBOLIC_FLOPS_PER_BYTE, abs=len(graph.operators)
    )
    assert api.plan("mlp", "8", "symbolic", batch=8).objective < replicated.objective


def test_the_exact_symbolic_plan_shards_every_heavy_operator():
    """GPT-2 small on 8 devices: every operator is split (it replicated them all when computation
    was ignored), and no communication hides behind compute."""
    plan = api.plan("gpt2-small", "8", "symbolic")
    assert all(any(d is not None for _, d in op.strategy) for op in plan.operators)
    assert plan.hidden_s == 0 and SYMBOLIC.overlap_weight == 0
