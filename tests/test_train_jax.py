"""Plans that train on JAX: GPT-2 imported from a transformers config (2 layers, hidden 256, 4 heads,
cross-entropy loss) trains 5 SGD steps under planned shardings on 8 emulated devices, and every
step's loss matches the one-device run from the same weights within 1e-4 (float32)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("jax")

import planner  # noqa: E402

SPEC = "hf:gpt2:layers=2,hidden=256,heads=4,seq=64,vocab=512,batch=8"


@pytest.fixture(scope="module")
def graph():
    return planner.import_torch(SPEC, loss="cross_entropy")


def test_exact_plan_on_2x4_trains_like_one_device(graph):
    loaded = planner.plan_for_verification(graph, "2x4", "exact")
    assert sum(any(s) for s in loaded.strategies.values()) > len(loaded.strategies) // 2  # a sharded plan
    run = planner.train_on_jax(loaded.graph, loaded.strategies, loaded.mesh.names, loaded.mesh.shape, steps=5, lr=1e-4)
    assert run.devices == 8 and len(run.losses) == 5
    assert run.max_rel_diff < 1e-4
    assert run.losses[-1] < run.losses[0]  # it trains: the loss goes down
    total = run.xla_comparison(loaded.graph, loaded.strategies, loaded.mesh)[0]
    assert total.compiled > 0 and total.predicted > 0


@pytest.mark.slow
@pytest.mark.parametrize("mesh,method", [("4", "megatron"), ("8", "dp"), ("2x4", "sapp"), ("8", "exact")])
def test_other_plans_train_like_one_device(graph, mesh, method):
    loaded = planner.plan_for_verification(graph, mesh, method)
    run = planner.train_on_jax(loaded.graph, loaded.strategies, loaded.mesh.names, loaded.mesh.shape, steps=5, lr=1e-4)
    assert run.max_rel_diff < 1e-4


def test_seed_changes_the_initial_weights(graph):
    loaded = planner.plan_for_verification(graph, "4", "dp")
    first = [planner.train_on_jax(loaded.graph, loaded.strategies, loaded.mesh.names, loaded.mesh.shape, steps=1,
                                  seed=seed).losses[0] for seed in (0, 1)]
    assert first[0] != first[1]
