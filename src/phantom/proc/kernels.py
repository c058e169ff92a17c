"""Start-up settings for the Jupyter kernels that phantom runs in batch (lab sweeps, book chapters).

Every notebook phantom executes with papermill shows a plotly figure. plotly's mimetype output
imports nbformat, nbformat imports jsonschema, and jsonschema's format checker for ``iri`` strings
builds ~35 Earley parsers from the optional ``rfc3987_syntax`` package at import time: 1.6 s of
CPU per kernel on the 2-core build machine (python-jsonschema/jsonschema#1428), ~1 minute of a
full ``make book``. No notebook schema uses that format.

Batch kernels therefore get an IPython directory of their own whose start-up file marks
``rfc3987_syntax`` as absent, so jsonschema skips that one optional checker, exactly as it does
where the package is not installed. Interactive sessions (JupyterLab, a user's own kernel) are not
touched: only the environments phantom hands to papermill name this directory.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["STARTUP", "batch_ipython_dir", "batch_kernel_env", "write_if_changed"]

#: The start-up file's text (IPython runs ``profile_default/startup/*.py`` in every kernel it starts).
STARTUP = '''\
# Written by phantom.proc.kernels for batch kernels (papermill): skip jsonschema's optional rfc3987_syntax
# backend, whose import costs ~1.6 s per kernel; see the module docstring of phantom.proc.kernels.
import sys as _sys
_sys.modules.setdefault("rfc3987_syntax", None)
del _sys
'''


def write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` only when it differs, atomically: kernels starting at that moment read
    either the old or the new file, never half of one."""
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def batch_ipython_dir(base: str | os.PathLike[str]) -> Path:
    """``<base>/.ipython`` with the start-up file in place (rewritten only when it differs); returns it."""
    d = Path(base) / ".ipython"
    write_if_changed(d / "profile_default" / "startup" / "00-phantom-batch.py", STARTUP)
    return d


def batch_kernel_env(base: str | os.PathLike[str]) -> dict[str, str]:
    """Environment entries for a batch kernel: ``IPYTHONDIR`` pointing at :func:`batch_ipython_dir`
    (none with ``$PHANTOM_BATCH_KERNELS=0``: the kernels then start as any other, e.g. to time them)."""
    if os.environ.get("PHANTOM_BATCH_KERNELS", "1") == "0":
        return {}
    return {"IPYTHONDIR": str(batch_ipython_dir(base))}
