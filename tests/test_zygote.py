"""Kernels forked from a zygote (phantom.proc.zygote): papermill's real kernels, started warm.

Each test runs real papermill / jupyter_client executions against a real zygote process and
compares with an ordinary kernel: same interpreter state a notebook can see (sys.path, argv,
environment, working directory), fresh global random state, signals relayed, nothing left behind.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
import papermill
import pytest
from jupyter_client.manager import start_new_kernel

from phantom.book.execute import environ
from phantom.proc.zygote import SOCKET_ENV, kernel_spec_dir, kernel_zygote

pytestmark = pytest.mark.slow

PROBE = """\
import json, os, random, sys
import numpy
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path": sys.path,
                  "argv0": os.path.basename(sys.argv[0]), "probe": os.environ.get("PROBE"),
                  "random": random.random(), "np_random": numpy.random.random(),
                  "session_leader": os.getsid(0) == os.getpid()}))
"""


def _notebook(tmp_path: Path) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROBE)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    src = tmp_path / "probe.ipynb"
    nbformat.write(nb, src)
    return src


def _probe(src: Path, env: dict[str, str], cwd: Path) -> tuple[dict, dict]:
    out = src.with_name("out.ipynb")
    with environ(env):
        papermill.execute_notebook(str(src), str(out), kernel_name="python3", progress_bar=False, cwd=str(cwd),
                                   shutdown_kernel="immediate")
    nb = nbformat.read(out, as_version=4)
    return json.loads(nb.cells[0].outputs[0]["text"]), dict(nb.metadata["kernelspec"])


def _gone(pid: int, timeout: float = 10.0) -> bool:
    """The process has exited (a zombie nobody has reaped yet counts: it runs nothing)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (ProcessLookupError, FileNotFoundError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_kernels_are_forked_from_the_zygote_and_see_what_a_plain_kernel_sees(tmp_path):
    src = _notebook(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    plain, plain_spec = _probe(src, {"PROBE": "plain"}, work)
    with kernel_zygote(tmp_path / "z", preload=("json", "numpy"), env={"OMP_NUM_THREADS": "1"}) as z:  # else BLAS threads
        zenv = z.env(wait=120)
        assert set(zenv) == {"JUPYTER_PATH", SOCKET_ENV}
        a, a_spec = _probe(src, {**zenv, "PROBE": "a"}, work)
        b, _ = _probe(src, {**zenv, "PROBE": "b"}, work)
        # papermill's immediate shutdown (SIGKILL to the client's group) reaches the forked kernels
        assert _gone(a["pid"]) and _gone(b["pid"])
        assert z.proc.poll() is None
        zygote_pid = z.proc.pid
    assert a["ppid"] == b["ppid"] == zygote_pid != plain["ppid"]  # forked, not started
    assert (a["probe"], b["probe"]) == ("a", "b")  # the client's environment, per kernel
    assert a["cwd"] == b["cwd"] == plain["cwd"] == str(work)
    assert a["path"] == plain["path"] and a["argv0"] == plain["argv0"] == "ipykernel_launcher.py"
    # fresh global random state in each, as in a fresh interpreter, not the zygote's copy
    assert a["random"] != b["random"] and a["np_random"] != b["np_random"]
    assert a["session_leader"] and plain["session_leader"]  # its own process group, as an ordinary kernel
    assert a_spec == plain_spec  # the executed notebook names the ordinary python3 kernel
    log = (tmp_path / "z" / "zygote.log").read_text()
    assert f"kernel {a['pid']} " in log and f"kernel {b['pid']} " in log


def test_without_a_zygote_the_client_starts_an_ordinary_kernel(tmp_path):
    """A stale socket path (the zygote is gone) or the off switch: the same kernel command still works."""
    src = _notebook(tmp_path)
    spec_env = {"JUPYTER_PATH": str(kernel_spec_dir(tmp_path / "z"))}
    stale, _ = _probe(src, {**spec_env, SOCKET_ENV: str(tmp_path / "no-such-socket")}, tmp_path)
    with kernel_zygote(tmp_path / "z2") as z:
        zenv = z.env(wait=120)
        off, _ = _probe(src, {**zenv, "PHANTOM_ZYGOTE": "0"}, tmp_path)
        assert off["ppid"] != z.proc.pid
    assert stale["probe"] is None and stale["argv0"] == "ipykernel_launcher.py"


def test_off_switch_and_a_batch_of_one_run_no_zygote(tmp_path, monkeypatch):
    with kernel_zygote(tmp_path, enabled=False) as z:
        assert z.env(wait=1) == {} and not hasattr(z, "proc")
    monkeypatch.setenv("PHANTOM_ZYGOTE", "0")
    with kernel_zygote(tmp_path) as z:
        assert z.env(wait=1) == {}


def test_a_zygote_with_threads_refuses_to_fork(tmp_path, capsys):
    """Forking a multi-threaded process can copy a held lock: such a zygote does not serve."""
    (tmp_path / "threaded_mod.py").write_text("import threading, time\n"
                                              "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    with kernel_zygote(tmp_path / "z", preload=("threaded_mod",), env=env) as z:
        assert z.env(wait=120) == {} and z.state == "failed"
    assert "forking would be unsafe" in (tmp_path / "z" / "zygote.log").read_text()
    assert "did not start" in capsys.readouterr().err


def test_a_preload_entry_with_a_function_is_called_once_in_the_zygote(tmp_path):
    """``module:function`` entries warm the zygote up (the lab's decode-kernel check) before it forks."""
    (tmp_path / "warm_mod.py").write_text(f"import os\ndef warm():\n    open({str(tmp_path / 'calls')!r}, 'a')"
                                          ".write(f'{os.getpid()}\\n')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    with kernel_zygote(tmp_path / "z", preload=("json", "warm_mod:warm"), env=env) as z:
        assert set(z.env(wait=120)) == {"JUPYTER_PATH", SOCKET_ENV}
        assert (tmp_path / "calls").read_text().split() == [str(z.proc.pid)]


def test_interrupt_reaches_the_forked_kernel(tmp_path):
    """jupyter_client interrupts by signalling the process it started (the client): it is relayed."""
    with kernel_zygote(tmp_path / "z", preload=("json",)) as z:
        with environ(z.env(wait=120)):
            km, kc = start_new_kernel(kernel_name="python3")
        try:
            kc.execute("import os; print(os.getppid())")
            ppid = None
            while ppid is None:
                msg = kc.get_iopub_msg(timeout=30)
                if msg["msg_type"] == "stream":
                    ppid = int(msg["content"]["text"].strip())
            assert ppid == z.proc.pid
            msg_id = kc.execute("import time\nprint('looping', flush=True)\nwhile True: time.sleep(0.01)")
            while True:  # interrupt only once the loop runs (an idle kernel ignores SIGINT)
                msg = kc.get_iopub_msg(timeout=30)
                if msg["msg_type"] == "stream" and "looping" in msg["content"]["text"]:
                    break
            km.interrupt_kernel()
            reply = kc.get_shell_msg(timeout=30)
            while reply["parent_header"].get("msg_id") != msg_id:
                reply = kc.get_shell_msg(timeout=30)
            assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def test_code_runs_forked_with_its_arguments_output_and_exit_status(tmp_path):
    """``code_command`` is ``python -c CODE ARGS`` (the sweep's papermill process), forked when a zygote serves."""
    import subprocess

    from phantom.proc.zygote import code_command

    code = ("import os, sys; print(os.getppid(), sys.argv[1:], os.getcwd(), repr(sys.path[0]), __name__); "
            "sys.exit(int(sys.argv[1]))")
    with kernel_zygote(tmp_path / "z", preload=("json",)) as z:
        zenv = z.env(wait=120)
        forked = subprocess.run(code_command(code, "3", "x y"), env={**os.environ, **zenv}, cwd=tmp_path,
                                capture_output=True, text=True, timeout=60)
        zygote_pid = z.proc.pid
    plain = subprocess.run(code_command(code, "3", "x y"), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    for r in (forked, plain):
        assert r.returncode == 3, r.stderr
        assert r.stdout.split(" ", 1)[1].strip() == f"['3', 'x y'] {tmp_path} '' __main__"
    assert int(forked.stdout.split()[0]) == zygote_pid != int(plain.stdout.split()[0])


def test_a_zygote_whose_parent_dies_exits(tmp_path):
    """A sweep killed with SIGKILL cannot stop its zygote: the zygote notices and exits by itself."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time; from phantom.proc.zygote import kernel_zygote\n"
            "with kernel_zygote(sys.argv[1], preload=('json',)) as z:\n"
            "    assert z.env(wait=120)\n    print(z.proc.pid, flush=True)\n    time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    zygote_pid = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    parent.stdout.close()
    assert _gone(zygote_pid, timeout=15)


def test_a_forked_kernel_dies_with_the_process_that_started_it(tmp_path):
    """papermill killed outright (OOM, SIGKILL): its kernel's client notices and takes the kernel along,
    while the zygote keeps serving."""
    import signal
    import subprocess
    import sys

    code = ("from jupyter_client.manager import start_new_kernel\n"
            "import time\nkm, kc = start_new_kernel(kernel_name='python3')\n"
            "kc.execute('import os; print(os.getpid())')\n"
            "while True:\n    m = kc.get_iopub_msg(timeout=60)\n"
            "    if m['msg_type'] == 'stream':\n        print(m['content']['text'].strip(), flush=True); break\n"
            "time.sleep(600)\n")
    with kernel_zygote(tmp_path / "z", preload=("json",)) as z:
        zenv = z.env(wait=120)
        launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, **zenv})
        lines = [launcher.stdout.readline()]
        while not lines[-1].strip().isdigit():
            assert lines[-1], "".join(lines)
            lines.append(launcher.stdout.readline())
        assert not any("NOTE" in line for line in lines), lines  # ipykernel knows its parent, as usual
        kernel_pid = int(lines[-1])
        assert f"kernel {kernel_pid} " in (tmp_path / "z" / "zygote.log").read_text()
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        launcher.stdout.close()
        assert _gone(kernel_pid, timeout=15)
        assert z.proc.poll() is None
