"""The gates on built wheels and sdists, and PyPI's plain-version wheels made from labelled ones.

Wheel names, versions, requirements and METADATA are read with `packaging`; a
wheel changes version through `wheel unpack` and `wheel pack`. The tools the
gates run (auditwheel, twine, check-wheel-contents, cuobjdump) are the
caller's to install: nox's wheel sessions do.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import json
import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from check_cuda_build import cuda_archs_in, missing_archs
from packaging.errors import ExceptionGroup
from packaging.metadata import Metadata
from packaging.tags import Tag
from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version
from wheel_hooks import ROOT, WheelError, is_excluded_lib, log, run, tool
from wheel_matrix import Matrix, load_matrix

LABEL_RE = re.compile(r"pt(?P<torch>\d+)(?P<variant>cpu|cu\d{3})")
MODULE_RE = re.compile(r"lltm/_C\.[^/]+")
BINARY_RE = re.compile(r".*(\.so(\.\d.*)?|\.pyd|\.dylib|\.dll)")
# The matrix keys of wheel platform tags where the tag does not end with the arch.
WINDOWS_KEYS = {"win_amd64": "windows-AMD64", "win_arm64": "windows-ARM64", "win32": "windows-x86"}
ARCHS = ("x86_64", "aarch64", "arm64")
Policy = tuple[str, dict[str, str]]  # PyPI's: the newest torch minor, the variant per platform
Results = list[tuple[str, str, str]]  # (gate, ok / FAIL / skip, detail)


def torch_minor(version: object) -> str:
    """``2.14`` of ``2.14.1+cu130``; empty where ``version`` is not a version."""
    try:
        return ".".join(map(str, Version(str(version)).release[:2]))
    except InvalidVersion:
        return ""


def built_variant(info: dict[str, Any]) -> str:
    """Cpu or cuNNN, from a wheel's _build_info (for a plain-version wheel, which has no label)."""
    cuda = info.get("CUDA_VERSION")
    return f"cu{str(cuda).replace('.', '')}" if cuda else "cpu"


def read_build_info(source: str) -> dict[str, Any]:
    """The literals of lltm/_build_info.py, whose VERSION is ``"full" or "plain"``."""
    info: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            values = node.value.values if isinstance(node.value, ast.BoolOp) else [node.value]
            with contextlib.suppress(ValueError):
                literals = [ast.literal_eval(v) for v in values]
                info[getattr(target, "id", "")] = next((v for v in literals if v), literals[-1])
    return info


@dataclass(frozen=True)
class WheelInfo:
    """What a wheel says about itself: its name, METADATA and lltm/_build_info.py."""

    version: Version
    tags: frozenset[Tag]
    metadata: Metadata
    build_info: dict[str, Any]
    names: list[str]

    @property
    def label(self) -> re.Match[str] | None:
        """The local label, ``pt214`` and ``cu130``."""
        return LABEL_RE.fullmatch(self.version.local or "")

    @property
    def variant(self) -> str | None:
        """``cpu`` or ``cuNNN``: from the local label, or for a plain version from _build_info."""
        if self.version.local is None:
            return built_variant(self.build_info) if self.build_info else None
        return self.label["variant"] if self.label else None


def platform_key(tags: frozenset[Tag]) -> str | None:
    """``linux-x86_64``, ``macos-arm64``, ``windows-AMD64``: the matrix key of a wheel's tags."""
    for platform in sorted({tag.platform for tag in tags}):
        system = "linux" if "linux" in platform else "macos" if "macosx" in platform else ""
        arch = next((a for a in ARCHS if platform.endswith(f"_{a}")), None)
        if key := WINDOWS_KEYS.get(platform) or (system and arch and f"{system}-{arch}"):
            return key
    return None


