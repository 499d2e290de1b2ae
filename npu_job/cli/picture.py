"""Pictures of a plan: the switches as boxes, every node with its pod index and new rank, the
ring's cross-switch edges, the scheduler's order and ours side by side (``npu-job plan
--picture``, ``npu-job demo --picture``), and the figure helpers the fabric benchmark plots with.

:func:`layout` is pure: it computes every box, label and edge from the rank table, the topology
and the plan, in abstract units, so the tests can check the picture without drawing it.
:func:`draw` hands that to matplotlib, an optional extra (``pip install 'npu-job[picture]'``)
that nothing on the pod side needs: it is imported only inside the drawing functions, and
without it :func:`require_matplotlib` raises :class:`~npu_job.errors.MissingExtraError`.
Files are written atomically (rendered in memory, then temp file + rename).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from npu_job.errors import MissingExtraError

EXTRA = "picture"
FORMATS = (".png", ".svg")
NODES_PER_COLUMN = 8  # nodes stacked in one column of a switch box before another column starts
SWITCHES_PER_ROW = 6
LABELLED_NODES = 128  # above this, nodes are drawn without their text

# geometry, in abstract units (one node box is NODE_W x NODE_H)
NODE_W, NODE_H, NODE_GAP = 1.5, 0.7, 0.25
PAD, HEADER, SWITCH_GAP = 0.3, 0.7, 0.9


@dataclass(frozen=True)
class Box:
    x: float  # lower-left corner
    y: float
    w: float
    h: float

    @property
    def centre(self) -> Tuple[float, float]:
        return self.x + self.w / 2, self.y + self.h / 2

    def contains(self, other: Box) -> bool:
        return (
            self.x <= other.x
            and other.x + other.w <= self.x + self.w
            and self.y <= other.y
            and other.y + other.h <= self.y + self.h
        )

    def overlaps(self, other: Box) -> bool:
        return (
            self.x < other.x + other.w
            and other.x < self.x + self.w
            and self.y < other.y + other.h
            and other.y < self.y + self.h
        )


@dataclass(frozen=True)
class SwitchBox:
    label: str  # the ToR (or "A+B" for a node on two, "no topology"), outer tiers first
    box: Box
    pods: Tuple[int, ...]


@dataclass(frozen=True)
class NodeBox:
    pod: int
    box: Box
    switch: int  # index into the panel's switches


@dataclass(frozen=True)
class Panel:
    """One order: which rank each pod gets and which ring edges leave their switch."""

    title: str
    rank_of_pod: Tuple[int, ...]
    cross_edges: Tuple[Tuple[int, int], ...]  # (pod of rank r, pod of rank r+1), switches differ

    def label(self, pod: int) -> str:
        return f"pod {pod}\nrank {self.rank_of_pod[pod]}"


@dataclass(frozen=True)
class Picture:
    title: str
    switches: Tuple[SwitchBox, ...]  # the same boxes in both panels
    nodes: Tuple[NodeBox, ...]  # by pod index
    panels: Tuple[Panel, ...]  # scheduler order, ours
    width: float
    height: float
    labelled: bool


def layout(table: Any, topology: Any, plan: Any, *, title: str = "") -> Picture:
    """The picture of ``plan`` for ``table`` on ``topology`` (pure; units are abstract).

    Switch groups are the planner's (:func:`npu_job.bootstrap.planner.switch_groups`), in its
    order; inside a box the nodes go by our new rank, top to bottom. Cross-switch edges are the
    ring's ``r -> r+1`` whose nodes sit on different switch groups (the scorer's rule).
    """
    from npu_job.bootstrap import canonical, planner, scorer
    from npu_job.bootstrap.base.model import PlanStatus

    count = len(table.servers)
    groups, _placed = planner.switch_groups(table, topology)
    ours = tuple(plan.node_rank_of_pod)
    switches: List[SwitchBox] = []
    nodes: Dict[int, NodeBox] = {}
    sizes = [_switch_size(len(group)) for group in groups]
    rows = [
        list(range(start, min(start + SWITCHES_PER_ROW, len(groups))))
        for start in range(0, len(groups), SWITCHES_PER_ROW)
    ]
    row_heights = [max(sizes[i][1] for i in row) for row in rows]
    width = max(
        (sum(sizes[i][0] for i in row) + SWITCH_GAP * (len(row) - 1) for row in rows), default=0.0
    )
    height = sum(row_heights) + SWITCH_GAP * max(0, len(rows) - 1)
    top = height
    for row, row_height in zip(rows, row_heights):
        x = 0.0
        for index in row:
            group = sorted(groups[index], key=ours.__getitem__)
            w, h = sizes[index]
            box = Box(x, top - h, w, h)
            switches.append(
                SwitchBox(_group_label(canonical, table, topology, group), box, tuple(group))
            )
            for position, pod in enumerate(group):
                column, place = divmod(position, NODES_PER_COLUMN)
                nodes[pod] = NodeBox(
                    pod,
                    Box(
                        x + PAD + column * (NODE_W + NODE_GAP),
                        top - HEADER - (place + 1) * NODE_H - place * NODE_GAP,
                        NODE_W,
                        NODE_H,
                    ),
                    len(switches) - 1,
                )
            x += w + SWITCH_GAP
        top -= row_height + SWITCH_GAP
    keys = scorer.switch_keys(table, topology)
    scheduler = tuple(range(count))
    planned = plan.status is PlanStatus.SUCCESS
    ours_order = tuple(plan.pod_of_node_rank)
    bound = scorer.ring_lower_bound(scheduler, keys)

    def panel(name: str, order: Tuple[int, ...]) -> Panel:
        edges = _cross_edges(order, keys)
        rank_of_pod = [0] * count
        for rank, pod in enumerate(order):
            rank_of_pod[pod] = rank
        return Panel(
            f"{name}: {len(edges)} cross-switch ring edges (lower bound {bound})",
            tuple(rank_of_pod),
            edges,
        )

    ours_name = (
        f"npu-job order ({plan.collective.value})"
        if planned
        else "npu-job order: not planned, scheduler order kept"
    )
    return Picture(
        title or f"{count} nodes on {len(groups)} switch groups",
        tuple(switches),
        tuple(nodes[pod] for pod in range(count)),
        (panel("scheduler order (rank = pod index)", scheduler), panel(ours_name, ours_order)),
        width,
        height,
        count <= LABELLED_NODES,
    )


def _switch_size(members: int) -> Tuple[float, float]:
    columns = max(1, math.ceil(members / NODES_PER_COLUMN))
    rows = min(members, NODES_PER_COLUMN)
    return (
        2 * PAD + columns * NODE_W + (columns - 1) * NODE_GAP,
        HEADER + rows * NODE_H + max(0, rows - 1) * NODE_GAP + PAD,
    )


def _group_label(canonical: Any, table: Any, topology: Any, group: Sequence[int]) -> str:
    from npu_job.bootstrap.base.payload import verbatim_or_shown

    tiers, tors, _slot = canonical.switch_path(table.servers[group[0]], topology)
    parts = [verbatim_or_shown(tier) for tier in tiers]
    parts.append("+".join(map(verbatim_or_shown, tors)) if tors else "no topology")
    return " / ".join(parts)


def _cross_edges(
    order: Sequence[int], keys: Sequence[Tuple[str, ...]]
) -> Tuple[Tuple[int, int], ...]:
    count = len(order)
    if count < 2:
        return ()
    pairs = [(order[r], order[(r + 1) % count]) for r in range(count)]
    return tuple((a, b) for a, b in pairs if keys[a] != keys[b])


# ---------------------------------------------------------------------------------------------
# drawing (matplotlib, the optional extra)
# ---------------------------------------------------------------------------------------------
def require_matplotlib() -> None:
    """Raise :class:`MissingExtraError` (one line, exit 9) unless matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError(
            f"drawing a picture needs matplotlib, which is not installed: "
            f"pip install 'npu-job[{EXTRA}]'"
        ) from None


