"""Gradient accumulation in flat plans (planner/accumulation.py, records.accumulated): the passes of
M micro-batches repeat, the gradient sync and the optimizer step run once, memory is one
micro-batch's; equal to the 3D search's cost of one stage with M micro-batches, and exact against
brute force."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from planner import accumulation, api, api3d
from planner.cluster.cluster import make_cluster
from planner.cost.collectives import Collective, collective_seconds
from planner.cost.records import CostRecord, Memory, accumulated, seconds
from planner.cost.settings import TrainingSettings
from planner.plans import make_plan, strategies_from_choice
from planner.search.brute import brute_force
from planner.search.exact import solve_exact


def test_accumulated_repeats_the_passes_and_not_the_step(a100):
    """By hand: 3 micro-batches of a record with 2 ms forward, 4 ms backward (1 ms hidden), a
    forward all-reduce of 1 MB, a gradient reduce-scatter of 8 MB (0.5 ms hidden behind the last
    backward) and a 3 ms optimizer step."""
    mesh = make_cluster("8", a100).mesh
    record = CostRecord(
        fwd_flops=1e9,
        bwd_flops=2e9,
        comm=(
            Collective("fwd", "all_reduce", 0, 1e6),
            Collective("grad", "reduce_scatter", 0, 8e6),
        ),
        memory=Memory(activations=5.0),
        fwd_s=2e-3,
        bwd_s=4e-3,
        opt_s=3e-3,
        hidden_s=1e-3,
        hidden_sync_s=0.5e-3,
    )
    axis = mesh.axes[0]
    ar = collective_seconds("all_reduce", 8, axis.bandwidth, axis.latency, 1e6)
    rs = collective_seconds("reduce_scatter", 8, axis.bandwidth, axis.latency, 8e6)
    step = accumulated(record, 3)
    expected = 3 * (2e-3 + 4e-3 - 1e-3 + ar) + 3e-3 + rs - 0.5e-3
    assert seconds(step, mesh, a100) == pytest.approx(expected, rel=1e-12)
    assert step.memory == record.memory and step.fwd_flops == 3e9
    assert accumulated(record, 1) is record


@pytest.mark.parametrize(
    "settings",
    [
        TrainingSettings(),
        TrainingSettings(zero=3, recompute="full"),
        TrainingSettings(zero=1, fp32_grads=True),
        TrainingSettings(zero=2, overlap="grad"),
    ],
)
@pytest.mark.parametrize("count", [1, 2, 4])
def test_flat_accumulation_equals_one_pipeline_stage(settings, count):
    """The flat plan of M micro-batches costs what the 3D model costs for one stage of the same
    data-parallel plan with M micro-batches (its chain: M passes, one sync)."""
    flat = api.evaluate(
        "gpt2-small", None, "a100-80g", dp=8, batch=32, num_microbatches=count, settings=settings
    )
    staged = api3d.evaluate_3d(
        "gpt2-small", "a100-80g", dp=8, micro_batch=32 // (8 * count), batch=32, settings=settings
    )
    assert flat.num_microbatches == count
    assert flat.estimated_step_time_s == pytest.approx(staged.pipeline.iteration_time_s, rel=1e-12)
    # the flat plan counts no working set (a layer's re-run, the loss's backward buffers)
    (stage,) = staged.stage_details
    assert stage.working_bytes > 0
    assert flat.memory_per_device_bytes == pytest.approx(
        staged.pipeline.max_memory_bytes - stage.working_bytes, rel=1e-12
    )


@pytest.mark.parametrize("count", [2, 4])
def test_the_exact_plan_of_m_micro_batches_equals_brute_force(a100, count):
    """The zoo MLP on 2x2 with a batch of 64 in M micro-batches: the exact search's optimum equals
    the enumeration of every strategy combination under the accumulated objective."""
    cluster = make_cluster("2x2", a100)
    model = "mlp:hidden=512"
    problem = api.make_problem(model, cluster, batch=64, num_microbatches=count)
    best, choice = brute_force(problem)
    found, _ = solve_exact(problem, math.inf)
    assert found.status == "OPTIMAL" and found.objective == best
    plan = make_plan(
        problem, strategies_from_choice(problem, found.choice), method="exact", status="OPTIMAL"
    )
    assert plan.objective == best and plan.num_microbatches == count
    single = api.make_problem(model, cluster, batch=64)
    assert best != brute_force(single)[0]  # the objective is not the one-micro-batch one


def test_auto_keeps_the_fastest_count_that_fits():
    """--num-microbatches auto: at a limit one micro-batch of 16 does not fit, the plan is the
    fastest of the counts that do (each count's plan OPTIMAL)."""
    limit = 1.5 * 2**30
    plans = {
        count: api.plan("gpt2-small", "2x4", batch=16, memory=limit, num_microbatches=count)
        for count in (1, 2, 4, 8, 16)
    }
    assert not plans[1].found or not plans[1].fits_memory
    fitting = [p for p in plans.values() if p.found and p.fits_memory]
    best = accumulation.plan_counts("gpt2-small", "2x4", batch=16, memory=limit)
    assert best.status == "OPTIMAL" and best.fits_memory
    assert best.estimated_step_time_s == min(p.estimated_step_time_s for p in fitting)
    assert "micro-batch counts tried: 1, 2, 4, 8, 16" in best.notes[-1]


def _cli(*words: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "planner", *words], capture_output=True, text=True)


def test_cli_plans_evaluates_and_refuses_micro_batch_counts(tmp_path):
    out = tmp_path / "plan.json"
    done = _cli(
        "plan", "--model", "gpt2-small", "--mesh", "2x4", "--batch", "16",
        "--num-microbatches", "4", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "gradient accumulation: 4 micro-batches" in done.stdout
    data = json.loads(out.read_text())
    assert data["num_microbatches"] == 4
    again = _cli("evaluate", "--plan", str(out), "--json", str(tmp_path / "again.json"))
    assert again.returncode == 0, again.stderr
    recosted = json.loads((tmp_path / "again.json").read_text())
    assert recosted["estimated_step_time_s"] == data["estimated_step_time_s"]
    for words, flag in (
        (("--num-microbatches", "3"), "--num-microbatches"),
        (("--num-microbatches", "2", "--top-k", "2"), "--num-microbatches"),
        (("--num-microbatches", "zero"), "--num-microbatches"),
    ):
        refused = _cli("plan", "--model", "gpt2-small", "--mesh", "2x4", "--batch", "16", *words)
        assert refused.returncode == 2 and flag in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1
