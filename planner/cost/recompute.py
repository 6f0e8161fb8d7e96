"""What recompute re-runs: the operators of each layer by its mode, the attention core that
selective recompute drops (Korthikanti et al. 2022) and what torchtitan's operator policy keeps."""

from __future__ import annotations

from planner.cost.settings import TrainingSettings
from planner.ir.graph import Graph
from planner.ir.ops import REGISTRY


def recompute_modes(graph: Graph, settings: TrainingSettings) -> dict[str, str]:
    """Per operator, its recompute mode (per layer under 'auto'). In a model with layers only the
    layers re-run: Megatron-LM checkpoints the transformer layers (transformer_block.py) and
    torchtitan wraps each TransformerBlock, so embedding, final norm, head and loss keep theirs."""
    layered = any(op.layer is not None for op in graph.operators)
    return {
        op.name: settings.recompute_at(op.layer) if op.layer is not None or not layered else "none"
        for op in graph.operators
    }


def attention_core(graph: Graph) -> frozenset[str]:
    """The tensors selective recompute drops (Korthikanti et al. 2022): each softmax's computed
    input (the attention scores), its output, and what elementwise ops (dropout) make of that
    output before a contraction reads it. Their producers are re-run in the backward pass."""
    produced = {o.tensor for op in graph.operators for o in op.outputs}
    core: set[str] = set()
    for op in graph.operators:  # graph order is topological
        category = REGISTRY[op.kind].category
        if op.kind == "softmax":
            core.update(
                o.tensor
                for o in op.inputs
                if o.tensor in produced and graph.tensor(o.tensor).role != "param"
            )
            core.update(o.tensor for o in op.outputs)
        elif category == "elementwise" and len(op.inputs) == 1 and op.inputs[0].tensor in core:
            core.update(o.tensor for o in op.outputs)
    return frozenset(core)


# torchtitan's SelectiveAC (torchtitan/distributed/activation_checkpoint.py, _get_default_save_ops
# and the policy of SelectiveAC._wrap_block): a layer keeps the outputs of compute-intensive and
# communication operators and re-runs the rest, except that of its weight matmuls (aten.mm and
# aten.linear, counted from 1 in forward order within the layer) it keeps only the odd ones.
WEIGHT_MATMULS = ("linear", "matmul", "einsum")


def operator_policy_kept(graph: Graph) -> frozenset[str]:
    """The operators whose outputs torchtitan's operator policy keeps: every contraction (the
    attention kernel, batched matmuls, convolutions, MoE dispatch) but, of each layer's weight
    matmuls, the 1st, 3rd, 5th... (a LLaMA block keeps q, v, gate and down projections and re-runs
    k, o and up)."""
    kept, count = set(), {}
    for op in graph.operators:  # graph order is the forward order
        if REGISTRY[op.kind].category != "contraction":
            continue
        if op.kind in WEIGHT_MATMULS and any(
            graph.tensor(o.tensor).role == "param" for o in op.inputs
        ):
            count[op.layer] = count.get(op.layer, 0) + 1
            if count[op.layer] % 2 == 0:
                continue
        kept.add(op.name)
    return frozenset(kept)


def policy_outputs(graph: Graph, mode: dict[str, str], kept: frozenset[str]) -> dict[str, bool]:
    """Under torchtitan's operator policy (``selective-op``): per tensor made in such a layer,
    whether the policy keeps it (its maker is in ``kept``: ``recompute.operator_policy_kept``)."""
    return {
        o.tensor: op.name in kept
        for op in graph.operators
        if mode[op.name] == "selective-op"
        for o in op.outputs
    }


def kept_for_backward(tensor, mode: str, core: frozenset[str], policy: dict[str, bool]) -> bool:
    """Whether a saved input of an operator under recompute ``mode`` is kept for the backward
    pass: full keeps layer inputs only, selective all but the attention core, the operator
    policy layer inputs and what its kept operators make."""
    if mode == "full":
        return tensor.checkpoint
    if mode == "selective-op":
        return tensor.checkpoint or policy.get(tensor.name, True)
    return tensor.name not in core
