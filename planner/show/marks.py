"""The marks every figure draws with: the colours of passes, memory parts and dim families, bars
that carry a gid each (tests read the drawn data back by gid), the device limit line, legends and
palettes (matplotlib imported only inside the functions that need it)."""

from __future__ import annotations

# outside, right of the panel
LEGEND = {"fontsize": 7, "loc": "upper left", "bbox_to_anchor": (1.0, 1.0)}
COLOURS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "recompute": "#8172B2",
    "comm": "#C44E52",
    "sync": "#DD8452",
    "bubble": "#DDDDDD",
    "compute": "#4C72B0",
    "params": "#4C72B0",
    "grads": "#55A868",
    "optimizer": "#8172B2",
    "activations": "#DD8452",
    "working": "#937860",
    "tied": "#DA8BC3",
}
FAMILY_COLOURS = {
    "batch": "#4C72B0",
    "sequence": "#64B5CD",
    "heads": "#55A868",
    "ffn": "#8172B2",
    "vocab": "#C44E52",
    "hidden": "#DD8452",
    "experts": "#DA8BC3",
    "other": "#937860",
    "replicate": "#EEEEEE",
}


def limit_line(ax, limit: float | None, peak_gib: float) -> None:
    """The device limit as a line, unless it is so far above the bars that they would flatten."""
    if limit is not None and limit / 2**30 <= 4 * peak_gib:
        ax.axhline(
            limit / 2**30,
            color="black",
            linestyle="--",
            linewidth=1,
            gid="limit",
            label=f"device limit {limit / 2**30:.1f} GiB",
        )


def limit_note(limit: float | None, peak_gib: float) -> str:
    if limit is None:
        return ", no device limit"
    return (
        ""
        if limit / 2**30 <= 4 * peak_gib
        else f" (device limit {limit / 2**30:.1f} GiB, off the scale)"
    )


def hbars(
    ax, y, widths, lefts, colour, gid, height: float = 0.8, hatch=None, label=None, edge=None
) -> None:
    if not len(y):
        return
    bars = ax.barh(
        y,
        widths,
        left=lefts,
        height=height,
        color=colour,
        hatch=hatch,
        label=label,
        edgecolor=edge,
        linewidth=0.5 if edge else 0,
    )
    gids = gid if isinstance(gid, list) else [gid] * len(bars)
    for patch, name in zip(bars, gids):
        patch.set_gid(name)


def vbars(ax, x, heights, bottom, colour, gid, label=None) -> None:
    for patch in ax.bar(list(x), heights, bottom=bottom, color=colour, label=label, width=0.6):
        patch.set_gid(gid)


def legend(ax, names, labels: dict | None = None, colours: dict | None = None) -> None:
    from matplotlib.patches import Patch

    colours, labels = colours or COLOURS, labels or {}
    ax.legend(handles=[Patch(color=colours[n], label=labels.get(n, n)) for n in names], **LEGEND)


def palette(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]
