"""The README and the pages under docs/ document what the code does: the spec-key table is the one
render generates, the quickstart commands are the ones CI runs, every link lands, and no page
points at something a reader cannot follow."""

import re
from pathlib import Path

from npu_job.render.keys import spec_keys_markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {
    path.name: path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))
}
PAGES = {ROOT / "README.md": README, **{ROOT / "docs" / name: text for name, text in DOCS.items()}}


def _prose(text: str) -> str:
    """The text with its fenced code blocks left out."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) <= 250, "move the detail to a page under docs/"
    assert "## Exit codes" in README  # tests/test_errors.py reads it there


def test_spec_key_table_matches_the_validator():
    assert spec_keys_markdown().strip() in DOCS["render.md"], (
        "regenerate the table in docs/render.md from spec_keys_markdown()"
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
    assert "```bash\n" + "\n".join(commands) + "\n```" in DOCS["development.md"]


def _github_anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set:
    return {_github_anchor(title) for title in re.findall(r"^#+ (.+)$", _prose(text), re.M)}


def test_every_relative_link_lands_on_a_file_and_heading():
    for page, text in PAGES.items():
        for target in re.findall(r"\]\(([^)\s]+)\)", _prose(text)):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.is_file(), f"{page.name}: {target}: no such file"
            if anchor:
                assert anchor in _anchors(
                    PAGES.get(linked) or linked.read_text(encoding="utf-8")
                ), f"{page.name}: {target}: no such heading"


def test_the_readme_links_every_page_under_docs():
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README))
    assert linked == set(DOCS)


def test_a_page_with_several_sections_opens_with_a_list_of_them_in_order():
    for name, text in DOCS.items():
        sections = re.findall(r"^## (.+)$", _prose(text), re.M)
        if len(sections) < 3:
            continue
        opening = text.split("\n## ", 1)[0]
        listed = re.findall(r"^- \[(.+?)\]\(#(.+?)\)", opening, re.M)
        assert [title for title, _ in listed] == sections, name
        assert [anchor for _, anchor in listed] == [_github_anchor(t) for t in sections], name


def test_no_page_cites_what_a_reader_cannot_follow():
    unfollowable = re.compile(
        HISTORY + r"|\b(this|the last|the next|the) session\b|\bsession (before|after)\b"
        r"|\blast note\b",
        re.I,
    )
    for page, text in PAGES.items():
        found = unfollowable.findall(text)
        assert not found, f"{page.name}: {found}"


# A section of a document the repository does not have, or the number of an issue: the reader of
# the code, a template or a test can follow neither.
HISTORY = r"\bDESIGN\b.{0,3}\u00a7|\u00a7\s*\d|\bissues? #?\d+|\(issue:"
SOURCES = ("npu_job", "bootstrap", "render", "templates", "launcher", "demo", "scripts", "examples")
SOURCES += ("benchmarks", "tests", ".ci")


def test_no_source_cites_what_a_reader_cannot_follow():
    """Code, templates, scripts and tests say why, not which issue or design note asked."""
    history = re.compile(HISTORY, re.I)
    found = [
        f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*"))
        if path.is_file()
        and path.suffix in (".py", ".j2", ".sh", ".cfg", ".toml", "")
        and "__pycache__" not in path.parts
        and path != Path(__file__).resolve()  # its own check names what it looks for
        for text in [path.read_text(encoding="utf-8", errors="replace")]
        for match in history.finditer(text)
    ]
    assert found == []


def test_the_history_check_sees_a_design_section_and_an_issue_number():
    history = re.compile(HISTORY, re.I)
    for cited in ("DESIGN \u00a77", "(issue 28)", "Issue 29, case 2", "(issue: 3.7, 3.8)"):
        assert history.search(cited), cited
    assert not history.search("a known issue with the API, see the section 3 table")


def _repository_paths(text: str):
    """The names in backticks that are paths in this repository: they start with one of its
    top-level folders and name no other repository's file (``owner/repo `path```)."""
    tops = {path.name for path in ROOT.iterdir() if path.is_dir() and not path.name.startswith(".")}
    tops |= {".ci"}
    for match in re.finditer(r"`([^`\s]+)`", text):
        name = match.group(1).split("::")[0]
        if any(mark in name for mark in "<>*{}$") or "/" not in name:
            continue
        if name.split("/")[0] not in tops:
            continue
        before, shorter = text[max(0, match.start() - 300) : match.start()].rstrip(), ""
        while shorter != before:  # past the paths listed before it: `a`, `b` and `c`
            shorter, before = before, re.sub(r"`[^`\s]+`(?:,|\s+and)?$", "", before).rstrip()
        if re.search(r"[\w.-]+/[\w.-]+$", before):  # another repository's paths
            continue
        yield name


def test_every_repository_path_a_page_names_exists():
    missing = [
        f"{page.name}: {name}"
        for page, text in PAGES.items()
        for name in _repository_paths(text)
        if not (ROOT / name).exists()
    ]
    assert missing == []


def test_the_path_check_reads_ours_and_leaves_other_repositories_paths():
    text = (
        "see `launcher/cpus.py` and `npu_job/launcher/torchcompat.py`, not volcano-sh/volcano"
        " `docs/user-guide/x.md`, NVIDIA/topograph `docs/a.md`, `docs/b/c.md` and `pkg/d.go`,"
        " nor `train.sh` or `tests/<area>`"
    )
    assert list(_repository_paths(text)) == ["launcher/cpus.py", "npu_job/launcher/torchcompat.py"]


def _command_lines(text: str):
    """The shell lines of a page's bash (or unmarked) code blocks, continuations joined."""
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
        if language in ("", "bash"):
            for line in block.replace("\\\n", " ").splitlines():
                yield line[2:] if line.startswith("$ ") else line


def test_every_npu_job_flag_a_page_shows_is_one_its_command_takes(capsys):
    from npu_job.cli import main

    helps = {}
    for page, text in PAGES.items():
        for line in _command_lines(text):
            command = re.match(r"(?:\w+=\S+ )*npu-job ([a-z]+)\b(.*)", line.split("  #", 1)[0])
            if not command:
                continue
            sub, rest = command.groups()
            if sub not in helps:
                try:
                    main([sub, "--help"])
                except SystemExit:
                    pass
                helps[sub] = capsys.readouterr().out
                assert "usage:" in helps[sub], f"{page.name}: npu-job {sub}: no such command"
            for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest.split("|", 1)[0]):
                assert flag in helps[sub], f"{page.name}: npu-job {sub} has no {flag}: {line}"


def test_the_cpu_build_step_comes_before_the_install_it_must_precede():
    """On plain PyPI the pinned install alone pulls torch's CUDA build, so the README shows the
    CPU wheel step first, in the order a newcomer runs the commands."""
    cpu = README.index("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu")
    assert cpu < README.index("pip install torch==2.13.0 -e '.[launcher,test]'")
