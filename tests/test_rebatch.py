"""A built graph at another batch (planner.ir.rebatch): the same graph the zoo builds at that
batch, and the Python and command-line calls that take a Graph honour ``batch`` with it."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

import planner
from planner.errors import GraphError, PlannerError
from planner.ir.graph_json import graph_to_dict
from planner.ir.rebatch import rebatched
from planner.zoo import load_model, model_names

GPT = "gpt:layers=4,hidden=256,heads=4,seq=64,vocab=512"


@pytest.mark.parametrize("name", model_names())
def test_rebatched_equals_the_zoo_at_that_batch(name):
    graph = load_model(name)
    own = graph.batch_size
    for batch in sorted({1, max(1, own // 2), 2 * own}):
        assert rebatched(graph, batch) == load_model(name, batch=batch), batch
    assert rebatched(graph, own) is graph


def test_flops_that_are_not_linear_in_the_batch_are_refused():
    graph = load_model(GPT, batch=8)
    first = next(op for op in graph.operators if graph.batch_dim in op.sizes)
    odd = replace(first, flops=first.flops + 1)
    bent = replace(
        graph, operators=tuple(odd if op is first else op for op in graph.operators), _index=None
    )
    with pytest.raises(GraphError, match="flops"):
        rebatched(bent, 3)
    with pytest.raises(GraphError, match="batch"):
        rebatched(graph, 0)


def test_plan_pipeline_and_evaluate_3d_take_a_graph():
    graph = load_model(GPT, batch=8)
    built = planner.plan_pipeline(graph, "node=2,gpu=2", time_limit_s=10)
    spelled = planner.plan_pipeline(GPT, "node=2,gpu=2", batch=8, time_limit_s=10)
    assert built.found and built.step_time_s == spelled.step_time_s
    assert built.pipeline.cuts == spelled.pipeline.cuts
    assert built.pipeline.num_microbatches == spelled.pipeline.num_microbatches
    kwargs = dict(tp=2, pp=2, dp=1, micro_batch=2)
    assert (
        planner.evaluate_3d(graph, **kwargs).step_time_s
        == planner.evaluate_3d(GPT, batch=8, **kwargs).step_time_s
    )


def test_batch_is_honoured_and_seq_refused_with_a_graph():
    graph = load_model(GPT, batch=8)
    assert (
        planner.plan(graph, "4", batch=16).objective
        == planner.plan(GPT, "4", batch=16).objective
        != planner.plan(graph, "4").objective
    )
    with pytest.raises(PlannerError, match="^seq:"):
        planner.plan(graph, "4", seq=32)


def test_the_command_line_honours_batch_with_a_graph_json(tmp_path):
    path = tmp_path / "gpt.json"
    path.write_text(json.dumps(graph_to_dict(load_model(GPT, batch=8))))

    def objective(*extra):
        out = tmp_path / "plan.json"
        run = subprocess.run(
            [sys.executable, "-m", "planner", "plan", "--mesh", "4", "--json", str(out), *extra],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
        return json.loads(out.read_text())["objective"]

    assert objective("--model", str(path), "--batch", "16") == objective(
        "--model", GPT, "--batch", "16"
    )
    refused = subprocess.run(
        [sys.executable, "-m", "planner", "plan", "--model", str(path), "--seq", "32"],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "--seq:" in refused.stderr, refused.stderr
