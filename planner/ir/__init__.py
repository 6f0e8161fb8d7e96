"""The intermediate representation: tensors and operators in einsum form (``graph``), the operator
registry and the graph builder every model is written with (``ops``), and the graph JSON format
(``graph_json``). Nothing here knows about meshes, costs or searches."""