def picture_format(path: str) -> Optional[str]:
    """``png`` or ``svg`` from the file name, else None."""
    suffix = Path(path).suffix.lower()
    return suffix[1:] if suffix in FORMATS else None


def figure(width: float, height: float) -> Any:
    """A matplotlib Figure of ``width`` x ``height`` inches, without pyplot (no GUI backend)."""
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def save_figure(fig: Any, path: str) -> Path:
    """Render ``fig`` as PNG or SVG (by the suffix) in memory, then write it atomically."""
    from matplotlib import rc_context

    from npu_job.fileio import write_atomic

    fmt = picture_format(path)
    if fmt is None:
        raise ValueError(f"{path}: expected a file name ending in .png or .svg")
    buffer = io.BytesIO()
    # text stays text in SVG, ids do not change from run to run, and no date is embedded
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "npu-job"}):
        fig.savefig(buffer, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else None)
    return write_atomic(path, buffer.getvalue(), durable=False)


def _anchors(source: Box, target: Box) -> Tuple[Tuple[float, float], Tuple[float, float]]:
    """Where an edge leaves ``source`` and enters ``target``: the facing sides' middles (the
    right side of both when they share a column, so the arc bulges beside them)."""
    (sx, sy), (tx, ty) = source.centre, target.centre
    if abs(sx - tx) < 1e-9:
        return (source.x + source.w, sy), (target.x + target.w, ty)
    if sx < tx:
        return (source.x + source.w, sy), (target.x, ty)
    return (source.x, sy), (target.x + target.w, ty)


