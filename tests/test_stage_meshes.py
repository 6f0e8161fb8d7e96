"""The 3D search's stage meshes (planner/pipeline/stage_meshes.py): pipeline degrees over the outer
part of the mesh, tensor-parallel factorings of a node's GPUs priced on the node's link, the plans
they give re-costed from their JSON, and the caches the search shares between its candidates."""

from __future__ import annotations

import numpy as np
import pytest

from planner.api import resolve_model
from planner.api3d import evaluate_3d_file, plan_pipeline
from planner.cluster.mesh import parse_mesh
from planner.cluster.profiles import get_profile
from planner.cost.problem import build_problem, rebuilt
from planner.cost.settings import TrainingSettings
from planner.cost.strategy import enumerate_strategies
from planner.errors import SettingsError
from planner.pipeline.stage_meshes import (
    candidates,
    physical_stage_mesh,
    pipeline_degrees,
    stage_mesh,
)
from planner.search.baselines import is_strategy

A100 = get_profile("a100-80g")


def test_pipeline_degrees_are_whole_outer_axes_times_a_divisor_of_the_next():
    mesh = parse_mesh("node=4,gpu=8", A100)
    assert pipeline_degrees(mesh) == [1, 2, 4, 8, 16, 32]
    assert pipeline_degrees(parse_mesh("node=6,gpu=2", A100)) == [1, 2, 3, 6, 12]
    # 8 stages: the node axis and 2 of each node's GPUs; the stage keeps the NVLink of gpu
    eight = physical_stage_mesh(mesh, 8)
    assert eight.spec == "gpu=4" and eight.axes[0].bandwidth == A100.intra_node_bandwidth
    assert physical_stage_mesh(mesh, 2).spec == "node=2,gpu=8"
    with pytest.raises(SettingsError, match="--pp: 3 stages are not an outer part"):
        physical_stage_mesh(mesh, 3)


def test_tensor_factorings_of_the_innermost_axis_keep_its_link():
    mesh = parse_mesh("node=4,gpu=8", A100)
    found = candidates(mesh, 2)
    assert [(c.mesh.spec, c.plan, c.tensor_axis) for c in found] == [
        ("node=2,gpu=8", "search", None),
        ("node=2,gpu=8", "dp", None),
        ("node=2,gpu=4,tp=2", "megatron", 2),
        ("node=2,gpu=2,tp=4", "megatron", 2),
        ("node=2,gpu=8", "megatron", 1),
    ]
    split = found[2].mesh
    assert split.axes[0].bandwidth == A100.inter_node_bandwidth
    assert {a.bandwidth for a in split.axes[1:]} == {A100.intra_node_bandwidth}
    assert [c.mesh.spec for c in candidates(mesh, 2, tensor=False)] == ["node=2,gpu=8"]
    assert stage_mesh(mesh, 2, "node=2,gpu=2,tp=4") == found[3].mesh
    with pytest.raises(SettingsError, match="field 'pipeline.stage_mesh'"):
        stage_mesh(mesh, 2, "node=2,gpu=8,tp=2")


@pytest.mark.parametrize("spec", ["8", "2x4", "node=2,gpu=2,tp=2"])
def test_is_strategy_agrees_with_the_enumeration(spec):
    graph = resolve_model("gpt:layers=1,hidden=64,heads=4,seq=32,vocab=96", 6, None)
    mesh = parse_mesh(spec, A100)
    dims = [None, "b", "s", "h", "a", "f", "v", "x"]
    for op in graph.operators:
        listed = set(enumerate_strategies(op, mesh))
        for strategy in np.array(np.meshgrid(*[range(len(dims))] * len(mesh.axes))).T.reshape(
            -1, len(mesh.axes)
        ):
            candidate = tuple(dims[k] for k in strategy)
            assert is_strategy(op, candidate, mesh) == (candidate in listed), (op.name, candidate)


def test_a_rebuilt_problem_shares_the_edges_and_equals_a_fresh_build():
    graph = resolve_model("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=96", 8, None)
    mesh = parse_mesh("2x4", A100)
    first = build_problem(graph, mesh, A100, TrainingSettings())
    other = TrainingSettings(recompute="full", zero=3, sequence_parallel=True)
    again, fresh = rebuilt(first, other), build_problem(graph, mesh, A100, other)
    assert again.edge_matrices is first.edge_matrices and len(first.edge_matrices) > 0
    assert len(again.edges) == len(fresh.edges)
    for a, b in zip(again.edges, fresh.edges):
        assert (a.tensor, a.src_layouts, a.dst_layouts) == (b.tensor, b.src_layouts, b.dst_layouts)
        assert np.array_equal(a.cost, b.cost)
    assert all(np.array_equal(a.cost, b.cost) for a, b in zip(again.ops, fresh.ops))


def test_a_tensor_parallel_stage_mesh_wins_where_memory_binds_and_recosts_from_its_json():
    """8 layers (hidden 1024) on two nodes of 8 GPUs at 250 MB: tensor parallelism 2 beside data
    parallelism 4 in each node (Megatron-LM's stage plan with SP) beats every plan of the search's
    own stage planner and plain data parallelism; evaluate --plan gives its time back."""
    model = "gpt:layers=8,hidden=1024,heads=16,seq=512,vocab=2048"
    plan = plan_pipeline(model, "node=2,gpu=8", "a100-80g", batch=16, memory=250e6, degrees=[1])
    assert plan.stage_mesh == "node=2,gpu=4,tp=2" and plan.intra_method == "megatron"
    others = [
        r["iteration_time_s"]
        for r in plan.candidates
        if r["fits_memory"] and r["stage_plan"] != "megatron"
    ]
    assert others and plan.pipeline.iteration_time_s < min(others)
    again = evaluate_3d_file(
        plan.to_dict(), model, "a100-80g", batch=16, settings=plan.settings, memory=250e6
    )
    assert again.stage_mesh == plan.stage_mesh
    assert again.pipeline.iteration_time_s == pytest.approx(plan.pipeline.iteration_time_s, 1e-12)
    assert again.stage_memory_bytes == pytest.approx(plan.stage_memory_bytes, rel=1e-12)
