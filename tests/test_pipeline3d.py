"""3D plans: pipeline degree, intra-operator plans on stage sub-meshes, memory."""

import subprocess
import sys

import pandas as pd
import pytest

from planner.api3d import plan_pipeline


@pytest.mark.slow  # 40-110 s on 2 cores: the default run keeps a faster test of the same path
@pytest.mark.heavy
def test_gpt3_175b_on_1024_gpus_keeps_tensor_parallel_in_node_and_takes_the_fastest():
    """Every pipeline degree under every settings variant: the plan is the fastest candidate that
    fits (one stage with FSDP and sequence parallelism beats Megatron-LM's 8-stage pipeline under
    the cost model), with heads or ffn split on the innermost axis of its stage mesh, inside the
    node (since ZeRO's collectives run the innermost axis first, tensor parallelism 4 beside data
    parallelism 2 in each node wins: node=128,gpu=2,tp=4)."""
    result = plan_pipeline("gpt3-175b", "node=128,gpu=8", "a100-80g", batch=1536)
    pipe = result.pipeline
    assert pipe.fits_memory and pipe.max_memory_bytes <= 78e9
    dims = dict(result.tensor_parallel_dims)
    assert dims[result.stage_mesh_names[-1]] in ("a", "f")
    assert dims["node"] not in ("a", "f")
    fitting = [c["iteration_time_s"] for c in result.candidates if c["fits_memory"]]
    assert len(fitting) > 10 and pipe.iteration_time_s == min(fitting)
    assert {c["zero"] for c in result.candidates} == {0, 1, 2, 3}


def test_pipeline_command_writes_csv(tmp_path):
    out = tmp_path / "pipe.csv"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "pipeline",
            "--model",
            "gpt:layers=8,hidden=512,heads=8",
            "--devices",
            "32",
            "--batch",
            "32",
            "--pipeline-method",
            "exact",
            "--csv",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(out)
    assert (
        row["method"][0] == "exact" and row["intra_method"][0] == "exact" and row["fits_memory"][0]
    )
    assert "pipeline stages" in proc.stdout


def test_fixed_3d_configuration_equals_the_pinned_search(capsys):
    """`planner evaluate --tp 8 --pp 12 --dp 8 --micro-batch 1` (GPT-3 175B, 768 GPUs, batch 1536)
    is the 3D search pinned to that configuration: same iteration time, time and memory per stage
    printed."""
    from planner.cli import main

    args = ["--model", "gpt3-175b", "--batch", "1536", "--device", "a100-80g"]
    assert (
        main(["evaluate", *args, "--tp", "8", "--pp", "12", "--dp", "8", "--micro-batch", "1"]) == 0
    )
    out = capsys.readouterr().out
    assert out.count("stage ") >= 12 and "GiB" in out
    evaluated = planner_api().evaluate_3d(
        "gpt3-175b", "a100-80g", tp=8, pp=12, dp=8, micro_batch=1, batch=1536
    )
    searched = plan_pipeline(
        "gpt3-175b",
        "node=96,gpu=8",
        "a100-80g",
        batch=1536,
        intra="megatron",
        method="even",
        degrees=[12],
        counts=[1536 // 8],
        escalate=False,
    )
    assert f"{evaluated.pipeline.iteration_time_s:.3f} s" in out
    assert evaluated.pipeline.iteration_time_s == searched.pipeline.iteration_time_s
    assert evaluated.stage_memory_bytes == searched.stage_memory_bytes
    assert evaluated.pipeline.cuts == tuple(range(8, 96, 8)) and evaluated.pipeline.fits_memory


def planner_api():
    import planner

    return planner


def test_search_reaches_every_divisor_degree_and_count():
    result = plan_pipeline(
        "gpt:layers=12,hidden=128,heads=4,seq=32,vocab=256", "node=6,gpu=2", "a100-80g", batch=12
    )
    # 3 and 6 are not powers of two; 12 takes the node axis and both GPUs of each node
    assert {c["stages"] for c in result.candidates} == {1, 2, 3, 6, 12}
    counts = [c for c in range(1, 13) if 12 % c == 0]
    from planner.api3d import layer_chain

    chain = layer_chain(
        "gpt:layers=12,hidden=128,heads=4,seq=32,vocab=256", "node=6,gpu=2", stages=3, batch=12
    ).chain
    assert set(chain.counts) <= set(counts) and 3 in chain.counts


def test_gradient_accumulation_is_costed():
    import planner

    one = planner.evaluate_3d("gpt2-small", "a100-80g", dp=2, micro_batch=4, batch=8)
    four = planner.evaluate_3d("gpt2-small", "a100-80g", dp=2, micro_batch=1, batch=8)
    assert one.pipeline.num_microbatches == 1 and four.pipeline.num_microbatches == 4
    assert (
        four.pipeline.stages == 1 and four.pipeline.max_memory_bytes < one.pipeline.max_memory_bytes
    )


def test_layer_chain_costs_given_cuts_and_count_as_the_pinned_search():
    """``layer_chain(...).cost(cuts, num_microbatches)`` is the public call that costs a pipeline
    on a chain: it equals the 3D search pinned to the same degree, cuts and count, and refuses a
    count the chain does not hold, naming it."""
    import planner
    from planner.errors import SettingsError

    model, mesh = "gpt:layers=8,hidden=128,heads=4,seq=32,vocab=256", "node=2,gpu=2"
    staged = planner.layer_chain(model, mesh, stages=2, batch=8)
    assert staged.stages == 2 and staged.stage_status == "OPTIMAL" and staged.strategies
    plan = staged.cost((3,), num_microbatches=4)
    pinned = planner.plan_pipeline(
        model, mesh, batch=8, degrees=[2], counts=[4], cuts=(3,), escalate=False
    )
    assert plan.status == "GIVEN" and plan.cuts == (3,) and plan.num_microbatches == 4
    assert plan.iteration_time_s == pytest.approx(pinned.pipeline.iteration_time_s, rel=1e-12)
    best = staged.cost((3,))  # the chain's best count for these cuts
    assert best.iteration_time_s <= plan.iteration_time_s
    with pytest.raises(SettingsError, match="num_microbatches: 3 is not a count"):
        staged.cost((3,), num_microbatches=3)


@pytest.mark.parametrize("mesh", ["gpu=4", "node=2,gpu=2"])
@pytest.mark.parametrize(
    "model",
    [
        "gpt:layers=2,hidden=64,heads=2,seq=16,vocab=64",
        "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=128,seq=16,vocab=64",
    ],
)
def test_the_exact_stage_planner_reads_what_plan_problem_finds(mesh, model):
    """The 3D search's exact stage planner takes the search's strategies without making a Plan:
    the same strategies and status as ``api.plan_problem``'s plan, operator by operator."""
    import math

    from planner import api, api3d
    from planner.cluster.cluster import make_cluster
    from planner.cost.problem import build_problem
    from planner.zoo import load_model

    cluster = make_cluster(mesh, "h100-80g")
    problem = build_problem(load_model(model, batch=8), cluster.mesh, cluster.profile, None)
    found = api.plan_problem(problem, math.inf, "exact")
    chosen = tuple(tuple(d for _, d in op.strategy) for op in found.operators)
    assert api3d.stage_planner("exact")(problem) == (chosen, found.status)
