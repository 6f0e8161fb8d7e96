"""Zoo parameter counts against published counts, the Megatron formula, and the regime flip by brute
force."""

import csv

import pytest

from planner.errors import ModelError
from planner.cluster.mesh import parse_mesh
from planner.cost.problem import build_problem
from planner.search.brute import brute_force
from planner.zoo import load_model, model_names
from planner.zoo.transformers import mlp


@pytest.mark.parametrize(
    "name,published",
    [
        ("gpt2-small", 124e6),
        ("gpt2-xl", 1.56e9),
        ("gpt3-175b", 174.6e9),
        ("resnet50", 25.6e6),
        ("vgg16", 138e6),
    ],
)
def test_parameter_counts_within_half_percent(name, published):
    assert abs(load_model(name).num_params - published) / published <= 0.005


def test_bert_large_in_published_range():
    assert 335e6 <= load_model("bert-large").num_params <= 340e6


def test_exact_counts_of_reference_implementations():
    # torchvision / HF counts (GPT-2 small with its vocabulary padded to 50304: +47 rows of 768)
    assert load_model("resnet50").num_params == 25_557_032
    assert load_model("vgg16").num_params == 138_357_544
    assert load_model("wide-resnet50-2").num_params == 68_883_240
    assert load_model("gpt2-small").num_params == 124_439_808 + 47 * 768


def megatron_formula(layers, h, vocab, seq):
    return 12 * layers * h * h + 13 * layers * h + (vocab + seq) * h


def test_parametric_gpt_reproduces_megatron_table1(reference_dir):
    lines = [
        ln
        for ln in (reference_dir / "megatron_sc21_table1.csv").read_text().splitlines()
        if not ln.startswith("#")
    ]
    rows = list(csv.DictReader(lines))
    assert len(rows) == 10
    for row in rows:
        layers, h, a = int(row["layers"]), int(row["hidden"]), int(row["heads"])
        graph = load_model(
            f"gpt:layers={layers},hidden={h},heads={a},seq=2048,vocab=51200", batch=1
        )
        formula = megatron_formula(layers, h, 51200, 2048)
        assert graph.num_params - 2 * h == formula  # the formula omits the final layer norm (2h)
        assert round(formula / 1e9, 1) == pytest.approx(float(row["params_b"]), abs=0.051)


def test_every_zoo_model_builds():
    for name in model_names():
        g = load_model(name)
        assert g.num_params > 0 and g.flops > 0


def test_unknown_model_suggests_close_match():
    with pytest.raises(ModelError, match="did you mean 'gpt2-small'"):
        load_model("gpt2-smal")
    with pytest.raises(ModelError, match="field 'heads'"):
        load_model("gpt:layers=2,hidden=100,heads=3")


def _best(graph, a100):
    problem = build_problem(graph, parse_mesh("8", a100), a100)
    value, choice = brute_force(problem)
    return {t.op.name: t.strategies[c][0] for t, c in zip(problem.ops, choice)}


def test_regime_flip_tensor_parallel_when_tokens_few(a100):
    best = _best(mlp(batch=8, hidden=8192), a100)
    assert best["fc1"] == "f" and best["fc2"] == "f"  # column then row parallel


def test_regime_flip_data_parallel_when_tokens_many(a100):
    # 32768 tokens: at 4096 the four gradient all-reduces' latency (one per parameter) outweighs the
    # 83 us of replicated compute, and replicating wins.
    best = _best(mlp(batch=32768, hidden=256), a100)
    assert best["fc1"] == "b" and best["fc2"] == "b"
