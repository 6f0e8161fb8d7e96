"""A graph at another global batch: what a pipeline's micro-batches and a ``batch=`` given with a
built graph need.

Only the batch dim changes: every operator that has it takes the new size, every tensor's shape is
recomputed from the operands that read or write it (a tensor axis that flattens the batch with
other dims, ``(b, s)``, scales with it), and an operator's flops scale with its batch size, as
they do for every operator with a batch dim (the work is done once per sample). An operator whose
flops the new batch does not divide exactly is refused: its count is not linear in the batch.
"""

from __future__ import annotations

from dataclasses import replace

from planner.errors import GraphError
from planner.ir.graph import Graph, Operator


def rebatched(graph: Graph, batch: int) -> Graph:
    """``graph`` with its batch dim (``graph.batch_dim``) of size ``batch``."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch <= 0:
        raise GraphError(f"--batch: must be a positive integer, got {batch!r}")
    old = graph.batch_size
    if batch == old:
        return graph
    operators = tuple(_rebatched_op(op, graph.batch_dim, old, batch) for op in graph.operators)
    shapes = {}
    for op in operators:
        for operand in op.inputs + op.outputs:
            shapes[operand.tensor] = op.operand_shape(operand)
    tensors = tuple(replace(t, shape=shapes.get(t.name, t.shape)) for t in graph.tensors)
    return replace(graph, tensors=tensors, operators=operators, _index=None)


def _rebatched_op(op: Operator, dim: str, old: int, new: int) -> Operator:
    if dim not in op.sizes:
        return op
    if (op.flops * new) % old:
        raise GraphError(
            f"operator {op.name}: field 'flops' {op.flops} is not linear in the batch "
            f"({old} -> {new}); rebuild the graph at batch {new}"
        )
    dims = tuple((d, new if d == dim else size) for d, size in op.dims)
    return replace(op, dims=dims, flops=op.flops * new // old)
