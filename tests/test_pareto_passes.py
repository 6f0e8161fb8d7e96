"""The memory-bound search's passes: prices evaluated side by side, the label fronts' sort, and a
master cut by its time limit that keeps the beam pass's plan with a proven bound."""

import math

import numpy as np
import pytest

from planner import make_cluster, make_problem
from planner.cost.settings import TrainingSettings
from planner.search import pareto
from planner.search.decompose import split_segments
from planner.search.exact import solve_exact
from planner.search.layer_modes import layer_options
from planner.search import labels
from planner.search.pareto import Unproven, pareto_search
from planner.search.prices import lagrangian, priced_paths
from planner.search.fallback import min_memory
from planner.search.ties import conditioned, owner_groups

GPT = "gpt:layers=4,hidden=256,heads=4,seq=128,vocab=1024"


def _untied(problem):
    """The problem with its tied embedding pinned to one layout (the master's chain has no tie
    edges)."""
    groups = owner_groups(problem)
    return conditioned(problem, {owner: sorted(groups[owner].items())[0][0] for owner in groups})


@pytest.fixture(scope="module")
def gpt():
    problem = _untied(make_problem(GPT, make_cluster("4", "a100-80g")))
    segments = split_segments(problem)
    _, chain = pareto._chain([problem], segments, pareto.FRONT_CAP, (), None, None)
    free = solve_exact(problem)[0]
    return problem, segments, chain, problem.memory(free.choice)


def _scalar_pass(chain, lam):
    """The least cost + lam * memory through the chain, one state at a time (no numpy tricks)."""
    best = {0: (0.0, 0.0, 0.0)}  # state -> (priced, cost, memory), first minimum kept
    for table in chain:
        nxt = {}
        for a, (value, cost, mem) in best.items():
            for b in range(table.shape[1]):
                for p in range(table.cost.shape[2]):
                    c, m = table.cost[a, b, p], table.mem[a, b, p]
                    if not math.isfinite(c):
                        continue
                    candidate = (value + c + lam * m, cost + c, mem + m)
                    if b not in nxt or candidate[0] < nxt[b][0]:
                        nxt[b] = candidate
        best = nxt
    return best[0]


def test_priced_paths_equal_a_scalar_pass_at_every_price(gpt):
    _, _, chain, _ = gpt
    lams = np.array([0.0, 1e-4, 3e-3, 0.2])
    value, cost, mem = priced_paths(chain, lams)
    for k, lam in enumerate(lams):
        expected = _scalar_pass(chain, lam)
        assert value[k] == pytest.approx(expected[0], rel=1e-12)
        # the path reaching it
        assert cost[k] + lam * mem[k] == pytest.approx(expected[0], rel=1e-12)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_the_lagrangian_bounds_the_optimum_and_its_plan_fits(gpt, fraction):
    problem, segments, chain, unconstrained = gpt
    low = min_memory(problem)
    limit = int(low + fraction * (unconstrained - low))
    lam, upper, bound = lagrangian(chain, limit, lambda: None)
    found = pareto_search(problem, segments, limit)
    # a lower bound, and a fitting path's cost above the optimum
    assert bound <= found.objective <= upper
    assert lam > 0 and math.isfinite(upper)


def _two_key_reference(rows, cols, c, m, bound, nb):
    """The fronts by row as a sort by (state, memory, cost, position) keeps them."""
    order = np.lexsort((c, m, rows))
    rows, cols, c, m, bound = rows[order], cols[order], c[order], m[order], bound[order]
    span = float(c.max() - c.min()) + 1.0
    shifted = (c - c.min()) + (nb - rows) * span
    keep = np.ones(len(c), dtype=bool)
    keep[1:] = shifted[1:] < np.minimum.accumulate(shifted)[:-1]
    return rows[keep], cols[keep], c[keep], m[keep], bound[keep]


