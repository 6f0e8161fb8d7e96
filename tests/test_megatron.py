"""Megatron-LM launch lines: a 3D plan's arguments, costed as given after reading them back, give
the plan's iteration time; Megatron-LM's own argument parser and TransformerConfig accept them
(when megatron-core is installed: `.ci/run` installs it); what the flags cannot say is refused."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib.util import find_spec

import pytest

from planner import api3d
from planner.cost.settings import TrainingSettings
from planner.launch.megatron import layout_cuts, layout_string, megatron_args
from planner.launch.megatron_read import read_megatron
from planner.errors import SettingsError
from planner.launch import evaluate_megatron, export_megatron, launch_run

SMALL = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=1024"
# the three cases: (model, mesh, device, batch, pipeline degree, micro-batch count)
PUBLISHED = (
    ("gpt3-175b", "node=128,gpu=8", "a100-80g", 1536, 16, 192),
    ("llama3-70b", "node=64,gpu=8", "h100-80g", 512, 8, 64),
    ("llama3-8b", "node=8,gpu=8", "h100-80g", 256, 2, 32),
)


def _plan_file(plan, model: str, batch: int | None, device: str) -> dict:
    data = plan.to_dict(timings=False)
    data["source"] = {"model": model, "batch": batch, "seq": None, "device": device}
    return data


def _given(model: str = SMALL, device: str = "a100-80g", **kw) -> dict:
    """A 3D plan file of a configuration costed as given (evaluate --tp/--pp/--dp --json)."""
    batch = kw.pop("batch", 16)
    settings = kw.pop("settings", TrainingSettings())
    plan = api3d.evaluate_3d(model, device, batch=batch, settings=settings, **kw)
    return _plan_file(plan, model, batch, device)


@pytest.fixture(scope="module")
def published() -> list[dict]:
    """The three published configurations planned by the 3D search with Megatron's stage plan
    (degree and count pinned; the cuts are CSIMD's, but llama3-70b's are given uneven: 80 layers
    as 9, 10, 11 x 5, 6, the layout Megatron-LM writes with --pipeline-model-parallel-layout)."""
    files = []
    for model, mesh, device, batch, stages, count in PUBLISHED:
        cuts = (9, 19, 30, 41, 52, 63, 74) if model == "llama3-70b" else None
        plan = api3d.plan_pipeline(
            model,
            mesh,
            device,
            batch=batch,
            intra="megatron",
            degrees=[stages],
            counts=[count],
            cuts=cuts,
        )
        files.append(_plan_file(plan, model, batch, device))
    return files


def test_published_plans_round_trip_through_megatron_arguments(published):
    for data in published:
        export = export_megatron(data)
        assert abs(export.gap) <= 1e-3, (data["model"], export.gap)
        assert export.run.world_size == {"gpt3-175b": 1024, "llama3-70b": 512}.get(
            data["model"], 64
        )
        assert export.recosted.pipeline.cuts == tuple(data["pipeline"]["cuts"])
    uneven = published[1]
    assert (
        len({b - a for a, b in zip((0, *uneven["pipeline"]["cuts"]), uneven["pipeline"]["cuts"])})
        > 1
    )
    args = megatron_args(launch_run(uneven))
    layout = args[args.index("--pipeline-model-parallel-layout") + 1]
    assert layout_cuts(layout, 8) == tuple(uneven["pipeline"]["cuts"])


VARIANTS = (
    dict(
        tp=2,
        pp=2,
        dp=2,
        micro_batch=2,
        batch=32,
        settings=TrainingSettings(sequence_parallel=True, recompute="selective"),
    ),
    dict(
        tp=2,
        pp=2,
        dp=2,
        micro_batch=1,
        settings=TrainingSettings(zero=1, recompute="full", fp32_grads=True),
    ),
    dict(tp=2, pp=2, dp=2, micro_batch=1, settings=TrainingSettings(zero=2)),
    dict(tp=2, pp=1, dp=4, micro_batch=1, settings=TrainingSettings(zero=3)),
    dict(tp=1, pp=2, dp=4, micro_batch=1, schedule="interleaved:2"),
    dict(tp=2, pp=2, dp=2, micro_batch=1, cuts=(3,), settings=TrainingSettings(overlap="none")),
    # FP8 GEMMs beside bf16 tensors: --bf16 --fp8-format hybrid
    dict(
        tp=2, pp=2, dp=2, micro_batch=1, device="h100-80g", settings=TrainingSettings(dtype="fp8")
    ),
)


@pytest.mark.parametrize("config", VARIANTS, ids=range(len(VARIANTS)))
def test_settings_survive_the_round_trip(config):
    data = _given(**config)
    export = export_megatron(data)
    assert export.gap == pytest.approx(0, abs=1e-9)
    run, _ = read_megatron(export.line)
    settings = config.get("settings", TrainingSettings())
    for name in ("recompute", "zero", "sequence_parallel", "fp32_grads", "dtype"):
        assert getattr(run.settings, name) == getattr(settings, name), name
    assert (run.tensor_parallel, run.pipeline_parallel, run.data_parallel) == (
        config["tp"],
        config["pp"],
        config["dp"],
    )
    assert run.schedule == config.get("schedule", "1f1b")


def test_a_user_line_is_costed_as_evaluate_costs_its_degrees():
    line = (
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
        "--num-attention-heads 8 --seq-length 256 --vocab-size 1024 --tensor-model-parallel-size 2 "
        "--pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 32 --bf16 "
        "--lr 3e-4 --data-path /data/x"
    )
    plan, run, ignored = evaluate_megatron(line)
    assert ignored == ("--lr", "--data-path")
    assert run.data_parallel == 2 and run.settings.fp32_grads  # Megatron's bf16 default
    assert run.model.dropout == 1 and run.settings.overlap == "none"  # its defaults: 0.1, off
    # Megatron's default bucket: max(40M, 1M x dp) parameters of fp32 gradients
    assert run.settings.bucket_bytes == 40_000_000 * 4
    same = api3d.evaluate_3d(
        run.model_spec,
        tp=2,
        pp=2,
        dp=2,
        micro_batch=2,
        batch=32,
        settings=run.settings,
        fit_required=False,
    )
    assert plan.pipeline.iteration_time_s == same.pipeline.iteration_time_s
    padded, _ = read_megatron(line.replace("--vocab-size 1024", "--vocab-size 1000"))
    assert padded.model.vocab == 1024  # padded to 128 x tp as Megatron pads


def test_what_megatron_cannot_say_is_refused():
    with pytest.raises(SettingsError, match="GPipe"):
        export_megatron(_given(tp=1, pp=2, dp=4, micro_batch=1, schedule="gpipe"))
    with pytest.raises(SettingsError, match="no operator-level selective checkpointing"):
        policy = TrainingSettings(recompute="selective-op")
        export_megatron(_given(tp=1, pp=2, dp=4, micro_batch=1, settings=policy))
    data = _given(tp=2, pp=1, dp=4, micro_batch=1)
    q = next(op for op in data["operators"] if op["name"] == "h0.attn.q")
    q["strategy"] = {axis: "h" for axis in q["strategy"]}
    with pytest.raises(SettingsError, match="one axis"):  # a file without a layout: its operators
        launch_run({**data, "layout": None})
    for axis in data["layout"]["mesh_axes"]:
        axis["role"] = "tensor"
    with pytest.raises(SettingsError, match="one axis"):
        launch_run(data)
    slower = _given(tp=2, pp=1, dp=4, micro_batch=1)
    slower["iteration_time_s"] *= 0.9  # as an exact stage plan would be: cheaper than Megatron's
    with pytest.raises(SettingsError, match="not Megatron-LM's pattern"):
        export_megatron(slower)
    base = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 256"
    with pytest.raises(SettingsError, match="--context-parallel-size"):
        read_megatron(base + " --context-parallel-size 2", dp=1)
    with pytest.raises(SettingsError, match="--dp"):
        read_megatron(base)
    with pytest.raises(SettingsError, match="--num-layers"):
        read_megatron("--hidden-size 8", dp=1)
    # a bad value: one line naming the flag (no argparse usage, no ZeroDivisionError)
    with pytest.raises(SettingsError, match="--tensor-model-parallel-size: needs a positive"):
        read_megatron(base + " --tensor-model-parallel-size 0", dp=1)
    with pytest.raises(SettingsError, match="--hidden-dropout"):
        read_megatron(base + " --hidden-dropout x", dp=1)
    with pytest.raises(SettingsError, match="cannot split"):
        read_megatron("torchrun --nnodes 'x pretrain_gpt.py")


def test_layout_strings_read_back():
    assert layout_string((3, 7), 10) == "Ettt|tttt|tttL"
    assert layout_cuts("Ettt|tttt|tttL", 3) == (3, 7)
    with pytest.raises(SettingsError, match="chunks"):
        layout_cuts("Ett|ttL", 3)


def test_cli_exports_and_reads_back(tmp_path):
    plan = tmp_path / "p.json"
    line = tmp_path / "launch.sh"
    run = [sys.executable, "-m", "planner"]
    model = ["--model", SMALL, "--batch", "16", "--micro-batch", "1"]
    subprocess.run(
        run
        + ["evaluate", *model, "--tp", "2", "--pp", "2", "--dp", "2", "--json", str(plan), "-q"],
        check=True,
    )
    subprocess.run(
        run + ["export", "--target", "megatron", "--plan", str(plan), "--out", str(line)],
        check=True,
        capture_output=True,
    )
    back = subprocess.run(
        run + ["evaluate", "--from-megatron", str(line), "--json", str(tmp_path / "b.json")],
        capture_output=True,
        text=True,
    )
    assert back.returncode == 0, back.stderr
    refused = subprocess.run(
        run + ["evaluate", "--from-megatron", str(line), "--zero", "1"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "--zero" in refused.stderr


VALIDATE = textwrap.dedent(
    """
    import os, shlex, sys, typing, typing_extensions, warnings
    warnings.filterwarnings("ignore")
    typing.override = typing_extensions.override  # megatron.training needs Python 3.12's
    import megatron.training.arguments as arguments
    from megatron.training.argument_utils import core_transformer_config_from_args
    words = shlex.split(sys.stdin.read(), comments=True)
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        os.environ[key] = value
    script = next(k for k, w in enumerate(words) if w.endswith(".py"))
    nodes = int(words[words.index("--nnodes") + 1])
    per_node = int(words[words.index("--nproc-per-node") + 1])
    os.environ.update(WORLD_SIZE=str(nodes * per_node), RANK="0")
    # no Transformer Engine on a CPU machine: its fused RoPE kernel is switched off
    sys.argv = ["pretrain_gpt.py"] + words[script + 1:] + ["--no-rope-fusion"]
    arguments.get_device_arch_version = lambda: 8  # no GPU to ask: an A100/H100-class one
    args = arguments.parse_args()
    arguments.validate_args(args)
    config = core_transformer_config_from_args(args)
    print(args.data_parallel_size, config.tensor_model_parallel_size,
          config.pipeline_model_parallel_size, config.num_layers)
    """
)


@pytest.mark.slow  # nine Megatron-LM parses, 50 s
@pytest.mark.skipif(find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_lm_accepts_the_exported_lines(published):
    lines = [export_megatron(data).line for data in published]
    lines += [export_megatron(_given(**config)).line for config in VARIANTS]
    for line in lines:
        run, _ = read_megatron(line)
        done = subprocess.run(
            [sys.executable, "-c", VALIDATE],
            input=line,
            text=True,
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        dp, tp, pp, layers = map(int, done.stdout.split()[-4:])
        assert (dp, tp, pp, layers) == (
            run.data_parallel,
            run.tensor_parallel,
            run.pipeline_parallel,
            run.model.layers,
        )


@pytest.mark.slow
@pytest.mark.heavy  # the engine's whole search on 64 to 1,024 GPUs: about 6 min on 2 cores
@pytest.mark.skipif(find_spec("megatron") is None, reason="megatron-core not installed")
@pytest.mark.parametrize("model, mesh, device, batch", [p[:4] for p in PUBLISHED])
def test_plan_for_megatron_answers_a_line_megatron_lm_accepts(model, mesh, device, batch):
    """The three acceptance models planned by `plan --for megatron` (unpinned): the line exports,
    reads back through --from-megatron to the plan's time within 0.1% and passes Megatron-LM's
    own parse_args, validate_args and TransformerConfig."""
    from planner.launch import plan_data, plan_for

    plan = plan_for("megatron", model, mesh, device, batch=batch)
    export = export_megatron(plan_data(plan, model, None))
    assert abs(export.gap) <= 1e-3
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE], input=export.line, text=True, capture_output=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    dp, tp, pp, _ = map(int, done.stdout.split()[-4:])
    assert (tp, pp, dp) == (
        export.run.tensor_parallel,
        plan.pipeline.stages,
        export.run.data_parallel,
    )


@pytest.mark.slow  # one Megatron-LM parse
@pytest.mark.skipif(find_spec("megatron") is None, reason="megatron-core not installed")
def test_megatron_lm_accepts_an_exported_block_recompute_line():
    """Per-layer recompute read from a block line exports as the same block flags, and the line
    passes Megatron-LM's parse_args, validate_args and TransformerConfig."""
    from planner.launch import plan_data, recost

    line = (
        "torchrun --nnodes 1 --nproc-per-node 8 pretrain_gpt.py --num-layers 8 --hidden-size 512 "
        "--num-attention-heads 8 --seq-length 256 --max-position-embeddings 256 --vocab-size 1024 "
        "--tokenizer-type NullTokenizer --micro-batch-size 1 --global-batch-size 16 --bf16 "
        "--pipeline-model-parallel-size 2 --recompute-granularity full --recompute-method block "
        "--recompute-num-layers 3"
    )
    run, _ = read_megatron(line)
    export = export_megatron(plan_data(recost(run, "a100-80g"), run.model_spec, None))
    assert "--recompute-method block --recompute-num-layers 3" in export.line
    assert abs(export.gap) <= 1e-3
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE], input=export.line, text=True, capture_output=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
