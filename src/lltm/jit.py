"""The tutorial's JIT flavor: build lltm's C++/CUDA sources on first use.

:func:`load` compiles the same ``cpp/`` and ``cuda/`` files as the CMake
build (shipped in the wheel under ``lltm/_csrc``) with
:func:`torch.utils.cpp_extension.load`, and returns a module with the same
``forward`` and ``backward`` as ``lltm._C``. torch caches the build: a second
load with unchanged sources and flags only loads the library.

It is what ``import lltm`` uses when ``LLTM_BACKEND=jit``, and, with the
default ``LLTM_BACKEND=auto``, when the prebuilt module was built for another
torch than the one installed. As ``import lltm`` runs the build, its options
come from the environment there: ``LLTM_JIT_VERBOSE=1`` shows the build
steps, ``LLTM_JIT_CUDA=0|1`` overrides the CUDA default, and torch's
``TORCH_EXTENSIONS_DIR`` moves the build directory. A later call of
:func:`load` returns the module already loaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

__all__ = [
    "JitUnavailableError",
    "load",
    "source_dir",
    "sources",
]

_lock = threading.Lock()
_loaded: ModuleType | None = None
# How _loaded was built: build_directory, with_cuda, library, cuda_archs.
_loaded_info: dict[str, Any] = {}


class JitUnavailableError(RuntimeError):
    """The JIT build cannot run here: no compiler, no ninja or no sources."""


def source_dir() -> Path:
    """Where the sources are: ``lltm/_csrc`` in an install, the checkout otherwise."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_csrc", here.parents[1]):
        if (candidate / "sources.txt").is_file():
            return candidate
    msg = f"lltm's C++ sources are not installed (looked in {here / '_csrc'})"
    raise JitUnavailableError(msg)


def sources(group: str, root: Path | None = None) -> tuple[str, ...]:
    """The files of one group of ``sources.txt`` (``module``, ``cpu_kernels`` or ``cuda``).

    The list CMakeLists.txt compiles and installs, relative to the source directory.
    """
    lines = ((root or source_dir()) / "sources.txt").read_text().splitlines()
    listed = (line.split() for line in lines if line.strip() and not line.startswith("#"))
    return tuple(path for name, path in listed if name == group)


