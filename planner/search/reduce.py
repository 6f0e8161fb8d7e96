"""The exact optimum of unary + edge costs over a segmented graph: every distinct segment reduced
once (``planner.search.eliminate``), in a pool of worker processes when asked, and the tables
multiplied (``planner.search.decompose``):

    value = min over boundary layouts b_0..b_K of  sum_k T_k[b_{k-1}, b_k],
    T_k = the (min,+) table of segment k (distinct segments share one table)

The Lagrangian price steps call it with unary costs c + lam * m; the tied-layout conditions share
the reductions of every segment they leave alone (keyed by content, so equal keys mean equal
tables)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from planner.cost.problem import Problem
from planner.search.decompose import Segment, group_blocks, product_block, segment_network

Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class DecomposedSolution:
    """The minimum of one unary-cost program and a strategy per operator reaching it."""

    value: float
    choice: tuple[int, ...]


def _reduce(
    problem: Problem, seg: Segment, unary: Sequence[np.ndarray], deadline: float | None = None
):
    net, entry, exit_ = segment_network(problem, seg, unary)
    return net.reduce(entry, exit_, deadline=deadline)


def reduce_segment(
    problem: Problem,
    seg: Segment,
    unary: Sequence[np.ndarray],
    deadline: float | None,
    reduced: dict | None,
):
    """One segment's reduction; kept in ``reduced`` by its key when given (``unary`` must then be
    the problem's own op costs, which the key hashes)."""
    if reduced is None:
        return _reduce(problem, seg, unary, deadline)
    if seg.key not in reduced:
        reduced[seg.key] = _reduce(problem, seg, unary, deadline)
    return reduced[seg.key]


_WORKER: dict = {}  # per worker process: the problem, sent once by the pool initializer


def _init_worker(problem: Problem) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool; no worker tracebacks
    _WORKER["problem"] = problem


def _reduce_in_worker(args):
    seg, unary, deadline = args
    return _reduce(_WORKER["problem"], seg, unary, deadline)


class Workers:
    """One pool of worker processes for a whole search (every price step reuses it).

    ``forkserver`` workers, since forking a process that has imported JAX is unsafe; at most one
    worker per CPU and per distinct segment. Terminated at once on an interrupt."""

    def __init__(self, problem: Problem, jobs: int, distinct: int) -> None:
        self.size = max(1, min(jobs, os.cpu_count() or 1, distinct))
        self.pool = None
        if self.size > 1:
            context = multiprocessing.get_context("forkserver")
            # the shared edge-matrix cache stays here: workers only read the problem's own edges
            sent = replace(problem, edge_matrices={}, digests={})
            self.pool = context.Pool(self.size, initializer=_init_worker, initargs=(sent,))

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if self.pool is not None:
            if kind is None:
                self.pool.close()
            else:
                self.pool.terminate()
            self.pool.join()


def solve_unary(
    problem: Problem,
    segments: Sequence[Segment],
    unary: Sequence[np.ndarray],
    workers: Workers | None = None,
    progress: Progress | None = None,
    deadline: float | None = None,
    reduced: dict | None = None,
) -> DecomposedSolution:
    """Exact minimum of sum(unary) + edge costs: distinct segments reduced once, tables multiplied
    (``TimeoutError`` when a segment's reduction runs past ``deadline``). ``reduced`` keeps the
    reductions by segment key across calls whose unary costs are the problems' own op costs (the
    key hashes them): the tied-layout conditions share every segment they do not change."""
    reductions = _reductions(problem, segments, unary, workers, progress, deadline, reduced)
    blocks = group_blocks(segments, [reductions[s.key].table for s in segments])
    top = product_block(blocks)
    states = top.boundaries(0, 0)
    choice = [-1] * len(problem.ops)
    for k, seg in enumerate(segments):
        local = reductions[seg.key].recover(states[k], states[k + 1], len(seg.ops) + 2)
        for n, op in enumerate(seg.ops):
            choice[op] = local[n]
    return DecomposedSolution(float(top.table[0, 0]), tuple(choice))


def _reductions(problem, segments, unary, workers, progress, deadline, reduced) -> dict:
    """Every distinct segment's reduction by key: the known ones reused, the rest computed (in the
    pool when there is one and more than one to do)."""
    distinct: dict[str, Segment] = {}
    for seg in segments:
        distinct.setdefault(seg.key, seg)
    known = reduced if reduced is not None else {}
    items = [(key, seg) for key, seg in distinct.items() if key not in known]
    if workers is not None and workers.pool is not None and len(items) > 1:
        results = workers.pool.imap(_reduce_in_worker, [(seg, unary, deadline) for _, seg in items])
    else:
        results = (_reduce(problem, seg, unary, deadline) for _, seg in items)
    reductions = {key: known[key] for key in distinct if key in known}
    for n, ((key, _), reduction) in enumerate(zip(items, results)):
        reductions[key] = known[key] = reduction
        if progress:
            progress(n + 1, len(items), "segments")
    return reductions
