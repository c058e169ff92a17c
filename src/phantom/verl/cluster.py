"""One local Ray head shared by the runs of a sweep: started once, found through ``$RAY_ADDRESS``, stopped by pid.

Every ``python -m verl.trainer.main_ppo`` starts its own local Ray cluster unless Ray is told of one:
the GCS, a raylet, the dashboard agent, the runtime-env agent, a log monitor and the autoscaler
monitor, each a Python or C++ process that must be up before the first actor. On a quiet two-core
machine that is ~20 s of every run; on a busy one the raylet gives up waiting for the dashboard agent
(``Timed out waiting for file .../metrics_agent_port_...``) and the run dies before it starts. A sweep
therefore starts one head here (``ray start --head``, retried) and exports its address; each run's
driver connects to it (:class:`phantom.verl.plan.Plan` drops ``num_cpus``/``num_gpus``, which Ray
refuses when connecting) and its workers start under the head's environment plus the run's own
``runtime_env`` variables (log paths), which the launcher always passes.

The head runs in its own session (process group) and its own temporary folder; :meth:`RayHead.stop`
ends exactly the processes of that group and folder, never other users' Ray processes (no ``ray stop``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["RayHead", "ADDRESS_ENV", "head_env"]

ADDRESS_ENV = "RAY_ADDRESS"
#: Variables that name one run's files: they travel in each run's runtime_env, never in the head's.
_PER_RUN = ("VERL_FILE_LOGGER_PATH", "PHANTOM_GATE_LOG", "PHANTOM_ROLLOUT_LOG", "PHANTOM_SYNC_LOG", ADDRESS_ENV)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def head_env(env: dict[str, str]) -> dict[str, str]:
    """The head's environment: a run's (the CPU backend's plugin and platform variables) minus its file paths."""
    out = {k: v for k, v in env.items() if k not in _PER_RUN}
    out.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    return out


class RayHead:
    """A local Ray head for a sweep (a context manager: ``with RayHead(env) as address: ...``)."""

    def __init__(self, env: dict[str, str], *, num_cpus: int = 8, num_gpus: int = 1, attempts: int = 4,
                 echo: bool = True):
        self.env, self.num_cpus, self.num_gpus, self.attempts, self.echo = head_env(env), num_cpus, num_gpus, attempts, echo
        self.address: str | None = None
        self.temp_dir: Path | None = None
        self.pgid: int | None = None

    def start(self) -> str:
        """Start the head (retrying: a busy machine can miss Ray's fixed start-up waits); return its address."""
        ray = Path(sys.executable).with_name("ray")
        last = ""
        for attempt in range(1, self.attempts + 1):
            # Ray's socket paths must stay short: /tmp/phr-XXXX, not a long runs folder.
            self.temp_dir = Path(tempfile.mkdtemp(prefix="phr-", dir="/tmp"))
            port = _free_port()
            argv = [str(ray), "start", "--head", f"--port={port}", f"--num-cpus={self.num_cpus}",
                    f"--num-gpus={self.num_gpus}", "--include-dashboard=false", "--disable-usage-stats",
                    f"--temp-dir={self.temp_dir}"]
            proc = subprocess.Popen(argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True)
            self.pgid = proc.pid
            out, _ = proc.communicate()
            if proc.returncode == 0:
                self.address = f"127.0.0.1:{port}"
                if self.echo:
                    print(f"phantom verl: Ray head at {self.address} (attempt {attempt})", file=sys.stderr)
                return self.address
            last = (out or "").strip().splitlines()[-1:] or ["(no output)"]
            last = last[0]
            self.stop()
            time.sleep(10 * attempt)
        raise RuntimeError(f"could not start a Ray head in {self.attempts} attempts; last error: {last}")

    def _members(self) -> list[Any]:
        import psutil

        found = {}
        for p in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = " ".join(p.info["cmdline"] or [])
                if (self.temp_dir is not None and str(self.temp_dir) in cmd) or os.getpgid(p.pid) == self.pgid:
                    found[p.pid] = p
                    for c in p.children(recursive=True):
                        found[c.pid] = c
            except (psutil.Error, ProcessLookupError, OSError):
                continue
        found.pop(os.getpid(), None)
        return list(found.values())

    def stop(self) -> None:
        """End the head's processes (its process group and anything naming its folder), then remove the folder."""
        import psutil

        members = self._members() if self.pgid is not None else []
        for p in members:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=15)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.address, self.pgid = None, None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
