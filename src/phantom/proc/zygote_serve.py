"""The zygote process of :mod:`phantom.proc.zygote`: imports once, then forks one process per request.

``python -m phantom.proc.zygote_serve SOCKET [MODULE ...]`` imports the modules, prints ``ready`` on
stdout and serves requests on the Unix socket: each is a client's arguments, environment, working
directory and mode (``kernel`` or ``code``) with four file descriptors (its stdin, stdout, stderr and
the read end of a lifeline pipe). The forked process takes those as its own, leads its own session
and becomes ``ipykernel`` (or runs the code); the zygote answers ``pid N``, reports ``exit N`` when it
is reaped, and kills its process group if the client's connection closes first. It is one thread
with one ``selectors`` loop (forking from a threaded process can copy a held lock), and stops on
SIGTERM or when its parent is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Sequence

__all__ = ["REQUEST_TIMEOUT_S", "kill_group", "serve"]

#: how long either side waits for the other's request or reply before giving up on it
REQUEST_TIMEOUT_S = 30.0


def _threads() -> int:
    """Threads of this process, native ones included (Linux)."""
    return len(os.listdir("/proc/self/task"))


def kill_group(pid: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def serve(sock_path: str, preload: Sequence[str]) -> int:
    """Import ``preload`` (``module`` or ``module:function``, the function then called once), then fork a kernel (or a ``python -c`` process) for each client until SIGTERM
    or until this process's parent is gone."""
    import gc
    import importlib

    # as phantom.proc.kernels' start-up file does in every batch kernel (plotly -> nbformat -> jsonschema)
    sys.modules.setdefault("rfc3987_syntax", None)
    # ipykernel's own modules are left to each kernel: its traitlets take defaults from the environment at
    # import (IPKernelApp.parent_handle from JPY_PARENT_PID), which is the client's, not the zygote's
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the "ready" line
        for name in (*preload, "IPython", "zmq", "tornado", "jupyter_client"):
            # "module:function" also calls a warm-up (no arguments) whose results the forks inherit
            module, _, func = name.partition(":")
            m = importlib.import_module(module)
            if func:
                getattr(m, func)()
    n = _threads()
    if n > 1:
        print(f"[phantom.zygote] {n} threads after importing {list(preload)}: forking would be unsafe, "
              "not serving", file=sys.stderr)
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
    gc.freeze()  # keep the imported objects out of the collector: fewer pages copied in each child
    print("ready", flush=True)
    while not stop and os.getppid() == parent:  # a killed sweep must not leave its zygote waiting forever
        for key, _ in sel.select(timeout=1.0):
            if key.fileobj is srv:
                try:
                    conn, _ = srv.accept()
                except OSError as e:  # e.g. out of descriptors: that client falls back after its timeout
                    print(f"[phantom.zygote] accept failed: {e}", file=sys.stderr, flush=True)
                    continue
                try:
                    if _threads() > 1:
                        raise RuntimeError("the zygote has more than one thread; forking would be unsafe")
                    pid = _fork_kernel(conn, path0, kernels, sockets=[srv, conn, *kernels.values()],
                                       fds=[wake_r, wake_w], selector=sel)
                except Exception as e:  # a bad request: that client falls back to an ordinary process
                    with contextlib.suppress(OSError):
                        conn.sendall(f"error {type(e).__name__}: {e}\n".encode())
                    conn.close()
                    continue
                sel.register(conn, selectors.EVENT_READ, pid)
            elif key.fileobj is wake_r:
                os.read(wake_r, 4096)
            else:  # a client's connection: it sends nothing after its request, so this is its end
                pid = key.data
                with contextlib.suppress(OSError):
                    if key.fileobj.recv(1):
                        continue
                sel.unregister(key.fileobj)
                kill_group(pid)  # the client was killed (or died): its process goes with it
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = kernels.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                conn.close()
    srv.close()
    with contextlib.suppress(OSError):
        os.unlink(sock_path)
    return 0


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    conn.settimeout(REQUEST_TIMEOUT_S)
    data, fds, _, _ = socket.recv_fds(conn, 65536, 8)
    try:
        if len(fds) != 4:
            raise ValueError(f"expected 4 file descriptors (stdin, stdout, stderr, lifeline), got {len(fds)}")
        while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
            more = conn.recv(65536)
            if not more:
                raise ValueError("request ended early")
            data += more
        req = json.loads(data[4:4 + struct.unpack("!I", data[:4])[0]])
        mode = req.get("mode", "kernel")
        if mode not in ("kernel", "code"):
            raise ValueError(f"mode={mode!r} is invalid; allowed: kernel, code")
        req["mode"], req["argv"], req["env"], req["cwd"] = mode, list(req["argv"]), dict(req["env"]), str(req["cwd"])
        return req, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        conn.settimeout(None)


