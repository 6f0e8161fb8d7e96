"""Graph JSON round trip and malformed graph files (one-line errors naming file, operator,
field)."""

import json

import pytest

from planner.errors import GraphError
from planner.ir.graph_json import graph_to_dict, load_graph, save_graph
from planner.zoo import load_model


@pytest.mark.parametrize("name", ["gpt2-small", "resnet50", "vgg16", "moe-gpt"])
def test_round_trip(tmp_path, name):
    graph = load_model(name)
    path = tmp_path / "g.json"
    save_graph(graph, path)
    again = load_graph(path)
    assert graph_to_dict(again) == graph_to_dict(graph)
    assert again.num_params == graph.num_params and again.flops == graph.flops


def _broken(tmp_path, mutate):
    data = graph_to_dict(load_model("mlp", batch=8))
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "mutate,message",
    [
        (
            lambda d: d["operators"][1].update(kind="frob"),
            "operator fc1: field 'kind' is unknown operator",
        ),
        (lambda d: d["operators"][1]["sizes"].update(h=0), "operator fc1: field 'sizes.h'"),
        (lambda d: d["operators"][1]["sizes"].update(h="x"), "operator fc1: field 'sizes.h'"),
        (lambda d: d["tensors"][0].pop("shape"), "tensor x: missing field 'shape'"),
        (
            lambda d: d["operators"][1].update(inputs=["nope", "fc1.weight"]),
            "operator fc1: field 'inputs' names unknown tensor",
        ),
        (
            lambda d: d["operators"][0].update(inputs=["residual", "ln.weight", "ln.bias"]),
            "closes a cycle",
        ),
        (lambda d: d.pop("operators"), "missing field 'operators'"),
    ],
)
def test_malformed_graph_files(tmp_path, mutate, message):
    with pytest.raises(GraphError, match=message):
        load_graph(_broken(tmp_path, mutate))


def test_not_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(GraphError, match="not valid JSON"):
        load_graph(path)
