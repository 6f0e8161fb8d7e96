"""Collectives of a compiled XLA (HLO) module: kinds, bytes and the mesh axes each group spans.

The all-reduce, all-gather, reduce-scatter, all-to-all and collective-permute ops are read with
their byte sizes and replica groups (list form ``{{0,1},..}``, iota form ``[G,S]<=[dims]T(perm)``
and mesh form ``mesh['a'=2,'b'=4] {'a'}``), and each group is mapped to the mesh axes its devices
differ in. The CPU backend has no reduce-scatter: it writes an all-reduce whose results are only
sliced down to the device's block (a fusion fed by the partition id); such an all-reduce is read as
the reduce-scatter it implements, element by element when XLA combined several into one tuple.
Bytes follow the cost model's convention: n is the full buffer on the axis (all-reduce and
reduce-scatter: the input, all-gather: the output, all-to-all: one rank's buffer).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

KINDS = {
    "all-reduce": "all_reduce",
    "all-gather": "all_gather",
    "reduce-scatter": "reduce_scatter",
    "all-to-all": "all_to_all",
    "collective-permute": "p2p",
}
DTYPE_BYTES = {
    "f64": 8,
    "f32": 4,
    "bf16": 2,
    "f16": 2,
    "s64": 8,
    "s32": 4,
    "u32": 4,
    "s8": 1,
    "u8": 1,
    "pred": 1,
    "s16": 2,
    "u16": 2,
    "u64": 8,
}
LINE = re.compile(
    r"=\s*(?P<shape>\(.*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(?P<op>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\("
)


@dataclass(frozen=True, slots=True)
class HloCollective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all | p2p
    nbytes: float  # n, the cost model's convention
    axes: tuple[str, ...]  # mesh axes the group spans, in mesh order


def shape_bytes(text: str) -> int:
    """Bytes of an HLO shape (a tuple sums its elements)."""
    total = 0
    for dtype, dims in re.findall(r"([a-z]+[0-9]*)\[([0-9,]*)\]", text):
        total += DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
    return total


def replica_groups(line: str, num_devices: int) -> list[list[int]]:
    """Device groups of a collective: list form, iota form, or source-target pairs."""
    import numpy as np

    match = re.search(r"replica_groups=\{(\{[0-9,]*\}(?:,\{[0-9,]*\})*)?\}", line)
    if match:
        groups = [
            [int(x) for x in g.split(",") if x]
            for g in re.findall(r"\{([0-9,]*)\}", match.group(1) or "")
        ]
        return [g for g in groups if g] or [list(range(num_devices))]
    match = re.search(r"replica_groups=\[([0-9,]+)\]<=\[([0-9,]+)\](?:T\(([0-9,]+)\))?", line)
    if match:
        shape = [int(x) for x in match.group(1).split(",")]
        dims = [int(x) for x in match.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(x) for x in match.group(3).split(",")])
        return ids.reshape(shape[0], -1).tolist()
    match = re.search(
        r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}", line
    )
    # mesh form: device ids over named dims (row-major, or as device_ids says); groups vary
    if match:
        dims = re.findall(r"'?([A-Za-z_][A-Za-z0-9_]*)'?\s*=\s*([0-9]+)", match.group(1))
        names = [n for n, _ in dims]
        chosen = [
            names.index(n) for n in re.findall(r"'?([A-Za-z_][A-Za-z0-9_]*)'?", match.group(3))
        ]
        sizes = [int(s) for _, s in dims]
        ids = np.arange(math.prod(sizes))
        order = re.fullmatch(r"\[([0-9,]+)\](?:T\(([0-9,]+)\))?", (match.group(2) or "").strip())
        if order:  # iota device order: arange(prod).reshape(dims).transpose(perm)
            ids = ids.reshape([int(x) for x in order.group(1).split(",")])
            if order.group(2):
                ids = ids.transpose([int(x) for x in order.group(2).split(",")])
        elif match.group(2):
            ids = np.array([int(x) for x in re.findall(r"[0-9]+", match.group(2))])
        ids = ids.reshape(sizes)
        rest = [ax for ax in range(len(dims)) if ax not in chosen]
        return (
            ids.transpose(rest + chosen)
            .reshape(-1, math.prod(int(dims[ax][1]) for ax in chosen))
            .tolist()
        )
    match = re.search(r"source_target_pairs=\{((?:\{[0-9]+,[0-9]+\},?)*)\}", line)
    if match:
        return [[int(a), int(b)] for a, b in re.findall(r"\{([0-9]+),([0-9]+)\}", match.group(1))]
    return [list(range(num_devices))]


def group_axes(
    groups: list[list[int]], mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]
) -> tuple[str, ...]:
    import numpy as np

    varying = set()
    for group in groups:
        coords = np.array([np.unravel_index(d, mesh_shape) for d in group])
        varying |= {ax for ax in range(len(mesh_shape)) if len(set(coords[:, ax])) > 1}
    return tuple(axis_names[ax] for ax in sorted(varying))


COMMENT = re.compile(r"/\*.*?\*/")
INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\([^=]*?\)|\S+)\s+"
    r"(?P<op>[\w\-]+)\((?P<args>[^)]*)"
)


def _users(hlo: str) -> tuple[dict[str, list[str]], dict[str, tuple[str, str, list[str]]]]:
    """Users of every instruction, and each instruction's (shape, opcode, operands)."""
    users: dict[str, list[str]] = {}
    defs = {}
    for line in hlo.splitlines():
        match = INSTRUCTION.match(line)
        if not match:
            continue
        operands = re.findall(r"%([\w.\-]+)", match.group("args"))
        defs[match.group("name")] = (match.group("shape"), match.group("op"), operands)
        for operand in operands:
            users.setdefault(operand, []).append(match.group("name"))
    return users, defs


