"""Run folders: one directory per run holding its spec, status and step metrics.

Every run (CPU lab or verl) writes ``runs/<name>/manifest.json`` and ``runs/<name>/metrics.jsonl``.
The metrics file uses verl's file-logger line format, ``{"step": n, "data": {...}}``, so one reader
serves both. A run is *finished* only when its manifest says ``status: done``; a crashed or killed
run stays ``running``/``failed`` (``interrupted`` after Ctrl-C) and is re-run, never read as a result.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from phantom.proc.malloc import in_use as malloc_in_use

__all__ = [
    "STATUSES",
    "FINISHED",
    "RunDir",
    "RunInUse",
    "RunConflict",
    "spec_hash",
    "runs_root",
    "read_metrics",
    "iter_runs",
    "package_versions",
    "git_commit",
    "machine",
    "write_json_atomic",
    "pid_alive",
    "file_lock",
    "check_writable_dir",
]

#: ``interrupted``: stopped by Ctrl-C (or SIGTERM); like ``failed``, re-run on the next start.
#: ``starved``: a verl run stopped because its group filter found no batch (``phantom.verl.starve``); an
#: outcome, not an error: like ``done`` it is reused, never re-run
STATUSES = ("running", "done", "failed", "interrupted", "starved")
#: statuses of a run that ended on its own terms (reused by a resumed sweep)
FINISHED = ("done", "starved")
MANIFEST = "manifest.json"
METRICS = "metrics.jsonl"


class RunInUse(RuntimeError):
    """The run folder belongs to a live process."""


class RunConflict(RuntimeError):
    """A finished run with this name holds a different spec."""


def runs_root(root: str | os.PathLike[str] | None = None) -> Path:
    """Where run folders live: ``root``, else ``$PHANTOM_RUNS``, else ``./runs``."""
    return Path(root or os.environ.get("PHANTOM_RUNS", "runs")).resolve()


def check_writable_dir(root: str | os.PathLike[str] | None = None, *, what: str = "--runs-dir") -> Path:
    """The runs folder of :func:`runs_root`, checked before any work: its existing part must be a folder
    in which folders can be made (tried, and removed at once: ``os.access`` says yes to root on a read-only
    folder). Raises ``ValueError`` naming the path, so a file given as ``--runs-dir`` or a read-only one
    fails at once, not after the warm start was built."""
    import tempfile

    p = runs_root(root)
    if root is None:  # the folder came from the environment or the default, not from the flag
        what = "$PHANTOM_RUNS" if os.environ.get("PHANTOM_RUNS") else "the runs folder (default ./runs)"
    probe = p
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{what} {p}: {probe} is not a folder; allowed: a folder, or a new path inside one")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".phantom-write-check-", dir=probe))
    except OSError as e:
        raise ValueError(f"{what} {p}: cannot create folders in {probe} ({e.strerror}); allowed: a folder you "
                         "can write to") from None
    return p


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy / torch scalars
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def spec_hash(spec: Mapping[str, Any]) -> str:
    """Stable short hash of a spec (key order does not matter)."""
    blob = json.dumps(_jsonable(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON through a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def package_versions(names: tuple[str, ...] = ("phantom", "torch", "transformers", "verl", "ray", "numpy")) -> dict:
    out = {"python": platform.python_version()}
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    return out


def machine() -> dict[str, Any]:
    """The CPU a run ran on: its model, core count and, when torch is loaded, the kernels torch chose.

    Runs are deterministic per machine kind, not across kinds: torch and MKL pick their code paths by
    CPU (vector width, vendor), and their sums round differently, so a warm start trained on one kind
    ends a few bits away from another's and its runs diverge from there. The manifest says which kind made
    a run, so two runs that differ can be told apart from two that should agree.
    """
    import sys

    out: dict[str, Any] = {"arch": platform.machine(), "cores": os.cpu_count()}
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                out["cpu"] = line.split(":", 1)[1].strip()
                break
    torch = sys.modules.get("torch")  # never imported here: the verl launcher and the audit stay light
    if torch is not None:
        with contextlib.suppress(Exception):
            out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def git_commit(cwd: str | os.PathLike[str] | None = None) -> str | None:
    """The checkout's commit (``+dirty`` when it has local changes), or None outside git."""
    try:
        here = cwd or Path(__file__).resolve().parent
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process of this host exists (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_alive(pid: Any, host: Any) -> bool:
    if host != socket.gethostname() or not isinstance(pid, int):
        return True  # cannot tell for another host: assume alive, be safe
    return pid_alive(pid)


@dataclass(frozen=True)
class RunDir:
    """A run's folder. Create with :meth:`start`; read with :meth:`manifest` / :func:`read_metrics`."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS

    @property
    def stdout_path(self) -> Path:
        return self.path / "stdout.log"

    def manifest(self) -> dict:
        try:
            return json.loads(self.manifest_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}

    @property
    def status(self) -> str | None:
        return self.manifest().get("status")

    @property
    def done(self) -> bool:
        return self.status == "done"

    @property
    def finished(self) -> bool:
        """Ended on its own terms (``done`` or ``starved``): reused, never re-run."""
        return self.status in FINISHED

    def existing(self, spec: Mapping[str, Any]) -> bool:
        """True when a finished run of exactly this spec is here (reuse it); raises on a conflict."""
        m = self.manifest()
        if m.get("status") not in FINISHED:
            return False
        if m.get("spec_hash") != spec_hash(spec):
            raise RunConflict(
                f"run {self.path} is finished with a different spec (hash {m.get('spec_hash')} != "
                f"{spec_hash(spec)}); pick another name or delete the folder"
            )
        return True

    def check_startable(self, spec: Mapping[str, Any]) -> bool:
        """Raise if the folder cannot be (re)started; return True if a finished copy exists."""
        if self.existing(spec):
            return True
        m = self.manifest()
        if m.get("status") == "running" and _pid_alive(m.get("pid"), m.get("host")):
            raise RunInUse(
                f"run {self.path} is marked running by pid {m.get('pid')} on {m.get('host')}; "
                "wait for it, or delete the folder if that process is gone"
            )
        return False

    @classmethod
    def start(cls, name: str, spec: Mapping[str, Any], *, kind: str, root: str | os.PathLike[str] | None = None,
              extra: Mapping[str, Any] | None = None) -> RunDir:
        """Create (or restart a failed/stale) run folder and mark it running.

        A finished run with the same spec is never overwritten: check :meth:`existing` first.
        """
        run = cls(runs_root(root) / name)
        if run.check_startable(spec):
            raise RunConflict(f"run {run.path} is already finished; reuse it instead of starting it again")
        if run.path.exists():
            shutil.rmtree(run.path)
        run.path.mkdir(parents=True)
        now = time.time()
        write_json_atomic(run.manifest_path, {
            "name": name, "kind": kind, "status": "running", "spec": dict(spec), "spec_hash": spec_hash(spec),
            "created": now, "started": now, "finished": None, "pid": os.getpid(), "host": socket.gethostname(),
            "versions": package_versions(), "malloc": malloc_in_use(), "machine": machine(),
            "git_commit": git_commit(),
            **dict(extra or {}),
        })
        return run

    def update(self, **fields: Any) -> None:
        m = self.manifest()
        m.update(fields)
        write_json_atomic(self.manifest_path, m)

    def finish(self, status: str = "done", **fields: Any) -> None:
        if status not in STATUSES:
            raise ValueError(f"status={status!r} is unknown; allowed: {', '.join(STATUSES)}")
        self.update(status=status, finished=time.time(), **fields)

    def abort(self, exc: BaseException) -> None:
        """Mark the run stopped by ``exc``: ``interrupted`` for Ctrl-C, else ``failed`` with the error.

        On an interrupt a note naming the folder is added to the exception, so the command line's one
        line says which run was left (:func:`phantom.cli.main`).
        """
        if isinstance(exc, KeyboardInterrupt):
            self.finish("interrupted", error="interrupted (Ctrl-C)")
            if hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(f"run folder {self.path} marked interrupted")
        else:
            self.finish("failed", error=f"{type(exc).__name__}: {exc}")

    def log(self, step: int, data: Mapping[str, Any]) -> None:
        """Append one step in verl's file-logger format."""
        with self.metrics_path.open("a") as fh:
            fh.write(json.dumps({"step": int(step), "data": _jsonable(data)}) + "\n")


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` between processes that leaves no file behind.

    The lock file is removed while still locked, before it is released; a process that was waiting on
    the removed file finds, once it holds the lock, that the path no longer names the file it locked,
    and locks the path again. So at most one holder at a time, and no empty ``.lock`` file stays after
    a build (or after Ctrl-C: the ``finally`` runs on KeyboardInterrupt too).
    """
    import fcntl

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                same = os.fstat(fd).st_ino == os.stat(p).st_ino
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
        os.close(fd)  # releases the lock


def read_metrics(path: str | os.PathLike[str]):
    """A run's metrics as a DataFrame indexed by step (several lines of one step are merged).

    Accepts a run folder or a ``metrics.jsonl`` file; a torn last line (a run still writing) is skipped.
    """
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        p = p / METRICS
    rows: dict[int, dict] = {}
    with p.open() as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict) or "step" not in rec:
                continue
            rows.setdefault(int(rec["step"]), {}).update(rec.get("data") or {})
    df = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    df.index.name = "step"
    return df


def iter_runs(root: str | os.PathLike[str] | None = None, *, status: str | None = "done",
              **spec_filter: Any) -> Iterator[RunDir]:
    """Run folders under ``root`` (finished ones by default) whose spec matches ``spec_filter``."""
    base = runs_root(root)
    if not base.is_dir():
        return
    for mpath in sorted(base.glob(f"**/{MANIFEST}")):
        run = RunDir(mpath.parent)
        m = run.manifest()
        if status is not None and m.get("status") != status:
            continue
        spec = m.get("spec", {})
        if all(spec.get(k) == v for k, v in spec_filter.items()):
            yield run