def _staged(root: Path, files: tuple[str, ...], folder: Path) -> list[str]:
    """``files`` copied into ``folder`` under names that hold their folders.

    torch.utils.cpp_extension names each object after its source's base name,
    and lltm's sources share base names across folders (a file per path on
    each device). A copy is rewritten only when it changed, so that ninja
    rebuilds only what changed; every include is spelled from ``root``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    staged = []
    for name in files:
        source = (root / name).read_bytes()
        copy = folder / name.replace("/", "__")
        if not copy.is_file() or copy.read_bytes() != source:
            copy.write_bytes(source)
        staged.append(str(copy))
    return staged


def _cuda_compiler_found() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME  # noqa: PLC0415 - import is slow

    return CUDA_HOME is not None and Path(CUDA_HOME, "bin", "nvcc").exists()


def _check_toolchain(with_cuda: bool) -> None:
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        msg = f"no C++ compiler: {compiler!r} (from $CXX, default c++) is not on PATH"
        raise JitUnavailableError(msg)
    if shutil.which("ninja") is None:
        msg = "ninja is not installed (pip install ninja)"
        raise JitUnavailableError(msg)
    if with_cuda and not _cuda_compiler_found():
        msg = "no CUDA compiler: set CUDA_HOME to a CUDA toolkit with bin/nvcc"
        raise JitUnavailableError(msg)


def load(
    verbose: bool = False,
    build_directory: str | os.PathLike[str] | None = None,
    with_cuda: bool | None = None,
) -> ModuleType:
    """Build (or load from torch's cache) lltm's extension for the installed torch.

    Args:
        verbose: show the build steps.
        build_directory: where to build; default: torch's extension cache,
            ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``.
        with_cuda: build the CUDA kernels too; default: when CUDA is available
            and a CUDA compiler is found.

    Returns:
        The module, with ``forward`` and ``backward`` as in ``lltm._C``.

    Raises:
        JitUnavailableError: no compiler, no ninja, or no sources.
        RuntimeError: another build of lltm is already loaded in this process
            (the prebuilt module, or a JIT build of another directory or
            variant): the ``lltm`` operators can be registered only once.
    """
    global _loaded  # noqa: PLW0603 - one registration of the ops per process
    with _lock:
        if _loaded is not None:
            loaded = (_loaded_info["build_directory"], _loaded_info["with_cuda"])
            requested = (
                loaded[0] if build_directory is None else str(build_directory),
                loaded[1] if with_cuda is None else with_cuda,
            )
            if requested != loaded:
                msg = (
                    f"lltm.jit.load{requested}: lltm is already loaded in this process "
                    f"from a JIT build {loaded}, and its operators can be registered "
                    "only once. Set LLTM_JIT_CUDA or TORCH_EXTENSIONS_DIR before importing "
                    "lltm instead."
                )
                raise RuntimeError(msg)
            return _loaded
        if "lltm._C" in sys.modules:
            msg = (
                "lltm.jit.load(): the prebuilt lltm._C is already loaded, and the lltm "
                "operators can be registered only once per process. Set LLTM_BACKEND=jit "
                "before importing lltm to use the JIT build instead."
            )
            raise RuntimeError(msg)
        if with_cuda is None:
            with_cuda = torch.cuda.is_available() and _cuda_compiler_found()
        _check_toolchain(with_cuda)
        root = source_dir()
        files = sources("module", root) + sources("cpu_kernels", root)
        if with_cuda:
            files += sources("cuda", root)

        from torch.utils import cpp_extension  # noqa: PLC0415 - import is slow

        if build_directory is not None:
            Path(build_directory).mkdir(parents=True, exist_ok=True)
        # Separate cache entries for the two variants.
        name = "lltm_jit_cuda" if with_cuda else "lltm_jit"
        openmp, openmp_lib = _openmp_flags()
        with _log_to_stderr(cpp_extension.logger if verbose else None):
            kernels, kernel_defines = _cpu_kernel_objects(root, build_directory)
            folder = _build_root(build_directory) / f"{name}_sources"
            module = cpp_extension.load(
                name=name,
                sources=_staged(root, files, folder),
                extra_include_paths=[str(root)],
                extra_cflags=["-O3", *openmp, *kernel_defines],
                extra_ldflags=[*openmp_lib, *kernels],
                extra_cuda_cflags=["-O3", "-lineinfo"],
                with_cuda=with_cuda,
                build_directory=None if build_directory is None else str(build_directory),
                verbose=verbose,
            )
        _loaded_info.update(
            {
                "build_directory": None if build_directory is None else str(build_directory),
                "with_cuda": with_cuda,
                "library": module.__file__,
                "cuda_archs": _arch_list() if with_cuda else [],
            }
        )
        _loaded = module
        return module


def _openmp_flags() -> tuple[list[str], list[str]]:
    """OpenMP for at::parallel_for, with torch's own runtime, as CMakeLists.txt does.

    at::parallel_for runs its loop in parallel only in code compiled with
    OpenMP; linking the libgomp that torch ships keeps one runtime.
    """
    libgomp = Path(torch.__file__).parent / "lib" / "libgomp.so.1"
    if sys.platform != "linux" or not libgomp.is_file():
        return [], []
    return ["-fopenmp"], [str(libgomp)]


def _cpu_kernel_objects(
    root: Path, build_directory: str | os.PathLike[str] | None
) -> tuple[list[str], list[str]]:
    """The CPU kernels of each capability besides DEFAULT, built as the CMake build does.

    Returns the objects, for the link, and the defines that tell
    cpp/cpu_kernels/dispatch.cpp which capabilities they hold: on x86-64 Linux, each
    capability of cpp/cpu_kernels/capabilities.txt compiled with its own flags, then
    objcopy keeps only its table global (cmake/LltmCpuKernels.cmake says
    why); elsewhere none. torch relinks the module when its link flags
    change, not when an object they name does, so the objects go in a folder
    named by a digest of their commands and sources.
    """
    objcopy = shutil.which("objcopy")
    if sys.platform != "linux" or platform.machine() != "x86_64" or objcopy is None:
        return [], []
    from torch.utils import cpp_extension  # noqa: PLC0415 - import is slow

    (source,) = (root / name for name in sources("cpu_kernels", root))
    # As torch.utils.cpp_extension compiles C++ on Linux, with hidden symbols
    # as in the CMake build.
    base = [cpp_extension.get_cxx_compiler(), "-fPIC", "-std=c++20", "-O3", "-fvisibility=hidden"]
    base += ["-I", str(root)]
    for include in cpp_extension.include_paths():
        base += ["-isystem", include]
    commands = {
        name: [*base, f"-DCPU_CAPABILITY={name}", f"-DCPU_CAPABILITY_{name}", *flags]
        for name, flags in _cpu_capabilities(root)
    }
    digest = hashlib.sha256(json.dumps([torch.__version__, commands]).encode())
    for path in [source, *sorted(root.glob("cpp/**/*.h")), *sorted(root.glob("cuda/common/*.h"))]:
        digest.update(path.read_bytes())
    folder = _build_root(build_directory) / "lltm_cpu_kernels" / digest.hexdigest()[:16]
    objects = {name: folder / f"{name.lower()}.o" for name in commands}
    todo = [name for name, path in objects.items() if not path.is_file()]
    if todo:
        folder.mkdir(parents=True, exist_ok=True)
        # Compiled side by side, each to a file of its own until it is done.
        steps = []
        for name in todo:
            partial = objects[name].with_suffix(f".{os.getpid()}.o")
            command = [*commands[name], "-c", str(source), "-o", str(partial)]
            cpp_extension.logger.info("lltm: %s", shlex.join(command))
            run = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            steps.append((name, partial, run))
        for name, partial, run in steps:
            output = run.communicate()[0]
            if run.returncode != 0:
                msg = f"Error building lltm's {name} CPU kernels: {shlex.join(run.args)}\n{output}"
                raise RuntimeError(msg)
            keep = f"--keep-global-symbol=lltm_cpu_kernels_{name}"
            subprocess.run([objcopy, keep, "--remove-section=.group", str(partial)], check=True)
            partial.replace(objects[name])
    return [str(path) for path in objects.values()], [f"-DLLTM_HAVE_{n}_KERNELS" for n in objects]


def _build_root(build_directory: str | os.PathLike[str] | None) -> Path:
    """``build_directory``, else where torch builds extensions."""
    if build_directory is not None:
        return Path(build_directory)
    from torch.utils import cpp_extension  # noqa: PLC0415 - import is slow

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root())


def _cpu_capabilities(root: Path) -> list[tuple[str, list[str]]]:
    """The capabilities of cpp/cpu_kernels/capabilities.txt, each with its compiler flags."""
    lines = (root / "cpp" / "cpu_kernels" / "capabilities.txt").read_text().splitlines()
    return [(w[0], w[1:]) for w in (line.split() for line in lines if line[:1].isupper())]


def load_from_environment() -> ModuleType:
    """:func:`load` with the options ``import lltm`` takes from the environment."""
    cuda = os.environ.get("LLTM_JIT_CUDA", "").strip()
    if cuda not in {"", "0", "1"}:
        msg = f"LLTM_JIT_CUDA={cuda!r}: expected 0 or 1 (or unset for the default)"
        raise JitUnavailableError(msg)
    return load(
        verbose=os.environ.get("LLTM_JIT_VERBOSE", "") not in {"", "0"},
        with_cuda=None if cuda == "" else cuda == "1",
    )


@contextlib.contextmanager
def _log_to_stderr(logger: logging.Logger | None) -> Iterator[None]:
    """Show a logger's INFO records on stderr for a while.

    torch.utils.cpp_extension reports the build steps (extensions root, ninja
    file, "Building extension module ...") through logging, which shows
    nothing by default.
    """
    if logger is None:
        yield
        return
    # torch usually has a handler on its loggers already; add one if not.
    handler = None if logger.hasHandlers() else logging.StreamHandler(sys.stderr)
    level = logger.level
    if handler is not None:
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        if handler is not None:
            logger.removeHandler(handler)
        logger.setLevel(level)


def _arch_list() -> list[str]:
    """The architectures torch.utils.cpp_extension built for."""
    from_env = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if from_env:
        return from_env.replace(";", " ").split()
    # Without the variable, cpp_extension builds for the visible GPUs.
    capabilities = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return [f"{major}.{minor}" for major, minor in sorted(capabilities)]


def loaded_info() -> dict[str, Any]:
    """How the JIT module of this process was built: {} when none was."""
    return dict(_loaded_info)
