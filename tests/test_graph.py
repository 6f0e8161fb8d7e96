"""Graph validation: every malformed graph raises a ValueError subclass naming the operator and the
field."""

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
    tensors = (
        Tensor("x", (4, 8), "data"),
        Tensor("r", (4, 8)),
        Tensor("w", (6, 2), "param"),
        Tensor("out", (4, 2)),
    )
    with pytest.raises(GraphError, match=r"operator mm: field 'inputs' sees r with shape \(4, 6\)"):
        Graph("g", tensors, (gb.build().operator("r"), op))


def test_unknown_operator_kind():
    with pytest.raises(
        GraphError, match=r"operator foo: field 'kind' is unknown operator 'frobnicate'"
    ):
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
    with pytest.raises(
        GraphError, match="operator r: field 'inputs' names unknown tensor 'missing'"
    ):
        Graph("g", (Tensor("y", (2,)),), (op,))


def test_networkx_view_and_topological_order():
    gb = GraphBuilder("g")
    x = gb.data("x", (2, 4))
    a = gb.op("relu", "a", "bk->bk", [x])
    b = gb.op("relu", "b", "bk->bk", [a])
    gb.op("add", "c", "bk,bk->bk", [a, b])
    g = gb.build()
    nxg = g.to_networkx()
    assert sorted((u, v, d["tensor"]) for u, v, d in nxg.edges(data=True)) == [
        ("a", "b", "a"),
        ("a", "c", "a"),
        ("b", "c", "b"),
    ]
    assert [op.name for op in g.operators] == ["a", "b", "c"]


def _two_layer(batch_dim: str, batch: int = 8) -> Graph:
    gb = GraphBuilder("named-batch", batch_dim=batch_dim)
    x = gb.data("x", (batch, 16))
    h = gb.op("matmul", "fc1", f"{batch_dim}k,kf->{batch_dim}f", [x, gb.param("w1", (16, 32))])
    y = gb.op("matmul", "fc2", f"{batch_dim}f,fm->{batch_dim}m", [h, gb.param("w2", (32, 16))])
    gb.op("reduce", "loss", f"{batch_dim}m->", [y], out="loss")
    return gb.build()


def test_batch_dim_is_a_property_of_the_graph(tmp_path):
    from planner.ir.graph_json import load_graph, save_graph

    graph = _two_layer("n", batch=24)
    assert (graph.batch_dim, graph.batch_size) == ("n", 24)
    save_graph(graph, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert (again.batch_dim, again.batch_size) == ("n", 24)
    with pytest.raises(GraphError, match="field 'batch_dim' 'z' is in no operator"):
        _ = Graph(graph.name, graph.tensors, graph.operators, "z").batch_size


def test_dim_names_round_trip_and_are_checked(tmp_path):
    from planner.ir.graph_json import load_graph, save_graph

    graph = _two_layer("n")
    # the zoo's letters, the default (and of older graph files)
    assert graph.dim_names == "semantic"
    positional = Graph(graph.name, graph.tensors, graph.operators, "n", "positional")
    save_graph(positional, tmp_path / "g.json")
    assert load_graph(tmp_path / "g.json").dim_names == "positional"
    with pytest.raises(
        GraphError, match="field 'dim_names' 'sorted' is not one of semantic, positional"
    ):
        Graph(graph.name, graph.tensors, graph.operators, "n", "sorted")


def test_batch_dims_of_different_sizes_are_named():
    gb = GraphBuilder("mixed")
    a = gb.op("relu", "r1", "bk->bk", [gb.data("x", (4, 8))])
    gb.op("matmul", "m", "kb,bn->kn", [gb.data("y", (8, 2)), gb.param("w", (2, 3))])
    graph = gb.build()
    assert a
    with pytest.raises(GraphError, match=r"field 'batch_dim' 'b' has different sizes \[2, 4\]"):
        _ = graph.batch_size


def test_data_parallel_splits_the_graphs_batch_dim():
    """The baseline reads the batch dim from the graph: 'n' here; a graph that calls its batch 'b'
    but has no 'b' in a layer gets no split there."""
    from planner import make_cluster, make_problem
    from planner.search.baselines import data_parallel

    problem = make_problem(_two_layer("n"), make_cluster("4", "a100-80g"))
    assert [s for s in data_parallel(problem)] == [("n",), ("n",), ("n",)]
