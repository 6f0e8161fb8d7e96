"""Exact under a memory limit: Pareto fronts, the segment front tables and the label-setting master,
against brute force (small random graphs) and the whole-program CP-SAT (small GPTs)."""

import math
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, seed
from hypothesis import strategies as st

from planner import make_cluster, make_problem
from planner.cluster.mesh import Mesh, MeshAxis
from planner.cluster.profiles import SYMBOLIC
from planner.cost.problem import build_problem
from planner.search.brute import brute_force
from planner.search.decompose import split_segments
from planner.search.exact import solve_exact
from planner.search.fronts import FrontTooLarge, prune
from planner.search.pareto import NoLabelFits, pareto_search, segment_front_table
from planner.search.fallback import min_memory
from planner.search.solver import solve
from test_decompose import chain_graphs


def test_prune_keeps_the_non_dominated_points_by_hand():
    cost = np.array([[5.0, 3.0, 4.0, 3.0, np.inf, 1.0]])
    mem = np.array([[1.0, 2.0, 2.0, 2.0, 0.0, 9.0]])
    c, m, src = prune(cost, mem, cap=10)
    # (4, 2) and a copy of (3, 2) go
    assert c.tolist() == [[5.0, 3.0, 1.0]] and m.tolist() == [[1.0, 2.0, 9.0]]
    assert src[0, 1] in (1, 3) and src[0, 2] == 5
    with pytest.raises(FrontTooLarge):
        prune(cost, mem, cap=2)


def _limits(problem, fractions):
    low = min_memory(problem)
    high = int(sum(int(t.memory.max()) for t in problem.ops))
    return [int(low + f * (high - low)) for f in fractions]


@seed(7)
@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=chain_graphs(), two_axes=st.booleans(), fraction=st.floats(0.0, 0.6))
def test_random_chains_under_memory_limits_match_brute_force(graph, two_axes, fraction):
    axes = (MeshAxis("a", 2, 1e9, 0.0),) + ((MeshAxis("b", 2, 4e9, 1e-6),) if two_axes else ())
    problem = build_problem(graph, Mesh(axes), SYMBOLIC)
    if np.prod([len(t.strategies) for t in problem.ops], dtype=float) > 3e6:
        problem = build_problem(graph, Mesh(axes[:1]), SYMBOLIC)
    (limit,) = _limits(problem, [fraction])
    best, _ = brute_force(problem, limit)
    found = pareto_search(problem, split_segments(problem), limit)
    assert found.objective == best
    assert problem.objective(found.choice) == best and problem.memory(found.choice) <= limit


GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024"


# 2x2: CP-SAT takes ~1 min
@pytest.mark.parametrize(
    "mesh", ["4", pytest.param("2x2", marks=(pytest.mark.slow, pytest.mark.heavy))]
)
def test_small_gpt_under_memory_limits_matches_the_whole_program(mesh):
    """Limits from the least memory to the unconstrained plan's; the exact search certifies each
    optimum, the whole-program CP-SAT agrees, and some limit makes identical layers differ."""
    problem = make_problem(GPT, make_cluster(mesh, "a100-80g"))
    free, _ = solve_exact(problem, math.inf)
    low, high = min_memory(problem), problem.memory(free.choice)
    mixed, by_pareto = 0, 0
    for fraction in (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95):
        limit = int(low + fraction * (high - low))
        result, notes = solve_exact(problem, limit, time_limit_s=60)
        whole = solve(problem, limit, time_limit_s=60)
        # the notes tell how the winning layout of the tied table was solved: near the top, its
        # unconstrained plan may fit (no Pareto master needed there)
        by_pareto += any("Pareto" in n for n in notes)
        assert result.status == "OPTIMAL"
        assert whole.status == "OPTIMAL" and whole.objective == result.objective
        assert problem.memory(result.choice) <= limit
        per_layer = {}
        for table, c in zip(problem.ops, result.choice):
            if table.op.layer is not None:
                per_layer.setdefault(table.op.layer, []).append(table.strategies[c])
        mixed += len({tuple(v) for v in per_layer.values()}) > 1
    assert mixed >= 1, "some limit is met only by giving identical layers different plans"
    assert by_pareto >= 5


def test_segment_front_table_holds_the_unconstrained_optimum():
    """The least cost of each front entry is the scalar decomposition's table entry."""
    from planner.search.ties import conditioned, owner_groups

    tied = make_problem(GPT, make_cluster("2x2", "a100-80g"))
    free, _ = solve_exact(tied, math.inf)
    ((owner, groups),) = owner_groups(tied).items()  # the tied embedding, at the optimum's layout
    problem = conditioned(
        tied, {owner: next(k for k, v in groups.items() if free.choice[owner] in v)}
    )
    total = 0.0
    segments = split_segments(problem)
    tables = {s.key: segment_front_table(problem, s) for s in segments}
    vector = np.zeros(1)
    for seg in segments:
        cost = np.where(np.isfinite(tables[seg.key].cost), tables[seg.key].cost, np.inf).min(
            axis=-1
        )
        vector = (vector[:, None] + cost).min(axis=0)
    total = float(vector[0])
    assert total == free.objective


