"""The decode step's attention as a small C kernel that gives torch's numbers bit for bit.

Why: at the lab's size a decode step's attention is two batched matmuls over (row, kv-head) matrices
of 2 queries x 24 features against up to ~180 keys, and torch's ``bmm`` spends ~0.5 us per matrix
whatever it holds: attention was ~40% of sampling. ``decode_kernel.c`` does rotary embedding, the
cache write, the scores and the weighted sum of values in one pass over each row's cache, summing in
the order torch 2.13's kernels sum (four partial sums over the head dimension for keys in blocks of
four, eight for the rest, a plain sequential sum below torch's small-matrix threshold; one
sequential sum over keys for the values). The softmax between the two stays torch's.

Bit-identity is checked, not assumed: before a model first uses the kernel for a head size and group
size, :func:`kernel_for` runs it and torch's own ops on random inputs over every key count from 1 to
the model's context and uses the kernel only if every value matches exactly. Otherwise, and wherever
no C compiler is found, sampling takes torch's path: the same numbers, slower. Run manifests record
which path ran (``decode``). ``$PHANTOM_DECODE=torch`` forces torch's path.

The library is compiled once per source, compiler and CPU (``-O3 -march=native -ffp-contract=off``,
no ``-ffast-math``) into ``$PHANTOM_ARTIFACTS/lab/kernels/`` and loaded with :mod:`ctypes`.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

__all__ = ["CHOICES", "choice", "DecodeKernel", "kernel_for", "describe", "reference_step", "matches_torch"]

CHOICES: tuple[str, ...] = ("c", "torch")
_SOURCE = Path(__file__).with_name("decode_kernel.c")
_FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-fast-math", "-std=c11", "-shared", "-fPIC")


def choice() -> str:
    """``$PHANTOM_DECODE`` (default ``c``); an unknown value raises naming the allowed ones."""
    value = os.environ.get("PHANTOM_DECODE", "c").strip().lower() or "c"
    if value not in CHOICES:
        raise ValueError(f"PHANTOM_DECODE={value!r} is unknown; allowed: {', '.join(CHOICES)}")
    return value


def _compiler() -> str | None:
    for cc in (os.environ.get("CC", ""), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def _cpu_flags() -> str:
    """The CPU's feature flags: ``-march=native`` code is only loaded where it was built for."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or platform.machine()


def _library_path(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False).stdout
    h = hashlib.sha256(_SOURCE.read_bytes())
    for part in (cc, version, " ".join(_FLAGS), _cpu_flags()):
        h.update(part.encode() + b"\0")
    # beside the warm starts (phantom.lab.sft.artifacts_root's rule; sft imports this module's user)
    from phantom.paths import artifacts_base

    root = artifacts_base() / "lab"
    return root / "kernels" / f"decode-{h.hexdigest()[:16]}.so"


def _build(cc: str) -> Path:
    """Compile the library unless this source, compiler and CPU already have one (atomic rename)."""
    path = _library_path(cc)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        r = subprocess.run([cc, *_FLAGS, "-o", tmp, str(_SOURCE)], capture_output=True, text=True, check=False)
        if r.returncode != 0:
            raise RuntimeError(f"{cc} failed on {_SOURCE.name}: {r.stderr.strip()[-500:]}")
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


