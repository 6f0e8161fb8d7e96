"""Hand-written plans used as baselines and for ``planner evaluate``.

``megatron``: tensor parallel on the chosen (fastest, innermost by default) mesh axis with
Megatron-LM's pattern, data parallel on every other axis. The pattern is read off the zoo's dim
names: on the tensor-parallel axis an operator splits its first dim among heads ``a``, ffn ``f``,
vocab ``v`` and experts ``e`` (column-parallel QKV/fc1 and row-parallel proj/fc2 fall out of
the einsums: the row-parallel ops split ``a``/``f`` as a reduction dim); elementwise ops, norms
and residual adds stay replicated there. On data-parallel axes every op splits its batch ``b``.
"""

from __future__ import annotations

from planner.cost.operators import input_layouts, op_cost, output_layouts
from planner.cost.records import seconds
from planner.cost.redistribution import edge_cost
from planner.errors import SettingsError
from planner.cluster.mesh import Mesh, MeshAxis
from planner.ir.ops import REGISTRY
from planner.cost.problem import Problem
from planner.cost.strategy import (
    Strategy,
    divides,
    enumerate_strategies,
    gradient_target,
    splittable_dims,
)
from planner.search.roles import batch_letters, megatron_letters
from planner.search.fallback import greedy_choice


def is_strategy(op, strategy: Strategy, mesh: Mesh) -> bool:
    """Whether ``strategy`` is one of ``enumerate_strategies(op, mesh)``, without listing them."""
    dims = splittable_dims(op)
    return all(
        dim is None or (axis.size > 1 and dim in dims) for axis, dim in zip(mesh.axes, strategy)
    ) and divides(op.sizes, strategy, mesh)


def drop_until_valid(problem: Problem, op_index: int, wanted: tuple[str | None, ...]) -> Strategy:
    """The wanted per-axis dims, dropping (to None) any axis whose wish is not valid for the op."""
    op, mesh = problem.ops[op_index].op, problem.mesh
    strategy = tuple(wanted)
    if is_strategy(op, strategy, mesh):
        return strategy
    for ax in range(len(strategy)):  # drop wishes one axis at a time, innermost first
        ax = len(strategy) - 1 - ax
        strategy = strategy[:ax] + (None,) + strategy[ax + 1 :]
        if is_strategy(op, strategy, mesh):
            return strategy
    return tuple(None for _ in strategy)


def data_parallel(problem: Problem) -> tuple[Strategy, ...]:
    """Split the batch dim on every mesh axis (replicate where the batch does not divide)."""
    n = len(problem.mesh.axes)
    return tuple(
        drop_until_valid(problem, i, (batch,) * n)
        for i, batch in enumerate(batch_letters(problem.graph))
    )


def megatron(problem: Problem, tensor_axis: int = -1) -> tuple[Strategy, ...]:
    """Megatron-LM tensor parallelism on ``tensor_axis``, data parallelism on the others."""
    n = len(problem.mesh.axes)
    tensor_axis %= n
    batches = batch_letters(problem.graph)
    ops, mesh = [t.op for t in problem.ops], problem.mesh

    def wish(i: int, letter: str | None) -> tuple[str | None, ...]:
        return tuple(letter if ax == tensor_axis else batches[i] for ax in range(n))

    letters = megatron_letters(problem.graph, lambda i, d: is_strategy(ops[i], wish(i, d), mesh))
    if problem.settings.sequence_parallel:
        letters = _sequence_letters(
            problem.graph, letters, lambda i: is_strategy(ops[i], wish(i, "s"), mesh)
        )
    return tuple(drop_until_valid(problem, i, wish(i, letter)) for i, letter in enumerate(letters))


def _sequence_letters(graph, letters, valid) -> tuple[str | None, ...]:
    """Megatron-LM's sequence parallelism (Korthikanti et al. 2022, section 4.2.2): the operators
    that tensor parallelism leaves replicated (norms, dropouts, residual adds) split the sequence
    ``s`` over the tensor-parallel ranks instead, so what they save, and the layer input a full
    recompute checkpoints, is kept 1/t (megatron/core/tensor_parallel/layers.py gathers it again
    before a column-parallel GEMM and reduce-scatters after a row-parallel one). Read off the zoo's
    letters; an imported graph keeps them replicated."""
    if graph.dim_names != "semantic":
        return tuple(letters)
    return tuple(
        "s" if letter is None and "s" in op.sizes and valid(i) else letter
        for i, (op, letter) in enumerate(zip(graph.operators, letters))
    )


# ---------------------------------------------------------------- D-Rec's recursion on our cost
# model


def _virtual_mesh(mesh: Mesh) -> tuple[Mesh, list[int]]:
    """Split every axis of size 2^k into k levels of size 2 (same link); returns level -> real
    axis."""
    axes, owner = [], []
    for ax, axis in enumerate(mesh.axes):
        size, k = axis.size, 0
        while size % 2 == 0 and size > 1:
            size //= 2
            k += 1
        if size != 1:
            raise SettingsError(
                f"--mesh: drec-cost needs power-of-two axis sizes, {axis.name} has {axis.size}"
            )
        for level in range(k):
            axes.append(MeshAxis(f"{axis.name}_{level}", 2, axis.bandwidth, axis.latency))
            owner.append(ax)
    return Mesh(tuple(axes)), owner


