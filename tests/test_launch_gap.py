"""--compare-best: the gap of a user's Megatron-LM line to the best configuration the 3D search
finds on the same GPUs, and the changes that close it, each one costed and each one lowering the
iteration time."""

from __future__ import annotations

import pytest

from planner.launch import evaluate_megatron, recost
from planner.launch_gap import _moved, compare_best

LINE = (
    "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
    "--num-attention-heads 8 --seq-length 256 --vocab-size 1024 --tensor-model-parallel-size 4 "
    "--micro-batch-size 1 --global-batch-size 16 --bf16 --recompute-granularity full "
    "--recompute-method uniform --recompute-num-layers 1 --overlap-grad-reduce"
)


def test_the_changes_each_lower_the_time_towards_the_best():
    given, run, _ = evaluate_megatron(LINE)
    gap = compare_best(run, given)
    assert gap.percent > 0  # a hand-written line with needless recompute on 8 GPUs
    # full recompute is pure cost on these GPUs: one of the changes lifts it
    assert "recompute" in {c.group for c in gap.changes}
    times = [given.pipeline.iteration_time_s] + [c.iteration_time_s for c in gap.changes]
    assert times == sorted(times, reverse=True) and len(set(times)) == len(times)
    # the last time is the given line with every listed change applied, costed as given
    target_data = gap.best.to_dict(timings=False)
    target_data["source"] = {"model": run.model_spec, "seq": None}
    from planner.launch import launch_run

    target, current = launch_run(target_data), run
    for change in gap.changes:
        current = _moved(current, target, change.group)
    assert recost(current).pipeline.iteration_time_s == pytest.approx(times[-1], rel=1e-12)
    text = "\n".join(gap.lines())
    assert "recompute: full -> none" in text and f"{gap.percent:+.1f}%" in text
