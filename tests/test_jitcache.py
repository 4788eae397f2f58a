"""The session's guarded cuTile compile cache and the stable checkout slots (``jitcache``, ``pristine.slot_root``).

The loop tests run the real CLI on the SIMULATED TileGym-shaped repository of ``fixtures_repo``
(no GPU, no cuTile compile): an observer appended to the simulated kernel writes down, from inside
each pytest child, which cache folder it was given and where its kernel file lives.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import sqlite3
import textwrap
from contextlib import closing
from pathlib import Path

import git
import pytest
from fixtures_repo import allow_no_gpu, build_tilegym_like_repo, edit_kernel, edit_session
from optional_deps import needs
from redteam_helpers import append_to_kernel, call, rows

from cutile_perf.store import jitcache
from cutile_perf.child import pristine

# The columns cutile_cache creates (cuda-tile 1.7); the guard reads key and blob only.
_TABLE = "CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, blob BLOB NOT NULL, blob_size INTEGER NOT NULL, " \
         "atime REAL NOT NULL, metadata TEXT)"


def _put(cache_dir: Path, key: str, blob: bytes) -> None:
    """Write one entry the way cuTile's cache_store does (INSERT OR REPLACE here: a forger overwrites)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(cache_dir / jitcache.DB_FILE)) as conn:
        conn.execute(_TABLE)
        conn.execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?, 0, NULL)", (key, blob, len(blob)))
        conn.commit()


def _keys(cache_dir: Path) -> set[str]:
    return set(jitcache.entries(cache_dir) or {})


# --- the guard, on its own ------------------------------------------------------------------------


def test_unrecorded_names_new_keys_and_changed_cubins_only():
    recorded = {"a": "1", "b": "2"}
    assert jitcache.unrecorded({"a": "1", "b": "2"}, recorded) == []
    assert jitcache.unrecorded({"a": "1", "b": "X", "c": "3"}, recorded) == ["b", "c"]
    assert jitcache.unrecorded({"a": "1"}, {}) == ["a"]  # no manifest vouches for nothing


def test_what_a_command_recorded_survives_and_anything_else_is_dropped(tmp_path):
    cache = tmp_path / "jit"
    with jitcache.guarded(cache) as dropped:
        assert dropped == []
        _put(cache, "ours", b"cubin compiled by our child")  # written while the command runs
    assert _keys(cache) == {"ours"}
    _put(cache, "planted", b"someone else's cubin")  # between two commands
    _put(cache, "ours", b"a swapped cubin")  # same key, other bytes
    with jitcache.guarded(cache) as dropped:
        assert dropped == ["ours", "planted"]
        assert _keys(cache) == set()
        _put(cache, "ours", b"cubin compiled by our child")
    with jitcache.guarded(cache) as dropped:
        assert dropped == [] and _keys(cache) == {"ours"}


def test_a_broken_manifest_vouches_for_nothing_and_a_broken_cache_file_is_removed(tmp_path):
    cache = tmp_path / "jit"
    with jitcache.guarded(cache):
        _put(cache, "ours", b"x")
    jitcache.manifest_path(cache).write_text("{not json")
    assert jitcache.drop_unrecorded(cache) == ["ours"]
    (cache / jitcache.DB_FILE).write_bytes(b"not an SQLite file at all, just bytes" * 10)
    assert jitcache.entries(cache) is None
    assert jitcache.drop_unrecorded(cache) == [jitcache.DB_FILE]
    assert not (cache / jitcache.DB_FILE).exists()


def test_the_command_records_its_cache_even_when_it_fails(tmp_path):
    cache = tmp_path / "jit"
    with pytest.raises(KeyboardInterrupt), jitcache.guarded(cache):
        _put(cache, "compiled before the interrupt", b"x")
        raise KeyboardInterrupt
    assert jitcache.drop_unrecorded(cache) == []


def test_the_file_names_and_the_table_are_cutile_caches_own(tmp_path):
    cache_mod = pytest.importorskip("cutile_cache._cache", reason="cuda-tile's cache module is not installed")
    assert jitcache.DB_FILE == cache_mod._CACHE_FILENAME
    cache_mod.cache_store(str(tmp_path), "k", b"cubin bytes", {"kernel_names": ["k"]})
    assert jitcache.entries(tmp_path) == {"k": hashlib.sha256(b"cubin bytes").hexdigest()}
    jitcache.record(tmp_path)
    _put(tmp_path, "planted", b"y")
    assert jitcache.drop_unrecorded(tmp_path) == ["planted"]
    assert cache_mod.cache_lookup(str(tmp_path), "k") == b"cubin bytes"
    assert cache_mod.cache_lookup(str(tmp_path), "planted") is None


