"""The CP-SAT program against brute force, and plan re-evaluation through the cost model."""

import numpy as np
from hypothesis import HealthCheck, assume, given, settings, seed
from hypothesis import strategies as st

from planner.cost.settings import TrainingSettings
from planner.plans import make_plan, strategies_from_choice
from planner.cost.problem import build_problem
from planner.search.brute import brute_force
from planner.search.solver import build_model, solve
from strategies_gen import COMPUTE_BOUND, graphs, meshes, profiles, sharded

MAX_COMBINATIONS = 2_000_000


def _small(problem):
    return np.prod([len(t.strategies) for t in problem.ops], dtype=np.float64) <= MAX_COMBINATIONS


def check_solver(graph, mesh, profile, zero, search=solve) -> None:
    """CP-SAT's optimum equals brute force, and re-costs to itself, on optima that shard."""
    problem = build_problem(graph, mesh, profile, TrainingSettings(zero=zero))
    if not _small(problem):
        mesh = mesh.sub_mesh(mesh.shape[:1])
        problem = build_problem(graph, mesh, profile, TrainingSettings(zero=zero))
    assume(_small(problem))
    best, best_choice = brute_force(problem)
    assume(sharded(problem, best_choice))  # a planner that never shards cannot pass
    result = search(problem, time_limit_s=30)
    assert result.status == "OPTIMAL"
    assert result.objective == best
    assert problem.objective(result.choice) == best
    plan = make_plan(
        problem,
        strategies_from_choice(problem, result.choice),
        method="exact",
        status=result.status,
    )
    assert plan.objective == best


def check_solver_under_memory(graph, mesh, fraction, search=solve) -> None:
    """Under a memory limit between the least and the most memory: brute force's optimum, within
    it."""
    problem = build_problem(graph, mesh, COMPUTE_BOUND)
    # counted by hypothesis: too many discards fail the test instead of passing it
    assume(_small(problem))
    low = sum(int(t.memory.min()) for t in problem.ops)
    high = sum(int(t.memory.max()) for t in problem.ops)
    limit = low + fraction * (high - low)
    expected = brute_force(problem, memory_limit=limit)
    free = brute_force(problem)
    assume(problem.memory(free[1]) > limit)  # the limit binds: ignoring it cannot pass
    result = search(problem, memory_limit=limit, time_limit_s=30)
    assert result.status == "OPTIMAL"
    assert result.objective == expected[0]
    assert problem.memory(result.choice) <= limit


@seed(20261130)
@settings(
    max_examples=220,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(graph=graphs(), mesh=meshes(), profile=profiles(), zero=st.sampled_from((0, 1, 3)))
def test_solver_equals_brute_force(graph, mesh, profile, zero):
    check_solver(graph, mesh, profile, zero)


@seed(7)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(graph=graphs(max_ops=5), mesh=meshes(max_axes=2), fraction=st.floats(0.0, 1.0))
def test_solver_equals_brute_force_under_a_memory_limit(graph, mesh, fraction):
    check_solver_under_memory(graph, mesh, fraction)


def test_infeasible_memory_is_explained(a100):
    from planner.cluster.mesh import parse_mesh
    from planner.zoo import load_model

    problem = build_problem(load_model("gpt2-small"), parse_mesh("8", a100), a100)
    result = solve(problem, memory_limit=1e6)
    assert result.status == "INFEASIBLE"
    assert (
        "memory" in result.explanation
        and "GiB" in result.explanation
        and "--zero" in result.explanation
    )


def test_build_model_exposes_typed_variable_maps(a100):
    from planner.cluster.mesh import parse_mesh
    from planner.zoo.transformers import mlp

    problem = build_problem(mlp(batch=64, hidden=64), parse_mesh("2x4", a100), a100)
    built = build_model(problem)
    assert len(built.x) == len(problem.ops)
    assert [len(r) for r in built.x] == [len(t.strategies) for t in problem.ops]
    assert len(built.y) == len(problem.edges)
    assert built.num_booleans == sum(len(r) for r in built.x) + sum(len(m) for m in built.y)


def test_constraints_are_named_after_their_family():
    from planner.api import make_cluster, make_problem

    problem = make_problem("mlp", make_cluster("2x4", "a100-80g"))
    built = build_model(problem, memory_limit=80e9, lower_bound=1)
    names = {c.name.split("[")[0] for c in built.model.proto.constraints}
    assert names == {"exactly_one", "marginal_src", "marginal_dst", "memory", "bound"}


def test_a_build_that_passes_the_deadline_stops_and_returns_the_greedy_plan(monkeypatch):
    """Building is Python (CP-SAT's limit cannot stop it): it checks the deadline per edge."""
    import time
    import pytest
    from planner.api import make_cluster, make_problem
    from planner.search import solver as solver_module

    problem = make_problem("gpt2-small", make_cluster("2x4", "a100-80g"))
    with pytest.raises(solver_module.BuildTimeout):
        build_model(problem, deadline=time.perf_counter())
    from planner.search import fallback

    # the estimate lets the build start
    monkeypatch.setattr(fallback, "BUILD_SECONDS_PER_BOOLEAN", 0.0)
    result = solve(problem, time_limit_s=0.05)
    assert result.status == "FEASIBLE" and result.choice == solver_module.greedy_choice(problem)
    assert "time limit shorter than building" in result.explanation and result.search_time_s < 2.0


def test_cp_sat_is_not_started_when_it_could_not_load_the_model_in_time(monkeypatch):
    from planner.api import make_cluster, make_problem
    from planner.search import solver as solver_module

    problem = make_problem("mlp", make_cluster("2x4", "a100-80g"))
    full = solve(problem, time_limit_s=30)
    monkeypatch.setattr(solver_module, "LOAD_SECONDS_PER_BOOLEAN", 1e3)
    stopped = solve(problem, time_limit_s=30)
    assert full.status == "OPTIMAL" and stopped.status == "FEASIBLE"
    assert stopped.explanation == "time limit reached before CP-SAT could load the model"
    assert (
        stopped.choice == solver_module.greedy_choice(problem)
        and stopped.objective >= full.objective
    )
    assert stopped.search_time_s < 5.0  # a 30 s limit, not waited for
