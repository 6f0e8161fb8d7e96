"""Pinned operators (``plan(..., fixed={op: strategy})``, ``planner.search.restrict``): the exact
search on the restricted problem equals brute force on the whole problem with every other strategy
of the pinned operator priced out (an independent construction: no edge is re-indexed there)."""

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, seed
from hypothesis import strategies as st

import planner
from planner.cost.problem import build_problem
from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.search.brute import brute_force
from planner.search.exact import solve_exact
from planner.search.restrict import pinned
from strategies_gen import graphs, meshes, profiles

MAX_COMBINATIONS = 500_000


def _priced_out(problem, op: int, keep: int):
    """Every strategy of ``op`` but ``keep`` costs more than any whole plan."""
    table = problem.ops[op]
    big = (
        int(
            table.cost.max()
            + sum(t.cost.max() for t in problem.ops)
            + sum(e.cost.max() for e in problem.edges)
        )
        + 1
    )
    penalty = np.full(len(table.strategies), big, dtype=table.cost.dtype)
    penalty[keep] = 0
    ops = list(problem.ops)
    ops[op] = replace(table, cost=table.cost + penalty)
    return replace(problem, ops=tuple(ops), _producer_index={})


@seed(20261203)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(graph=graphs(max_ops=6), mesh=meshes(max_axes=2), profile=profiles(), data=st.data())
def test_a_pinned_optimum_equals_brute_force(graph, mesh, profile, data):
    problem = build_problem(graph, mesh, profile, TrainingSettings())
    assume(
        not problem.ties
        and np.prod([len(t.strategies) for t in problem.ops], dtype=np.float64) <= MAX_COMBINATIONS
    )
    free, free_choice = brute_force(problem)
    op = data.draw(
        st.sampled_from([i for i, t in enumerate(problem.ops) if len(t.strategies) > 1] or [None])
    )
    assume(op is not None)
    keep = data.draw(
        st.sampled_from([s for s in range(len(problem.ops[op].strategies)) if s != free_choice[op]])
    )
    expected, choice = brute_force(_priced_out(problem, op, keep))
    assert choice[op] == keep
    axes = problem.mesh.names
    name, strategy = problem.ops[op].op.name, problem.ops[op].strategies[keep]
    held = pinned(problem, {name: dict(zip(axes, strategy))})
    result, _ = solve_exact(held, math.inf, 30.0)
    assert result.status == "OPTIMAL" and result.objective == expected >= free
    assert held.ops[op].strategies[result.choice[op]] == strategy


def test_a_pin_moves_the_plan_and_keeps_the_rest_optimal():
    """gpt2-small on 2x4: the embedding the free optimum shards, pinned to replicate, costs more,
    and pinning it to its optimal strategy gives the free optimum back."""
    free = planner.plan("gpt2-small", mesh="2x4")
    strategy = free.strategy_of("embed")
    assert any(dim is not None for dim in strategy.values())  # the free optimum shards it
    held = planner.plan("gpt2-small", mesh="2x4", fixed={"embed": {}})
    assert held.status == "OPTIMAL" and held.strategy_of("embed") == {"node": None, "gpu": None}
    assert held.objective > free.objective
    again = planner.plan("gpt2-small", mesh="2x4", fixed={"embed": strategy})
    assert again.objective == free.objective and again.strategy_of("embed") == strategy


@pytest.mark.parametrize(
    "fixed,method,settings,message",
    [
        ({"nope": {}}, "exact", None, "fixed: the model has no operator 'nope'"),
        (
            {"embed": {"rack": "v"}},
            "exact",
            None,
            "fixed: operator 'embed': the strategy must map mesh axes",
        ),
        ({"embed": {"gpu": "nonsense"}}, "exact", None, "is not one of its"),
        ({"embed": {}}, "dp", None, "fixed: only the exact methods"),
        (
            {"embed": {}},
            "exact",
            TrainingSettings(recompute="auto"),
            "fixed: pinned operators with recompute",
        ),
    ],
)
def test_a_bad_pin_names_the_parameter(fixed, method, settings, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace("'", "'")):
        planner.plan("gpt2-small", mesh="2x4", method=method, settings=settings, fixed=fixed)
