"""Kernels forked from a warm process: the imports of a batch of notebook executions paid once.

Each cell of a lab sweep is a papermill execution of ``notebooks/lab_arm.py`` in a fresh Jupyter
kernel. On the 2-core build machine a fresh kernel spends ~3 CPU-seconds before the arm's first
step: importing torch (1.5 s), ``torch._dynamo`` (1.5 s: every torch optimizer imports it, in
``add_param_group`` and again in ``step``), ipykernel, pandas and plotly. A 36-cell sweep pays that
36 times, about a minute of wall time.

A *zygote* is one process that imports all of that once and then waits on a Unix socket. Kernels
started through it are forked from it, so each is still a fresh process with a fresh ipykernel
(papermill, jupyter_client and the notebook are unchanged), but its modules are already imported:

* :func:`kernel_zygote` starts the zygote with the batch's environment and yields the environment
  entries for the processes that run papermill: ``JUPYTER_PATH`` names a kernel spec ``python3`` whose
  command is this module's ``client``, and ``PHANTOM_ZYGOTE_SOCKET`` the socket.
* The client is what jupyter_client starts and watches as "the kernel". It hands the zygote its
  arguments, environment, working directory, stdio and one end of a pipe, relays the signals it gets
  (interrupt, terminate) to the forked kernel, and exits with the kernel's exit status. If it is
  killed (papermill's immediate shutdown), the pipe closes and the forked kernel exits at once.
* Without a zygote (none running, ``$PHANTOM_ZYGOTE=0``, or a zygote that cannot start) the client
  replaces itself with ``python -m ipykernel_launcher``: the ordinary kernel, the same results.

Forking is only safe from a single-threaded process, so the zygote checks that it has one thread
after its imports (torch with ``OMP_NUM_THREADS=1`` starts none) and refuses to serve otherwise. A
forked kernel re-seeds Python's and numpy's global generators, as a fresh process would; the lab
seeds everything it draws from, so trajectories are bit-identical either way (a test pins it).
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
    text = json.dumps({"argv": [sys.executable, "-m", "phantom.zygote", "client", "-f", "{connection_file}"],
                       "display_name": "Python 3 (ipykernel)", "language": "python", "interrupt_mode": "signal",
                       "metadata": {"debugger": True}}, indent=1) + "\n"
    if not spec.is_file() or spec.read_text() != text:
        spec.parent.mkdir(parents=True, exist_ok=True)
        tmp = spec.with_name(f".kernel.json.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, spec)
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
        self.proc = subprocess.Popen([sys.executable, "-m", "phantom.zygote", "serve", str(self.socket), *preload],
                                     stdout=subprocess.PIPE, stderr=self._log, env=zenv, start_new_session=True)
        self.state = "starting"  # -> "ready" | "failed"

    def env(self, wait: float = 0.0) -> dict[str, str]:
        """The environment entries for kernel launchers ({} while starting or after a failure)."""
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
        if self.state != "ready":
            return {}
        paths = [str(kernel_spec_dir(self.base)), *filter(None, [os.environ.get("JUPYTER_PATH")])]
        return {"JUPYTER_PATH": os.pathsep.join(paths), SOCKET_ENV: str(self.socket)}

    def close(self) -> None:
        """Stop the zygote (kernels it forked are not touched) and remove its socket."""
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
    if not enabled or os.environ.get(SWITCH_ENV, "1") == "0" or not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        yield _Off()
        return
    z = Zygote(base, preload, env)
    try:
        yield z
    finally:
        z.close()


# -------------------------------------------------------------------------------------------
# the zygote
# -------------------------------------------------------------------------------------------
def _threads() -> int:
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/task"))
    import threading

    return threading.active_count()


def _serve(sock_path: str, preload: Sequence[str]) -> int:
    import importlib

    # as phantom.kernels' start-up file does in every batch kernel (plotly -> nbformat -> jsonschema)
    sys.modules.setdefault("rfc3987_syntax", None)
    for name in (*preload, "ipykernel.kernelapp"):
        importlib.import_module(name)
    if _threads() > 1:
        print(f"[phantom.zygote] {_threads()} threads after importing {list(preload)}: forking would be "
              "unsafe, not serving", file=sys.stderr)
        return 2
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    kernels: dict[int, socket.socket] = {}  # pid -> its client's connection
    path0 = sys.path[0] if sys.path else ""  # `python -m` puts the start directory first
    parent = os.getppid()
    print("ready", flush=True)
    while not stop and os.getppid() == parent:  # a killed sweep must not leave its zygote waiting forever
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is srv:
                conn, _ = srv.accept()
                try:
                    pid = _fork_kernel(conn, path0, sockets=[srv, conn, *kernels.values()], fds=[wake_r, wake_w])
                except Exception as e:  # a bad request: that client falls back to an ordinary kernel
                    with contextlib.suppress(OSError):
                        conn.sendall(f"error {type(e).__name__}: {e}\n".encode())
                    conn.close()
                    continue
                kernels[pid] = conn
            else:
                os.read(wake_r, 4096)
        while kernels:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = kernels.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
    srv.close()
    return 0


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 8)
    try:
        if len(fds) != 4:
            raise ValueError(f"expected 4 file descriptors (stdin, stdout, stderr, lifeline), got {len(fds)}")
        while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            more = conn.recv(65536)
            if not more:
                raise ValueError("request ended early")
            data += more
        return json.loads(data[4:4 + struct.unpack("!I", data[:4])[0]]), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def _fork_kernel(conn: socket.socket, path0: str, *, sockets: list[socket.socket], fds: list[int]) -> int:
    """Fork one kernel for the request on ``conn``; in the zygote, return its pid (``sockets`` and
    ``fds`` are the zygote's own, closed in the kernel)."""
    req, passed = _recv_request(conn)
    argv, env, cwd, mode = list(req["argv"]), dict(req["env"]), str(req["cwd"]), req.get("mode", "kernel")
    if mode not in ("kernel", "code"):
        raise ValueError(f"mode={mode!r} is invalid; allowed: kernel, code")
    pid = os.fork()
    if pid:
        for fd in passed:
            os.close(fd)
        conn.sendall(f"pid {pid}\n".encode())
        what = "kernel" if mode == "kernel" else "process"
        print(f"[phantom.zygote] {what} {pid} for client {req.get('client')}", file=sys.stderr, flush=True)
        return pid
    code = 1
    try:  # the kernel: never returns into the zygote's loop
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for s in sockets:  # detach first: the objects stay referenced by the zygote's frames
            with contextlib.suppress(OSError):
                os.close(s.detach())
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for i, fd in enumerate(passed[:3]):
            os.dup2(fd, i)
            os.close(fd)
        _watch_lifeline(passed[3])
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        if sys.path and sys.path[0] == path0:  # as ipykernel_launcher does (IPython adds '' back)
            del sys.path[0]
        _reseed()
        if mode == "code":  # `python -c CODE ARGS...`: argv = [CODE, *ARGS]
            sys.argv = ["-c", *argv[1:]]
            exec(compile(argv[0], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            import importlib.util

            from ipykernel import kernelapp

            spec = importlib.util.find_spec("ipykernel_launcher")
            sys.argv = [spec.origin if spec and spec.origin else "ipykernel_launcher", *argv]
            kernelapp.launch_new_instance(argv=argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch_lifeline(fd: int) -> None:
    """Exit as soon as the client is gone (its end of the pipe closes): it was killed or it exited."""
    import threading

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 1):
                pass
        os._exit(1)

    threading.Thread(target=watch, name="phantom-zygote-lifeline", daemon=True).start()


def _reseed() -> None:
    """Fresh global random state, as a newly started interpreter would have (a fork copies the zygote's)."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


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
            return _client_via(path, args, mode)
    head = ["-m", "ipykernel_launcher"] if mode == "kernel" else ["-c"]
    os.execv(sys.executable, [sys.executable, *head, *args])
    return 1  # not reached


def code_command(code: str, *args: str) -> list[str]:
    """The command that runs ``python -c CODE ARGS`` forked from the zygote named in the environment
    (``$PHANTOM_ZYGOTE_SOCKET``), or as exactly that where none is running."""
    return [sys.executable, "-m", "phantom.zygote", "run", "-c", code, *args]


def _readline(s: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf.strip()


def _client_via(path: str, args: list[str], mode: str) -> int:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as e:
        raise _Unavailable(str(e)) from None
    lifeline_r, lifeline_w = os.pipe()  # the write end stays open in this process until it exits
    payload = json.dumps({"argv": args, "env": dict(os.environ), "cwd": os.getcwd(), "client": os.getpid(),
                          "mode": mode}).encode()
    try:
        socket.send_fds(s, [struct.pack("!I", len(payload)) + payload], [0, 1, 2, lifeline_r])
        reply = _readline(s)
    except OSError as e:
        raise _Unavailable(str(e)) from None
    finally:
        os.close(lifeline_r)
    if not reply.startswith(b"pid "):
        os.close(lifeline_w)
        raise _Unavailable(reply.decode(errors="replace"))
    pid = int(reply.split()[1])

    def relay(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in _RELAYED:
        signal.signal(sig, relay)
    line = _readline(s)
    if line.startswith(b"exit "):
        return int(line.split()[1]) % 256
    with contextlib.suppress(ProcessLookupError):  # the zygote died: do not leave the kernel behind
        os.kill(pid, signal.SIGKILL)
    return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"] and len(argv) >= 2:
        return _serve(argv[1], argv[2:])
    if argv[:1] == ["client"]:
        return _client(argv[1:])
    if argv[:2] == ["run", "-c"] and len(argv) >= 3:
        return _client(argv[2:], mode="code")
    print("usage: python -m phantom.zygote serve SOCKET [MODULE ...] | client -f CONNECTION_FILE "
          "| run -c CODE [ARG ...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