def read_wheel(path: Path) -> WheelInfo:
    """Read the name, METADATA and lltm/_build_info.py of a wheel."""
    try:
        _, version, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        msg = f"{path.name}: {exc}"
        raise WheelError(msg) from None
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        metadata = [n for n in names if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(metadata) != 1:
            msg = f"{path.name}: expected one .dist-info/METADATA, found {metadata}"
            raise WheelError(msg)
        try:
            meta = Metadata.from_email(archive.read(metadata[0]))
        except ExceptionGroup as exc:
            msg = f"{path.name}: {metadata[0]}: {'; '.join(map(str, exc.exceptions))}"
            raise WheelError(msg) from None
        info = "lltm/_build_info.py"
        build_info = read_build_info(archive.read(info).decode()) if info in names else {}
    if meta.version != version:
        msg = f"{path.name}: METADATA says version {meta.version}"
        raise WheelError(msg)
    return WheelInfo(version, tags, meta, build_info, names)


def gate_metadata(
    results: Results, wheel: WheelInfo, expect_variant: str | None, policy: Policy | None = None
) -> None:
    """The label, the torch pin and the recorded build agree, and name the intended variant.

    A wheel with a plain version is a PyPI wheel: ``policy`` says which it must be.
    """
    info = wheel.build_info
    torch_version = str(info.get("TORCH_VERSION", ""))
    minor = torch_minor(torch_version)
    label, problems = wheel.label, []
    if label is None and wheel.version.local is not None:
        detail = f"version {wheel.version}: no +pt{{XY}}cpu/cu{{NNN}}"
        results.append(("label", "FAIL", detail))
        return
    variant = label["variant"] if label else built_variant(info)
    if label is None:  # a PyPI wheel, which must be the one [tool.lltm.wheels.pypi] names
        problems += pypi_problems(wheel, variant, minor, policy)
    elif label["torch"] != minor.replace(".", ""):
        problems.append(f"label pt{label['torch']} but built against torch {torch_version}")
    requires = wheel.metadata.requires_dist or []
    torch_pins = [str(r) for r in requires if canonicalize_name(r.name) == "torch"]
    if torch_pins != [f"torch=={minor}.*"]:
        problems.append(f"Requires-Dist {torch_pins}, expected ['torch=={minor}.*']")
    torch_local = Version(torch_version).local if minor else None
    if torch_local is not None and torch_local != variant:
        problems.append(f"label says {variant}, torch {torch_version} is {torch_local}")
    if variant == "cpu" and info.get("CUDA_VERSION") is not None:
        problems.append(f"a cpu wheel built with CUDA {info['CUDA_VERSION']}")
    if variant != "cpu" and not (info.get("CUDA_VERSION") and info.get("CUDA_ARCHS")):
        problems.append("a CUDA wheel without CUDA kernels (LLTM_CUDA was off, or no nvcc)")
    if info.get("VERSION") != str(wheel.version):
        problems.append(f"_build_info.VERSION {info.get('VERSION')!r} != {wheel.version}")
    if expect_variant is not None and variant != expect_variant:
        problems.append(f"expected the {expect_variant} variant, got {variant}")
    detail = "; ".join(problems) or (
        f"{wheel.version.local or f'plain {wheel.version} (PyPI), {variant}'}: torch "
        f"{torch_version}, Requires-Dist torch=={minor}.*, CUDA {info.get('CUDA_VERSION')}"
    )
    results.append(("label", "FAIL" if problems else "ok", detail))


def pypi_problems(wheel: WheelInfo, variant: str, minor: str, policy: Policy | None) -> list[str]:
    """Why a plain-version wheel is not the PyPI wheel of its platform, if it is not."""
    if policy is None:
        return [f"version {wheel.version}: a plain version, but no PyPI policy to check it against"]
    newest, variants = policy
    key = platform_key(wheel.tags) or ""
    problems = []
    if minor != newest:
        problems.append(f"a PyPI wheel built against torch {minor}, not the newest, {newest}")
    if variants.get(key) != variant:
        problems.append(
            f"a PyPI wheel for {key or sorted(map(str, wheel.tags))} in the {variant} variant, "
            f"but [tool.lltm.wheels.pypi] says {variants.get(key)!r}"
        )
    return problems


def gate_contents(results: Results, wheel: WheelInfo) -> None:
    """One compiled module, lltm/_C, and no other library: torch and CUDA stay outside."""
    binaries = [n for n in wheel.names if BINARY_RE.fullmatch(n)]
    modules = [n for n in binaries if MODULE_RE.fullmatch(n)]
    others = sorted(set(binaries) - set(modules))
    vendored = sorted(
        {n.split("/")[0] + "/" for n in wheel.names if n.split("/")[0].endswith(".libs")}
        | {n for n in wheel.names if "/.dylibs/" in n}
    )
    problems = []
    if len(modules) != 1:
        problems.append(f"expected one lltm/_C module, found {modules}")
    if others:
        torch_cuda = [n for n in others if is_excluded_lib(n)]
        problems.append(
            f"libraries bundled: {others}" + (f" (torch/CUDA: {torch_cuda})" if torch_cuda else "")
        )
    if vendored:
        problems.append(f"vendored library folders: {vendored}")
    detail = "; ".join(problems) or f"only {modules[0]}"
    results.append(("contents", "FAIL" if problems else "ok", detail))


def gate_size(results: Results, path: Path, wheel: WheelInfo, budgets: dict[str, float]) -> None:
    """The size budget of the wheel's kind: cpu or cuda."""
    kind = "cpu" if wheel.variant == "cpu" else "cuda"
    if (budget := budgets.get(kind)) is None:
        results.append(("size", "FAIL", f"[tool.lltm.wheels] size-budget-mb has no {kind!r}"))
        return
    size = path.stat().st_size / 1e6
    detail = f"{size:.3f} MB, budget {kind} < {budget} MB"
    results.append(("size", "ok" if size < budget else "FAIL", detail))


def gate_auditwheel(path: Path, wheel: WheelInfo, expect_plat: str | None) -> tuple[bool, str]:
    """The platform tag is the one the manylinux policy allows; only torch/CUDA stay external."""
    shown = json.loads(run([*tool("auditwheel", "auditwheel"), "show", "--json", path],
                           capture_output=True).stdout)  # fmt: skip
    tags = sorted({tag.platform for tag in wheel.tags})
    external = sorted(shown.get("external_libs", {}))
    problems = []
    if shown["sym_tag"] not in tags or not all(t.startswith("manylinux_") for t in tags):
        problems.append(f"tags {tags}, but auditwheel says its symbols allow {shown['sym_tag']}")
    if expect_plat is not None and not any(fnmatch.fnmatch(t, expect_plat) for t in tags):
        problems.append(f"expected the platform tag {expect_plat}")
    if stray := [lib for lib in external if not is_excluded_lib(lib)]:
        problems.append(f"external libraries that are not torch's or CUDA's: {stray}")
    ok = f"{shown['sym_tag']} (symbols), external only torch/CUDA: {', '.join(external)}"
    return not problems, "; ".join(problems) or ok


def gate_cuda_archs(path: Path, wheel: WheelInfo) -> tuple[bool, str]:
    """The module carries machine code (and PTX) for every architecture it claims."""
    claimed = list(wheel.build_info.get("CUDA_ARCHS", []))
    module = next((n for n in wheel.names if MODULE_RE.fullmatch(n)), None)
    if module is None:
        return False, "no lltm/_C module to inspect"
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(path) as archive:
        try:
            elf, ptx = cuda_archs_in(archive.extract(module, tmp))
        except SystemExit as exc:  # check_cuda_build's "cuobjdump not found"
            raise WheelError(str(exc)) from None
    failures = missing_archs(claimed, elf, ptx)
    ok = f"claims {' '.join(claimed)}; has sm_{' sm_'.join(sorted(elf))}, PTX {sorted(ptx)}"
    return not failures and bool(claimed), "; ".join(failures) or ok


def run_gate(results: Results, gate: str, skip: set[str], check: Any) -> None:
    """Run ``check()`` (-> (ok, detail)) unless skipped; a failing tool is the gate's failure."""
    if gate in skip:
        results.append((gate, "skip", f"--skip {gate}"))
        return
    try:
        ok, detail = check()
    except (WheelError, subprocess.SubprocessError) as exc:  # the tool's complaint, or no tool
        ok, detail = False, str(exc)
    results.append((gate, "ok" if ok else "FAIL", detail))


def check_file(
    path: Path, args: argparse.Namespace, budgets: dict[str, float], policy: Policy | None
) -> Results:
    """Run every gate that applies to ``path``; one gate's failure does not stop the others."""
    results: Results = []
    skip = set(args.skip)

    def passes(*cmd: str | Path) -> tuple[bool, str]:
        run(cmd, capture_output=True)
        return True, "passed"

    twine = [*tool("twine", "twine"), "check", "--strict", path]
    if path.name.endswith(".tar.gz"):  # the sdist, for PyPI
        try:
            version = parse_sdist_filename(path.name)[1]
        except InvalidSdistFilename as exc:
            return [("read", "FAIL", str(exc))]
        detail = f"{version} (PyPI refuses local labels)"
        results.append(("version", "FAIL" if version.local else "ok", detail))
        run_gate(results, "twine", skip, lambda: passes(*twine))
        return results
    try:
        wheel = read_wheel(path)
    except (WheelError, zipfile.BadZipFile) as exc:
        return [("read", "FAIL", str(exc))]
    if args.expect_pypi and wheel.version.local is not None:
        results.append(("pypi", "FAIL", f"{wheel.version}: PyPI refuses local labels"))
    gate_metadata(results, wheel, args.expect_variant, policy)
    gate_contents(results, wheel)
    gate_size(results, path, wheel, budgets)
    run_gate(results, "twine", skip, lambda: passes(*twine))
    contents = [*tool("check_wheel_contents", "check-wheel-contents"), "--config"]
    check = [*contents, ROOT / "pyproject.toml", path]
    run_gate(results, "check-wheel-contents", skip, lambda: passes(*check))
    if not any("linux" in tag.platform for tag in wheel.tags):
        results.append(("auditwheel", "skip", f"not a Linux wheel ({path.name})"))
    else:
        run_gate(
            results, "auditwheel", skip, lambda: gate_auditwheel(path, wheel, args.expect_plat)
        )
    if wheel.variant not in {None, "cpu"}:
        run_gate(results, "cuda-archs", skip, lambda: gate_cuda_archs(path, wheel))
    return results


def cmd_check(args: argparse.Namespace) -> None:
    """The gates, on each wheel and sdist given."""
    matrix = load_matrix()
    policy = pypi_policy(matrix, args.policy)
    if not args.dists:
        msg = "no wheels or sdists to check: give their paths"
        raise WheelError(msg)
    failed = []
    for path in map(Path, args.dists):
        results = check_file(path, args, matrix.size_budget_mb, policy)
        print(path.name)
        print("\n".join(f"  {status:4} {gate:20} {detail}" for gate, status, detail in results))
        if any(status == "FAIL" for _, status, _ in results):
            failed.append(path.name)
    if failed:
        msg = f"{len(failed)} of {len(args.dists)} failed the gates: {', '.join(failed)}"
        raise WheelError(msg)
    log(f"all {len(args.dists)} passed the gates")


# --- PyPI's plain-version wheels -------------------------------------------------------


def relabel(wheel: Path, out: Path, version: str) -> Path:
    """The same wheel under another version, into ``out``: for PyPI, the plain version.

    The compiled module is the very one built, repaired and tested under the
    label (as PyTorch strips +cpu from the wheels it puts on PyPI). `wheel pack`
    takes the public version from the .dist-info folder's name, sets the local
    label in it and in METADATA, and writes RECORD and the file name anew.
    """
    new = Version(version)
    wheel_cli = tool("wheel", "wheel")
    with tempfile.TemporaryDirectory() as tmp:
        run([*wheel_cli, "unpack", "--dest", tmp, wheel], capture_output=True)
        (tree,) = (p for p in Path(tmp).iterdir() if p.is_dir())
        (dist_info,) = tree.glob("*.dist-info")
        name = dist_info.name.split("-", 1)[0]
        dist_info.rename(tree / f"{name}-{new.public}.dist-info")
        build_info = tree / "lltm" / "_build_info.py"
        text = re.sub(r"(?m)^VERSION = .*$", f'VERSION = "{new}"', build_info.read_text(), count=1)
        build_info.write_text(text)
        packed = Path(tmp) / "packed"
        packed.mkdir()
        run([*wheel_cli, "pack", "--dest-dir", packed, "--local-version", new.local or "", tree],
            capture_output=True)  # fmt: skip
        (built,) = packed.glob("*.whl")
        target = Path(shutil.move(built, out / built.name))
    log(f"{wheel.name} -> {target.name}")
    return target


def plain_wheel(wheel: Path, out: Path) -> Path:
    """The PyPI wheel of a labelled one: the plain version (PyPI refuses local labels)."""
    version = read_wheel(wheel).version
    if version.local is None:
        msg = f"{wheel.name} has a plain version already: expected a labelled wheel"
        raise WheelError(msg)
    return relabel(wheel, out, version.public)


def pypi_policy(matrix: Matrix, override: str | None) -> Policy:
    """The newest torch and [tool.lltm.wheels.pypi]; or --policy TORCH:KEY=VARIANT,... instead.

    The override is for the local proof, whose machine has the CPU build of an
    older torch, not the CUDA build that PyPI's Linux x86_64 wheel is.
    """
    if override is None:
        return matrix.newest_torch, matrix.pypi
    match = re.fullmatch(r"(\d+\.\d+):((?:[\w-]+=\w+,?)+)", override)
    if match is None:
        msg = f"--policy {override!r}: expected TORCH:PLATFORM=VARIANT[,...], like 2.13:linux-x86_64=cpu"
        raise WheelError(msg)
    return match[1], dict(item.split("=") for item in match[2].strip(",").split(","))


def cmd_pypi(args: argparse.Namespace) -> None:
    """Of the wheels given, write the plain-version one of each that PyPI gets, into --out."""
    newest, variants = pypi_policy(load_matrix(), args.policy)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for path in map(Path, args.wheels):
        info = read_wheel(path)
        key, minor = (
            platform_key(info.tags) or "",
            torch_minor(info.build_info.get("TORCH_VERSION")),
        )
        if (variants.get(key), minor) == (info.variant, newest):
            made.append(plain_wheel(path, out))
        else:
            log(
                f"{path.name}: not PyPI's ({key} {info.variant} torch {minor}; PyPI gets "
                f"{variants.get(key)} torch {newest})"
            )
    if args.expect and not made:
        msg = f"none of {[Path(w).name for w in args.wheels]} is a PyPI wheel ([tool.lltm.wheels.pypi])"
        raise WheelError(msg)
    print("\n".join(map(str, made)))


def cmd_relabel(args: argparse.Namespace) -> None:
    """Write the wheel under --version into --out (the local proof's second release)."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(relabel(Path(args.wheel), Path(args.out), args.version))
