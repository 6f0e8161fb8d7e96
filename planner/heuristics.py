"""Hand-written plans used as baselines and for ``planner evaluate``.

``megatron``: tensor parallel on the chosen (fastest, innermost by default) mesh axis with
Megatron-LM's pattern, data parallel on every other axis. The pattern is read off the zoo's dim
names: on the tensor-parallel axis an operator splits its first dim among heads ``a``, ffn ``f``,
vocab ``v`` and experts ``e`` (column-parallel QKV/fc1 and row-parallel proj/fc2 fall out of
the einsums: the row-parallel ops split ``a``/``f`` as a reduction dim); elementwise ops, norms
and residual adds stay replicated there. On data-parallel axes every op splits its batch ``b``.
"""

from __future__ import annotations

from planner.problem import Problem
from planner.strategy import Strategy, enumerate_strategies

TENSOR_PARALLEL_DIMS = ("a", "f", "v", "e")
BATCH_DIM = "b"


def _rule_strategy(problem: Problem, op_index: int, wanted: tuple[str | None, ...]) -> Strategy:
    """The wanted per-axis dims, dropping (to None) any axis whose wish is not valid for the op."""
    table = problem.ops[op_index]
    valid = set(enumerate_strategies(table.op, problem.mesh))
    strategy = tuple(wanted)
    if strategy in valid:
        return strategy
    for ax in range(len(strategy)):  # drop wishes one axis at a time, innermost first
        ax = len(strategy) - 1 - ax
        strategy = strategy[:ax] + (None,) + strategy[ax + 1:]
        if strategy in valid:
            return strategy
    return tuple(None for _ in strategy)


def data_parallel(problem: Problem) -> tuple[Strategy, ...]:
    """Split the batch dim on every mesh axis (replicate where the batch does not divide)."""
    n = len(problem.mesh.axes)
    out = []
    for i, table in enumerate(problem.ops):
        dims = table.op.sizes
        out.append(_rule_strategy(problem, i, tuple(BATCH_DIM if BATCH_DIM in dims else None for _ in range(n))))
    return tuple(out)


def megatron(problem: Problem, tensor_axis: int = -1) -> tuple[Strategy, ...]:
    """Megatron-LM tensor parallelism on ``tensor_axis``, data parallelism on the others."""
    n = len(problem.mesh.axes)
    tensor_axis %= n
    out = []
    for i, table in enumerate(problem.ops):
        dims = table.op.sizes
        splittable = set(enumerate_strategies(table.op, problem.mesh))
        wanted = [BATCH_DIM if BATCH_DIM in dims else None for _ in range(n)]
        wanted[tensor_axis] = None
        for dim in TENSOR_PARALLEL_DIMS:
            trial = list(wanted)
            trial[tensor_axis] = dim
            if dim in dims and tuple(trial) in splittable:
                wanted = trial
                break
        out.append(_rule_strategy(problem, i, tuple(wanted)))
    return tuple(out)
