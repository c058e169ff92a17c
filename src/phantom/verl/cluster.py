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

The head runs in its own session (process group) and its own temporary folder, on 127.0.0.1, with a token
of its own (Ray 2.60's token authentication: ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` in that
folder, never the shared ``~/.ray/auth_token`` another user's ``ray start`` may rewrite); :meth:`RayHead.run_env`
is what a run needs to join it. :meth:`RayHead.stop` ends exactly the processes of that group and folder,
never other users' Ray processes (no ``ray stop``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["RayHead", "ADDRESS_ENV", "head_env", "term_as_interrupt"]

ADDRESS_ENV = "RAY_ADDRESS"
#: Variables that name one run's files: they travel in each run's runtime_env, never in the head's.
_PER_RUN = ("VERL_FILE_LOGGER_PATH", "PHANTOM_GATE_LOG", "PHANTOM_ROLLOUT_LOG", "PHANTOM_SYNC_LOG", ADDRESS_ENV,
            "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")


@contextlib.contextmanager
def term_as_interrupt():
    """SIGTERM raises KeyboardInterrupt inside the block (main thread only), so that a `kill` of a sweep or of
    a launcher runs the same clean-up as Ctrl-C: verl and the Ray head live in sessions of their own and
    would otherwise outlive it."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: seconds the head's processes get to exit on SIGTERM before SIGKILL
STOP_GRACE_S = 3.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def head_env(env: dict[str, str]) -> dict[str, str]:
    """The head's environment: a run's (the CPU backend's plugin and platform variables) minus its file paths."""
    out = {k: v for k, v in env.items() if k not in _PER_RUN}
    out.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Idle workers prestarted for the head's own environment are never used: every run brings its own
    # runtime_env (log paths), so they only import Ray's worker code (~13 CPU-s each on this machine).
    out.setdefault("RAY_enable_worker_prestart", "0")
    out.setdefault("RAY_prestart_worker_first_driver", "0")
    return out


class RayHead:
    """A local Ray head for a sweep (a context manager: ``with RayHead(env) as address: ...``)."""

    def __init__(self, env: dict[str, str], *, num_cpus: int = 8, num_gpus: int = 1, attempts: int = 4,
                 echo: bool = True, nice: int | None = None):
        self.env, self.num_cpus, self.num_gpus, self.attempts, self.echo = head_env(env), num_cpus, num_gpus, attempts, echo
        # The head's processes (and so every worker the raylet forks) run at the caller's niceness; with
        # ``nice`` set, its start-up burst runs at 0 and the head is reniced to ``nice`` once it is up: Ray's
        # start-up waits (~15 s for the dashboard agent, 30 s for the raylet) are missed on a busy machine
        # when a reniced agent gets too little CPU to import its modules in time.
        self.nice = nice
        self.address: str | None = None
        self.temp_dir: Path | None = None
        self.pgid: int | None = None
        self.token_path: Path | None = None

    def run_env(self) -> dict[str, str]:
        """What a run's driver needs to join this head: its address and its token."""
        if self.address is None or self.token_path is None:
            raise RuntimeError("the Ray head is not running")
        return {ADDRESS_ENV: self.address, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}

    def start(self) -> str:
        """Start the head (retrying: a busy machine can miss Ray's fixed start-up waits); return its address."""
        ray = Path(sys.executable).with_name("ray")
        last = ""
        for attempt in range(1, self.attempts + 1):
            # Ray's socket paths must stay short: /tmp/phr-XXXX, not a long runs folder.
            self.temp_dir = Path(tempfile.mkdtemp(prefix="phr-", dir="/tmp"))
            self.token_path = self.temp_dir / "auth_token"
            self.token_path.write_text(secrets.token_hex(32))
            self.token_path.chmod(0o600)
            port = _free_port()
            # Fixed agent ports: with 0 (Ray's default) the raylet waits ~15 s for the dashboard agent to
            # write the port it bound, and aborts ("Timed out waiting for file .../metrics_agent_port_...")
            # when a busy machine starts that Python process more slowly.
            agents = [f"--dashboard-agent-grpc-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
                      f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}"]
            argv = [str(ray), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", *agents,
                    f"--num-cpus={self.num_cpus}", f"--num-gpus={self.num_gpus}", "--include-dashboard=false",
                    "--disable-usage-stats", f"--temp-dir={self.temp_dir}"]
            env = {**self.env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path)}
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    start_new_session=True, preexec_fn=self._start_priority if self.nice else None)
            self.pgid = proc.pid
            out, _ = proc.communicate()
            if proc.returncode == 0:
                self.address = f"127.0.0.1:{port}"
                self._renice()
                if self.echo:
                    print(f"phantom verl: Ray head at {self.address} (attempt {attempt})", file=sys.stderr)
                return self.address
            last = ((out or "").strip().splitlines()[-1:] or ["(no output)"])[0]
            if self.echo:
                print(f"phantom verl: Ray head attempt {attempt} failed: {last}", file=sys.stderr)
            self.stop()
            time.sleep(10 * attempt)
        raise RuntimeError(f"could not start a Ray head in {self.attempts} attempts; last error: {last}")

    @staticmethod
    def _start_priority() -> None:  # in the child, before exec: niceness 0 where permitted
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, 0)

    def _renice(self) -> None:
        import psutil

        if self.nice is None:
            return
        for p in self._members():
            with contextlib.suppress(psutil.Error):
                p.nice(self.nice)

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
        # A few seconds of grace: the head is disposable (its folder goes next), and Ray's GCS server and
        # log monitor ignore SIGTERM for longer than any wait here (15 s measured), so they are killed.
        _, alive = psutil.wait_procs(members, timeout=STOP_GRACE_S)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        self.address, self.pgid, self.token_path = None, None, None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
