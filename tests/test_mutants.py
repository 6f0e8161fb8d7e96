"""The random exactness suites can fail: a planner that never shards and one that ignores the
memory limit are run through them (same generators, same checks) and each must be caught."""

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from planner.search.exact import solve_exact
from planner.search.solver import solve
from strategies_gen import graphs, meshes, profiles
from test_decompose import chain_graphs, check_chain
from test_solver import check_solver, check_solver_under_memory
from test_ties import check_tied_chain, tied_chains

# find one failing example quickly: no shrinking, no example database
HUNT = settings(
    max_examples=40,
    deadline=None,
    database=None,
    phases=(Phase.generate,),
    suppress_health_check=list(HealthCheck),
)


def _replicated(problem):
    return tuple(
        next(i for i, s in enumerate(t.strategies) if all(d is None for d in s))
        for t in problem.ops
    )


def never_shards_exact(problem, *args, **kwargs):
    """solve_exact's result with every operator replicated (claimed OPTIMAL)."""
    result, notes = solve_exact(problem, *args, **kwargs)
    choice = _replicated(problem)
    return replace(result, choice=choice, objective=problem.objective(choice)), notes


def never_shards(problem, *args, **kwargs):
    result = solve(problem, *args, **kwargs)
    choice = _replicated(problem)
    return replace(result, choice=choice, objective=problem.objective(choice))


def ignores_memory(problem, memory_limit=None, **kwargs):
    return solve(problem, math.inf, **kwargs)


def _caught(check, **strategies) -> None:
    @HUNT
    @given(**strategies)
    def run(**drawn):
        check(**drawn)

    with pytest.raises(AssertionError):
        run()


def test_a_planner_that_never_shards_fails_the_random_chains():
    _caught(
        lambda graph, two_axes: check_chain(graph, two_axes, exact=never_shards_exact),
        graph=chain_graphs(),
        two_axes=st.booleans(),
    )


def test_a_planner_that_never_shards_fails_the_tied_chains():
    _caught(
        lambda graph, two_axes, slow_second: check_tied_chain(
            graph, two_axes, slow_second, exact=never_shards_exact
        ),
        graph=tied_chains(),
        two_axes=st.booleans(),
        slow_second=st.booleans(),
    )


def test_a_planner_that_never_shards_fails_the_solver_suite():
    _caught(
        lambda graph, mesh, profile, zero: check_solver(
            graph, mesh, profile, zero, search=never_shards
        ),
        graph=graphs(),
        mesh=meshes(),
        profile=profiles(),
        zero=st.sampled_from((0, 1, 3)),
    )


def test_a_planner_that_ignores_memory_fails_the_memory_suite():
    _caught(
        lambda graph, mesh, fraction: check_solver_under_memory(
            graph, mesh, fraction, search=ignores_memory
        ),
        graph=graphs(max_ops=5),
        mesh=meshes(max_axes=2),
        fraction=st.floats(0.0, 1.0),
    )
