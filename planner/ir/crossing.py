"""What crosses a pipeline boundary: the one rule for the 3D cost model, the runners and ``verify``.

With the operators placed at positions 0..n-1 (layers or stages, in execution order), boundary k
lies between positions k and k+1. A tensor made at position i and last read at position j > i
crosses every boundary i, i+1, ..., j-1: neighbouring stages hand it on (the multi-stage runtimes
send only to the next stage), so it is sent once at each boundary it crosses, however many
operators read it after. Graph inputs (data, parameters) are fed where they are read: never sent.
"""

from __future__ import annotations

from typing import Mapping

from planner.ir.graph import Graph


def crossing_tensors(graph: Graph, position: Mapping[str, int], count: int) -> list[list[str]]:
    """Per boundary k (position k -> k+1, k < count - 1), the tensors made at or before position
    k and read after it, sorted by name."""
    made = {o.tensor: position[op.name] for op in graph.operators for o in op.outputs}
    crossing: list[set[str]] = [set() for _ in range(max(0, count - 1))]
    for op in graph.operators:
        for operand in op.inputs:
            if operand.tensor in made:
                for k in range(made[operand.tensor], min(position[op.name], count - 1)):
                    crossing[k].add(operand.tensor)
    return [sorted(names) for names in crossing]


def stages_reading(graph: Graph, stage_of: Mapping[str, int]) -> dict[str, set[int]]:
    """Per parameter, the stages that read it (two or more: a tied parameter with a copy on
    each)."""
    out: dict[str, set[int]] = {}
    for op in graph.operators:
        for o in op.inputs:
            if graph.tensor(o.tensor).role == "param":
                out.setdefault(o.tensor, set()).add(stage_of[op.name])
    return out


def tied_copies(graph: Graph, stage_of: Mapping[str, int]) -> int:
    """The most stages that hold a copy of one parameter (1: nothing is tied across stages)."""
    return max((len(s) for s in stages_reading(graph, stage_of).values()), default=1)
