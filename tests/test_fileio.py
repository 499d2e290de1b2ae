"""Atomic writes: a reader sees the old file or the new one, never a part, and no debris is left."""

import os
import stat

import pytest

from npu_job import fileio
from npu_job.fileio import write_atomic


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "rename-only"])
def test_replaces_content_creates_parents_and_sets_mode(tmp_path, durable):
    target = tmp_path / "a" / "b" / "out.txt"
    write_atomic(target, "first", durable=durable)
    write_atomic(target, b"second\xff", mode=0o600, durable=durable)
    assert target.read_bytes() == b"second\xff"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    write_atomic(target, "good")

    def failing_replace(src, dst):  # the last step fails, e.g. the disk filled up
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        write_atomic(target, "half")
    assert target.read_text() == "good"
    assert os.listdir(tmp_path) == ["plan.json"]


def test_a_set_of_files_is_written_all_or_none(tmp_path, monkeypatch):
    """A failure on the second file leaves neither file, no temp files and no new directory."""
    from npu_job.fileio import write_files_atomic

    real_fdopen = os.fdopen
    opened = []

    def full_disk_on_second(fd, *args, **kwargs):
        opened.append(fd)
        if len(opened) == 2:
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real_fdopen(fd, *args, **kwargs)

    monkeypatch.setattr(fileio.os, "fdopen", full_disk_on_second)
    with pytest.raises(OSError, match="No space"):
        write_files_atomic(tmp_path / "new" / "out", [("a", "1", 0o644), ("b", "2", 0o755)])
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    written = write_files_atomic(tmp_path / "out", [("a", "1", 0o644), ("b", "2", 0o755)])
    assert [p.read_text() for p in written] == ["1", "2"] and os.access(written[1], os.X_OK)
    assert sorted(os.listdir(tmp_path / "out")) == ["a", "b"]


def test_the_temporary_file_is_new_private_and_beside_its_target(tmp_path, monkeypatch):
    """As tempfile.mkstemp makes it: a name no file has (a taken one is passed over, never
    opened), created 0600 in the target's directory; a symlink planted at a name is not
    followed."""
    names = iter([b"\x00" * 6, b"\x00" * 6, b"\x01" * 6])
    monkeypatch.setattr(fileio.os, "urandom", lambda size: next(names))
    taken = tmp_path / ".out.json.000000000000.tmp"
    taken.symlink_to(tmp_path / "elsewhere")
    fd, path = fileio._create_temp(tmp_path / "out.json")
    os.close(fd)
    assert path == str(tmp_path / ".out.json.010101010101.tmp")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert not (tmp_path / "elsewhere").exists()


def test_a_directory_whose_every_name_is_taken_is_an_error_not_a_loop(tmp_path, monkeypatch):
    monkeypatch.setattr(fileio.os, "urandom", lambda size: b"\x07" * size)
    (tmp_path / ".out.json.070707070707.tmp").write_text("someone else's")
    with pytest.raises(FileExistsError):
        fileio._create_temp(tmp_path / "out.json")
    assert (tmp_path / ".out.json.070707070707.tmp").read_text() == "someone else's"
