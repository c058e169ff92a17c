"""Kernels forked from a warm process: the imports of a batch of notebook executions paid once.

Each cell of a lab sweep is a papermill execution of ``notebooks/lab_arm.py`` in a fresh Jupyter
kernel. On the 2-core build machine a fresh kernel spends ~3 CPU-seconds before the arm's first
step: importing torch (1.5 s), ``torch._dynamo`` (1.5 s: every torch optimizer imports it, in
``add_param_group`` and again in ``step``), IPython, pandas and plotly; papermill's own process
adds its imports. A 36-cell sweep pays that 36 times.

A *zygote* is one process that imports all of that once and then waits on a Unix socket. Kernels
started through it are forked from it, so each is still a fresh process with a fresh ipykernel
(papermill, jupyter_client and the notebook are unchanged), but its modules are already imported:

* :func:`kernel_zygote` starts the zygote with the batch's environment and yields the environment
  entries for the processes that run papermill: ``JUPYTER_PATH`` names a kernel spec ``python3`` whose
  command is this module's ``client``, and ``PHANTOM_ZYGOTE_SOCKET`` the socket.
* The client is what jupyter_client starts and watches as "the kernel". It hands the zygote its
  arguments, environment, working directory, stdio and one end of a pipe, relays the signals it gets
  (interrupt, terminate) to the forked kernel's process group, and exits with the kernel's exit
  status. The forked kernel leads its own session, as an ordinary kernel does. When the client is
  killed (papermill's immediate shutdown) the zygote sees its connection close and kills the kernel's
  process group; the pipe closing makes the kernel exit too, should the zygote be gone. When the
  client's own parent (papermill) dies, the client kills the kernel and exits.
* Without a zygote (none running, ``$PHANTOM_ZYGOTE=0``, or a zygote that cannot start) the client
  replaces itself with ``python -m ipykernel_launcher``: the ordinary kernel, the same results.

Forking is only safe from a single-threaded process, so the zygote checks that it has one thread
after its imports and before each fork (torch with ``OMP_NUM_THREADS=1`` starts none) and refuses to
serve otherwise. A forked kernel gets fresh global random state (CPython re-seeds ``random`` after a
fork; numpy's legacy generator is re-seeded here), the client's environment, working directory,
``sys.argv`` and ``sys.path`` as ``ipykernel_launcher`` would set them. What an interpreter reads once
at start (``PYTHONHASHSEED``, ``PYTHONPATH``, the thread counts torch read at import) is the zygote's,
so a batch's zygote must be started with the batch's environment (``env``). The lab seeds everything
it draws from, so its trajectories are bit-identical with and without a zygote (a test pins it).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from phantom.proc.kernels import write_if_changed
from phantom.proc.zygote_serve import REQUEST_TIMEOUT_S, kill_group

__all__ = ["SOCKET_ENV", "SWITCH_ENV", "Zygote", "kernel_zygote", "kernel_spec_dir", "code_command"]

#: the environment entry that tells a client where the zygote listens
SOCKET_ENV = "PHANTOM_ZYGOTE_SOCKET"
#: ``0`` turns zygotes off (every kernel starts as an ordinary one)
SWITCH_ENV = "PHANTOM_ZYGOTE"
_RELAYED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def kernel_spec_dir(base: str | os.PathLike[str]) -> Path:
    """``<base>/.jupyter-zygote``: a Jupyter data directory whose ``python3`` kernel is this module's
    client (``JUPYTER_PATH`` entries come before every other kernel directory)."""
    d = Path(base) / ".jupyter-zygote"
    spec = d / "kernels" / "python3" / "kernel.json"
    text = json.dumps({"argv": [sys.executable, "-m", "phantom.proc.zygote", "client", "-f", "{connection_file}"],
                       "display_name": "Python 3 (ipykernel)", "language": "python", "interrupt_mode": "signal",
                       "metadata": {"debugger": True}}, indent=1) + "\n"
    write_if_changed(spec, text)
    return d


class Zygote:
    """A running zygote. :meth:`env` is empty until it has finished its imports (kernels started
    meanwhile start as usual, so nobody waits for it), then the entries that route kernels to it."""

    def __init__(self, base: str | os.PathLike[str], preload: Sequence[str], env: dict[str, str] | None):
        self.base = Path(base)
        self.base.mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix="phantom-zygote-"))  # short: AF_UNIX paths stop at ~107 bytes
        self.socket = self._dir / "s"
        self._log = (self.base / "zygote.log").open("w")
        # pyarrow (imported by pandas) links jemalloc, whose default starts a background purging thread;
        # without it the zygote stays single-threaded and memory is purged inline
        zenv = {"JE_ARROW_MALLOC_CONF": "background_thread:false", **os.environ, **(env or {})}
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "phantom.proc.zygote_serve", str(self.socket), *preload],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._log, env=zenv, start_new_session=True)
        except BaseException:
            self._log.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.state = "starting"  # -> "ready" | "failed"

    def env(self, wait: float = 0.0) -> dict[str, str]:
        """The environment entries for kernel launchers ({} while starting, after a failure, or once
        the zygote has died)."""
        if self.state == "starting":
            sel = selectors.DefaultSelector()
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            try:
                if sel.select(timeout=wait):
                    self.state = "ready" if self.proc.stdout.readline().strip() == b"ready" else "failed"
                    if self.state == "failed":
                        print(f"[phantom] kernel zygote did not start (see {self.base / 'zygote.log'}); "
                              "kernels start as usual", file=sys.stderr)
            finally:
                sel.close()
        if self.state == "ready" and self.proc.poll() is not None:
            self.state = "failed"
        if self.state != "ready":
            return {}
        paths = [str(kernel_spec_dir(self.base)), *filter(None, [os.environ.get("JUPYTER_PATH")])]
        return {"JUPYTER_PATH": os.pathsep.join(paths), SOCKET_ENV: str(self.socket)}

    def close(self) -> None:
        """Stop the zygote and remove its socket. Processes it forked that are still running are killed
        by their clients, which see the zygote's end of the connection close."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._log.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class _Off:
    def env(self, wait: float = 0.0) -> dict[str, str]:
        return {}


