"""`plan --for ENGINE` (planner.launch.plan_for): the whole-cluster search restricted to what the
engine runs as the plan costs it, so its answer exports and reads back to the plan's time."""

from __future__ import annotations

import pytest

from planner import api3d
from planner.cli.main import main
from planner.cost.settings import TrainingSettings
from planner.errors import SettingsError
from planner.launch import TARGETS, launch_run, plan_data, plan_for

GPT = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=1024"
SELECTIVE = TrainingSettings(recompute="selective", fp32_grads=True)


def test_a_torchtitan_search_answers_what_torchtitan_runs():
    """torchtitan has no attention-core selective recompute (its selective AC is an operator
    policy): asked for at least selective, the unrestricted search keeps selective, which
    torchtitan's export refuses; the search for torchtitan climbs torchtitan's own ladder and
    answers its operator policy (selective-op), which exports to the same time."""
    kw = dict(batch=8, seq=512, degrees=[1])
    free = api3d.plan_pipeline(
        "llama3-8b", "gpu=4", "h100-80g", settings=SELECTIVE, intra="megatron-grid", **kw
    )
    assert free.settings.recompute == "selective"
    with pytest.raises(SettingsError, match="selective"):
        TARGETS["torchtitan"].check(launch_run(plan_data(free, "llama3-8b", 512)))
    found = plan_for("torchtitan", "llama3-8b", "gpu=4", "h100-80g", settings=SELECTIVE, **kw)
    assert found.settings.recompute == "selective-op"
    assert found.pipeline.iteration_time_s > free.pipeline.iteration_time_s  # a real restriction
    assert (
        "SelectiveAC.Config()"
        in TARGETS["torchtitan"].export(plan_data(found, "llama3-8b", 512)).text
    )
    export = TARGETS["torchtitan"].export(plan_data(found, "llama3-8b", 512))
    assert export.gap == pytest.approx(0, abs=1e-3)


def test_a_megatron_search_exports_and_reads_back():
    found = plan_for("megatron", GPT, "node=2,gpu=4", "a100-80g", batch=16)
    assert found.settings.fp32_grads  # Megatron-LM's main gradients under bf16
    export = TARGETS["megatron"].export(plan_data(found, GPT, None))
    assert abs(export.gap) <= 1e-3 and "pretrain_gpt.py" in export.line


def test_an_engine_that_runs_none_of_the_search_is_refused():
    with pytest.raises(SettingsError, match="--for: no configuration"):
        # not a LLaMA 3 flavor
        plan_for("torchtitan", GPT, "gpu=4", "a100-80g", batch=16, degrees=[1])
    with pytest.raises(SettingsError, match="--for: unknown engine 'deepspeed'"):
        plan_for("deepspeed", GPT, "gpu=4", batch=16)
    with pytest.raises(SettingsError, match="intra: set by the engine"):
        plan_for("megatron", GPT, "gpu=4", batch=16, intra="exact")


@pytest.mark.parametrize(
    "extra, flag", [(["--method", "dp"], "--method"), (["--top-k", "2"], "--top-k")]
)
def test_the_cli_refuses_what_for_does_not_combine_with(extra, flag, capsys):
    argv = ["plan", "--model", GPT, "--mesh", "gpu=4", "--batch", "16", "--for", "megatron"]
    assert main(argv + extra) == 2 and flag in capsys.readouterr().err


def test_the_cli_plans_for_an_engine(tmp_path, capsys):
    out = tmp_path / "p.json"
    argv = ["plan", "--model", GPT, "--mesh", "node=2,gpu=4", "--batch", "16", "--for"]
    assert main(argv + ["megatron", "--pp", "2", "--json", str(out), "-q"]) == 0
    assert main(["export", "--plan", str(out), "--target", "megatron"]) == 0
    assert "--pipeline-model-parallel-size 2" in capsys.readouterr().out


def test_each_engine_plans_with_its_own_loss_kernel():
    """megatron-core's vocabulary-parallel cross-entropy writes the gradient into its saved softmax
    (no buffer), torchtitan's loss-parallel keeps three on vocabulary-sharded logits: the search
    for each engine prices its kernel, and refuses another one asked for."""
    kernels = {
        engine: plan_for(engine, "llama3-8b", "gpu=4", "h100-80g", batch=8, seq=512, degrees=[1])
        for engine in ("megatron", "torchtitan")
    }
    assert kernels["megatron"].settings.loss_kernel == "fused"
    assert kernels["torchtitan"].settings.loss_kernel == "loss-parallel"
    with pytest.raises(SettingsError, match="--loss-kernel: megatron runs its own loss kernel"):
        plan_for(
            "megatron",
            GPT,
            "gpu=4",
            batch=16,
            settings=TrainingSettings(loss_kernel="loss-parallel"),
        )
