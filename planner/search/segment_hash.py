"""Content hashes of the homomorphism decomposition's segments (``planner.search.decompose``):
two segments with equal hashes have equal operator tables, edges and exit layouts, so their
tables are reduced once. Each table's and edge's bytes are hashed once per object, and a
segment's hash once per set of objects (``Problem.digests``, shared by a problem's copies)."""

from __future__ import annotations

import hashlib

from planner.cost.problem import Problem


def _digest(problem: Problem, obj, content) -> bytes:
    """The sha256 of ``content(obj)``, computed once per object (``Problem.digests`` keeps the
    object, so its id is not reused while the digest is held)."""
    found = problem.digests.get(id(obj))
    if found is None or found[0] is not obj:
        found = (obj, hashlib.sha256(content(obj)).digest())
        problem.digests[id(obj)] = found
    return found[1]


def _array_bytes(array) -> bytes:
    return array.tobytes()


def _table_bytes(problem: Problem, table) -> bytes:
    # the arrays, not the table: identical operators' tables share them (one hash per array)
    return _digest(problem, table.cost, _array_bytes) + _digest(problem, table.memory, _array_bytes)


def _edge_bytes(problem: Problem, local: dict[int, int], e) -> bytes:
    src = local.get(e.src, -1)
    return (
        b"%d>%d:%d:%d|%d|" % (
            src,
            local[e.dst],
            e.src_slot if src >= 0 else -1,
            e.dst_slot,
            hash(e.dst_layouts),
        )
        + _digest(problem, e.cost, _array_bytes)
        + _digest(problem, e.src_index, _array_bytes)
        + _digest(problem, e.dst_index, _array_bytes)
    )  # fmt: skip


def edges_by_dst(problem: Problem) -> dict[int, list]:
    by_dst: dict[int, list] = {}
    for e in problem.edges:
        by_dst.setdefault(e.dst, []).append(e)
    return by_dst


def content_key(
    problem: Problem,
    ops: tuple[int, ...],
    exit_tensor: str | None,
    exit_producer: int | None,
    by_dst: dict[int, list],
) -> str:
    """The segment's hash, computed once per set of table and edge objects: the conditioned and
    restricted copies of a problem (``Problem.digests`` is theirs too) replace a few tables and
    edges and keep the rest, so most of their segments are hashed once."""
    tables = tuple(problem.ops[op] for op in ops)
    edges = tuple(e for op in ops for e in by_dst.get(op, ()))
    index = problem.producer_layout_index(exit_tensor) if exit_tensor else None
    ident = (
        "segment",
        ops,
        exit_producer,
        tuple(map(id, tables)),
        tuple(map(id, edges)),
        id(index),
    )
    found = problem.digests.get(ident)
    if found is None:
        # the objects are held with the hash: their ids are not reused while it is kept
        found = (
            (tables, edges, index),
            _segment_hash(problem, ops, tables, edges, exit_producer, index),
        )
        problem.digests[ident] = found
    return found[1]


def _segment_hash(problem: Problem, ops, tables, edges, exit_producer, index) -> str:
    local = {op: n for n, op in enumerate(ops)}
    digest = hashlib.sha256()
    edges_of: dict[int, list] = {}
    for e in edges:
        edges_of.setdefault(e.dst, []).append(e)
    for op, table in zip(ops, tables):
        digest.update(_table_bytes(problem, table))
        for e in edges_of.get(op, ()):
            digest.update(_edge_bytes(problem, local, e))
    if index is not None:
        digest.update(b"exit%d" % local[exit_producer] + index.tobytes())
    return digest.hexdigest()