def draw(picture: Picture, path: str) -> Path:
    """Draw ``picture`` to ``path`` (``.png`` or ``.svg``); the written path."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    scale = 0.62  # inches per unit, before a huge picture is capped
    panel_w = max(picture.width, 6.0)
    width = min(2 * (panel_w + 1) * scale + 0.6, 60.0)
    # equal aspect: a panel is (width / 2) inches for panel_w + 1 units; height follows
    per_unit = (width / 2) / (panel_w + 1)
    # plus the title (0.45 inch), the caption (0.3) and the panel titles (0.35)
    fig = figure(width=width, height=min((picture.height + 1.1) * per_unit + 1.1, 40.0))
    fig.suptitle(picture.title, fontsize=12)
    fig.text(
        0.5,
        0.015,
        "boxes: switch groups (ToR), nodes ordered by the new rank; red arrows: "
        "ring edges rank r -> r+1 that leave their switch",
        ha="center",
        fontsize=8,
        color="#555555",
    )
    for index, panel in enumerate(picture.panels):
        axes = fig.add_subplot(1, len(picture.panels), index + 1)
        axes.set_title(panel.title, fontsize=9)
        for switch in picture.switches:
            b = switch.box
            axes.add_patch(
                FancyBboxPatch(
                    (b.x, b.y),
                    b.w,
                    b.h,
                    boxstyle="round,pad=0.02",
                    facecolor="#eef2f7",
                    edgecolor="#5a6b82",
                    lw=1.2,
                    zorder=1,
                )
            )
            axes.text(
                b.x + b.w / 2,
                b.y + b.h - HEADER / 2,
                switch.label,
                ha="center",
                va="center",
                fontsize=7,
                color="#23324a",
                fontweight="bold",
                zorder=2,
            )
        for node in picture.nodes:
            b = node.box
            axes.add_patch(
                FancyBboxPatch(
                    (b.x, b.y),
                    b.w,
                    b.h,
                    boxstyle="round,pad=0.02",
                    facecolor="#ffffff",
                    edgecolor="#8a97a8",
                    lw=0.8,
                    zorder=2,
                )
            )
            if picture.labelled:
                axes.text(
                    b.x + b.w / 2,
                    b.y + b.h / 2,
                    panel.label(node.pod),
                    ha="center",
                    va="center",
                    fontsize=7,
                    linespacing=1.15,
                    zorder=3,
                )
        for source, target in panel.cross_edges:
            start, end = _anchors(picture.nodes[source].box, picture.nodes[target].box)
            axes.add_patch(
                FancyArrowPatch(
                    start,
                    end,
                    connectionstyle="arc3,rad=-0.12",
                    arrowstyle="-|>",
                    mutation_scale=9,
                    color="#d1495b",
                    lw=1.1,
                    alpha=0.85,
                    zorder=4,
                    shrinkA=1,
                    shrinkB=1,
                )
            )
        axes.set_xlim(-0.5, panel_w + 0.5)
        axes.set_ylim(-0.8, picture.height + 0.3)
        axes.set_aspect("equal")
        axes.axis("off")
    inches = fig.get_size_inches()[1]  # keep the title's 0.45 inch and the caption's 0.3 free
    fig.tight_layout(rect=(0, 0.3 / inches, 1, 1 - 0.45 / inches))
    return save_figure(fig, path)
