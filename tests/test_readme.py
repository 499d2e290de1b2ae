"""The README documents what the code does: its spec-key table is the one render generates, and
its quickstart commands are the ones CI runs."""

from pathlib import Path

from npu_job.render.spec import spec_keys_markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_spec_key_table_matches_the_validator():
    assert spec_keys_markdown().strip() in README, "regenerate the README table from spec_keys_markdown()"


def test_ci_runs_exactly_the_readme_install_and_test_commands():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [line for line in ci if line and not line.startswith(("#", "set ", "cd ", "export ", "echo ", "start="))]
    assert commands[:2] == ["pip install torch==2.13.0 -e '.[launcher,test]'", "python -m pytest"]
    for command in commands[:2]:
        assert f"```bash\n{command}\n```" in README
    assert commands[2:] == ["python -m nox", "python -m nox -s supported"]  # the torch matrix
    for command in commands[2:]:
        assert command in README
