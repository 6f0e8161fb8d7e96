"""Gradient accumulation for flat plans: the micro-batch count searched with the plan.

A flat plan of M micro-batches (``api.plan(..., num_microbatches=M)``) costs the graph of one
micro-batch (batch / M samples) and repeats its passes M times; the gradient sync and the
optimizer step run once a step, and memory holds one micro-batch's activations
(``planner.cost.records.accumulated``)::

    time(plan, M) = M * (forward + backward + their collectives - hidden) + sync + optimizer
    memory(plan, M) = state + activations(batch / M)

``plan_counts`` solves the plan at every count that divides the batch and keeps the fastest that
fits: each count's plan is its method's (OPTIMAL for the exact methods), so the pair is optimal
over the counts tried when every count's plan is.
"""

from __future__ import annotations

from dataclasses import replace

from planner import api
from planner.errors import SettingsError
from planner.pipeline.threed import divisors
from planner.plans import Plan


def plan_counts(model, mesh="8", device="a100-80g", *, batch=None, seq=None, **options) -> Plan:
    """The fastest fitting plan over every micro-batch count that divides the batch (``options``:
    those of ``api.plan``). None fits: the count with the least memory, as the search said."""
    total = api.resolve_model(model, batch, seq).batch_size
    plans = []
    for count in divisors(total):
        try:
            found = api.plan(
                model, mesh, device, batch=batch, seq=seq, num_microbatches=count, **options
            )
        except SettingsError:  # a split that no longer divides the micro-batch
            continue
        plans.append(found)
    if not plans:
        raise SettingsError(f"--num-microbatches: no count divides the batch {total}")
    fitting = [p for p in plans if p.found and p.fits_memory]
    best = min(fitting, key=lambda p: p.estimated_step_time_s) if fitting else plans[-1]
    tried = ", ".join(str(p.num_microbatches) for p in plans)
    note = f"micro-batch counts tried: {tried}; {len(fitting)} fit"
    return replace(best, notes=best.notes + (note,))
