"""What the baselines split in each operator: its batch letter and Megatron's tensor-parallel
letter.

On the zoo's graphs (``Graph.dim_names == "semantic"``) both are read off the letters (``b``; heads
``a``, ffn ``f``, vocabulary ``v``, experts ``e``). An imported graph names its letters by position
in each operator (``positional``): a view that merges batch and sequence calls the merged dim ``a``,
and ``a`` elsewhere is the sequence. So on such graphs both are found by following the data flow:

    batch      a data tensor whose first axis has the batch size carries the batch there; an
               operator's batch letter is the leading letter of the group that an input's batch
               axis maps to; an output carries the batch on the group that letter leads.
    megatron   Megatron-LM's pattern, found instead of read. An operator with a weight matrix is
               row-parallel when an input descends from a column-parallel operator that no
               row-parallel one has closed: it splits a contraction letter (the one the input
               arrives split on, if any), so its output is a partial sum and nothing below follows.
               Otherwise it is column-parallel: it splits the weight's output letter. The token
               embedding splits its table's vocabulary (Megatron's vocabulary-parallel embedding; a
               contraction); a position embedding (its ids do not carry the batch) stays
               replicated. Any other operator follows the split of its first split input, on the
               leading letter of that axis' group, when that is a valid split and not a dim it
               normalises over; else it stays replicated and its outputs are unsplit. So the loss
               reads gathered logits: unlike the zoo's rule (and Megatron's vocabulary-parallel
               cross entropy), because the torch referee runs no split normalisation.

Limitation (documented): a fused projection whose output is cut into pieces along the split dim
(GPT-2's ``c_attn`` -> q, k, v) cannot keep the split, since a merged group may only split its
leading letter (the piece index, 3); Megatron interleaves the weight for this, which a layout cannot
say.
"""

from __future__ import annotations

from typing import Callable

from planner.cost.strategy import splittable_dims
from planner.ir.graph import Graph, Operator

TENSOR_PARALLEL_DIMS = ("a", "f", "v", "e")  # the zoo's heads, ffn, vocabulary, experts


def batch_letters(graph: Graph) -> tuple[str | None, ...]:
    """Per operator (graph order), the letter that carries the batch, or None."""
    if graph.dim_names == "semantic":
        return tuple(
            graph.batch_dim if graph.batch_dim in op.sizes else None for op in graph.operators
        )
    batch = graph.batch_size
    axis_of = {
        t.name: 0 for t in graph.tensors if t.role == "data" and t.shape and t.shape[0] == batch
    }
    out = []
    for op in graph.operators:
        letter = next(
            (o.dims[axis_of[o.tensor]][0] for o in op.inputs if o.tensor in axis_of), None
        )
        out.append(letter)
        for operand in op.outputs:
            axis = next(
                (
                    k
                    for k, group in enumerate(operand.dims)
                    if letter is not None and group[0] == letter
                ),
                None,
            )
            if axis is not None:
                axis_of[operand.tensor] = axis
    return tuple(out)


def _weight_letters(graph: Graph, op: Operator) -> tuple[str | None, tuple[str, ...]]:
    """(output letter of the op's weight matrix, its contraction letters); (None, ()) without
    one."""
    weights = [o for o in op.inputs if graph.tensor(o.tensor).role == "param" and len(o.dims) >= 2]
    if not weights:
        return None, ()
    out_letters = {d for o in op.outputs for group in o.dims for d in group}
    act_letters = {
        d
        for o in op.inputs
        if graph.tensor(o.tensor).role != "param"
        for group in o.dims
        for d in group
    }
    weight = [d for group in weights[0].dims for d in group]
    produced = next((d for d in weight if d in out_letters and d not in act_letters), None)
    return produced, tuple(d for d in weight if d not in out_letters)


def megatron_letters(graph: Graph, valid: Callable[[int, str], bool]) -> tuple[str | None, ...]:
    """Per operator, the letter Megatron's pattern splits on the tensor-parallel axis (see module
    doc). ``valid(op_index, letter)``: whether that split is one of the op's strategies on this
    mesh."""
    if graph.dim_names == "semantic":
        return tuple(
            next((d for d in TENSOR_PARALLEL_DIMS if d in op.sizes and valid(i, d)), None)
            for i, op in enumerate(graph.operators)
        )
    batches = batch_letters(graph)
    # tensor -> the axis that arrives split on the tensor-parallel axis
    split_axis: dict[str, int] = {}
    # tensors below a column-parallel op that no row-parallel op has closed
    open_column: set[str] = set()
    out = []
    for i, op in enumerate(graph.operators):
        arriving = [o.dims[split_axis[o.tensor]] for o in op.inputs if o.tensor in split_axis]
        below_column = any(o.tensor in open_column for o in op.inputs)
        produced, contracted = _weight_letters(graph, op)
        if op.kind == "embedding":  # token ids carry the batch; position ids do not
            letter = op.inputs[1].dims[0][0] if batches[i] is not None else None
        # row-parallel: on the split that arrives, else the weight's input letter
        elif contracted and below_column:
            row = [d for group in arriving for d in group if d in contracted] + list(contracted)
            letter = next((d for d in row if d in splittable_dims(op) and valid(i, d)), None)
        elif produced is not None:
            letter = produced
        else:  # a normalised dim (the loss over a vocabulary-parallel head) is gathered, not split
            letter = arriving[0][0] if arriving and arriving[0][0] not in op.norm_dims else None
        if letter is not None and (letter not in splittable_dims(op) or not valid(i, letter)):
            letter = None
        out.append(letter)
        row_parallel = bool(contracted) and below_column
        if op.kind != "embedding" and (produced is not None or below_column) and not row_parallel:
            open_column.update(o.tensor for o in op.outputs)
        for operand in op.outputs:
            axis = next(
                (
                    k
                    for k, group in enumerate(operand.dims)
                    if letter is not None and group[0] == letter
                ),
                None,
            )
            if axis is not None:
                split_axis[operand.tensor] = axis
    return tuple(out)