def _elements(shape: str) -> int:
    return sum(
        math.prod(int(d) for d in dims.split(",") if d)
        for dims in re.findall(r"\[([0-9,]*)\]", shape)
    )


def _is_scatter(name: str, group: int, users, defs) -> bool:
    """An all-reduce whose every result is only cut down to this device's 1/group block (a slice
    indexed by the partition id): the reduce-scatter the CPU backend writes as all-reduce +
    slice."""
    shape, _, _ = defs[name]
    results = (
        [u for u in users.get(name, []) if defs[u][1] == "get-tuple-element"]
        if shape.startswith("(")
        else [name]
    )
    if not results:
        return False
    for result in results:
        consumers = users.get(result, [])
        if not consumers:
            return False
        for consumer in consumers:
            operands = defs[consumer][2]
            if not any(
                defs.get(o, ("", "", []))[1] in ("partition-id", "replica-id") for o in operands
            ):
                return False
            if _elements(defs[consumer][0]) * group != _elements(defs[result][0]):
                return False
    return True


def _all_reduce_parts(name: str, group: int, users, defs) -> list[tuple[str, int]]:
    """(kind, bytes) of an all-reduce: XLA combines independent all-reduces into one of a tuple, so
    each element read out (get-tuple-element) counts on its own, as a reduce-scatter when it is only
    cut down to this device's block; elements nobody reads count as all-reduced."""
    shape = defs[name][0]
    if not shape.startswith("("):
        return [
            (
                "reduce_scatter" if _is_scatter(name, group, users, defs) else "all_reduce",
                shape_bytes(shape),
            )
        ]
    parts, seen = [], 0
    for element in (u for u in users.get(name, []) if defs[u][1] == "get-tuple-element"):
        nbytes = shape_bytes(defs[element][0])
        parts.append(
            ("reduce_scatter" if _is_scatter(element, group, users, defs) else "all_reduce", nbytes)
        )
        seen += nbytes
    if shape_bytes(shape) > seen:
        parts.append(("all_reduce", shape_bytes(shape) - seen))
    return parts


def _feeds_all_reduce(name: str, users, defs) -> bool:
    """An all-reduce whose one user is another all-reduce of the same array: one step of a
    reduction over several mesh axes that the CPU backend writes one axis at a time."""
    shape, only = defs[name][0], users.get(name, [])
    return (
        defs[name][1] == "all-reduce"
        and not shape.startswith("(")
        and len(only) == 1
        and defs[only[0]][1] == "all-reduce"
        and defs[only[0]][0] == shape
    )


def _chain_before(name: str, users, defs) -> list[str]:
    """The all-reduces that feed ``name`` step by step (the first first)."""
    chain, operands = [], defs[name][2]
    while (
        len(operands) == 1 and operands[0] in defs and _feeds_all_reduce(operands[0], users, defs)
    ):
        chain.insert(0, operands[0])
        operands = defs[operands[0]][2]
    return chain


def _reduction(chain, groups_of, users, defs, mesh_shape, axis_names) -> list[HloCollective]:
    """A chain of all-reduces (one per mesh axis) whose result is only cut down to this device's
    block over all of them: the one reduce-scatter over those axes it implements (the CPU
    backend's all-reduce + all-reduce + slice). Otherwise each step is read on its own."""
    last = chain[-1]
    axes_of = {m: group_axes(groups_of[m], mesh_shape, axis_names) for m in chain}
    if len(chain) > 1:
        group = math.prod(len(groups_of[m][0]) for m in chain)
        union = tuple(a for a in axis_names if any(a in axes_of[m] for m in chain))
        if _is_scatter(last, group, users, defs):
            return [HloCollective("reduce_scatter", float(shape_bytes(defs[last][0])), union)]
    out = [
        HloCollective("all_reduce", float(shape_bytes(defs[m][0])), axes_of[m]) for m in chain[:-1]
    ]
    return out + [
        HloCollective(kind, float(nbytes), axes_of[last])
        for kind, nbytes in _all_reduce_parts(last, len(groups_of[last][0]), users, defs)
    ]


def parse_collectives(
    hlo: str, mesh_shape: tuple[int, ...], axis_names: tuple[str, ...]
) -> list[HloCollective]:
    """Every collective of a compiled HLO module with its bytes (n) and mesh axes."""
    out = []
    num_devices = math.prod(mesh_shape)
    # XLA numbers long operand lists with /*index=5*/, whose '=' breaks the shapes
    hlo = COMMENT.sub("", hlo)
    users, defs = _users(hlo)
    groups_of: dict[str, list[list[int]]] = {}
    for line in hlo.splitlines():
        match = LINE.search(line)
        if not match or "-done" in line.split("=")[1].split("(")[0]:
            continue
        kind = KINDS[match.group("op")]
        groups = replica_groups(line, num_devices)
        name = INSTRUCTION.match(line).group("name") if INSTRUCTION.match(line) else ""
        if kind == "all_reduce" and name:
            groups_of[name] = groups
            if not _feeds_all_reduce(name, users, defs):  # a chain's last step reads it whole
                chain = _chain_before(name, users, defs) + [name]
                out.extend(_reduction(chain, groups_of, users, defs, mesh_shape, axis_names))
            continue
        nbytes = shape_bytes(match.group("shape"))
        if kind == "reduce_scatter":
            nbytes *= len(groups[0])
        if kind == "p2p":  # bytes per device: only the pairs that leave a device send anything
            groups = [pair for pair in groups if pair[0] != pair[1]]
            nbytes *= len(groups) / num_devices
            if not groups:
                continue
        out.append(HloCollective(kind, float(nbytes), group_axes(groups, mesh_shape, axis_names)))
    return out
