"""Pictures of plans (npu_job.cli.picture; ``npu-job plan --picture``, ``npu-job demo --picture``).

The layout is pure and checked as data: one box per switch group, every node inside its switch,
nothing overlapping, the ranks of both orders, and exactly the ring's cross-switch edges the
scorer counts. The drawing is checked as files: a real PNG and a real SVG (parsed), written
atomically, holding the labels. Without matplotlib (the ``[picture]`` extra), ``--picture`` is one
line naming the extra and exit 9.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from itertools import combinations
from pathlib import Path

import pytest
from npu_job.bootstrap import planner, scorer
from npu_job.bootstrap.base.model import Collective, PlanStatus
from npu_job.demo.synthetic import synthetic_cluster

from npu_job.cli import main
from npu_job.cli.picture import layout

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _plan(nodes=12, tors=4, collective=Collective.RING, **kwargs):
    table, topology = synthetic_cluster(nodes, tors, seed=3, **kwargs)
    return table, topology, planner.plan(table, topology, collective)


def test_every_switch_group_is_a_box_holding_its_nodes_in_new_rank_order():
    table, topology, plan = _plan()
    picture = layout(table, topology, plan)
    assert len(picture.switches) == 4
    assert sorted(pod for s in picture.switches for pod in s.pods) == list(range(12))
    for index, switch in enumerate(picture.switches):
        placed = {topology.placement_of(table.servers[pod].server_id).tors for pod in switch.pods}
        assert len(placed) == 1 and switch.label == next(iter(placed))[0]
        ranks = [plan.node_rank_of_pod[pod] for pod in switch.pods]
        assert ranks == sorted(ranks)
        tops = [picture.nodes[pod].box.y for pod in switch.pods]
        assert tops == sorted(tops, reverse=True)  # the lowest new rank on top
        for pod in switch.pods:
            assert picture.nodes[pod].switch == index
            assert switch.box.contains(picture.nodes[pod].box)
    for a, b in combinations([s.box for s in picture.switches], 2):
        assert not a.overlaps(b)
    for a, b in combinations([n.box for n in picture.nodes], 2):
        assert not a.overlaps(b)
    assert all(0 <= n.box.x and n.box.x + n.box.w <= picture.width for n in picture.nodes)
    assert all(0 <= n.box.y and n.box.y + n.box.h <= picture.height for n in picture.nodes)


def test_both_panels_show_their_ranks_and_exactly_the_scorers_cross_switch_edges():
    table, topology, plan = _plan()
    picture = layout(table, topology, plan)
    scheduler, ours = picture.panels
    keys = scorer.switch_keys(table, topology)
    assert scheduler.rank_of_pod == tuple(range(12))
    assert ours.rank_of_pod == plan.node_rank_of_pod
    assert ours.label(plan.pod_of_node_rank[0]) == f"pod {plan.pod_of_node_rank[0]}\nrank 0"
    for panel, order in ((scheduler, tuple(range(12))), (ours, plan.pod_of_node_rank)):
        assert len(panel.cross_edges) == scorer.ring_cross_edges(order, keys)
        for source, target in panel.cross_edges:
            assert keys[source] != keys[target]
            assert (panel.rank_of_pod[target] - panel.rank_of_pod[source]) % 12 == 1
        assert f"{len(panel.cross_edges)} cross-switch ring edges (lower bound 4)" in panel.title
    assert len(ours.cross_edges) == 4 < len(scheduler.cross_edges)
    assert ours.title.startswith("npu-job order (ring)")


def test_many_switches_wrap_into_rows_and_big_switches_into_columns():
    table, topology, plan = _plan(nodes=40, tors=9, occupancy="uneven")
    picture = layout(table, topology, plan)
    assert len({round(s.box.y + s.box.h, 6) for s in picture.switches}) == 2  # 6 per row
    big = max(picture.switches, key=lambda s: len(s.pods))
    assert len(big.pods) > 8 and len({picture.nodes[p].box.x for p in big.pods}) > 1
    for a, b in combinations([n.box for n in picture.nodes], 2):
        assert not a.overlaps(b)


def test_outer_tiers_nodes_on_two_tors_and_nodes_without_topology_are_labelled():
    table, topology, plan = _plan(nodes=12, tors=4, spine_groups=2, multi_tor=1, missing_topology=1)
    labels = [s.label for s in layout(table, topology, plan).switches]
    assert any(label.startswith("spine-0 / 172.16.0.") for label in labels)
    assert any("+" in label for label in labels)
    assert labels[-1] == "no topology"


def test_a_plan_that_fell_back_shows_the_scheduler_order_twice_and_says_so():
    table, topology, plan = _plan(nodes=2, tors=2)
    assert plan.status is PlanStatus.FAILED
    scheduler, ours = layout(table, topology, plan).panels
    assert ours.rank_of_pod == scheduler.rank_of_pod == (0, 1)
    assert "not planned" in ours.title


# -- files -------------------------------------------------------------------------------------
def _inputs(tmp_path: Path) -> Path:
    inputs = tmp_path / "in"
    assert main(["demo", "--nodes", "9", "--tors", "3", "--write-inputs", str(inputs)]) == 0
    return tmp_path / "in" / "jobstart_hccl.json"


def test_plan_picture_png_is_a_real_png_written_atomically(tmp_path, capsys):
    target = tmp_path / "out" / "plan.png"
    target.parent.mkdir()
    target.write_bytes(b"old")
    assert main(["plan", "--rank-table", str(_inputs(tmp_path)), "--picture", str(target)]) == 0
    data = target.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 2 * height > 400
    assert [p.name for p in target.parent.iterdir()] == ["plan.png"]  # no temporary file left
    assert "comparison for ring" in capsys.readouterr().out  # the text report is unchanged


def test_plan_picture_svg_holds_the_boxes_labels_and_edges(tmp_path):
    target = tmp_path / "plan.svg"
    assert main(["plan", "--rank-table", str(_inputs(tmp_path)), "--picture", str(target)]) == 0
    root = ElementTree.parse(target).getroot()
    assert root.tag.endswith("svg")
    texts = ["".join(t.itertext()) for t in root.iter() if t.tag.endswith("text")]
    joined = "\n".join(texts)
    for pod in range(9):
        assert f"pod {pod}" in joined
    assert "scheduler order (rank = pod index)" in joined and "npu-job order (ring)" in joined
    assert "3 cross-switch ring edges (lower bound 3)" in joined
    assert sum(label.startswith("172.16.0.") for label in texts) == 2 * 3  # 3 ToRs, 2 panels


def test_the_same_plan_draws_the_same_svg(tmp_path):
    rank_table = _inputs(tmp_path)
    for name in ("a.svg", "b.svg"):
        picture = str(tmp_path / name)
        assert main(["plan", "--rank-table", str(rank_table), "--picture", picture]) == 0
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_demo_draws_its_jobs_picture(tmp_path):
    target = tmp_path / "demo.svg"
    assert (
        main(
            [
                "demo",
                "--nodes",
                "6",
                "--tors",
                "3",
                "--write-inputs",
                str(tmp_path / "in"),
                "--picture",
                str(target),
            ]
        )
        == 0
    )
    joined = "".join(ElementTree.parse(target).getroot().itertext())
    assert "npu-job demo: 6 pods on 3 ToRs" in joined and "pod 5" in joined


def test_a_picture_name_without_png_or_svg_is_a_usage_error(tmp_path, capsys):
    assert main(["plan", "--rank-table", "x.json", "--picture", str(tmp_path / "p.jpg")]) == 2
    assert "expected a file name ending in .png or .svg" in capsys.readouterr().err
    assert not (tmp_path / "p.jpg").exists()


def test_an_unwritable_picture_is_one_line_and_exit_3(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    code = main(
        [
            "plan",
            "--rank-table",
            str(_inputs(tmp_path)),
            "--picture",
            str(tmp_path / "file" / "p.png"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3
    assert err[-1].startswith("npu-job: error: ") and "cannot write the picture" in err[-1]


HIDDEN = (
    "import sys; sys.modules['matplotlib'] = None; from npu_job.cli import main;"
    " sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "command", [["plan", "--rank-table", "RANK_TABLE"], ["demo", "--write-inputs", "INPUTS"]]
)
def test_without_matplotlib_picture_is_one_line_naming_the_extra_and_exit_9(tmp_path, command):
    rank_table = _inputs(tmp_path)
    argv = [
        str(rank_table) if a == "RANK_TABLE" else str(tmp_path / "new") if a == "INPUTS" else a
        for a in command
    ]
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN, *argv, "--picture", str(tmp_path / "p.png")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 9
    assert done.stderr.strip().splitlines() == [
        "npu-job: error: drawing a picture needs matplotlib, which is not installed:"
        " pip install 'npu-job[picture]'"
    ]
    assert not (tmp_path / "p.png").exists() and not (tmp_path / "new").exists()


def test_plan_without_picture_never_imports_matplotlib(tmp_path):
    code = (
        "import sys; from npu_job.cli import main; rc = main(sys.argv[1:]);"
        " print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "plan", "--rank-table", str(_inputs(tmp_path))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "[]"


def test_a_drawing_that_fails_leaves_the_old_file_as_it_was(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from npu_job.cli.picture import draw

    table, topology, plan = _plan()
    target = tmp_path / "plan.png"
    target.write_bytes(b"the old picture")

    def broken(self, *args, **kwargs):
        raise RuntimeError("renderer died")

    monkeypatch.setattr(Figure, "savefig", broken)
    with pytest.raises(RuntimeError, match="renderer died"):
        draw(layout(table, topology, plan), str(target))
    assert target.read_bytes() == b"the old picture"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]