@needs("cuda.tile")
def test_cutile_bytecode_embeds_the_kernel_files_path_which_is_why_slots_are_stable(tmp_path):
    """The fact the design rests on: one kernel, two folders, two bytecodes (so two cache keys)."""
    from cuda.tile.compilation import export_kernel  # no GPU and no tileiras needed for bytecode

    from cutile_perf.kernel import compilecheck, signature_spec

    source = textwrap.dedent("""\
        import cuda.tile as ct

        @ct.kernel
        def add_one(x, y, TILE: ct.Constant[int]):
            t = ct.load(x, index=(ct.bid(0),), shape=(TILE,))
            ct.store(y, index=(ct.bid(0),), tile=t + 1)
        """)
    out = []
    for folder in ("a", "b"):
        path = tmp_path / folder / "kmod.py"
        path.parent.mkdir()
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"kmod_{folder}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        params = {name: signature_spec.parse_param(name, raw) for name, raw in
                  {"x": "float16[1]", "y": "float16[1]", "TILE": 1024}.items()}
        signature = compilecheck.build_signature(module.add_one, "add_one", params)
        export_kernel(module.add_one, [signature], str(tmp_path / f"{folder}.bc"), gpu_code="sm_90",
                      output_format="tileir_bytecode")
        out.append((tmp_path / f"{folder}.bc").read_bytes())
    assert str(tmp_path / "a").encode() in out[0]
    assert out[0] != out[1]


# --- the slots ------------------------------------------------------------------------------------


