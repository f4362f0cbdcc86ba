"""The gates on built wheels and sdists, and PyPI's plain-version wheels made from labelled ones.

On `packaging`, `wheel unpack` and `wheel pack`; the gates' tools are the caller's to install.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import wheel_hooks as hooks
from check_cuda_build import cuda_archs_in, missing_archs
from packaging.errors import ExceptionGroup
from packaging.metadata import Metadata
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from wheel_hooks import WheelError, require, run, tool
from wheel_matrix import Matrix, load_matrix

LABEL_RE = re.compile(r"pt(?P<torch>\d+)(?P<variant>cpu|cu\d{3})")
MODULE_RE = re.compile(r"lltm/_C\.[^/]+")
BINARY_RE = re.compile(r".*(\.so(\.\d.*)?|\.pyd|\.dylib|\.dll)")
# A platform tag's matrix key: Windows' by name, the others' by system and arch.
WINDOWS_KEYS = {"win_amd64": "windows-AMD64", "win_arm64": "windows-ARM64"}
ARCHS = ("x86_64", "aarch64", "arm64")
Policy = tuple[str, dict[str, str]]  # PyPI's: the newest torch minor, the variant per platform
Gate = tuple[bool, str]  # passed, and what it found


def torch_minor(version: object) -> str:
    """``2.14`` of ``2.14.1+cu130``; empty where ``version`` is not a version."""
    with contextlib.suppress(InvalidVersion):
        return ".".join(map(str, Version(str(version)).release[:2]))
    return ""


def platform_key(tags: frozenset[Tag]) -> str | None:
    """``linux-x86_64``, ``macos-arm64``, ``windows-AMD64``: the matrix key of a wheel's tags."""
    for platform in sorted({tag.platform for tag in tags}):
        system = "linux" if "linux" in platform else "macos" if "macosx" in platform else ""
        arch = next((a for a in ARCHS if platform.endswith(f"_{a}")), None)
        if key := WINDOWS_KEYS.get(platform) or (system and arch and f"{system}-{arch}"):
            return key
    return None


class WheelInfo(NamedTuple):
    """What a wheel says about itself: its name, METADATA and lltm/_build_info.py."""

    version: Version
    tags: frozenset[Tag]
    metadata: Metadata
    build_info: dict[str, Any]  # VERSION, TORCH_VERSION, CUDA_VERSION, CUDA_ARCHS, ...
    names: list[str]

    @property
    def variant(self) -> str:
        """``cpu`` or ``cuNNN``: the local label's, or for a plain version the build's."""
        if label := LABEL_RE.fullmatch(self.version.local or ""):
            return label["variant"]
        cuda = self.build_info.get("CUDA_VERSION")
        return f"cu{str(cuda).replace('.', '')}" if cuda else "cpu"