@contextlib.contextmanager
def kernel_zygote(base: str | os.PathLike[str], *, preload: Sequence[str] = (),
                  env: dict[str, str] | None = None, enabled: bool = True) -> Iterator[Zygote | _Off]:
    """Run a zygote (``preload`` imported, environment ``env``) for the duration of the block.

    Yields an object whose ``env()`` gives the environment entries for the processes that start
    kernels: empty while the zygote is still importing, when zygotes are off, or when this one could
    not start (kernels then start as usual). Its own output goes to ``<base>/zygote.log``. With
    ``enabled=False`` (e.g. a batch of one kernel, where it cannot pay for its own start) none runs.
    """
    # Linux only: the single-thread check reads /proc/self/task (elsewhere native threads go unseen)
    if (not enabled or os.environ.get(SWITCH_ENV, "1") == "0" or not sys.platform.startswith("linux")
            or not hasattr(socket, "send_fds")):
        yield _Off()
        return
    try:
        z = Zygote(base, preload, env)
    except OSError as e:
        print(f"[phantom] kernel zygote did not start ({e}); kernels start as usual", file=sys.stderr)
        yield _Off()
        return
    try:
        yield z
    finally:
        z.close()


# -------------------------------------------------------------------------------------------
# the client: the process jupyter_client starts as the kernel
# -------------------------------------------------------------------------------------------
class _Unavailable(Exception):
    pass


def _client(args: list[str], mode: str = "kernel") -> int:
    """Run ``args`` forked from the zygote, else as ``python -m ipykernel_launcher ARGS`` (``kernel``)
    or ``python -c CODE ARGS`` (``code``: ``args = [CODE, *ARGS]``) in place of this process."""
    path = os.environ.get(SOCKET_ENV)
    if path and os.environ.get(SWITCH_ENV, "1") != "0":
        with contextlib.suppress(_Unavailable):
            code = _client_via(path, args, mode)
            if code < 0:  # killed by a signal: end the same way, as the process itself would have
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            return code % 256
    head = ["-m", "ipykernel_launcher"] if mode == "kernel" else ["-c"]
    os.execv(sys.executable, [sys.executable, *head, *args])
    return 1  # not reached


def code_command(code: str, *args: str) -> list[str]:
    """The command that runs ``python -c CODE ARGS`` forked from the zygote named in the environment
    (``$PHANTOM_ZYGOTE_SOCKET``), or as exactly that where none is running."""
    return [sys.executable, "-m", "phantom.proc.zygote", "run", "-c", code, *args]


def _readline(s: socket.socket, *, pid: int | None = None, parent: int | None = None) -> bytes:
    """One line from the zygote. With ``pid``, waits without end but watches this process's parent:
    if it is gone (papermill died), kills ``pid``'s process group and returns ``b""``."""
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            chunk = s.recv(1)
        except TimeoutError:
            if pid is not None and os.getppid() != parent:
                kill_group(pid)
                return b""
            if pid is None:
                raise
            continue
        if not chunk:
            break
        buf += chunk
    return buf.strip()


def _client_via(path: str, args: list[str], mode: str) -> int:
    parent = os.getppid()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(REQUEST_TIMEOUT_S)
    try:
        s.connect(path)
    except OSError as e:
        raise _Unavailable(str(e)) from None
    lifeline_r, lifeline_w = os.pipe()  # the write end stays open in this process until it exits
    payload = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "client": os.getpid(),
                          "mode": mode}).encode()
    try:
        msg = struct.pack("!I", len(payload)) + payload
        sent = socket.send_fds(s, [msg], [0, 1, 2, lifeline_r])
        if sent < len(msg):
            s.sendall(msg[sent:])
        reply = _readline(s)
    except OSError as e:  # includes a zygote too busy to answer within the timeout
        raise _Unavailable(str(e)) from None
    finally:
        os.close(lifeline_r)
    if not reply.startswith(b"pid "):
        os.close(lifeline_w)
        raise _Unavailable(reply.decode(errors="replace"))
    pid = int(reply.split()[1])

    def relay(signum: int, _frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except OSError:  # before the forked process has made its own group
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    for sig in _RELAYED:
        signal.signal(sig, relay)
    s.settimeout(1.0)
    line = _readline(s, pid=pid, parent=parent)
    if line.startswith(b"exit "):
        return int(line.split()[1])
    kill_group(pid)  # the zygote or papermill died: do not leave the process behind
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["client"]:
        return _client(argv[1:])
    if argv[:2] == ["run", "-c"] and len(argv) >= 3:
        return _client(argv[2:], mode="code")
    print("usage: python -m phantom.proc.zygote client -f CONNECTION_FILE | run -c CODE [ARG ...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
