"""Compute time of one operator on one device: a roofline with GEMM quantisation (issue 16).

For an operator under a strategy, with its local (sharded) dim sizes, on a device with tensor peak
P, large-GEMM efficiency e, vector (non-tensor) peak P_v, HBM bandwidth W, S streaming
multiprocessors and launch overhead k::

    contraction:  t = max(F / (P * e * q(M, N, K, G)), bytes / W) + k
    other ops:    t = max(F / P_v, bytes / W) + k             (memory-bound in practice)
    views:        t = 0                                       (no kernel: a reshape is metadata)

F is the local FLOP count; bytes the local bytes the kernel reads and writes (its inputs and
outputs). A contraction is G independent GEMMs of an M x N output reduced over K: M are the
output dims not in the second operand, N the output dims of the second operand only, K the
reduced dims of the second operand, G the dims all three share. ``q`` is the fraction of executed
work that is useful when the output is cut into T x T tiles run in waves of S tiles, and K is
padded to the next multiple of T_k (tile and wave quantisation):

    q = (M N G) / (ceil(ceil(M/T) ceil(N/T) G / S) * S * T^2)  *  K / (ceil(K / T_k) T_k)

so thin tensor-parallel shards and small micro-batches lose efficiency the way they do on GPUs. The
backward pass of a contraction is two GEMMs of F x backward_factor / 2 FLOPs each, with their own
quantisation: the data gradient (M x K over N) and the second operand's gradient (K x N over M, G of
them); the backward of any other op moves twice its forward bytes (read the output gradient and the
saved input, write the input gradient) and launches two kernels. With ``roofline`` off in the
profile, or without an HBM bandwidth (a user profile that lacks it), t = F / (P * efficiency): the
datasheet-only model of cost model v1.

Under ``dtype fp8`` a linear layer's GEMMs (a contraction with a parameter operand inside the
repeated layers) run at the FP8 tensor peak P8 with the same efficiency and quantisation, and pay
Transformer Engine's casts (``transformer_engine/common/transpose/cast_transpose.cu``: one fused
kernel reads a bf16 tensor, records its amax for the per-tensor scale, and writes the FP8 copy and
its transpose, each half the bf16 bytes; the transpose feeds the weight-gradient GEMM)::

    forward:   t = max(F / (P8 * e * q), bytes / W) + k + 2 * in_bytes / W + (inputs) k
    backward:  the two GEMMs at P8, plus 2 * out_bytes / W + k  (the output gradient's cast)

in_bytes: the local bf16 bytes of the GEMM's inputs; out_bytes: of its output (its gradient has the
same size). The attention core, the embedding and layers outside the repeated ones stay bf16 (TE's
FP8 covers the transformer layers' linear modules; Megatron-LM's output layer is not one of them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cluster.mesh import Mesh
from planner.cluster.profiles import MachineProfile
from planner.cost.strategy import Strategy
from planner.ir.graph import Operator
from planner.ir.ops import REGISTRY

TILE = 128  # output tile edge of the large cuBLAS/CUTLASS BF16 kernels (documented assumption)
K_TILE = 64  # reduction step of those kernels


@dataclass(frozen=True, slots=True)
class Fp8Casts:
    """An FP8 GEMM's casts: the local bytes (at the storage dtype) of its inputs, cast before the
    forward GEMM, and of its output, whose gradient is cast before the backward GEMMs."""

    input_bytes: float
    output_bytes: float


@dataclass(frozen=True, slots=True)
class ComputeTime:
    """Seconds of one operator on one device: forward and backward of one pass."""

    fwd_s: float
    bwd_s: float


def local_sizes(op: Operator, strategy: Strategy, mesh: Mesh) -> dict[str, int]:
    sizes = dict(op.sizes)
    for axis, dim in zip(mesh.axes, strategy):
        if dim is not None:
            sizes[dim] //= axis.size
    return sizes


def gemm_shape(op: Operator, sizes: dict[str, int]) -> tuple[int, int, int, int]:
    """(M, N, K, G) of a contraction's local GEMMs (see the module docstring). Fused attention: its
    q k^T product (queries x keys over the head dim, per batch and head); the second product has the
    same work."""
    prod = lambda dims: math.prod(sizes[d] for d in dims)
    if op.kind == "attention":
        query, key = list(op.inputs[0].op_dims()), set(op.inputs[1].op_dims())
        head = query[-1]
        return (
            prod(set(query) - key),
            prod(key - set(query)),
            sizes[head],
            prod((set(query) & key) - {head}),
        )
    first = set(op.inputs[0].op_dims())
    second = set(op.inputs[1].op_dims()) if len(op.inputs) > 1 else set()
    out = set(op.outputs[0].op_dims())
    return (
        prod(out - second),
        prod(out & second - first),
        prod(second - out),
        prod(out & first & second),
    )


def quantisation(m: int, n: int, k: int, g: int, sm_count: int) -> float:
    """Useful fraction of the tile-and-wave work of G GEMMs M x N over K (1 when S is unknown)."""
    if sm_count <= 0:
        return 1.0
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * g
    waves = math.ceil(tiles / sm_count)
    return (m * n * g) / (waves * sm_count * TILE * TILE) * k / (math.ceil(k / K_TILE) * K_TILE)


def contraction_seconds(
    flops: float,
    m: int,
    n: int,
    k: int,
    g: int,
    profile: MachineProfile,
    backward_factor: float,
    fp8: bool = False,
) -> tuple[float, float]:
    """Forward and backward compute seconds of a contraction's GEMMs (no memory term); ``fp8``:
    at the FP8 tensor peak."""
    rate = (profile.fp8_flops if fp8 else profile.peak_flops) * profile.gemm_efficiency
    fwd = flops / (rate * quantisation(m, n, k, g, profile.sm_count))
    half = flops * backward_factor / 2  # data gradient and weight gradient: equal FLOPs
    dgrad = half / (rate * quantisation(m, k, n, g, profile.sm_count))
    wgrad = half / (rate * quantisation(k, n, m, g, profile.sm_count))
    return fwd, dgrad + wgrad


def op_seconds(
    op: Operator,
    strategy: Strategy,
    mesh: Mesh,
    profile: MachineProfile,
    flops: float,
    io_bytes: float,
    fp8: Fp8Casts | None = None,
) -> ComputeTime:
    """Forward and backward seconds of one pass of ``op`` on one device (``flops`` and ``io_bytes``
    local to the device); ``fp8``: a linear layer's GEMMs in FP8 and their casts (module text)."""
    if not (profile.roofline and profile.hbm_bandwidth > 0):
        peak = profile.fp8_flops if fp8 is not None else profile.peak_flops
        rate = peak * profile.efficiency
        return ComputeTime(flops / rate, flops * op.backward_factor / rate)
    family = REGISTRY[op.kind].category
    if family == "view":
        return ComputeTime(0.0, 0.0)
    memory_s = io_bytes / profile.hbm_bandwidth
    launch = profile.kernel_launch_s
    if family == "contraction" and len(op.inputs) > 1:
        m, n, k, g = gemm_shape(op, local_sizes(op, strategy, mesh))
        fwd, bwd = contraction_seconds(
            flops, m, n, k, g, profile, op.backward_factor, fp8 is not None
        )
        cast_fwd, cast_bwd = (0.0, 0.0) if fp8 is None else _cast_seconds(op, fp8, profile)
        return ComputeTime(
            max(fwd, memory_s) + launch + cast_fwd, max(bwd, 2 * memory_s) + 2 * launch + cast_bwd
        )
    vector = profile.vector_flops if profile.vector_flops > 0 else profile.peak_flops
    fwd = flops / vector
    return ComputeTime(
        max(fwd, memory_s) + launch, max(fwd * op.backward_factor, 2 * memory_s) + 2 * launch
    )


def _cast_seconds(op: Operator, fp8: Fp8Casts, profile: MachineProfile) -> tuple[float, float]:
    """Forward and backward seconds of an FP8 GEMM's fused cast-transposes: each reads its bf16
    tensor and writes two FP8 copies of half its bytes (module text), one kernel per tensor."""
    launch = profile.kernel_launch_s
    return (
        2 * fp8.input_bytes / profile.hbm_bandwidth + len(op.inputs) * launch,
        2 * fp8.output_bytes / profile.hbm_bandwidth + launch,
    )
