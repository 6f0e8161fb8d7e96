"""The homomorphism decomposition equals the whole-graph program, with and without binding
memory."""

import math
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, seed
from hypothesis import strategies as st

from planner import make_cluster, make_problem
from planner.search.decompose import chain, find_cuts, matrix_power, split_segments, tree_product
from planner.search.eliminate import minplus
from planner.search.exact import solve_exact
from planner.cluster.mesh import MeshAxis, Mesh
from planner.cluster.profiles import SYMBOLIC
from planner.ir.ops import GraphBuilder
from planner.plans import make_plan, strategies_from_choice
from planner.cost.problem import build_problem
from planner.search.brute import brute_force
from planner.search.fallback import min_memory
from planner.search.solver import solve
from strategies_gen import COMPUTE_BOUND, sharded

MATRIX = [
    ("mlp", "8"),
    ("transformer-block", "2x4"),
    ("gpt2-small", "8"),
    ("resnet50", "8"),
    ("moe-gpt", "8"),
    ("bert-base", "8"),
    ("vgg16", "2x4"),
    ("gpt:layers=2,hidden=256,heads=4,seq=128,vocab=1024", "2x4"),
]


def _check(problem, limit):
    decomposed, notes = solve_exact(problem, limit, time_limit_s=120)
    whole = solve(problem, limit, time_limit_s=120)
    assert decomposed.status == "OPTIMAL"
    if whole.status == "OPTIMAL":
        assert decomposed.objective == whole.objective
    else:  # CP-SAT stopped at its limit: the exact optimum lies between its bound and its plan
        assert whole.status == "FEASIBLE" and whole.bound <= decomposed.objective <= whole.objective
    assert problem.objective(decomposed.choice) == decomposed.objective
    plan = make_plan(
        problem,
        strategies_from_choice(problem, decomposed.choice),
        method="exact",
        status="OPTIMAL",
    )
    assert plan.objective == decomposed.objective
    assert problem.memory(decomposed.choice) <= limit
    return decomposed, notes


@pytest.mark.parametrize("model,mesh", MATRIX)
def test_decomposition_equals_whole_program(model, mesh):
    problem = make_problem(model, make_cluster(mesh, "a100-80g"))
    result, notes = _check(problem, math.inf)
    assert "decomposed" in notes[0]


@pytest.mark.parametrize("model,mesh", MATRIX)
def test_decomposition_equals_whole_program_when_memory_binds(model, mesh):
    problem = make_problem(model, make_cluster(mesh, "a100-80g"))
    free, _ = solve_exact(problem, math.inf)
    low, free_memory = min_memory(problem), problem.memory(free.choice)
    assert free_memory > low, "every case of the matrix has a memory limit that binds"
    limit = low + 0.5 * (free_memory - low)  # binds: the unconstrained optimum does not fit
    result, notes = _check(problem, limit)
    assert any("memory binds" in n for n in notes)
    assert result.objective > free.objective or problem.memory(free.choice) <= limit


@st.composite
def chain_graphs(draw):
    """Random chains of small segments: residual blocks, branches that rejoin, plain ops."""
    gb = GraphBuilder("chain")
    width = draw(st.sampled_from((4, 8)))
    x = gb.op("relu", "in", "bk->bk", [gb.data("x", (8, width))])
    for i in range(draw(st.integers(2, 5))):
        kind = draw(st.sampled_from(("residual", "fork", "plain", "matmul")))
        if kind == "residual":
            y = gb.op("matmul", f"r{i}", "bk,kn->bn", [x, gb.param(f"w{i}", (width, width))])
            x = gb.op("add", f"a{i}", "bk,bk->bk", [x, y])
        elif kind == "fork":
            left = gb.op("softmax", f"s{i}", "bk->bk", [x], norm="k")
            right = gb.op("relu", f"g{i}", "bk->bk", [x])
            x = gb.op("mul", f"m{i}", "bk,bk->bk", [left, right])
        elif kind == "matmul":
            x = gb.op("matmul", f"p{i}", "bk,kn->bn", [x, gb.param(f"v{i}", (width, width))])
        else:
            x = gb.op("layernorm", f"n{i}", "bk->bk", [x], norm="k")
    return gb.build()


def check_chain(graph, two_axes, exact=solve_exact) -> None:
    """The decomposition's optimum equals brute force on a random chain whose optimum shards."""
    axes = (MeshAxis("a", 2, 1e9, 0.0),) + ((MeshAxis("b", 2, 4e9, 1e-6),) if two_axes else ())
    problem = build_problem(graph, Mesh(axes), COMPUTE_BOUND)
    if np.prod([len(t.strategies) for t in problem.ops], dtype=float) > 3e5:
        problem = build_problem(graph, Mesh(axes[:1]), COMPUTE_BOUND)
    assume(np.prod([len(t.strategies) for t in problem.ops], dtype=float) <= 2e6)
    best, best_choice = brute_force(problem)
    assume(sharded(problem, best_choice))  # a planner that never shards cannot pass
    result, _ = exact(problem)
    assert result.objective == best
    assert problem.objective(result.choice) == best


@seed(42)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=chain_graphs(), two_axes=st.booleans())
def test_random_chains_match_brute_force(graph, two_axes):
    check_chain(graph, two_axes)


def test_power_and_bracketing_agree_with_plain_products():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 100, size=(5, 5)).astype(float)
    plain = base
    for _ in range(6):
        plain = minplus(plain, base)[0]
    power = matrix_power(base, 7)
    assert np.array_equal(power.table, plain)
    states = power.boundaries(1, 3)
    assert len(states) == 8 and states[0] == 1 and states[-1] == 3
    assert sum(base[a, b] for a, b in zip(states, states[1:])) == power.table[1, 3]
    tables = [
        rng.integers(0, 50, size=(1 if k == 0 else 4, 1 if k == 5 else 4)).astype(float)
        for k in range(6)
    ]
    value, _ = chain(tables)
    assert value == tree_product(tables)[0, 0]


def test_gpt_layers_are_solved_once_and_cut_at_the_residual_stream():
    problem = make_problem("gpt2-small", make_cluster("8", "a100-80g"))
    segments = split_segments(problem)
    assert len(segments) == 29 and len({s.key for s in segments}) == 7
    cut_tensors = {t for _, t in find_cuts(problem)}
    assert "h3.attn_residual" in cut_tensors and "h3.mlp_residual" in cut_tensors


def test_graph_without_cuts_falls_back_to_whole_program():
    gb = GraphBuilder("nocut")
    x = gb.data("x", (8, 8))
    gb.op(
        "split",
        "s",
        "bi->bj,bl",
        [x],
        sizes={"j": 4, "l": 4},
        out=["left", "right"],
        unsplittable="ijl",
    )
    gb.op("add", "c", "bk,bk->bk", ["left", "right"])
    problem = build_problem(gb.build(), Mesh((MeshAxis("a", 2, 1e9, 0.0),)), SYMBOLIC)
    result, notes = solve_exact(problem)
    assert result.status == "OPTIMAL" and "no single-tensor cut" in notes[0]