class DecodeKernel:
    """The loaded library; :meth:`scores` and :meth:`mix` write into tensors the caller allocates."""

    def __init__(self, path: Path):
        lib = ctypes.CDLL(str(path))
        i, p = ctypes.c_int, ctypes.c_void_p
        lib.decode_scores.argtypes = [i, i, i, i, i, i, p, p, p, p, p, p, p, p, ctypes.c_float, p]
        lib.decode_mix.argtypes = [i, i, i, i, i, i, p, p, p, p]
        lib.decode_scores.restype = lib.decode_mix.restype = i
        self.path, self._lib = path, lib

    def scores(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
               rows: torch.Tensor, kt: torch.Tensor, vc: torch.Tensor, bias: torch.Tensor, slot: int, heads: int,
               scale: float, att: torch.Tensor) -> torch.Tensor:
        """Rotate the step's heads, write key and value at ``slot``, fill ``att`` (n, KV, g, slot+1).

        ``qkv`` (n, (H+2KV)D) holds the n active rows' projections, ``pos`` their positions and ``rows``
        their rows in the caches ``kt`` (B, KV, D, L), ``vc`` (B, KV, L, D) and ``bias`` (B, L);
        ``cos``/``sin`` are the rotary tables (positions, D). All contiguous, float32 or int64, as
        :meth:`phantom.lab.model.LabQwen2.generate` keeps them (the C code trusts the layout).
        """
        n = qkv.shape[0]
        _, kv, d, length = kt.shape
        rc = self._lib.decode_scores(n, heads, kv, d, length, slot, qkv.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                     pos.data_ptr(), rows.data_ptr(), kt.data_ptr(), vc.data_ptr(), bias.data_ptr(),
                                     scale, att.data_ptr())
        if rc:
            raise ValueError(f"decode_scores: sizes out of range (heads={heads}, kv={kv}, D={d}, slot={slot}, L={length})")
        return att

    def mix(self, att: torch.Tensor, rows: torch.Tensor, vc: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (n, KV*g*D) = ``att`` (n, KV, g, S) @ ``vc[rows, :, :S]``."""
        n, kv, g, s = att.shape
        rc = self._lib.decode_mix(n, kv, g, vc.shape[3], vc.shape[2], s, att.data_ptr(), rows.data_ptr(),
                                  vc.data_ptr(), out.data_ptr())
        if rc:
            raise ValueError(f"decode_mix: sizes out of range (D={vc.shape[3]}, S={s}, L={vc.shape[2]})")
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def reference_step(qkv: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, pos: torch.Tensor,
                   kc: torch.Tensor, vc: torch.Tensor, bias: torch.Tensor, slot: int, heads: int) -> torch.Tensor:
    """torch's decode-step attention exactly as ``LabQwen2.generate`` computes it without the kernel
    (``kc`` (n, KV, L, D) and ``vc`` are written at ``slot``); returns the heads' outputs (n, H*D)."""
    n, kv, _, d = kc.shape
    g, nq, nkv = heads // kv, heads * d, kv * d
    qk = _rotate(qkv[:, :nq + nkv].view(n, heads + kv, d), cos_t[pos][:, None], sin_t[pos][:, None])
    kc[:, :, slot] = qk[:, heads:]
    vc[:, :, slot] = qkv[:, nq + nkv:].view(n, kv, d)
    att = torch.matmul(qk[:, :heads].view(n, kv, g, d), kc[:, :, :slot + 1].transpose(-1, -2))
    att = torch.softmax(att.mul_(d ** -0.5).add_(bias[:, None, None, :slot + 1]), dim=-1)
    return torch.matmul(att, vc[:, :, :slot + 1]).view(n, nq)


def _kernel_step(k: DecodeKernel, qkv: torch.Tensor, cos_t: torch.Tensor, sin_t: torch.Tensor, pos: torch.Tensor,
                 rows: torch.Tensor, kt: torch.Tensor, vc: torch.Tensor, bias: torch.Tensor, slot: int,
                 heads: int) -> torch.Tensor:
    n, (_, kv, d, _) = len(rows), kt.shape
    att = k.scores(qkv, cos_t, sin_t, pos, rows, kt, vc, bias, slot, heads, d ** -0.5,
                   torch.empty(n, kv, heads // kv, slot + 1))
    return k.mix(torch.softmax(att, dim=-1), rows, vc, torch.empty(n, heads * d))


def matches_torch(k: DecodeKernel, heads: int, kv_heads: int, head_dim: int, context: int, rows: int = 3) -> bool:
    """Does the kernel reproduce :func:`reference_step` exactly, for every key count up to ``context``?

    Random queries, keys and values (some keys masked with -inf, as padding is) at each slot, the
    active rows a shuffled subset of the cache's (as after finished rows left the batch); the caches,
    scores and outputs are compared value for value.
    """
    g = torch.Generator().manual_seed(20261202)
    with torch.inference_mode():
        cos_t, sin_t = (f(torch.randn(64, head_dim, generator=g)) for f in (torch.cos, torch.sin))
        for slot in range(context):
            qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=g)
            kc = torch.randn(rows, kv_heads, context, head_dim, generator=g)
            vc = torch.randn(rows, kv_heads, context, head_dim, generator=g)
            pos = torch.randint(0, 64, (rows,), generator=g)
            bias = torch.zeros(rows, context)
            if slot >= 4:
                bias[0, :slot // 2] = float("-inf")
            kt, vc2 = kc.transpose(-1, -2).contiguous(), vc.clone()
            active = torch.randperm(rows, generator=g)[:max(1, rows - slot % 2)]  # every other slot drops one
            kc_a, vc_a = kc[active], vc[active]  # copies, which the reference writes into
            want = reference_step(qkv[active], cos_t, sin_t, pos[active], kc_a, vc_a, bias[active], slot, heads)
            got = _kernel_step(k, qkv[active], cos_t, sin_t, pos[active], active, kt, vc2, bias, slot, heads)
            kc[active], vc[active] = kc_a, vc_a
            if not (torch.equal(want, got) and torch.equal(kt.transpose(-1, -2), kc) and torch.equal(vc, vc2)):
                return False
    return True


_LIB: DecodeKernel | None = None
_LIB_ERROR: str | None = None
_CHECKED: dict[tuple[int, int, int, int], bool] = {}


def _library() -> DecodeKernel | None:
    global _LIB, _LIB_ERROR
    if _LIB is None and _LIB_ERROR is None:
        cc = _compiler()
        if cc is None:
            _LIB_ERROR = "no C compiler (cc, gcc or clang) on PATH"
        else:
            try:
                _LIB = DecodeKernel(_build(cc))
            except (OSError, RuntimeError) as e:
                _LIB_ERROR = str(e)
        if _LIB_ERROR:
            warnings.warn(f"phantom.lab: the C decode kernel is unavailable ({_LIB_ERROR}); sampling uses "
                          "torch's ops (the same numbers, slower)", RuntimeWarning, stacklevel=3)
    return _LIB


def kernel_for(heads: int, kv_heads: int, head_dim: int, context: int) -> DecodeKernel | None:
    """The kernel if ``$PHANTOM_DECODE`` allows it, it builds here, and it matches torch bit for bit on
    this shape (checked once per process and shape); else None (use torch's ops)."""
    if choice() == "torch" or head_dim % 8 or head_dim > 64 or heads > 64:
        return None
    lib = _library()
    if lib is None:
        return None
    key = (heads, kv_heads, head_dim, context)
    if key not in _CHECKED:
        _CHECKED[key] = matches_torch(lib, heads, kv_heads, head_dim, context)
        if not _CHECKED[key]:
            warnings.warn(f"phantom.lab: the C decode kernel does not reproduce torch {torch.__version__} bit for "
                          f"bit for heads={heads}, kv_heads={kv_heads}, head_dim={head_dim} on this machine; "
                          "sampling uses torch's ops", RuntimeWarning, stacklevel=2)
    return lib if _CHECKED[key] else None


def describe(heads: int, kv_heads: int, head_dim: int, context: int) -> str:
    """``c`` or ``torch``: which path sampling takes for this shape (recorded in run manifests)."""
    return "c" if kernel_for(heads, kv_heads, head_dim, context) is not None else "torch"


