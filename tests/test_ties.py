"""Tied parameters (a table stored once, read by two operators): the tie edge's cost against hand
numbers, and the exact search (conditioned on the owner's layout, then decomposed) against brute
force and the whole-graph program, which holds the tie as an ordinary pairwise term."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, assume, given, seed, settings, strategies as st

from planner.api import make_cluster, make_problem
from planner.cluster.mesh import Mesh, MeshAxis
from planner.cost.problem import build_problem
from planner.cost.strategy import GRAD_PARTIAL, REPLICATE
from planner.cost.terms import tie_cost
from planner.ir.ops import GraphBuilder
from planner.plans import integer_objective
from planner.search.brute import brute_force
from planner.search.exact import solve_exact
from planner.search.solver import solve
from strategies_gen import COMPUTE_BOUND, sharded

TINY_GPT = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=128"


def test_tie_cost_is_the_gather_of_the_table_and_its_transposed_gradient():
    """Owner h-split on a 2-way axis, reader replicated: one all-gather of the 2048 x 512 fp32
    table (4 MiB) forward, nothing backward (the reader's gradient, already all-reduced by its own
    data-parallel reduction, is sliced locally). Owner replicated, reader split: free forward, the
    reader's sharded gradient gathered backward. Same layouts: no cost."""
    table = 2048 * 512 * 4
    forward = tie_cost((2048, 512), 4, (1,), (GRAD_PARTIAL,), (2,)).comm
    assert [(c.phase, c.kind, c.axis, c.nbytes) for c in forward] == [
        ("fwd", "all_gather", 0, table)
    ]
    backward = tie_cost((2048, 512), 4, (REPLICATE,), (0,), (2,)).comm
    assert [(c.phase, c.kind, c.nbytes) for c in backward] == [("bwd", "all_gather", table)]
    assert tie_cost((2048, 512), 4, (0,), (0,), (2,)).comm == ()


def test_gpt_ties_its_embedding_and_the_plan_pays_for_it():
    problem = make_problem("gpt2-small", make_cluster("2x4"))
    (tie,) = problem.ties
    assert (problem.ops[tie.src].op.name, problem.ops[tie.dst].op.name, tie.tensor) == (
        "embed",
        "lm_head",
        "wte",
    )
    result, notes = solve_exact(problem)
    assert result.status == "OPTIMAL" and any("tied parameters" in n for n in notes)
    assert problem.objective(result.choice) == result.objective
    strategies = [t.strategies[c] for t, c in zip(problem.ops, result.choice)]
    # plan_terms holds the tie too
    assert integer_objective(problem, strategies)[0] == result.objective


@st.composite
def tied_chains(draw):
    """A chain whose first matmul owns a parameter that a later matmul reads again (maybe
    transposed)."""
    gb = GraphBuilder("tied")
    width = draw(st.sampled_from((4, 8)))
    x = gb.data("x", (draw(st.sampled_from((4, 8))), width))
    tied = gb.param("tied", (width, width))
    x = gb.op("matmul", "owner", "bk,kn->bn", [x, tied])
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(("relu", "matmul", "layernorm")))
        if kind == "matmul":
            x = gb.op("matmul", f"m{i}", "bk,kn->bn", [x, gb.param(f"w{i}", (width, width))])
        elif kind == "layernorm":
            x = gb.op("layernorm", f"n{i}", "bk->bk", [x], norm="k")
        else:
            x = gb.op("relu", f"r{i}", "bk->bk", [x])
    equation = "bk,nk->bn" if draw(st.booleans()) else "bk,kn->bn"
    gb.op("matmul", "reader", equation, [x, tied])
    return gb.build()


def check_tied_chain(graph, two_axes, slow_second, exact=solve_exact) -> None:
    """Exact search with a tie equals brute force and the whole program, on optima that shard."""
    axes = (MeshAxis("a", 2, 25e9, 1e-6),) + (
        (MeshAxis("b", 2, 1e9 if slow_second else 100e9, 0.0),) if two_axes else ()
    )
    problem = build_problem(graph, Mesh(axes), COMPUTE_BOUND)
    if np.prod([len(t.strategies) for t in problem.ops], dtype=float) > 3e5:
        problem = build_problem(graph, Mesh(axes[:1]), COMPUTE_BOUND)
    assume(np.prod([len(t.strategies) for t in problem.ops], dtype=float) <= 2e6)
    assert len(problem.ties) == 1
    best, best_choice = brute_force(problem)
    assume(sharded(problem, best_choice))  # a planner that never shards cannot pass
    result, _ = exact(problem)
    assert result.status == "OPTIMAL" and result.objective == best == problem.objective(
        result.choice
    )
    whole = solve(problem, time_limit_s=60)
    assert whole.status == "OPTIMAL" and whole.objective == best


@seed(7)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=tied_chains(), two_axes=st.booleans(), slow_second=st.booleans())
def test_tied_chains_match_brute_force_and_the_whole_program(graph, two_axes, slow_second):
    check_tied_chain(graph, two_axes, slow_second)


def test_tiny_gpt_exact_equals_the_whole_program_on_two_meshes():
    for mesh in ("4", "2x2"):
        problem = make_problem(TINY_GPT, make_cluster(mesh))
        result, _ = solve_exact(problem)
        whole = solve(problem, time_limit_s=120)
        assert result.status == whole.status == "OPTIMAL" and result.objective == whole.objective


def test_free_optima_equal_each_conditioned_problems_optimum():
    """The shared-segment relaxation (``ties.free_optima``) gives each owner-layout condition the
    optimum its own conditioned problem has, exactly, on GPT models (tied embedding and head) over
    one and two mesh axes, under recompute and ZeRO settings; and the conditions differ."""
    from planner.cost.settings import TrainingSettings
    from planner.search.exact import _relaxed
    from planner.search.state import SearchCache
    from planner.search.ties import conditioned, free_optima, owner_groups

    checked, spread = 0, 0
    for spec, mesh, training in [
        (TINY_GPT, "4", TrainingSettings()),
        (TINY_GPT, "2x4", TrainingSettings(recompute="selective", zero=1)),
        (TINY_GPT, "4x2", TrainingSettings(zero=3)),
        ("gpt:layers=4,hidden=64,heads=4,seq=32,vocab=512", "node=2,gpu=4", TrainingSettings()),
    ]:
        cluster = make_cluster(mesh, "a100-80g")
        problem = make_problem(spec, cluster, training, batch=8)
        groups = owner_groups(problem)
        chosen = [{owner: layouts} for owner in groups for layouts in sorted(groups[owner])]
        fast = free_optima(problem, chosen, {}, float("inf"))
        slow = [
            _relaxed(conditioned(problem, c), float("inf"), SearchCache(), float("inf"))
            for c in chosen
        ]
        assert fast == slow
        exact = [solve_exact(conditioned(problem, c))[0].objective for c in chosen]
        assert fast == [float(value) for value in exact]
        # past the deadline a condition has no bound: -inf, never a made-up value
        assert free_optima(problem, chosen, {}, 0.0) == [float("-inf")] * len(chosen)
        checked, spread = checked + len(chosen), spread + (len(set(fast)) > 1)
    assert checked >= 12 and spread >= 2
