"""How the sequence ops choose a path, and the choices' cache on disk.

Each kind of block of steps (device, dtype, training or inference, threads,
sizes in buckets) gets one path per process, chosen at its first block:

1. ``LLTM_SEQUENCE_PATH`` where set: that path of the block's device
   (:func:`lltm.sequence_paths`), or an error saying why it cannot run it;
2. else a choice kept from an earlier process (this module's cache);
3. else the fastest path measured on a block of these sizes
   (``LLTM_TUNING=1``, the default; CUDA times with events on the current
   stream) or, with ``LLTM_TUNING=0``, the one a cost model fitted to
   measurements expects to be fastest (the CPU) or the first path of the
   table whose rules (its window of sizes) take the block (CUDA);
4. inside a CUDA graph's capture, where nothing can be timed, a kept choice,
   else the rules for that block (``source`` ``"capture"``): the next block of
   the kind outside a capture measures.

Measured choices are kept in ``$LLTM_CACHE_DIR`` (default
``~/.cache/lltm``; empty: not kept), one file per machine, lltm version and
torch version, written when the process exits. Writers replace the file
whole, so processes running at once never see half of one.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import json
import os
import platform
import tempfile
import warnings
from pathlib import Path
from typing import TypedDict

import torch

# Set on the package before this module's import (lltm/__init__.py).
from . import _C

__all__ = ["PathChoice", "cache_file", "clear_path_choices", "path_choices"]

_FORMAT = 1


class PathChoice(TypedDict):
    """One kind of block and its path, or one GEMM around the blocks and its library.

    ``key`` names the kind (``cpu|Float|inference|threads=2|T=64|B=16|F=32|S=128``,
    ``cuda|Half|backward|gpu=NVIDIA H200|T=512|B=64|F=32|S=256``: steps past
    32 on the CPU, 128 on CUDA, and batches share the power of two at or above
    them); ``path`` is the
    path, ``plan`` the plan of the kind's last block (``"fused/held"``).
    A ``gemm`` key (``cpu|Float|gemm|threads=2|M=32768|K=30|N=180``, M in
    the same buckets) is the CPU's input projection or ``d_input``, [M, K]
    times [K, N] over every step's rows; its ``path`` is the library that
    runs it, ``aten`` (``torch.mm``: MKL in torch's x86 wheels) or ``onednn``.
    For both,
    ``source`` is ``"measured"``, ``"model"``, ``"rules"``, ``"capture"`` (the
    rules, inside a CUDA graph's capture) or ``"cache"`` (from disk);
    ``times_us`` the microseconds each candidate took (or the model's
    estimate) for a block of that kind.
    """

    key: str
    path: str
    plan: str
    source: str
    times_us: list[tuple[str, float]]


def path_choices() -> list[PathChoice]:
    """The paths chosen so far in this process, with why (``PathChoice``)."""
    return [
        PathChoice(
            key=c["key"],
            path=c["path"],
            plan=c["plan"],
            source=c["source"],
            times_us=list(c["times_us"]),
        )
        for c in _C._path_choices()
    ]


def clear_path_choices() -> None:
    """Forget every choice of this process: the next block of each kind chooses again."""
    _C._clear_path_choices()


@functools.cache
def _machine() -> str:
    """The processor's model and logical CPUs: a choice measured on one is not another's."""
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model} x{os.cpu_count()}"


def cache_file() -> Path | None:
    """The file that keeps this machine's choices, or None where ``LLTM_CACHE_DIR`` is empty."""
    from . import __version__  # noqa: PLC0415

    root = os.environ.get("LLTM_CACHE_DIR")
    if root == "":
        return None
    directory = Path(root) if root is not None else Path.home() / ".cache" / "lltm"
    identity = json.dumps([_FORMAT, _machine(), __version__, str(torch.__version__)])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return directory / f"paths-{digest}.json"


def _read(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, dict):
        return {}
    return {k: v for k, v in choices.items() if isinstance(k, str) and isinstance(v, str)}


def load() -> None:
    """Keep the choices of the cache file (lltm's import calls this)."""
    path = cache_file()
    if path is not None and path.exists():
        _C._load_path_choices(sorted(_read(path).items()))


def save() -> None:
    """Add this process's measured choices to the cache file (at exit)."""
    path = cache_file()
    if path is None:
        return
    measured = {c["key"]: c["path"] for c in _C._path_choices() if c["source"] == "measured"}
    if not measured:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        choices = {**_read(path), **measured}
        with tempfile.NamedTemporaryFile(
            "w", dir=path.parent, prefix=path.name, suffix=".tmp", delete=False
        ) as f:
            json.dump({"format": _FORMAT, "choices": choices}, f, indent=0, sort_keys=True)
        Path(f.name).replace(path)
    except OSError as e:
        warnings.warn(
            f"lltm: could not keep the sequence paths' choices in {path}: {e}", stacklevel=1
        )


def _install() -> None:
    load()
    atexit.register(save)
