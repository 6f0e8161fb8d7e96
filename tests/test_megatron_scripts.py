"""Megatron-LM launch scripts read as shipped (tests/data/megatron_examples, cited in its
SOURCES.md): their variables, arrays, defaults and arithmetic expanded as bash expands them
(planner/launch/shell_script.py), every flag priced, inert or refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner import api3d
from planner.launch.megatron_flags import INERT
from planner.launch.megatron_read import read_megatron
from planner.launch.shell_script import launch_text
from planner.errors import SettingsError
from planner.launch import evaluate_megatron

EXAMPLES = Path(__file__).parent / "data" / "megatron_examples"


def test_the_857m_example_is_read_as_shipped():
    """tp 8 on one node of 8 GPUs, micro-batch 8 of 128, fp16 (fp16 gradient buffers),
    GPT-2's vocabulary padded to 128 x 8; every flag not priced is inert."""
    text = (EXAMPLES / "train_gpt3_857m_distributed.sh").read_text()
    plan, run, ignored = evaluate_megatron(text)
    assert (run.tensor_parallel, run.pipeline_parallel, run.data_parallel) == (8, 1, 1)
    assert (run.micro_batch, run.global_batch) == (8, 128)
    assert run.model.vocab == 51200 and run.model.layers == 24
    assert run.settings.dtype == "fp16" and not run.settings.fp32_grads
    assert ignored and set(ignored) <= INERT
    same = api3d.evaluate_3d(
        run.model_spec, tp=8, pp=1, dp=1, micro_batch=8, batch=128, settings=run.settings
    )
    assert plan.pipeline.iteration_time_s == pytest.approx(same.pipeline.iteration_time_s)
    assert plan.fits_memory


def test_the_175b_example_names_the_variable_to_set():
    """Shipped for one node, it asks for tp 8 x pp 16: refused naming NUM_NODES; with 128
    nodes it reads as tp 8, pp 16, dp 8 (its --rampup-batch-size is inert: the steady step)."""
    text = (EXAMPLES / "train_gpt3_175b_distributed.sh").read_text()
    with pytest.raises(SettingsError, match="set NUM_NODES in the script"):
        read_megatron(text)
    run, ignored = read_megatron(text.replace("NUM_NODES=1\n", "NUM_NODES=128\n"))
    assert (run.tensor_parallel, run.pipeline_parallel, run.data_parallel) == (8, 16, 8)
    assert "--rampup-batch-size" in ignored and set(ignored) <= INERT


def test_a_megatron_deepspeed_script_is_refused_naming_its_flag():
    """A Megatron-DeepSpeed script (a heredoc writing DeepSpeed's JSON, the deepspeed launcher,
    --zero-stage=3 and DeepSpeed's checkpointing among its flags): refused as such, naming a
    DeepSpeed flag, not as an unknown Megatron-LM flag or a typo."""
    text = (EXAMPLES / "azure_run_175b.sh").read_text()
    with pytest.raises(SettingsError, match="Megatron-DeepSpeed line") as refused:
        read_megatron(text)
    assert "--deepspeed" in str(refused.value) and "typo" not in str(refused.value)
    for flag in ("--zero-stage=3", "--deepspeed_config=ds.json", "--no-pipeline-parallel"):
        line = "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 " + flag
        with pytest.raises(SettingsError, match=flag.split("=")[0]):
            read_megatron(line)


SCRIPT = """#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1
GPUS=${GPUS:-8}
NODES=2
WORLD=$(( GPUS * NODES ))
TP=2
MODEL_ARGS="--num-layers 4 --hidden-size 512 \\
    --num-attention-heads 8"   # a comment (with parentheses)
DIST=(--nproc_per_node $GPUS --nnodes $NODES)
python -m torch.distributed.run "${DIST[@]}" pretrain_gpt.py $MODEL_ARGS \\
    --seq-length 256 --vocab-size 1024 --tensor-model-parallel-size $TP \\
    --micro-batch-size 1 --global-batch-size $((WORLD / TP * 2)) --data-path a#b
"""


def test_a_script_is_expanded_as_bash_expands_it():
    line = launch_text(SCRIPT)
    assert "--global-batch-size 16" in line and "--data-path a#b" in line
    run, ignored = read_megatron(SCRIPT)
    assert (run.tensor_parallel, run.data_parallel, run.global_batch) == (2, 8, 16)
    assert run.model.layers == 4 and ignored == ("--data-path",)
    # a '#' inside a word is kept (shlex's comments would cut the line there)
    argfile = "--num-layers 4 --hidden-size 512 --num-attention-heads 8 --seq-length 256 "
    argfile += "--data-path a#b --vocab-size 1024  # a comment\n--micro-batch-size 2"
    run, _ = read_megatron(argfile, dp=8)
    assert run.model.vocab == 1024 and run.micro_batch == 2


def test_deepspeed_and_srun_launchers():
    deepspeed = SCRIPT.replace(
        'python -m torch.distributed.run "${DIST[@]}"', "deepspeed --num_gpus 4 --num_nodes 2"
    )
    assert read_megatron(deepspeed)[0].data_parallel == 4
    srun = SCRIPT.replace('python -m torch.distributed.run "${DIST[@]}"', "srun python")
    with pytest.raises(SettingsError, match="--dp: give the data-parallel degree"):
        read_megatron(srun)
    assert read_megatron(srun, dp=4)[0].data_parallel == 4


@pytest.mark.parametrize(
    "change, message",
    [
        (("TP=2", "TP=$SLURM_TP"), "set SLURM_TP in the script"),
        (("NODES=2", "NODES=$(scontrol show hostnames | wc -l)"), r"runs a command, \$\(scontrol"),
        (("NODES=2", "NODES=$SLURM_NNODES"), "set SLURM_NNODES in the script"),
    ],
)
def test_what_cannot_be_expanded_is_refused_naming_it(change, message):
    with pytest.raises(SettingsError, match=message):
        read_megatron(SCRIPT.replace(*change))