def _drec_level(problem, vmesh, level: int, visit, light, neighbours, assign, splittable) -> None:
    """One level of D-Rec: each operator in ``visit`` order picks the dim to halve at ``level``
    (``assign[i][level]``), its light neighbours following at once."""
    ops, levels = [t.op for t in problem.ops], len(vmesh.axes)
    decided: set[int] = set()

    def decide(i: int) -> None:
        best = None
        for dim in [None] + splittable[i]:
            trial = tuple(assign[i][:level]) + (dim,) + (None,) * (levels - level - 1)
            if divides(ops[i].sizes, trial, vmesh):
                cost = _level_cost(problem, vmesh, i, trial, assign, decided, neighbours[i], level)
                if best is None or cost < best[0]:
                    best = (cost, dim)
        assign[i][level] = best[1]
        decided.add(i)

    for i in visit:
        if i in decided:
            continue
        decide(i)
        frontier = [i]
        while frontier:  # light neighbours follow the decision at once
            j = frontier.pop()
            for e in neighbours[j]:
                k = e.dst if e.src == j else e.src
                if light[k] and k not in decided:
                    decide(k)
                    frontier.append(k)


def drec_cost(problem: Problem, order: str = "weight") -> tuple[Strategy, ...]:
    """D-Rec's level loop on the planner's own cost model (``--method drec-cost``; SAPP is
    ``sapp``).

    Level by level (each mesh axis of size 2^k is k halvings), every searched operator, visited in
    decreasing FLOPs (``order="weight"``) or topological order, picks the one dim to halve that
    minimises its own symbolic cost plus redistribution against neighbours already decided at this
    level; right after each decision, the light operators (elementwise, norms, views) reachable
    through light operators take the cheapest dim given their decided neighbours, i.e. they follow
    the searched operator, so the next searched operator sees the layouts it must meet.
    Departure from SMSG (documented): our strategies give each mesh axis one dim, so when the
    halvings of one axis chose different dims, the axis keeps the dim of the most halvings (the
    earliest on ties).
    """
    vmesh, owner = _virtual_mesh(problem.mesh)
    ops = [t.op for t in problem.ops]
    light = [REGISTRY[op.kind].light for op in ops]
    searched = [i for i in range(len(ops)) if not light[i]]
    if order == "weight":
        searched.sort(key=lambda i: (-ops[i].flops, i))
    visit = searched + [i for i in range(len(ops)) if light[i]]
    neighbours = _edge_lists(problem)
    levels = len(vmesh.axes)
    assign = [[None] * levels for _ in ops]
    splittable = [splittable_dims(op) for op in ops]
    for level in range(levels):
        _drec_level(problem, vmesh, level, visit, light, neighbours, assign, splittable)
    return tuple(_collapse(problem, i, assign[i], owner) for i in range(len(ops)))


def _edge_lists(problem: Problem) -> list[list]:
    lists: list[list] = [[] for _ in problem.ops]
    # D-Rec's levels see producer -> consumer edges; ties are costed with the plan
    for e in problem.edges:
        lists[e.src].append(e)
        lists[e.dst].append(e)
    return lists


def _level_cost(
    problem: Problem,
    vmesh: Mesh,
    i: int,
    trial: tuple,
    assign,
    decided: set[int],
    edges,
    level: int,
) -> float:
    table = problem.ops[i]
    cost = seconds(
        op_cost(table.op, trial, vmesh, problem.settings, table.inputs, problem.profile),
        vmesh,
        problem.profile,
    )
    for e in edges:
        other = e.dst if e.src == i else e.src
        if other not in decided:
            if e.src == i:  # SMSG charges an operator the reduction of its own Partial output
                a = output_layouts(table.op, trial)[e.src_slot]
                info = problem.ops[e.dst].inputs[e.dst_slot]
                cost += seconds(
                    edge_cost(
                        info.shape, info.elem_bytes, a, gradient_target(a), vmesh.shape, False
                    ),
                    vmesh,
                    problem.profile,
                )
            continue
        other_strategy = tuple(assign[other][: level + 1]) + (None,) * (len(trial) - level - 1)
        src, dst = (trial, other_strategy) if e.src == i else (other_strategy, trial)
        info = problem.ops[e.dst].inputs[e.dst_slot]
        a = output_layouts(problem.ops[e.src].op, src)[e.src_slot]
        b = input_layouts(problem.ops[e.dst].op, dst, problem.ops[e.dst].inputs)[e.dst_slot]
        cost += seconds(
            edge_cost(info.shape, info.elem_bytes, a, b, vmesh.shape, info.edge_grad),
            vmesh,
            problem.profile,
        )
    return cost


def _collapse(problem: Problem, i: int, levels: list, owner: list[int]) -> Strategy:
    out = []
    for ax in range(len(problem.mesh.axes)):
        dims = [d for d, o in zip(levels, owner) if o == ax]
        counts = {d: dims.count(d) for d in dims}
        out.append(max(dims, key=lambda d: (counts[d], -dims.index(d))) if dims else None)
    strategy = tuple(out)
    return (
        strategy
        if strategy in enumerate_strategies(problem.ops[i].op, problem.mesh)
        else drop_until_valid(problem, i, strategy)
    )


def greedy(problem: Problem) -> tuple[Strategy, ...]:
    """Topological order; each operator takes its locally cheapest strategy given its producers."""
    return tuple(t.strategies[c] for t, c in zip(problem.ops, greedy_choice(problem)))