def _fork_kernel(conn: socket.socket, path0: str, kernels: dict[int, socket.socket], *,
                 sockets: list[socket.socket], fds: list[int], selector: selectors.BaseSelector) -> int:
    """Fork one process for the request on ``conn``; in the zygote, record it in ``kernels`` and return
    its pid (``sockets``, ``fds`` and ``selector`` are the zygote's own, closed in the child)."""
    req, passed = _recv_request(conn)
    try:
        pid = os.fork()
    except BaseException:
        for fd in passed:
            os.close(fd)
        raise
    if pid:
        kernels[pid] = conn  # tracked before anything else can fail: it is reaped and reported
        for fd in passed:
            os.close(fd)
        what = "kernel" if req["mode"] == "kernel" else "process"
        with contextlib.suppress(OSError):
            print(f"[phantom.zygote] {what} {pid} for client {req.get('client')}", file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):  # a client gone already is noticed by the selector
            conn.sendall(f"pid {pid}\n".encode())
        return pid
    _child(req, passed, path0, sockets=sockets, fds=fds, selector=selector)
    return 0  # not reached


def _child(req: dict, passed: list[int], path0: str, *, sockets: list[socket.socket], fds: list[int],
           selector: selectors.BaseSelector) -> None:
    """The forked process: becomes the kernel (or runs the code) and never returns into the zygote's loop."""
    code = 1
    try:
        os.setsid()  # its own session and process group, as an ordinary kernel (the client's) has
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        with contextlib.suppress(OSError):
            selector.close()
        for s in sockets:  # detach first: the objects stay referenced by the zygote's frames
            with contextlib.suppress(OSError):
                os.close(s.detach())
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for i, fd in enumerate(passed[:3]):
            os.dup2(fd, i)
            os.close(fd)
        os.set_inheritable(passed[3], False)
        _watch_lifeline(passed[3])
        os.environ.clear()
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        if sys.path and sys.path[0] == path0:
            del sys.path[0]
        _reseed()
        argv = req["argv"]
        if req["mode"] == "code":  # `python -c CODE ARGS...`: argv = [CODE, *ARGS]
            import types

            if not sys.flags.safe_path:
                sys.path.insert(0, "")  # as `python -c` has it
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            sys.argv = ["-c", *argv[1:]]
            exec(compile(argv[0], "<string>", "exec"), main.__dict__)
        else:  # as ipykernel_launcher does: its own directory out of sys.path (IPython adds '' back)
            import importlib.util

            from ipykernel import kernelapp

            spec = importlib.util.find_spec("ipykernel_launcher")
            sys.argv = [spec.origin if spec and spec.origin else "ipykernel_launcher", *argv]
            kernelapp.launch_new_instance(argv=argv)
        code = 0
    except SystemExit as e:
        if isinstance(e.code, int) or e.code is None:
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        import atexit

        # as at a normal exit; the handlers the zygote's imports registered run in each child too: for the
        # lab's preloads they are process-local (logging.shutdown, torch's op-library finalizers, zmq notices)
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch_lifeline(fd: int) -> None:
    """Exit (with the process group) as soon as the client's end of the pipe closes: it is gone."""
    import threading

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 1):
                pass
        with contextlib.suppress(OSError):
            os.killpg(0, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="phantom-zygote-lifeline", daemon=True).start()


def _reseed() -> None:
    """Fresh global random state for numpy's legacy generator (CPython re-seeds ``random`` itself)."""
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2:]) if len(sys.argv) >= 2 else 2)
