"""--compare-best: the gap of a user's Megatron-LM line to the best configuration the 3D search
finds on the same GPUs, and the changes that close it, each one costed and each one lowering the
iteration time."""

from __future__ import annotations

import itertools

import pytest

from planner.launch import evaluate_megatron, recost
from planner.launch.gap import _moved, compare_best

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
    # the best, spelled out as a launch line, is read back to the same configuration and time
    assert f"the best as a launch line: {gap.best_line}" in text
    again, _, ignored = evaluate_megatron(gap.best_line)
    assert ignored == ("--mock-data", "--train-iters", "--lr")  # the placeholders
    assert again.pipeline.iteration_time_s == pytest.approx(
        gap.best.pipeline.iteration_time_s, rel=1e-12
    )


BASE = (
    "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
    "--num-attention-heads 8 --seq-length 256 --vocab-size 1024 --global-batch-size 16 --bf16 "
    "--overlap-grad-reduce "
)


def test_no_line_of_the_grid_beats_the_best_it_reports():
    """Every Megatron-LM line of the practitioner's grid on one node (tp 1/2/4/8, pp 1/2/4,
    micro-batch 1/2/8, the distributed optimizer on or off) that fits is no faster than the best
    that --compare-best reports for it; before the search tried Megatron-LM's stage plan at every
    tensor degree of the node, tp 1 / micro-batch 2 beat its best by 45%."""
    best = None
    for tp, pp, mb, extra in itertools.product(
        (1, 2, 4, 8), (1, 2, 4), (1, 2, 8), ("", "--use-distributed-optimizer")
    ):
        dp = 8 // (tp * pp)
        if dp == 0 or 16 % (dp * mb):
            continue
        line = BASE + (
            f"--tensor-model-parallel-size {tp} --pipeline-model-parallel-size {pp} "
            f"--micro-batch-size {mb} {extra}"
        )
        given, run, _ = evaluate_megatron(line)
        if best is None:
            gap = compare_best(run, given)
            best = gap.searched.pipeline.iteration_time_s
        if given.fits_memory:
            assert given.pipeline.iteration_time_s >= best * (1 - 1e-12), line


def test_a_given_line_faster_than_the_search_is_the_best(monkeypatch):
    """Where the (heuristic) search's answer is slower than the given line, the given line is
    reported as the best, with no changes, and the search's time beside it."""
    fast, run, _ = evaluate_megatron(BASE + "--micro-batch-size 2 --use-distributed-optimizer")
    slow, _, _ = evaluate_megatron(BASE + "--tensor-model-parallel-size 8 --micro-batch-size 1")
    assert slow.pipeline.iteration_time_s > fast.pipeline.iteration_time_s
    monkeypatch.setattr("planner.launch.gap.plan_for", lambda *a, **k: slow)
    gap = compare_best(run, fast)
    assert gap.best is fast and gap.best_is_given and gap.changes == () and gap.percent == 0
    text = "\n".join(gap.lines())
    assert "the given configuration is the fastest found" in text
    assert f"{slow.pipeline.iteration_time_s:.3f} s" in text


def test_a_line_that_does_not_fit_gets_a_change_that_fits_it():
    """Under a memory limit 0.6 x what a plain data-parallel line needs, the line does not fit;
    the first change of the advice makes it fit (costed as given), and the best fits too."""
    line = BASE + "--micro-batch-size 2"
    plain, _, _ = evaluate_megatron(line)
    memory = 0.6 * plain.pipeline.max_memory_bytes
    given, run, _ = evaluate_megatron(line, memory=memory)
    assert not given.fits_memory
    gap = compare_best(run, given, memory=memory)
    assert gap.best.fits_memory and gap.changes
    target_data = gap.best.to_dict(timings=False)
    target_data["source"] = {"model": run.model_spec, "seq": None}
    from planner.launch import launch_run

    first = _moved(run, launch_run(target_data), gap.changes[0].group)
    assert recost(first, memory=memory).fits_memory
    assert "does not fit (the first change fits it)" in "\n".join(gap.lines())