def _pinned_optimum(problem, limit):
    """The optimum for fixed per-layer modes by the Pareto master alone (no mode choice), on each
    layout of the tied embedding (the master itself sees no tie edge)."""
    from planner.search.ties import conditioned, owner_groups

    found = []
    for owner, groups in owner_groups(problem).items():
        for layouts in groups:
            untied = conditioned(problem, {owner: layouts})
            try:
                found.append(pareto_search(untied, split_segments(untied), limit).objective)
            except NoLabelFits:
                pass
    return min(found, default=None)


def _every_layer_assignment(mesh: str, decided: str):
    """A 2-layer GPT under per-layer choices ('auto'), and the same problem with every per-layer
    assignment of the decided modes fixed: (auto problem, {modes: problem}, layers)."""
    import itertools

    from planner.api import resolve_model
    from planner.cost.settings import TrainingSettings

    cluster = make_cluster(mesh)
    graph = resolve_model("gpt:layers=2,hidden=64,heads=4,seq=64,vocab=128", 8)
    layers = sorted({op.layer for op in graph.operators if op.layer is not None})
    recompute = ("none", "selective", "full") if decided in ("recompute", "both") else ("none",)
    zero = (0, 1, 2, 3) if decided in ("zero", "both") else (0,)
    auto = dict(
        recompute="auto" if len(recompute) > 1 else "none", zero="auto" if len(zero) > 1 else 0
    )

    def settings(modes=None):
        if modes is None:
            return TrainingSettings(**auto)
        return TrainingSettings(
            **auto,
            layer_recompute=tuple((k, m[0]) for k, m in zip(layers, modes))
            if len(recompute) > 1
            else (),
            layer_zero=tuple((k, m[1]) for k, m in zip(layers, modes)) if len(zero) > 1 else (),
        )

    problem = build_problem(graph, cluster.mesh, cluster.profile, settings())
    pinned = {
        modes: build_problem(graph, cluster.mesh, cluster.profile, settings(modes))
        for modes in itertools.product(itertools.product(recompute, zero), repeat=len(layers))
    }
    return problem, pinned, layers


@pytest.mark.parametrize(
    "mesh,oracle,decided,fractions",
    [
        ("4", "cp-sat", "recompute", (0.2, 0.4, 0.6, 0.8, 0.95)),
        # 45 pinned Pareto searches, each on every layout of the tied table: about 150 s on 2 cores
        pytest.param(
            "2x2",
            "pareto",
            "recompute",
            (0.2, 0.4, 0.6, 0.8, 0.95),
            marks=(pytest.mark.slow, pytest.mark.heavy),
        ),
        ("4", "cp-sat", "zero", (0.1, 0.6, 0.9)),
        # 144 joint assignments: 25 s
        pytest.param(
            "4", "pareto", "both", (0.15, 0.5), marks=(pytest.mark.slow, pytest.mark.heavy)
        ),
    ],
)
def test_auto_matches_brute_force_over_every_assignment_of_layer_choices(
    mesh, oracle, decided, fractions
):
    """--recompute auto / --zero auto decide none / selective / full recompute and the ZeRO stage
    per layer inside the Pareto master. The optimum equals the best optimum over every per-layer
    assignment (3^L, 4^L or 12^L), each solved with its choices fixed (by the whole-program CP-SAT
    on 4 devices; by the Pareto master without choices on 2x2 and for the 144 joint assignments,
    where CP-SAT takes minutes), at limits from "only the least-memory choices fit" to "almost
    nothing needs them"; with recompute, the limits force mixed assignments (two layers choosing
    differently)."""
    problem, pinned, layers = _every_layer_assignment(mesh, decided)
    low = min(min_memory(p) for p in pinned.values())
    high = problem.memory(solve_exact(problem)[0].choice)
    mixed, stages = set(), set()
    for fraction in fractions:
        limit = low + fraction * (high - low)
        result, notes = solve_exact(problem, limit)
        if oracle == "cp-sat":
            found = [solve(p, limit) for p in pinned.values()]
            assert all(o.status in ("OPTIMAL", "INFEASIBLE") for o in found)
            best = min(o.objective for o in found if o.status == "OPTIMAL")
        else:
            best = min(
                v for v in (_pinned_optimum(p, limit) for p in pinned.values()) if v is not None
            )
        assert result.status == "OPTIMAL" and any("chosen per layer" in n for n in notes)
        assert result.objective == best
        chosen_r = dict(result.layer_recompute) or {layer: "none" for layer in layers}
        chosen_z = dict(result.layer_zero) or {layer: 0 for layer in layers}
        modes = tuple((chosen_r[layer], chosen_z[layer]) for layer in layers)
        assert pinned[modes].objective(result.choice) == result.objective
        stages.update(z for _, z in modes)
        if len(set(modes)) > 1:
            mixed.add(modes)
    # recompute: at least one limit where the layers differ; ZeRO alone: stage 3 is cheapest here at
    # every limit (its gathers hide behind compute, its reduce-scatter moves half an all-reduce)
    assert mixed if decided != "zero" else stages - {0}
