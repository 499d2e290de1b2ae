"""mypy over the pure core, through a link tree of the installed package layout.

setup.cfg's ``package_dir`` maps top-level folders (bootstrap/, render/, ...) into the
``npu_job`` namespace; mypy cannot follow that from the editable install. This script builds a
temporary tree whose ``npu_job/`` holds symlinks to ``npu_job/*.py`` and ``npu_job/cli`` plus one
link per ``package_dir`` entry (read from setup.cfg, never hard-coded), and runs mypy there with
the settings of pyproject.toml's ``[tool.mypy]``.

    python .ci/typecheck.py            # the pure core (PURE_CORE)
    python .ci/typecheck.py -p npu_job.bootstrap.run   # other packages or modules
"""

from __future__ import annotations

import argparse
import configparser
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
# Modules that take values and return values (no I/O beyond fileio's helpers): mypy must pass here.
PURE_CORE = [
    "npu_job.parsing",
    "npu_job.polling",
    "npu_job.errors",
    "npu_job.podfacts",
    "npu_job.fileio",
    "npu_job.bootstrap.base.model",
    "npu_job.bootstrap.base.columns",
    "npu_job.bootstrap.planner",
    "npu_job.bootstrap.nodereport",
    "npu_job.bootstrap.scorer",
    "npu_job.bootstrap.canonical",
    "npu_job.bootstrap.ranktable",
    "npu_job.bootstrap.topology",
    "npu_job.bootstrap.base.fields",
    "npu_job.bootstrap.options",
    "npu_job.bootstrap.base.accelerator",
    "npu_job.bootstrap.base.jsondecode",
    "npu_job.bootstrap.base.payload",
    "npu_job.bootstrap.kube.objects",
    "npu_job.bootstrap.kube.facts",
    "npu_job.bootstrap.kube.podpage",
    "npu_job.bootstrap.kube.podtypes",
    "npu_job.bootstrap.kube.hypernode",
    "npu_job.bootstrap.kube.hypernodetree",
    "npu_job.bootstrap.goregexp",
    "npu_job.bootstrap.kube.topology",
    "npu_job.bootstrap.kube.labels",
    "npu_job.bootstrap.kube.jobpods",
    "npu_job.render.keys",
    "npu_job.render.spec",
    "npu_job.render.checks",
    "npu_job.render.values",
    "npu_job.render.render",
    "npu_job.render.lint",
    "npu_job.launcher.proxy.coalescing",
    "npu_job.launcher.probe.stats",
]


def package_dirs(root: Path = ROOT) -> Dict[str, Path]:
    """setup.cfg's ``package_dir``: dotted package name -> folder it installs from."""
    parser = configparser.ConfigParser()
    parser.read(root / "setup.cfg")
    mapping: Dict[str, Path] = {}
    for line in parser.get("options", "package_dir", fallback="").splitlines():
        if not line.strip():
            continue
        name, _, folder = line.partition("=")
        name, folder = name.strip(), folder.strip()
        if not name or not folder:
            raise ValueError(f"setup.cfg: [options] package_dir: cannot read {line.strip()!r}")
        mapping[name] = root / folder
    return mapping


def build_link_tree(dest: Path, root: Path = ROOT) -> Path:
    """Lay out ``dest/npu_job`` as it installs; returns ``dest`` (the directory mypy runs in)."""
    package = dest / "npu_job"
    package.mkdir(parents=True)
    for entry in sorted((root / "npu_job").iterdir()):
        if entry.suffix == ".py" or (entry.is_dir() and (entry / "__init__.py").exists()):
            (package / entry.name).symlink_to(entry)
    # outer packages first: a folder mapped inside another mapped folder (npu_job.render.templates
    # in npu_job.render) turns its parent's link into a directory of links to the parent's entries
    for name, folder in sorted(package_dirs(root).items(), key=lambda item: item[0].count(".")):
        parts = name.split(".")
        if parts[0] != "npu_job" or len(parts) < 2:
            raise ValueError(f"setup.cfg: package_dir maps {name!r}; only npu_job.<name> fits")
        parent = package.joinpath(*parts[1:-1])
        if parent.is_symlink():
            outer = parent.resolve()
            parent.unlink()
            parent.mkdir()
            for entry in sorted(outer.iterdir()):
                (parent / entry.name).symlink_to(entry)
        elif not parent.is_dir():
            raise ValueError(f"setup.cfg: package_dir maps {name!r} inside no mapped package")
        link = parent / parts[-1]
        if link.exists() or link.is_symlink():
            raise ValueError(f"setup.cfg: package_dir maps {name!r} over {link.relative_to(dest)}")
        link.symlink_to(folder)
    return dest


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "-p",
        "--package",
        action="append",
        dest="packages",
        help="a module or package to check instead of the pure core (repeatable)",
    )
    parser.add_argument(
        "--mypy", default=sys.executable, help="the Python whose mypy runs (default: this one)"
    )
    args = parser.parse_args(argv)
    targets = args.packages or PURE_CORE
    with tempfile.TemporaryDirectory(prefix="npu-job-typecheck-") as tmp:
        tree = build_link_tree(Path(tmp))
        command = [args.mypy, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
        for target in targets:
            command += ["-p", target]
        return subprocess.run(command, cwd=tree).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
