"""Operand facts: per operator, what the cost model needs to know of each input under the
training settings (shape, role, whether it needs a gradient, bytes per element, whether this
operator keeps its memory, recompute, the ZeRO stage of a parameter), and the signature that lets
identical operators (the layers of a model) share one costing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from planner.cost.recompute import (
    attention_core,
    kept_for_backward,
    operator_policy_kept,
    policy_outputs,
    recompute_modes,
)
from planner.cost.settings import INTEGER_BYTES, TrainingSettings
from planner.ir.graph import Graph, Operator
from planner.ir.ops import REGISTRY


@dataclass(frozen=True, slots=True)
class OperandInfo:
    """Facts of one operator input that the cost model needs from the graph."""

    shape: tuple[int, ...]
    role: str
    needs_grad: bool
    elem_bytes: int
    counts_memory: bool  # this op owns the tensor's parameter state or saved activation
    # the op sums its input to a scalar: the input's gradient is a broadcast
    grad_free: bool = False
    # bytes per element the op keeps when it saves this input (a dropout mask: 1)
    saved_bytes: int = 0
    rerun: bool = False  # the op reading this input is re-run in the backward pass (recompute)
    zero: int = 0  # the ZeRO stage of this parameter (its layer's, under zero 'auto')

    @property
    def edge_grad(self) -> bool:
        """Whether the edge into this input carries a gradient back that may need moving. The
        gradient of a full sum is the (replicated) scalar's gradient broadcast, which every device
        materialises locally in whatever layout the producer needs (XLA emits no collective)."""
        return self.needs_grad and not self.grad_free


def operand_infos(
    graph: Graph, settings: TrainingSettings
) -> Mapping[str, tuple[OperandInfo, ...]]:
    """Per operator, its inputs' facts. A tensor's memory is counted once, at its first consumer;
    what recompute drops is not kept (full: all but layer inputs; selective: the attention core).
    Built once per (graph, settings) and shared: read it, never change it."""
    return graph.derived(
        ("operand_infos", *infos_settings(settings)), lambda: _operand_infos(graph, settings)
    )


def infos_settings(settings: TrainingSettings) -> tuple:
    """The settings ``operand_infos`` reads (precision, recompute and ZeRO, per layer too): the
    variants of a 3D search that differ elsewhere (sequence parallelism, overlap) share them."""
    return (
        settings.dtype,
        settings.recompute,
        settings.layer_recompute,
        settings.zero,
        settings.layer_zero,
    )


def _operand_infos(graph: Graph, settings: TrainingSettings) -> dict[str, tuple[OperandInfo, ...]]:
    mode = recompute_modes(graph, settings)
    core = attention_core(graph) if "selective" in mode.values() else frozenset()
    # the core of the selective layers only
    core = frozenset(
        t
        for op in graph.operators
        if mode[op.name] == "selective"
        for o in op.outputs
        if (t := o.tensor) in core
    )
    rerun_ops = {op.name for op in graph.operators if any(o.tensor in core for o in op.outputs)}
    kept_ops = operator_policy_kept(graph) if "selective-op" in mode.values() else frozenset()
    policy = policy_outputs(graph, mode, kept_ops)
    rerun_ops |= {op.name for op in graph.operators if mode[op.name] == "selective-op"} - kept_ops
    owner: dict[str, str] = {}
    for op in graph.operators:
        for operand in op.inputs:
            t = graph.tensor(operand.tensor)
            if t.role == "param" or (
                operand.saved and kept_for_backward(t, mode[op.name], core, policy)
            ):
                owner.setdefault(t.name, op.name)
            elif mode[op.name] == "selective-op" and policy.get(t.name):
                # the policy caches the output whether or not the backward pass reads it
                owner.setdefault(t.name, op.name)
    infos = {}
    grads = graph.grad_tensors()
    for op in graph.operators:
        row = []
        full_sum = op.kind == "reduce" and all(not o.dims for o in op.outputs)
        saved_bytes = REGISTRY[op.kind].saved_bytes
        rerun = mode[op.name] == "full" or op.name in rerun_ops
        for operand in op.inputs:
            t = graph.tensor(operand.tensor)
            row.append(
                OperandInfo(
                    t.shape,
                    t.role,
                    t.name in grads,
                    INTEGER_BYTES if t.integer else settings.elem_bytes,
                    owner.get(t.name) == op.name,
                    full_sum,
                    saved_bytes,
                    rerun,
                    settings.zero_at(op.layer) if t.role == "param" else 0,
                )
            )
        infos[op.name] = tuple(row)
    return infos


def op_signature(op: Operator, infos: tuple[OperandInfo, ...]) -> tuple:
    """What ``op_cost`` reads of an operator: operators with equal signatures cost the same under
    every strategy (the identical layers of a model share one costing)."""
    return (
        op.kind,
        op.dims,
        tuple((o.dims, o.saved) for o in op.inputs),
        tuple(o.dims for o in op.outputs),
        op.flops,
        op.backward_factor,
        op.unsplittable,
        op.norm_dims,
        op.norm_stats,
        infos,
    )


def signature_ids(graph: Graph, settings: TrainingSettings) -> tuple[int, ...]:
    """Per operator, a small id, equal for operators with equal ``op_signature`` under these
    settings (built once per graph and settings: a plan walk then hashes ints, not signatures)."""

    def build() -> tuple[int, ...]:
        infos, ids = operand_infos(graph, settings), {}
        return tuple(
            ids.setdefault(op_signature(op, infos[op.name]), len(ids)) for op in graph.operators
        )

    return graph.derived(("signature_ids", *infos_settings(settings)), build)
