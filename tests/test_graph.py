"""Graph validation: every malformed graph raises a ValueError subclass naming the operator and the field."""

import pytest

from planner.errors import GraphError
from planner.ir.graph import Graph, Tensor
from planner.ir.ops import GraphBuilder, make_operator


def test_cycle_is_rejected():
    a = make_operator("relu", "a", "bk->bk", ["t2"], ["t1"], {"b": 2, "k": 4})
    b = make_operator("relu", "b", "bk->bk", ["t1"], ["t2"], {"b": 2, "k": 4})
    tensors = (Tensor("t1", (2, 4)), Tensor("t2", (2, 4)))
    with pytest.raises(GraphError, match=r"operator (a|b): field 'inputs' closes a cycle"):
        Graph("g", tensors, (a, b))


def test_shape_mismatch_names_operator_and_field():
    gb = GraphBuilder("g")
    x = gb.data("x", (4, 8))
    y = gb.op("relu", "r", "bk->bk", [x])
    op = make_operator("matmul", "mm", "bk,kn->bn", [y, "w"], ["out"], {"b": 4, "k": 6, "n": 2})
    tensors = (Tensor("x", (4, 8), "data"), Tensor("r", (4, 8)), Tensor("w", (6, 2), "param"), Tensor("out", (4, 2)))
    with pytest.raises(GraphError, match=r"operator mm: field 'inputs' sees r with shape \(4, 6\)"):
        Graph("g", tensors, (gb.build().operator("r"), op))


def test_unknown_operator_kind():
    with pytest.raises(GraphError, match=r"operator foo: field 'kind' is unknown operator 'frobnicate'"):
        make_operator("frobnicate", "foo", "a->a", ["x"], ["y"], {"a": 2})


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_non_positive_dim(size):
    with pytest.raises(GraphError, match=r"operator bad: field 'dims'"):
        make_operator("relu", "bad", "a->a", ["x"], ["y"], {"a": size})


def test_errors_are_value_errors():
    assert issubclass(GraphError, ValueError)


def test_duplicate_names_and_dangling_tensor():
    with pytest.raises(GraphError, match="field 'name' is not unique"):
        Graph("g", (Tensor("x", (2,)), Tensor("x", (2,))), ())
    op = make_operator("relu", "r", "a->a", ["missing"], ["y"], {"a": 2})
    with pytest.raises(GraphError, match="operator r: field 'inputs' names unknown tensor 'missing'"):
        Graph("g", (Tensor("y", (2,)),), (op,))


def test_networkx_view_and_topological_order():
    gb = GraphBuilder("g")
    x = gb.data("x", (2, 4))
    a = gb.op("relu", "a", "bk->bk", [x])
    b = gb.op("relu", "b", "bk->bk", [a])
    gb.op("add", "c", "bk,bk->bk", [a, b])
    g = gb.build()
    nxg = g.to_networkx()
    assert sorted((u, v, d["tensor"]) for u, v, d in nxg.edges(data=True)) == [("a", "b", "a"), ("a", "c", "a"), ("b", "c", "b")]
    assert [op.name for op in g.operators] == ["a", "b", "c"]