def test_slots_are_stable_per_repository_and_index_and_outside_it(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert pristine.slot_root(one, 0) == pristine.slot_root(one, 0)
    assert pristine.slot_root(one, 0) != pristine.slot_root(one, 1)
    assert pristine.slot_root(one, 0) != pristine.slot_root(two, 0)
    assert not pristine.is_inside(pristine.slot_root(one, 0), one)


def test_a_slot_left_by_a_killed_command_or_replaced_by_a_link_is_rebuilt_from_git(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    g = git.Repo(repo)
    head = g.head.commit.hexsha
    slot = tmp_path / "slot"
    slot.mkdir()
    (slot / "left-over.py").write_text("stale")
    built = pristine.build(g, protected_from=head, fenced_from=head, fence=("src/",), root=slot)
    assert not (slot / "left-over.py").exists() and (slot / "pytest.ini").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    built.remove()
    slot.symlink_to(elsewhere)
    pristine.build(g, protected_from=head, fenced_from=head, fence=("src/",), root=slot)
    assert not slot.is_symlink() and (slot / "pytest.ini").is_file() and not any(elsewhere.iterdir())


def test_sweep_leaves_the_checkout_as_built_and_nothing_else(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    (repo / "tests/ops/linked.py").symlink_to("__init__.py")  # a committed link inside the checkout
    git.Repo(repo).git.add("-A")
    git.Repo(repo).git.commit("-qm", "a link")
    g = git.Repo(repo)
    head = g.head.commit.hexsha
    built = pristine.build(g, protected_from=head, fenced_from=head, fence=("src/",), root=tmp_path / "slot")
    root = built.root
    before = {p.relative_to(root).as_posix() for p in root.rglob("*")}
    planted = ["tests/ops/conftest.py", "src/fakegym/ops/cutile/__pycache__/__init__.cpython-312.pyc",
               ".pytest_cache/v/cache/lastfailed", "output.bin"]
    for rel in planted:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("left by a child")
    (root / "src/escape").symlink_to(tmp_path)  # a link out, made by a child: removed, never followed
    removed = pristine.sweep(built)
    assert {p.relative_to(root).as_posix() for p in root.rglob("*")} == before
    assert (root / "tests/ops/linked.py").is_symlink() and any(tmp_path.iterdir())
    assert removed == sorted(["tests/ops/conftest.py", "src/fakegym/ops/cutile/__pycache__/", ".pytest_cache/",
                              "output.bin", "src/escape/"])
    assert pristine.sweep(built) == []


def test_child_env_reads_installed_bytecode_only_without_a_prefix(tmp_path):
    fresh = pristine.child_env(tmp_path, [], tmp_path / "pycache", {"PYTHONPATH": ""})
    installed = pristine.child_env(tmp_path, [], None, {"PYTHONPATH": ""})
    assert fresh["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache") and "PYTHONDONTWRITEBYTECODE" not in fresh
    assert "PYTHONPYCACHEPREFIX" not in installed and installed["PYTHONDONTWRITEBYTECODE"] == "1"


# --- through the loop (simulated repository) ------------------------------------------------------

OBSERVER = """
import os as _os
with open({log!r}, "a") as _fh:
    _fh.write(_os.environ.get("CUDA_TILE_CACHE_DIR", "-") + " " + __file__ + "\\n")
"""


def _observed(log: Path) -> list[tuple[str, str]]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return [tuple(line.split(" ", 1)) for line in lines]


def _session(tmp_path: Path, *session_changes) -> tuple[Path, Path]:
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", "300")
    assert code == 0, data
    allow_no_gpu(repo)
    if session_changes:
        edit_session(repo, **dict(session_changes))
    code, data, _ = call(repo, "baseline", "--repeats", "2")
    assert code == 0, data
    return repo, tmp_path / "observed.txt"


@pytest.mark.slow
@pytest.mark.usefixtures("runtime_defences_only")
def test_children_compile_into_the_guarded_session_cache_from_the_same_paths_and_verify_starts_empty(
        tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")  # the observer writes outside the box; boxed paths: test_box.py
    repo, log = _session(tmp_path)
    cache = repo / "sandbox" / jitcache.CACHE_DIR
    edit_kernel(repo, latency={"256x1024": 0.5, "4096x1024": 1.0})
    append_to_kernel(repo, OBSERVER.format(log=str(log)))
    code, data, _ = call(repo, "try", "twice as fast, observed")
    assert code == 0 and data["decision"] == "keep", data
    first = _observed(log)
    assert first and {env for env, _ in first} == {str(cache)}
    assert all(not pristine.is_inside(path, repo) for _, path in first)

    # Between two commands, something plants a compiled kernel in the session cache.
    _put(cache, "planted-key", b"a cubin no cutile-perf child compiled")
    capsys.readouterr()
    append_to_kernel(repo, "# a comment only")
    code, data, _ = call(repo, "try", "comment only, observed")
    assert code in (0, 1), data
    assert "dropped 1 compiled kernel(s)" in capsys.readouterr().err
    assert "planted-key" not in _keys(cache)
    assert rows(repo)[-1]["compile_cache_dropped"] == 1  # on the record, for a reviewer
    assert all("compile_cache_dropped" not in row for row in rows(repo)[:-1])
    second = _observed(log)
    # Same slot, same kernel path: an unchanged kernel has the same cuTile cache key as before. (A
    # superset: when this try is re-checked, the base, which now holds the observer too, runs from
    # the next slot; on a loaded 2-core machine it was.)
    assert {path for _, path in first} <= {path for _, path in second}

    code, data, _ = call(repo, "verify")
    assert data.get("verified") is not None, data
    seen = _observed(log)
    verify_caches = {env for env, _ in seen}
    assert seen and str(cache) not in verify_caches and len(verify_caches) == 1
    assert not Path(verify_caches.pop()).exists()  # verify's own cache is gone with it


@pytest.mark.slow
@pytest.mark.usefixtures("runtime_defences_only")
def test_without_jit_cache_children_keep_the_users_cache_and_fresh_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", str(tmp_path / "users-own-cache"))
    monkeypatch.setenv("CUTILE_PERF_SANDBOX", "off")  # the box passes no cache of the user's own (harness.md, Sandbox)
    repo, log = _session(tmp_path, ("jit_cache", False))
    append_to_kernel(repo, OBSERVER.format(log=str(log)))
    code, data, _ = call(repo, "try", "observed 1")
    first = _observed(log)
    append_to_kernel(repo, "# a comment only")
    code, data, _ = call(repo, "try", "observed 2")
    second = _observed(log)
    assert first and second
    assert {env for env, _ in first + second} == {str(tmp_path / "users-own-cache")}
    assert {path for _, path in first}.isdisjoint({path for _, path in second})
    assert not (repo / "sandbox" / jitcache.CACHE_DIR).exists()


def test_jit_cache_must_be_true_or_false(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", "300")
    assert code == 0, data
    edit_session(repo, jit_cache="yes")
    code, data, _ = call(repo, "status")
    assert code != 0 and "jit_cache must be true or false" in json.dumps(data)


def test_status_warns_about_kernels_no_command_compiled(tmp_path):
    repo = build_tilegym_like_repo(tmp_path)
    code, data, _ = call(repo, "init", "--kernel", "rms_norm", "--timeout", "300")
    assert code == 0, data
    cache = repo / "sandbox" / jitcache.CACHE_DIR
    with jitcache.guarded(cache):  # what a loop command's children compiled
        _put(cache, "ours", b"x")
    code, data, text = call(repo, "status")
    assert data["compile_cache"] == {"kernels": 1, "unrecorded": 0, "unreadable": False}
    _put(cache, "planted", b"y")
    code, data, text = call(repo, "status")
    assert data["compile_cache"] == {"kernels": 2, "unrecorded": 1, "unreadable": False}
    edit_session(repo, jit_cache=False)
    code, data, text = call(repo, "status")
    assert data["compile_cache"] is None
