"""``npu-job render``: job spec files and ``--set`` values -> Volcano Job stream or files.

The edge of the render part: it reads the spec files (``-`` = stdin), hands the merged values to
the pure core (``npu_job.render.spec.validate`` then ``npu_job.render.render.render``) and writes
the result to stdout or, with ``--output-dir``, as files (atomically, ``wrote <path>`` per file).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import List, Sequence, Tuple, Union

from npu_job.errors import InputError

HELP = "render a job spec into a Volcano Job and train.sh"

log = logging.getLogger(__name__)

DESCRIPTION = """\
Render a job spec (YAML) into what `kubectl apply -f -` needs: a ConfigMap carrying train.sh,
bootstrap.sh when routing acceleration is on, and the job's bundle of npu-job (npu-job.pyz: the
bootstrap and npu-run, so the image needs nothing installed), and the Volcano Job that mounts it.

Values are merged helm-style: SPEC, then each -f file in order, then --set / --set-string;
the right-most wins. Maps merge, lists are replaced, null removes a key (back to its default)
in any input, except where a key gives null a meaning of its own (shm_size: null, no /dev/shm).
The spec is validated before anything is rendered; every problem is listed with its key path
(exit code 5)."""

EPILOG = """\
examples:
  npu-job render job.yaml | kubectl apply -f -
  npu-job render job.yaml -f prod.yaml --set nodes=16 --set 'args={--epochs,90}'
  cat job.yaml | npu-job render - --set-string env.RUN_ID=0042
  npu-job render job.yaml --output-dir out/   # config.yaml, train.sh, bootstrap.sh, npu-job.pyz

--set syntax (as helm): a.b=c; several with commas: a=1,b=2; lists: a={x,y} or a[0]=x (0..65536);
true/false/integers are typed, but a key that expects a string keeps the text as written;
escape . , = [ ] { } with a backslash: labels.app\\.kubernetes\\.io/name=demo"""


class _SetArgument:
    """argparse ``type`` for --set/--set-string: parse now so syntax errors are usage errors."""

    def __init__(self, as_string: bool) -> None:
        self.as_string = as_string
        self.__name__ = "--set-string" if as_string else "--set"

    def __call__(self, text: str) -> Tuple[object, ...]:
        from npu_job.render.values import SetSyntaxError, parse_set

        try:
            return parse_set(text, as_string=self.as_string, source=self.__name__)
        except SetSyntaxError as error:
            raise argparse.ArgumentTypeError(str(error)) from None


class _Ordered(argparse.Action):
    """Collect -f/--set/--set-string in one list (each kind keeps its command-line order)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        items = list(getattr(namespace, self.dest) or [])
        items.append((self.const, values))
        setattr(namespace, self.dest, items)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("spec", metavar="SPEC", help="job spec YAML file ('-' reads stdin)")
    parser.add_argument(
        "-f",
        "--values",
        dest="layers",
        action=_Ordered,
        const="file",
        metavar="FILE",
        help="more spec values, merged over SPEC in order ('-' reads stdin)",
    )
    parser.add_argument(
        "--set",
        dest="layers",
        action=_Ordered,
        const="set",
        type=_SetArgument(False),
        metavar="KEY=VALUE",
        help="set a value over the files (repeatable): nodes=6, env.FOO=bar, 'args={--lr,0.1}', "
        "args[0]=x",
    )
    parser.add_argument(
        "--set-string",
        dest="layers",
        action=_Ordered,
        const="set",
        type=_SetArgument(True),
        metavar="KEY=VALUE",
        help="like --set, but every value stays a string",
    )
    parser.add_argument(
        "--output-dir",
        metavar="DIR",
        type=Path,
        help="write config.yaml, train.sh (and bootstrap.sh, npu-job.pyz) into DIR instead of "
        "printing the stream",
    )


def _read(path: str, stdin_used: List[bool]) -> Tuple[str, str]:
    if path == "-":
        if stdin_used:
            raise InputError("-", "", "stdin can be read only once; give the other specs as files")
        stdin_used.append(True)
        return "<stdin>", sys.stdin.read()
    try:
        return path, Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(path, "", "no such file") from None
    except IsADirectoryError:
        raise InputError(path, "", "is a directory; expected a YAML file") from None
    except UnicodeDecodeError as error:
        raise InputError(path, f"byte {error.start}", "not UTF-8 text") from None
    except OSError as error:
        raise InputError(path, "", f"cannot read: {error.strerror}") from None


def run(args: argparse.Namespace) -> int:
    from npu_job.render.render import render
    from npu_job.render.spec import validate
    from npu_job.render.values import SpecInput, load_yaml_values, merge_values

    stdin_used: List[bool] = []
    inputs: List[SpecInput] = []
    layers = list(args.layers or [])
    # as helm: every file first (in order), then every --set/--set-string (in order)
    ordered = (
        [("file", args.spec)]
        + [item for item in layers if item[0] == "file"]
        + [item for item in layers if item[0] == "set"]
    )
    for kind, value in ordered:
        if kind == "file":
            source, text = _read(value, stdin_used)
            inputs.append(SpecInput(source, values=load_yaml_values(text, source)))
        else:
            inputs.append(
                SpecInput(value[0].source if value else "--set", assignments=tuple(value))
            )
    spec = validate(merge_values(inputs))
    rendered = render(spec)

    if args.output_dir is None:
        sys.stdout.write(rendered.stream())
        sys.stdout.flush()
        return 0
    for path in _write_output_dir(args.output_dir, rendered.files()):
        print(f"wrote {path}")
    return 0


def _write_output_dir(
    directory: Path, files: Sequence[Tuple[str, Union[str, bytes], int]]
) -> List[Path]:
    """Write all ``files`` into ``directory`` or none; an unusable directory is an InputError."""
    from npu_job.fileio import write_files_atomic

    try:
        return write_files_atomic(directory, files)
    except OSError as error:
        names = [name for name, _, _ in files]
        listed = f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]
        if isinstance(error, FileExistsError) and error.filename == str(directory):
            reason = "it exists and is not a directory"
        elif error.filename in {str(directory / name) for name in names}:
            reason = f"{error.filename}: {error.strerror}"
        else:  # the directory itself, a parent, or a temporary file in it
            reason = error.strerror or str(error)
        raise InputError(
            str(directory),
            "--output-dir",
            f"expected a directory to write {listed} into ({reason})",
        ) from None
