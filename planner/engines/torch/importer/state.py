"""The importer's state while it walks an exported program: the graph builder, the IR tensor of
every fx value, and the generic helpers the ATen handlers share (fresh einsum letters, shape checks
against the trace, broadcasting, the opaque fallback)."""

from __future__ import annotations

from typing import Sequence

from planner.errors import GraphError
from planner.ir.ops import GraphBuilder

# the batch letter and conv/pool letters (HWpqrt) apart
LETTERS = "acdefgijklmnosuvwxyzABCDEFGIJKLMNOPQSUVXYZ"


class TorchImportError(GraphError):
    """An exported op the importer cannot map (names the op)."""


class ImportState:
    def __init__(self, name: str, allow_unknown: bool) -> None:
        self.gb = GraphBuilder(name, dim_names="positional")
        self.allow_unknown = allow_unknown
        # fx node name -> IR tensor name (or a python scalar)
        self.value: dict[str, str | float] = {}
        self.kind: dict[str, str] = {}  # IR tensor -> "param" | "data" | "activation"
        self.batch = 0  # dim 0 of the first user input: a leading dim of that size is the batch dim
        self.batch_dim = self.gb.batch_dim
        self.skip: set[str] = set()  # fx nodes a pattern handler has already written (MoE routing)
        self.layers: dict[str, int] = {}  # module path of a container item (a block) -> its layer

    # ------------------------------------------------------------------ helpers

    def tensor(self, arg) -> str | None:
        name = getattr(arg, "name", None)
        value = self.value.get(name) if name else None
        return value if isinstance(value, str) else None

    def letters(self, count: int, first_size: int | None = None) -> list[str]:
        """Fresh letters for an operator; the first is 'b' when it has the batch size (so the
        data-parallel baseline, which splits 'b', applies to imported graphs)."""
        if count > len(LETTERS):
            raise TorchImportError(
                f"import: a tensor of rank {count} is beyond the {len(LETTERS)} einsum letters"
            )
        if count and first_size is not None and first_size == self.batch:
            return [self.batch_dim] + list(LETTERS[: count - 1])
        return list(LETTERS[:count])

    def add(
        self, kind: str, node, equation: str, inputs: Sequence[str], sizes: dict[str, int], **extra
    ) -> None:
        out = self.gb.op(
            kind, node.name, equation, list(inputs), sizes=sizes, out=node.name, **extra
        )
        want = tuple(node.meta["val"].shape)
        if self.gb.shape(out) != want:
            raise TorchImportError(
                f"import: operator {node.name} ({node.target}): shape {self.gb.shape(out)} != "
                f"traced {want}"
            )
        self.value[node.name] = out
        self.kind[out] = "activation"

    def broadcast_operand(
        self, shape: Sequence[int], out: list[str], sizes: dict[str, int], fresh
    ) -> str:
        """Letters of an input aligned right to the output; broadcast size-1 dims get own
        letters."""
        offset = len(out) - len(shape)
        text = []
        for i, size in enumerate(shape):
            letter = out[offset + i]
            if size == sizes[letter]:
                text.append(letter)
            else:
                extra = next(fresh)
                sizes[extra] = size
                text.append(extra)
        return "".join(text)

    def unknown(self, node, tensors: list[str]) -> None:
        target = str(node.target)
        if not self.allow_unknown:
            raise TorchImportError(
                f"import: unsupported operator {target} at node {node.name} (pass --allow-unknown "
                "to plan it as a replicated opaque operator)"
            )
        val = node.meta.get("val")
        if not hasattr(val, "shape"):
            raise TorchImportError(
                f"import: unsupported multi-output operator {target} at node {node.name}"
            )
        pool = iter(LETTERS)
        sizes, operands = {}, []
        for t in tensors:
            text = "".join(next(pool) for _ in self.gb.shape(t))
            sizes.update(zip(text, self.gb.shape(t)))
            operands.append(text)
        out = "".join(next(pool) for _ in val.shape)
        sizes.update(zip(out, val.shape))
        self.add(
            "opaque",
            node,
            ",".join(operands) + "->" + out,
            tensors,
            sizes,
            unsplittable="".join(sizes),
        )


def failure(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__
