"""One way to cost a plan: every caller (plan report, problem record, pipeline layer chains,
verification prediction) sums the same terms from ``planner.cost.terms.plan_terms``."""

import dataclasses
import math

import pytest

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from planner.cost.collectives import bytes_sent, collective_seconds
from planner.cost.records import breakdown, sum_records
from planner.cost.settings import TrainingSettings
from planner.ir.graph import Graph
from planner.pipeline.schedule import point_to_point_seconds
from planner.pipeline.layer_costs import cost_layers
from planner.plans import integer_objective, make_plan
from planner.cost.problem import build_problem
from planner.engines.predicted import predicted_collectives
from strategies_gen import graphs, meshes, profiles


def _layered(graph: Graph, per_layer: int) -> Graph:
    ops = tuple(
        dataclasses.replace(op, layer=i // per_layer) for i, op in enumerate(graph.operators)
    )
    return Graph(graph.name, graph.tensors, ops)


@seed(20261130)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    graph=graphs(),
    mesh=meshes(max_axes=2),
    profile=profiles(),
    zero=st.sampled_from((0, 1, 3)),
    per_layer=st.integers(1, 3),
    data=st.data(),
)
def test_every_caller_costs_a_plan_the_same(graph, mesh, profile, zero, per_layer, data):
    graph = _layered(graph, per_layer)
    settings_ = TrainingSettings(dtype="fp32", optimizer="sgd", zero=zero)
    problem = build_problem(graph, mesh, profile, settings_)
    choice = [data.draw(st.integers(0, len(t.strategies) - 1)) for t in problem.ops]
    strategies = [t.strategies[c] for t, c in zip(problem.ops, choice)]
    objective, record = integer_objective(problem, strategies)
    assert objective == problem.objective(choice)  # the integer tables of the search
    whole = problem.record(choice)
    assert whole == record
    plan = make_plan(problem, strategies, method="test", status="GIVEN")
    assert plan.objective == objective
    assert math.isclose(plan.memory_per_device_bytes, record.memory.total, rel_tol=1e-12)
    # pipeline layer chains: per-layer sums add up to the whole plan
    layers = cost_layers(
        graph, mesh, profile, settings_, {t.op.name: s for t, s in zip(problem.ops, strategies)}
    )
    total = breakdown(record, mesh, profile).total_s
    assert math.isclose(
        float(np.sum(layers["time"]) + np.sum(layers["sync"])), total, rel_tol=1e-9, abs_tol=1e-15
    )
    assert math.isclose(
        float(np.sum(layers["activation_memory"]) + np.sum(layers["static_memory"])),
        record.memory.total,
        rel_tol=1e-9,
        abs_tol=1e-9,
    )
    # verification (float32, SGD, no ZeRO): the predicted collectives are the record's
    if zero:
        problem = build_problem(graph, mesh, profile, dataclasses.replace(settings_, zero=0))
        record = integer_objective(problem, strategies)[1]
    predicted = predicted_collectives(
        graph, {t.op.name: s for t, s in zip(problem.ops, strategies)}, mesh
    )
    assert math.isclose(
        sum(n for *_, n in predicted), sum(c.nbytes for c in record.comm), rel_tol=1e-12
    )


def test_collective_formula_by_hand():
    # 1 MB all-reduce on 4 devices at 1 GB/s, 1 us per step: 2*3 steps + 2*3/4 MB
    assert math.isclose(collective_seconds("all_reduce", 4, 1e9, 1e-6, 1e6), 6e-6 + 1.5e-3)
    assert math.isclose(collective_seconds("all_gather", 4, 1e9, 1e-6, 1e6), 3e-6 + 0.75e-3)
    assert math.isclose(point_to_point_seconds(1e6, 1e9, 1e-6), 1e-6 + 1e-3)  # a pipeline send
    with pytest.raises(ValueError, match="unknown collective kind 'p2p'"):
        collective_seconds("p2p", 2, 1e9, 1e-6, 1e6)
    assert bytes_sent("all_reduce", 8, 800.0) == 1400.0
    assert bytes_sent("reduce_scatter", 1, 800.0) == 0.0
    assert sum_records([]).comm == ()


@pytest.mark.parametrize("changed", [None, 2])
def test_layer_sums_walk_identical_layers_once_and_equal_the_plan_terms(changed):
    """``layer_sums`` sums each distinct layer once: its per-layer sums equal those of the whole
    walk (``plan_terms``) exactly, on a model of identical layers under a data-parallel plan and
    under one where a single operator of layer ``changed`` takes another strategy (that layer must
    not be taken for its neighbours)."""
    from planner.api import resolve_model
    from planner.cluster.mesh import parse_mesh
    from planner.cluster.profiles import load_profiles
    from planner.cost.terms import layer_sums, plan_terms
    from planner.pipeline.layer_costs import layer_of
    from planner.search.baselines import data_parallel

    profile = load_profiles()["a100-80g"]
    graph = resolve_model("gpt:layers=4,hidden=256,heads=4,seq=64,vocab=512", batch=8)
    mesh = parse_mesh("2x2", profile)
    settings_ = TrainingSettings(zero=1)
    problem = build_problem(graph, mesh, profile, settings_)
    strategies = list(data_parallel(problem))
    if changed is not None:
        i = next(
            i for i, t in enumerate(problem.ops) if t.op.layer == changed and len(t.strategies) > 1
        )
        strategies[i] = next(s for s in problem.ops[i].strategies if s != strategies[i])
    layer = layer_of(graph)
    n = max(layer) + 1
    op_records, sums = layer_sums(graph, mesh, profile, settings_, strategies, layer, n)
    terms = plan_terms(graph, mesh, profile, settings_, strategies)
    assert list(op_records) == list(terms.ops)
    per_layer = [[] for _ in range(n)]
    for i, record in enumerate(terms.ops):
        per_layer[layer[i]].append(record)
    for src, dst, slot, record in terms.edges:
        per_layer[layer[dst]].append(record)
    expected = [sum_records(records) for records in per_layer]
    assert sums == expected
    middle = sums[1:-1]  # the first and last layers hold the embedding and the head
    assert (len({id(s) for s in middle}) == 1) == (changed is None)


def test_operand_facts_read_only_the_settings_they_are_keyed_by():
    """``operand_infos`` is shared by settings equal in ``infos_settings`` (a 3D search's
    sequence-parallel and overlap variants): the facts built under settings that differ elsewhere
    are equal, and differ where a keyed field does."""
    from planner.api import resolve_model
    from planner.cost.operands import _operand_infos, infos_settings

    graph = resolve_model("gpt:layers=2,hidden=128,heads=4,seq=32,vocab=256", batch=4)
    base = TrainingSettings(recompute="selective", zero=2)
    others = dataclasses.replace(
        base, sequence_parallel=True, overlap="grad", fp32_grads=True, bucket_bytes=0.0
    )
    assert infos_settings(base) == infos_settings(others)
    assert _operand_infos(graph, base) == _operand_infos(graph, others)
    for field, value in (("recompute", "full"), ("zero", 0), ("dtype", "fp32")):
        changed = dataclasses.replace(base, **{field: value})
        assert infos_settings(changed) != infos_settings(base)
        assert _operand_infos(graph, changed) != _operand_infos(graph, base)
