"""Atomic writes: the old content survives a failed write, and no temp file is left behind."""
from __future__ import annotations

import os
import stat

import pytest

from cutile_perf.store import atomic


def test_write_text_replaces_and_keeps_old_content_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "perf_results.md"
    atomic.write_text(path, "old\n")
    atomic.write_text(path, "new\n")
    assert path.read_text() == "new\n"

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic.write_text(path, "half")
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["perf_results.md"]


def test_an_exception_inside_the_block_leaves_the_target_untouched(tmp_path):
    # The plot is written through `replacing`: a matplotlib error mid-save must not truncate the PNG.
    path = tmp_path / "running_best.png"
    atomic.write_bytes(path, b"\x89PNG old")
    with pytest.raises(RuntimeError):
        with atomic.replacing(path, "wb") as fh:
            fh.write(b"partial")
            raise RuntimeError("savefig failed")
    assert path.read_bytes() == b"\x89PNG old"
    assert [p.name for p in tmp_path.iterdir()] == ["running_best.png"]


def test_parent_directories_are_created(tmp_path):
    target = atomic.write_text(tmp_path / "sandbox" / "patches" / "1-x.patch", "diff\n")
    assert target.read_text() == "diff\n"


@pytest.fixture
def umask():
    """Set the process umask for one test, then put the old one back."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def test_written_files_get_the_mode_open_would_give_not_mkstemps_0600(tmp_path, umask):
    # Issue 21: installed skill files and sandbox outputs were 0600 (mkstemp's mode).
    umask(0o022)
    assert stat.S_IMODE(atomic.write_text(tmp_path / "perf_results.md", "x\n").stat().st_mode) == 0o644
    with atomic.replacing(tmp_path / "running_best.png", "wb") as fh:
        fh.write(b"png")
    assert stat.S_IMODE((tmp_path / "running_best.png").stat().st_mode) == 0o644
    # The umask is honoured, as open() honours it, and a replaced file takes the new mode too.
    umask(0o077)
    assert stat.S_IMODE(atomic.write_bytes(tmp_path / "perf_results.md", b"y\n").stat().st_mode) == 0o600
    umask(0o002)
    assert stat.S_IMODE(atomic.write_text(tmp_path / "shared.md", "z\n").stat().st_mode) == 0o664


def test_the_umask_is_read_without_being_changed(umask):
    umask(0o027)
    assert atomic._umask() == 0o027
    assert os.umask(0o027) == 0o027  # still in place
