"""A lower bound on the iteration time of every configuration of the 3D space: the proof behind a
3D plan's gap (``Plan3D.lower_bound_s``, ``Plan3D.gap``).

    T(config) >= (1 / W) sum_devices busy(device)                 the step's last device finishes
              >= (1 / W) sum_ops c(op, whole batch, one device)    each op's work is done somewhere

    c(op) = w (t_fwd + t_bwd) of the op unsharded on one device over the whole global batch, without
            recompute (``planner.cost.compute``: a roofline with tile and wave quantisation)

Why the second step holds for every configuration (pipeline degree and cuts, stage mesh, stage
plan, data/tensor parallel degrees, micro-batch size and count, ZeRO, SP, recompute, schedule):
- splitting an op k ways (over a stage's devices, data-parallel replicas or micro-batches) leaves
  each piece at least 1/k of the whole's seconds: its FLOPs and bytes are at least 1/k of the
  whole's, and the quantised work of a GEMM whose dim D becomes D/k takes ceil(D/(kT)) >=
  ceil(D/T)/k tiles (the same for waves and the reduction step), so the pieces' seconds add up to
  at least the whole's; a replicated piece costs the whole;
- a stage's time per micro-batch is its compute plus exposed communication (hidden communication
  is never more than the communication), recompute adds, and a schedule runs every micro-batch of
  a stage on its devices one after another (1F1B, GPipe, interleaved: at least M x the stage's
  time per micro-batch).
What the bound leaves out (communication, bubbles, recompute, the optimizer step, the imbalance
between stages) is the gap: a plan within x% of the bound is within x% of the optimum of the whole
space. ``tests/test_bound.py`` checks it on hand-computed numbers and against every fitting point
of the practitioner's grid.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cluster.mesh import Mesh, MeshAxis
from planner.cluster.profiles import MachineProfile
from planner.cost.settings import AUTO, TrainingSettings
from planner.cost.terms import plan_terms
from planner.ir.graph import Graph


def compute_bound(
    graph: Graph,
    devices: int,
    profile: MachineProfile,
    settings: TrainingSettings,
    recompute: bool = False,
) -> float:
    """Seconds no configuration of ``devices`` devices can beat for one step of ``graph`` (built at
    the whole global batch) under ``settings``' dtype: the sum over operators of their forward and
    backward seconds on one device, over the device count (see the module docstring).
    ``recompute``: the bound of the configurations that run ``settings.recompute`` (the forward
    passes it re-runs are work too)."""
    one = Mesh((MeshAxis("one", 1, 1.0, 0.0),))
    plain = replace(settings, zero=0, layer_zero=(), sequence_parallel=False)
    if not recompute or settings.recompute != AUTO:  # AUTO: the re-runs given per layer
        mode = settings.recompute if recompute else "none"
        plain = replace(plain, recompute=mode, layer_recompute=())
    terms = plan_terms(graph, one, profile, plain, [(None,)] * len(graph.operators))
    seconds = sum(record.fwd_s + record.bwd_s for record in terms.ops)
    return profile.compute_weight * seconds / devices


def pipeline_factor(stages: int, chunks: int, max_count: int) -> float:
    """What a pipeline of ``stages`` stages (``chunks`` model chunks per device) multiplies the
    bound by at ``max_count`` micro-batches at most: with T = sum_k T_k / v + (M - 1/v) max_k T_k
    (``planner.pipeline.schedule``) and sum_k T_k >= p x bound / M (the stages share the work),
    T >= bound x (1 + (p - 1) / (v M))."""
    return 1.0 + (stages - 1) / (chunks * max_count)
