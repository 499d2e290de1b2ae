"""The README documents what the code does: its spec-key table is the one render generates, and
its quickstart commands are the ones CI runs."""

import re
from pathlib import Path

from npu_job.render.keys import spec_keys_markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_spec_key_table_matches_the_validator():
    assert spec_keys_markdown().strip() in README, (
        "regenerate the README table from spec_keys_markdown()"
    )


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [
        line
        for line in ci
        if line and not line.startswith(("#", "set ", "cd ", "export ", "echo ", "start="))
    ]
    venv = "python3 -m venv .venv && . .venv/bin/activate"
    assert commands[0] == venv and re.search(rf"^{re.escape(venv)}(  +#.*)?$", README, re.M)
    assert commands[1:3] == [
        "pip install torch==2.13.0 -e '.[launcher,test]'",
        "python -m pytest -n auto",
    ]
    for command in commands[1:3]:
        assert f"```bash\n{command}\n```" in README
    assert commands[3:] == ["python -m nox", "python -m nox -s supported"]  # the torch matrix
    for command in commands[3:]:
        assert command in README


def _github_anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_the_contents_list_every_section_in_order_and_every_link_lands():
    headings = [(m.group(1), m.group(2)) for m in re.finditer(r"^(##|###) (.+)$", README, re.M)]
    sections = [
        (level, title) for level, title in headings if title not in ("Contents", "Quickstart")
    ]
    contents = README.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^( *)- \[(.+)\]\(#(.+)\)$", contents, re.M)
    assert [(len(indent) // 2, title) for indent, title, _ in listed] == [
        (len(level) - 2, title) for level, title in sections
    ]
    anchors = {_github_anchor(title) for _, title in headings}
    assert all(anchor == _github_anchor(title) for _, title, anchor in listed)
    for target in re.findall(r"\]\(#([^)]+)\)", README):
        assert target in anchors, target