def read_wheel(path: Path) -> WheelInfo:
    """Read the name, METADATA and lltm/_build_info.py of a wheel."""
    _, version, _, tags = parse_wheel_filename(path.name)
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        metadata = [n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        require(len(metadata) == 1, f"{path.name}: expected one .dist-info/METADATA: {metadata}")
        try:
            meta = Metadata.from_email(archive.read(metadata[0]))
        except ExceptionGroup as exc:
            msg = f"{path.name}: {metadata[0]}: {'; '.join(map(str, exc.exceptions))}"
            raise WheelError(msg) from None
        source = archive.read("lltm/_build_info.py") if "lltm/_build_info.py" in names else b""
    require(meta.version == version, f"{path.name}: METADATA says version {meta.version}")
    build_info: dict[str, Any] = {}  # literals; VERSION is `"full" or "plain"`
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            values = node.value.values if isinstance(node.value, ast.BoolOp) else [node.value]
            with contextlib.suppress(ValueError):
                literals = [ast.literal_eval(v) for v in values]
                build_info[getattr(target, "id", "")] = next(filter(None, literals), literals[-1])
    return WheelInfo(version, tags, meta, build_info, names)


def gate_label(wheel: WheelInfo, expect_variant: str | None, policy: Policy | None) -> Gate:
    """The label, the torch pin and the build agree; a plain version is the PyPI ``policy``'s."""
    info, version, variant = wheel.build_info, wheel.version, wheel.variant
    torch, cuda = str(info.get("TORCH_VERSION", "")), info.get("CUDA_VERSION")
    minor, label = torch_minor(torch), LABEL_RE.fullmatch(version.local or "")
    if version.local and not label:
        return False, f"version {version}: no +pt{{XY}}cpu/cu{{NNN}}"
    problems = []
    if label is None and policy is None:
        problems.append(f"version {version}: a plain version, but no PyPI policy to check it by")
    elif label is None:
        key, (newest, pypi) = platform_key(wheel.tags) or "", policy
        if minor != newest:
            problems.append(f"a PyPI wheel built against torch {minor}, not the newest, {newest}")
        if pypi.get(key) != variant:
            problems.append(f"a PyPI wheel for {key} in the {variant} variant, but "
                            f"[tool.lltm.wheels.pypi] says {pypi.get(key)!r}")  # fmt: skip
    elif label["torch"] != minor.replace(".", ""):
        problems.append(f"label pt{label['torch']} but built against torch {torch}")
    requires = wheel.metadata.requires_dist or []
    pins = [str(r) for r in requires if canonicalize_name(r.name) == "torch"]
    if pins != [f"torch=={minor}.*"]:
        problems.append(f"Requires-Dist {pins}, expected ['torch=={minor}.*']")
    if (torch_local := Version(torch).local if minor else None) not in {None, variant}:
        problems.append(f"label says {variant}, torch {torch} is {torch_local}")
    if (variant == "cpu") == bool(cuda) or (cuda and not info.get("CUDA_ARCHS")):
        problems.append(f"a {variant} wheel built with CUDA {cuda} for {info.get('CUDA_ARCHS')} "
                        "(CUDA kernels need LLTM_CUDA=1 and nvcc)")  # fmt: skip
    if info.get("VERSION") != str(version):
        problems.append(f"_build_info.VERSION {info.get('VERSION')!r} != {version}")
    if expect_variant not in {None, variant}:
        problems.append(f"expected the {expect_variant} variant, got {variant}")
    name = version.local or f"plain {version} (PyPI), {variant}"
    found = f"{name}: torch {torch}, Requires-Dist torch=={minor}.*, CUDA {cuda}"
    return not problems, "; ".join(problems) or found


def gate_contents(wheel: WheelInfo) -> Gate:
    """One compiled module, lltm/_C, and no other library (in lltm.libs/, .dylibs/)."""
    binaries = [n for n in wheel.names if BINARY_RE.fullmatch(n)]
    modules = [n for n in binaries if MODULE_RE.fullmatch(n)]
    others = sorted(set(binaries) - set(modules))
    torch_cuda = [n for n in others if hooks.is_excluded_lib(n)]
    problems = [f"expected one lltm/_C module, found {modules}"] * (len(modules) != 1)
    problems += [f"libraries bundled: {others} (torch/CUDA: {torch_cuda})"] * bool(others)
    return not problems, "; ".join(problems) or f"only {modules[0]}"


def gate_auditwheel(path: Path, wheel: WheelInfo, expect_plat: str | None) -> Gate:
    """The platform tag is the one the manylinux policy allows; only torch/CUDA stay external."""
    auditwheel = [*tool("auditwheel", "auditwheel"), "show", "--json", path]
    shown = json.loads(run(auditwheel, capture_output=True).stdout)
    tags, sym_tag = sorted({tag.platform for tag in wheel.tags}), shown["sym_tag"]
    external = sorted(shown.get("external_libs", {}))
    problems = []
    if sym_tag not in tags or not all(t.startswith("manylinux_") for t in tags):
        problems.append(f"tags {tags}, but auditwheel says its symbols allow {sym_tag}")
    if expect_plat is not None and not any(fnmatch.fnmatch(t, expect_plat) for t in tags):
        problems.append(f"expected the platform tag {expect_plat}")
    if stray := [lib for lib in external if not hooks.is_excluded_lib(lib)]:
        problems.append(f"external libraries that are not torch's or CUDA's: {stray}")
    found = f"{sym_tag} (symbols), external only torch/CUDA: {', '.join(external)}"
    return not problems, "; ".join(problems) or found


def gate_cuda_archs(path: Path, wheel: WheelInfo) -> Gate:
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
    found = f"claims {' '.join(claimed)}; has sm_{' sm_'.join(sorted(elf))}, PTX {sorted(ptx)}"
    return not failures and bool(claimed), "; ".join(failures) or found


def check_file(
    path: Path, args: argparse.Namespace, matrix: Matrix, policy: Policy | None
) -> list[tuple[str, str, str]]:
    """Each gate that applies to ``path``: (gate, ok/FAIL/skip, detail); none stops the others."""
    results = []

    def gate(name: str, check: Callable[[], Gate]) -> None:
        try:
            ok, detail = (None, f"--skip {name}") if name in args.skip else check()
        except (WheelError, subprocess.SubprocessError) as exc:  # a tool's complaint, or none
            ok, detail = False, str(exc)
        results.append((name, {None: "skip", True: "ok", False: "FAIL"}[ok], detail))

    def passes(module: str, command: str, *options: str | Path) -> Gate:
        return bool(run([*tool(module, command), *options, path], capture_output=True)), "passed"

    if path.name.endswith(".tar.gz"):  # the sdist, for PyPI
        version = parse_sdist_filename(path.name)[1]
        gate("version", lambda: (not version.local, f"{version} (PyPI refuses local labels)"))
        gate("twine", lambda: passes("twine", "twine", "check", "--strict"))
        return results
    try:
        wheel = read_wheel(path)
    except (ValueError, WheelError, zipfile.BadZipFile) as exc:
        return [("read", "FAIL", str(exc))]
    if args.expect_pypi:
        gate("pypi", lambda: (not wheel.version.local, f"{wheel.version}: PyPI refuses labels"))
    gate("label", lambda: gate_label(wheel, args.expect_variant, policy))
    gate("contents", lambda: gate_contents(wheel))
    kind = "cpu" if wheel.variant == "cpu" else "cuda"
    budget, size = matrix.wheels.get("size-budget-mb", {}).get(kind), path.stat().st_size / 1e6
    found = f"{size:.3f} MB, budget {kind} < {budget} MB ([tool.lltm.wheels] size-budget-mb)"
    gate("size", lambda: (budget is not None and size < budget, found))
    gate("twine", lambda: passes("twine", "twine", "check", "--strict"))
    contents = ("check_wheel_contents", "check-wheel-contents", "--config", hooks.PYPROJECT)
    gate("check-wheel-contents", lambda: passes(*contents))
    if any("linux" in tag.platform for tag in wheel.tags):
        gate("auditwheel", lambda: gate_auditwheel(path, wheel, args.expect_plat))
    if wheel.variant != "cpu":
        gate("cuda-archs", lambda: gate_cuda_archs(path, wheel))
    return results


def cmd_check(args: argparse.Namespace) -> None:
    """The gates, on each wheel and sdist given."""
    require(args.dists, "no wheels or sdists to check: give their paths")
    matrix = load_matrix()
    policy = pypi_policy(matrix, args.policy)
    failed = []
    for path in map(Path, args.dists):
        results = check_file(path, args, matrix, policy)
        print(path.name)
        print("\n".join(f"  {status:4} {gate:20} {detail}" for gate, status, detail in results))
        failed += [path.name] * any(status == "FAIL" for _, status, _ in results)
    require(not failed, f"{len(failed)} of {len(args.dists)} failed the gates: {', '.join(failed)}")
    hooks.log(f"all {len(args.dists)} passed the gates")


def relabel(wheel: Path, out: Path, version: str) -> Path:
    """The same wheel (the tested binary) under another version, into ``out``."""
    new, wheel_cli = Version(version), tool("wheel", "wheel")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        run([*wheel_cli, "unpack", "--dest", f"{tmp}/tree", wheel], capture_output=True)
        (tree,) = Path(tmp, "tree").iterdir()
        (dist_info,) = tree.glob("*.dist-info")
        # wheel pack reads the public version here, and writes METADATA, RECORD and the name.
        dist_info.rename(tree / f"{dist_info.name.split('-')[0]}-{new.public}.dist-info")
        build_info = tree / "lltm" / "_build_info.py"
        text = re.sub(r"(?m)^VERSION = .*$", f'VERSION = "{new}"', build_info.read_text(), count=1)
        build_info.write_text(text)
        pack = ["pack", "--dest-dir", tmp, "--local-version", new.local or "", tree]
        run([*wheel_cli, *pack], capture_output=True)
        (built,) = Path(tmp).glob("*.whl")
        target = Path(shutil.move(built, out / built.name))
    hooks.log(f"{wheel.name} -> {target.name}")
    return target


def cmd_relabel(args: argparse.Namespace) -> None:
    """Write the wheel under --version into --out (the local proof's second release)."""
    print(relabel(Path(args.wheel), Path(args.out), args.version))


def pypi_policy(matrix: Matrix, override: str | None) -> Policy:
    """The newest torch and [tool.lltm.wheels.pypi], or --policy's (for a local proof)."""
    if override is None:
        return matrix.newest_torch, dict(matrix.wheels.get("pypi", {}))
    match = re.fullmatch(r"(\d+\.\d+):((?:[\w-]+=\w+,?)+)", override)
    if match is None:
        msg = f"--policy {override!r}: expected TORCH:PLATFORM=VARIANT,... (2.13:linux-x86_64=cpu)"
        raise WheelError(msg)
    return match[1], dict(item.split("=") for item in match[2].strip(",").split(","))


def cmd_pypi(args: argparse.Namespace) -> None:
    """Write the plain-version PyPI wheel of each labelled one in the policy's variant."""
    newest, variants = pypi_policy(load_matrix(), args.policy)
    made = []
    for path in map(Path, args.wheels):
        info = read_wheel(path)
        minor = torch_minor(info.build_info.get("TORCH_VERSION"))
        key = platform_key(info.tags) or ""
        if info.version.local and (variants.get(key), minor) == (info.variant, newest):
            made.append(relabel(path, Path(args.out), info.version.public))
        else:
            hooks.log(f"{path.name}: not PyPI's ({key} {info.variant} torch {minor}; PyPI gets "
                      f"{variants.get(key)} torch {newest})")  # fmt: skip
    require(made or not args.expect, f"none of {args.wheels} is PyPI's ([tool.lltm.wheels.pypi])")
    print("\n".join(map(str, made)))


def add_commands(sub: Any) -> None:
    """The gates' and PyPI wheels' commands."""
    p = hooks.command(sub, cmd_check, "the gates, on wheels and sdists")
    p.add_argument("dists", nargs="*", help="wheels and sdists")
    p.add_argument("--expect-variant", help="cpu or cuNNN: every wheel must be this variant")
    p.add_argument("--expect-plat", help="the platform tag (a glob) Linux wheels must carry")
    p.add_argument("--expect-pypi", action="store_true", help="every wheel must be a PyPI one")
    p.add_argument("--policy", help="TORCH:PLATFORM=VARIANT,...: PyPI's, for a local proof")
    gates = ["twine", "check-wheel-contents", "auditwheel", "cuda-archs"]
    p.add_argument("--skip", action="append", default=[], choices=gates, help="a gate not to run")
    p = hooks.command(sub, cmd_pypi, "PyPI's plain-version wheels")
    p.add_argument("wheels", nargs="+", help="labelled wheels; PyPI's are relabelled")
    p.add_argument("--out", required=True)
    p.add_argument("--expect", action="store_true", help="fail unless one is PyPI's")
    p.add_argument("--policy", help="TORCH:PLATFORM=VARIANT,... instead of pyproject.toml's")
    p = hooks.command(sub, cmd_relabel, "a wheel under another version")
    p.add_argument("wheel")
    p.add_argument("--version", required=True)
    p.add_argument("--out", required=True)
