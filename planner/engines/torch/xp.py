"""The slice of numpy's API the interpreter uses (``planner.engines.interpret``), on torch tensors,
so the same kernels run under autograd on each rank of a PyTorch run (``planner run-torch``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


einsum = torch.einsum
exp, log, tanh, sqrt = torch.exp, torch.log, torch.tanh, torch.sqrt
stack = lambda parts, axis=0: torch.stack(list(parts), dim=axis)  # noqa: E731
concatenate = lambda parts, axis=0: torch.cat(list(parts), dim=axis)  # noqa: E731


def reshape(x, shape):
    return torch.reshape(x, tuple(shape))


def _reduce(fn, x, axis, keepdims):
    if axis is None:
        return fn(x)
    return fn(x, dim=axis, keepdim=keepdims)


def sum(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(torch.sum, x, axis, keepdims)


def mean(x, axis=None, keepdims=False):
    return _reduce(torch.mean, x, axis, keepdims)


def max(x, axis=None, keepdims=False):  # noqa: A001
    return _reduce(torch.amax, x, axis, keepdims)


def maximum(x, y):
    return torch.maximum(x, torch.as_tensor(y, dtype=x.dtype))


def clip(x, low, high):
    return torch.clamp(x, low, high)


def expand_dims(x, axis):
    return torch.unsqueeze(x, axis)


def arange(n):
    return torch.arange(n)


def take(x, index, axis=0):
    if isinstance(index, int):
        return x.select(axis, index)
    picked = torch.index_select(x, axis, index.reshape(-1).long())
    return picked.reshape(x.shape[:axis] + tuple(index.shape) + x.shape[axis + 1 :])


def take_along_axis(x, index, axis):
    return torch.take_along_dim(x, index.long(), dim=axis)


def broadcast_to(x, shape):
    return torch.broadcast_to(x, tuple(shape))


def pad(x, widths, constant_values=0.0):
    flat = [w for pair in reversed(widths) for w in pair]
    return F.pad(x, flat, value=constant_values)


def where(condition, x, y):
    return torch.where(condition, x, torch.as_tensor(y, dtype=x.dtype))
