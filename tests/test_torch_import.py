"""torch.export import: GPT-2 (12 layers) and ResNet-50 from transformers configs (no weights)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import planner  # noqa: E402
from planner.cli import main  # noqa: E402
from planner.ir.graph_json import load_graph  # noqa: E402
from planner.engines.torch.importer import TorchImportError, import_module  # noqa: E402
from planner.engines.torch.presets import build_spec  # noqa: E402


@pytest.mark.parametrize(
    "spec,expected_kinds",
    [
        (
            "hf:gpt2:seq=128",
            {"embedding", "linear", "batch_matmul", "softmax", "layernorm", "split"},
        ),
        ("hf:resnet50:batch=8", {"conv2d", "batchnorm", "relu", "maxpool", "avgpool", "linear"}),
    ],
)
def test_import_plans_exactly_with_matching_parameter_count(spec, expected_kinds):
    module, inputs, name = build_spec(spec)
    graph = import_module(module, inputs, name=name)
    # tied lm_head counted once
    assert graph.num_params == sum(p.numel() for p in module.parameters())
    assert expected_kinds <= {op.kind for op in graph.operators}
    if "gpt2" in spec:
        assert sum(op.kind == "layernorm" for op in graph.operators) == 25  # 12 layers x 2 + final
    result = planner.plan(graph, "8", "a100-80g", method="exact")
    assert result.status == "OPTIMAL" and result.estimated_step_time_s > 0


def test_cross_entropy_loss_reads_integer_labels(tmp_path):
    out = tmp_path / "g.json"
    assert (
        main(
            [
                "import-torch",
                "hf:gpt2:layers=1,hidden=64,heads=2,seq=16,vocab=128,batch=2",
                "--loss",
                "cross_entropy",
                "--json",
                str(out),
                "-q",
            ]
        )
        == 0
    )
    graph = load_graph(out)
    loss = graph.operators[-1]
    assert loss.kind == "cross_entropy" and [graph.tensor(o.tensor).shape for o in loss.inputs] == [
        (2, 16, 128),
        (2, 16),
    ]
    assert graph.tensor("labels").integer and graph.tensor("labels").role == "data"
    summed = tmp_path / "s.json"
    assert (
        main(
            [
                "import-torch",
                "hf:gpt2:layers=1,hidden=64,heads=2,seq=16,vocab=128,batch=2",
                "--json",
                str(summed),
                "-q",
            ]
        )
        == 0
    )
    assert load_graph(summed).operators[-1].kind == "reduce"


def test_cli_import_then_plan(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert main(["import-torch", "hf:gpt2:layers=2,seq=64", "--json", str(out)]) == 0
    assert "parameters" in capsys.readouterr().out
    graph = load_graph(out)
    assert len(graph.operators) > 50
    assert main(["plan", "--model", str(out), "--mesh", "4", "-q"]) == 0


def test_unknown_op_is_named_or_opaque():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return torch.cumsum(self.fc(x), dim=-1)

    x = torch.zeros(4, 8)
    with pytest.raises(TorchImportError, match="cumsum"):
        import_module(Odd(), (x,))
    graph = import_module(Odd(), (x,), allow_unknown=True)
    opaque = [op for op in graph.operators if op.kind == "opaque"]
    assert len(opaque) == 1 and opaque[0].unsplittable == frozenset(opaque[0].sizes)


def test_bad_spec_exits_2(capsys):
    assert main(["import-torch", "hf:bart", "--json", "/tmp/x.json"]) == 2
    assert "unknown preset" in capsys.readouterr().err


def test_imported_gpt2_block_has_no_unread_data_and_verifies(tmp_path, capsys):
    pytest.importorskip("jax")
    out, plan = tmp_path / "g.json", tmp_path / "p.json"
    assert main(["import-torch", "hf:gpt2:layers=1,seq=16,batch=4", "--json", str(out), "-q"]) == 0
    graph = load_graph(out)
    read = {o.tensor for op in graph.operators for o in op.inputs}
    # folded causal-mask buffers dropped
    assert all(t.name in read for t in graph.tensors if t.role == "data")
    assert main(["plan", "--model", str(out), "--mesh", "4", "--json", str(plan), "-q"]) == 0
    capsys.readouterr()
    # XLA compiles the step (before: "no value fed for tensor 'attn.bias'"). Exit 5 is the known
    # tied-embedding gather gap (issue: tie edge), not a crash; any other code is a failure.
    assert main(["verify", "--plan", str(plan), "--no-numpy"]) in (0, 5)
    assert "collectives compiled" in capsys.readouterr().out


def test_handlers_are_a_registry_with_one_entry_per_aten_op():
    """Every ATen op the importer maps has exactly one handler; a second registration is refused;
    a registered handler is what the dispatch calls."""
    from planner.engines.torch.importer import handlers

    for op in (
        "linear",
        "addmm",
        "bmm",
        "convolution",
        "embedding",
        "layer_norm",
        "softmax",
        "batch_norm",
        "max_pool2d",
        "view",
        "permute",
        "transpose",
        "split",
        "gelu",
        "add",
        "clone",
        "slice",
    ):
        assert op in handlers.HANDLERS, op
    assert handlers.HANDLERS["bmm"] is handlers.HANDLERS["mm"]  # one handler per op family
    with pytest.raises(ValueError, match="two handlers"):
        handlers.register("linear")(lambda imp, node, op: None)
    calls = []
    handlers.HANDLERS["__probe"] = lambda imp, node, op: calls.append(op)
    try:
        handlers.handle(None, None, "__probe")
    finally:
        del handlers.HANDLERS["__probe"]
    assert calls == ["__probe"]
    assert len(set(map(id, handlers.HANDLERS.values()))) < len(handlers.HANDLERS) / 2