@pytest.mark.parametrize("draw", range(20))
def test_fronts_by_row_keep_what_the_two_key_sort_keeps(draw):
    rng = np.random.default_rng(draw)
    n, nb = int(rng.integers(1, 400)), int(rng.integers(1, 6))
    rows = rng.integers(0, nb, n)
    m = rng.integers(0, 12, n).astype(float) * 1e6  # few values: many ties in memory
    c = rng.integers(0, 9, n).astype(float) * 1e3  # and in cost (equal points too)
    cols, bound = np.arange(n), rng.random(n)
    got = labels.fronts_by_row(rows, cols, c, m, bound, nb, 10**6, None)
    want = _two_key_reference(rows, cols, c, m, bound, nb)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_a_cut_exact_pass_keeps_the_beam_plan_with_a_proven_bound(gpt, monkeypatch):
    problem, segments, _, unconstrained = gpt
    low = min_memory(problem)
    limit = int(low + 0.3 * (unconstrained - low))
    optimum = pareto_search(problem, segments, limit).objective
    real = pareto._master

    def cut(*args, beam=None, **kwargs):
        if beam is None:
            raise TimeoutError("the time limit ended the Pareto search")
        return real(*args, beam=beam, **kwargs)

    monkeypatch.setattr(pareto, "_master", cut)
    with pytest.raises(Unproven) as caught:
        pareto_search(problem, segments, limit)
    plan = caught.value.plan
    assert plan is not None and caught.value.bound <= optimum <= plan.objective
    assert problem.objective(plan.choice) == plan.objective and problem.memory(plan.choice) <= limit
    result, notes = solve_exact(problem, limit)
    assert result.status == "FEASIBLE" and result.objective == plan.objective
    assert result.bound == caught.value.bound <= result.objective
    assert any("beam pass" in note for note in notes)


def test_a_cut_master_under_layer_choices_reports_its_own_bound(gpt, monkeypatch):
    """Under --recompute auto the restricted (no-choice) program's bound is no bound of the problem:
    with no beam plan the search has no plan and keeps the choices' Lagrangian bound, which the
    greedy fallback plan (FEASIBLE, as the whole-graph program's at a too-short limit) carries."""
    problem = _untied(
        make_problem(GPT, make_cluster("4", "a100-80g"), TrainingSettings(recompute="auto"))
    )
    limit = int(min_memory(problem) * 1.02)
    monkeypatch.setattr(pareto, "BEAMS", ())
    monkeypatch.setattr(
        pareto, "_master", lambda *a, **k: (_ for _ in ()).throw(TimeoutError("cut"))
    )
    result, notes = solve_exact(problem, limit)
    assert (
        result.status == "FEASIBLE"
        and result.bound is not None
        and result.bound <= result.objective
    )
    assert problem.memory(result.choice) <= limit and "greedy plan" in result.explanation
    assert any("the exact Pareto master stopped (cut)" in note for note in notes)
    with pytest.raises(Unproven) as caught:  # the bound is the choices' Lagrangian one
        pareto_search(
            problem,
            split_segments(problem),
            limit,
            variants=layer_options(problem, split_segments(problem)).variants,
            units=layer_options(problem, split_segments(problem)).units,
        )
    assert result.bound == caught.value.bound


def test_one_price_search_serves_both_lagrangian_paths(monkeypatch):
    """The Pareto tables' price search and the decomposition's bisection are one function
    (``prices.search_price``): a sweep x4 up to the first fitting price, then bracket splits."""
    import numpy as np

    from planner.search import lagrangian as decomposition_path
    from planner.search import prices

    asked = []
    prices.search_price(
        lambda lams: (asked.extend(lams), lams >= 3.7)[1],
        1.0,
        1,
        80,
        lambda low, high, passes: passes >= 40,
    )
    assert asked[:2] == [1.0, 4.0] and abs(asked[-1] - 3.7) < 1e-9  # 1 fits not, 4 fits
    several = []
    prices.search_price(
        lambda lams: (several.append(len(lams)), lams >= 3.7)[1],
        1.0,
        4,
        60,
        lambda low, high, passes: high is not None and high - low < 1e-6,
    )
    assert several[0] == 4 and set(several) == {4}
    calls = []
    real = prices.search_price
    monkeypatch.setattr(prices, "search_price", lambda *a: (calls.append(a[2]), real(*a))[1])
    monkeypatch.setattr(decomposition_path, "search_price", prices.search_price)
    chain = [prices_chain_table()]
    prices.lagrangian(chain, 1.5, lambda: None)
    decomposition_path.bisect_price(
        lambda lam: lam >= 2.0, [np.array([4.0])], [np.array([2.0])], lambda: False
    )
    assert len(calls) == 2 and calls[1] == 1  # the decomposition's path: one price per pass


def prices_chain_table():
    """One front table with two points: (cost 0, memory 2) and (cost 3, memory 1)."""
    import numpy as np

    from planner.search.fronts import Node

    return Node(np.array([[[0.0, 3.0]]]), np.array([[[2.0, 1.0]]]), ())
