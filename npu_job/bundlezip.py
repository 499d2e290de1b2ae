"""The bundle's bytes from its parts: sources with their prose blanked, and the zip archive, its
entries in their order, every field fixed, with the sentinels between them that ``python3
npu-job.pyz`` finds in a file cut short.

What the parts are and why (the prologue, ``__main__.py``, the stream of sources in stored
chunks, the digest) is :mod:`npu_job.bundle`'s; this module blanks any source it is given and
writes any entries as a zip archive that zipfile and zipimport read, the same bytes wherever and
whenever it is built. Pure: values in, values out.
"""

from __future__ import annotations

from typing import Collection, List, Sequence, Tuple

#: zip's earliest date: an entry's timestamp must not depend on when or where it was built.
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
ENTRY_MODE = 0o644

#: The most bytes a sentinel's end of archive may be from the next one, or from the archive's end:
#: zipimport (CPython 3.8 and later) looks for an archive's end in a file's last 64 KiB.
SENTINEL_SPACING = 60 * 1024


def zip_archive(
    entries: Sequence[Tuple[str, bytes]], *, sentinel: bytes = b"", stored: Collection[str] = ()
) -> bytes:
    """A zip archive of ``entries`` (name, data), in their order, every field fixed: deflated,
    but those named in ``stored`` (already compressed) stored.

    With ``sentinel`` (an archive itself), copies of it lie between the entries, unreferenced: one
    first, then one wherever the next entry or the archive's directory would end more than
    :data:`SENTINEL_SPACING` after the last copy. A file cut anywhere after the first copy then
    ends within 64 KiB of a whole sentinel, which ``python3 FILE`` runs (Python finds no archive
    at the file's end and looks back for one), so that way too a bundle cut short is the loader's
    one line and exit 10. Python 3.7 looks at the file's last 22 bytes only; it shows its own
    error (the prologue's).
    """
    import struct
    import zlib

    body = bytearray()
    directory = bytearray()
    last_sentinel = -SENTINEL_SPACING  # none yet: the first comes before the first entry
    dos_time = 0
    dos_date = (FIXED_DATE[0] - 1980) << 9 | FIXED_DATE[1] << 5 | FIXED_DATE[2]

    def keep_within_reach(size: int) -> None:
        nonlocal last_sentinel
        if sentinel and len(body) + size - last_sentinel > SENTINEL_SPACING:
            body.extend(sentinel)
            last_sentinel = len(body)

    for name, data in entries:
        encoded = name.encode("utf-8")
        method = 0 if name in stored else 8
        packed = data
        if method:
            compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
            packed = compressor.compress(data) + compressor.flush()
        crc = zlib.crc32(data) & 0xFFFFFFFF
        keep_within_reach(30 + len(encoded) + len(packed))
        offset = len(body)
        fields = (20, 0, method, dos_time, dos_date, crc, len(packed), len(data), len(encoded), 0)
        body += struct.pack("<4s5H3L2H", b"PK\x03\x04", *fields) + encoded + packed
        directory += struct.pack(
            "<4s6H3L5H2L",
            b"PK\x01\x02",
            3 << 8 | 20,  # made on Unix, whatever the building machine is; zip 2.0
            *fields[:-1],
            0,  # no extra field
            0,  # no comment
            0,  # disk
            0,  # internal attributes
            ENTRY_MODE << 16,
            offset,
        )
        directory += encoded
    keep_within_reach(len(directory) + 22)
    end = struct.pack(
        "<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(directory), len(body), 0
    )
    return bytes(body + directory + end)


def strip_prose(source: str) -> str:
    """``source`` with docstrings and comments blanked, every line where it was.

    A docstring becomes ``""`` followed by as many newlines as it spanned; a comment is cut off
    its line. The result compiles to the same code on the same line numbers (tests check the
    syntax trees).
    """
    import ast
    import io
    import tokenize

    lines = source.splitlines(keepends=True)
    spans: List[Tuple[Tuple[int, int], Tuple[int, int], str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            spans.append((token.start, token.end, ""))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
                and first.end_col_offset is not None
            ):
                newlines = "\n" * (first.end_lineno - first.lineno)
                start = (first.lineno, _column(lines, first.lineno, first.col_offset))
                end = (first.end_lineno, _column(lines, first.end_lineno, first.end_col_offset))
                spans.append((start, end, '""' + newlines))
    # from the end, so that earlier positions stay valid; columns are of the line's own text
    for (start_line, start_col), (end_line, end_col), replacement in sorted(spans, reverse=True):
        head = lines[start_line - 1][:start_col]
        tail = lines[end_line - 1][end_col:]
        if not replacement:  # a comment: drop it and the spaces before it
            head = head.rstrip()
        lines[start_line - 1 : end_line] = [head + replacement + tail]
    return "".join(lines)


def _column(lines: Sequence[str], line: int, utf8_offset: int) -> int:
    """ast's column (UTF-8 bytes into the line) as a character index, as tokenize counts."""
    return len(lines[line - 1].encode("utf-8")[:utf8_offset].decode("utf-8"))
