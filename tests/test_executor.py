"""The IR interpreter (numpy = JAX), the numpy executor on virtual devices, and plan export."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.api import make_cluster
from planner.engines.executor import check_plan, redistribute, scatter
from planner.engines.export import export_plan, placements_of, spec_of
from planner.engines.interpret import random_feeds, run_graph
from planner.cost.strategy import PARTIAL, REPLICATE, enumerate_strategies
from planner.zoo import load_model
from planner.zoo.transformers import mlp, transformer_block
from planner.zoo.vision import resnet

SMALL = {
    "mlp": lambda: mlp(batch=8, hidden=8),
    "block": lambda: transformer_block(batch=2, seq=8, hidden=16, heads=4),
    "gpt": lambda: load_model("gpt:layers=1,hidden=16,heads=4,seq=8,vocab=32", batch=4),
    "moe": lambda: load_model(
        "moe-gpt:layers=2,hidden=16,heads=4,seq=8,vocab=32,experts=4", batch=4
    ),
}


@pytest.mark.slow  # 12-26 s on 2 cores: the default run keeps a faster test of the same path
def test_interpreter_numpy_matches_jax():
    jnp = pytest.importorskip("jax.numpy")
    import jax

    jax.config.update("jax_enable_x64", True)
    for build in list(SMALL.values()) + [lambda: resnet((1, 1, 1, 1), 2, name="r")]:
        graph = build()
        feeds = random_feeds(graph)
        a = run_graph(graph, feeds, np)
        b = run_graph(graph, {k: jnp.asarray(v) for k, v in feeds.items()}, jnp)
        loss = graph.operators[-1].outputs[0].tensor
        assert np.allclose(a[loss], np.asarray(b[loss]), rtol=1e-9), graph.name


def test_interpreter_hand_computed_mlp():
    graph = mlp(batch=2, hidden=2, ffn=2)
    feeds = {
        "x": np.array([[1.0, 3.0], [2.0, -2.0]]),
        "fc1.weight": np.eye(2),
        "fc2.weight": np.eye(2) * 2,
        "ln.weight": np.ones(2),
        "ln.bias": np.zeros(2),
    }
    out = run_graph(graph, feeds, np)
    normed = np.array([[-1.0, 1.0], [1.0, -1.0]]) / np.sqrt(1 + 1e-5)  # layer norm without scale
    gelu = 0.5 * normed * (1 + np.tanh(0.7978845608028654 * (normed + 0.044715 * normed**3)))
    assert np.allclose(out["loss"], (normed + 2 * gelu).sum())


def test_redistribution_collectives_by_hand():
    mesh_shape = (2, 2)
    value = np.arange(16.0).reshape(4, 4)
    t = scatter(value, (0, 1), mesh_shape)  # rows on axis 0, columns on axis 1
    assert t.local[(1, 0)].tolist() == value[2:, :2].tolist()
    whole = redistribute(t, (REPLICATE, REPLICATE), mesh_shape)
    assert all(np.array_equal(v, value) for v in whole.local.values())
    both = redistribute(scatter(value, (REPLICATE, REPLICATE), mesh_shape), (0, 0), mesh_shape)
    assert both.local[(0, 1)].tolist() == value[1:2].tolist()  # axis 0 major: block 0*2+1
    swapped = redistribute(t, (1, 0), mesh_shape)  # all-to-all on both axes
    assert swapped.local[(1, 0)].tolist() == value[:2, 2:].tolist()
    partial = t.__class__(
        {c: v * 0 + 1 for c, v in whole.local.items()}, (PARTIAL, REPLICATE), value.shape
    )
    reduced = redistribute(partial, (0, REPLICATE), mesh_shape)  # reduce-scatter
    assert reduced.local[(0, 0)].tolist() == (2 * np.ones((2, 4))).tolist()


@pytest.mark.parametrize("name", sorted(SMALL))
@pytest.mark.parametrize("mesh", ["4", "2x2"])
@settings(max_examples=8, deadline=None, derandomize=True)
@given(data=st.data())
def test_random_plans_execute_exactly(name, mesh, data):
    """Any valid strategy per operator, run on virtual devices, equals the unsharded forward."""
    graph = SMALL[name]()
    cluster = make_cluster(mesh, "symbolic")
    strategies = {
        op.name: data.draw(st.sampled_from(enumerate_strategies(op, cluster.mesh)))
        for op in graph.operators
    }
    errors = check_plan(graph, strategies, cluster.mesh)
    assert max(errors.values()) < 1e-10


def test_export_specs_and_placements():
    graph = mlp(batch=8, hidden=8)
    cluster = make_cluster("2x4", "symbolic")
    strategies = {op.name: ("b", None) for op in graph.operators}
    strategies.update({"fc1": ("b", "f"), "gelu": ("b", "f"), "fc2": ("b", "f")})
    exported = export_plan(graph, strategies, cluster.mesh)
    specs = exported.partition_specs(graph)
    assert (
        specs["fc1.weight"] == (None, "gpu")
        and specs["fc2.weight"] == ("gpu", None)
        and specs["x"] == ("node", None)
    )
    assert exported.dtensor_placements(graph)["fc1.weight"] == ("Replicate()", "Shard(1)")
    assert spec_of((PARTIAL, 0), 2, ("node", "gpu")) is None
    assert spec_of((0, 0), 2, ("node", "gpu")) == (("node", "gpu"), None)
    assert placements_of((PARTIAL, REPLICATE, 1)) == ("Partial()", "Replicate()", "Shard(1)")
