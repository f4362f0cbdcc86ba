"""The gates on built wheels and sdists, PyPI's plain-version wheels, and the index per variant.

On `packaging`, `wheel unpack`/`pack` and dumb-pypi; the gates' tools are the caller's to install.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import functools
import hashlib
import html
import http.server
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator
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
    msg = f"--policy {override!r}: expected TORCH:PLATFORM=VARIANT,... (2.13:linux-x86_64=cpu)"
    require(match, msg)
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


def write_metadata_file(wheel: Path) -> bytes:
    """WHEEL.metadata beside the wheel: its METADATA, which pip reads before downloading."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA")))
    wheel.with_name(f"{wheel.name}.metadata").write_bytes(metadata)
    return metadata


def write_index(out: Path, files: list[Path]) -> None:
    """A PEP 503 index at ``out`` (out/<project>/index.html) of wheels and sdists in ``out``."""
    entries = []
    for path in files:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        entry = {"filename": path.name, "hash": f"sha256={digest}"}
        if path.suffix == ".whl":
            metadata = write_metadata_file(path)
            entry["core_metadata"] = f"sha256={hashlib.sha256(metadata).hexdigest()}"
            if requires := Metadata.from_email(metadata, validate=False).requires_python:
                entry["requires_python"] = str(requires)
        entries.append(json.dumps(entry) + "\n")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "files.json").write_text("".join(entries))
        options = ["--output-dir", f"{tmp}/site", "--packages-url", ".."]  # from out/<project>/
        run([*tool("dumb_pypi.main", "dumb-pypi"), "--package-list-json", f"{tmp}/files.json",
             *options, "--no-generate-timestamp"], capture_output=True)  # fmt: skip
        shutil.copytree(Path(tmp, "site", "simple"), out, dirs_exist_ok=True)
    hooks.log(f"{out}: {len(files)} file(s)")


def variant_of(filename: str) -> str | None:
    """The variant a wheel's local label names (cpu, cu130), or None for a plain version."""
    local: str | None = "?"
    with contextlib.suppress(ValueError):
        local = parse_wheel_filename(filename)[1].local
    label = LABEL_RE.fullmatch(local or "")
    require(
        label or local is None,
        f"{filename}: expected a +pt{{XY}}{{variant}} label or a plain version (did an upload "
        "rename it? GitHub once turned + into .)",
    )
    return label["variant"] if label else None


def write_release_index(out: Path, releases: list[dict[str, Any]]) -> None:
    """Per variant, a page linking every release's labelled wheels where GitHub serves them."""
    # Ours: dumb-pypi links all files under one base URL, GitHub each release's under its tag.
    links: dict[str, dict[str, str]] = {}
    for release in (r for r in releases if not r.get("draft")):
        assets = {asset["name"]: asset for asset in release.get("assets", [])}
        for name, asset in sorted(assets.items()):
            if not name.endswith(".whl") or (variant := variant_of(name)) is None:
                continue  # the plain version is PyPI's
            require(name not in links.setdefault(variant, {}), f"{name} is in two releases")
            digest = str(asset.get("digest") or "").replace("sha256:", "#sha256=")
            attrs = f'href="{html.escape(asset["browser_download_url"] + digest)}"'
            if metadata := str(assets.get(f"{name}.metadata", {}).get("digest") or ""):
                attrs += f' data-core-metadata="{metadata.replace("sha256:", "sha256=")}"'
            links[variant][name] = f"<a {attrs}>{html.escape(name)}</a><br>"
    page = "<!DOCTYPE html>\n<html><body>\n{}\n</body></html>\n"
    for variant, anchors in links.items():
        (out / variant / "lltm").mkdir(parents=True)
        (out / variant / "lltm" / "index.html").write_text(page.format("\n".join(anchors.values())))
        (out / variant / "index.html").write_text(page.format('<a href="lltm/">lltm</a>'))
        hooks.log(f"{variant}/: {len(anchors)} wheel(s) of {len(releases)} release(s)")


def cmd_index(args: argparse.Namespace) -> None:
    """A PEP 503 index per variant (OUT/cpu/): WHEELHOUSE's copied in, or every release's linked."""
    if args.expect_url is not None:  # host names compare in lowercase (Pages' is)
        configured, published = load_matrix().wheels.get("index-url", ""), args.expect_url
        urls = [urllib.parse.urlsplit(u.rstrip("/")) for u in (configured, published)]
        require(
            len({(u.scheme.lower(), u.netloc.lower(), u.path, u.query) for u in urls}) == 1,
            f"[tool.lltm.wheels] index-url is {configured!r}, but the index is published at "
            f"{published!r}: set index-url to it (docs/building.md's install lines use it)",
        )
    require((args.wheelhouse is None) != (args.releases is None), "give a WHEELHOUSE or --releases")
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    if args.releases is not None:
        # JSON documents one after another: a release each (--jq '.[]'), or a list each (pages).
        text, releases = Path(args.releases).read_text().strip(), []
        while text:
            value, end = json.JSONDecoder().raw_decode(text)
            releases += value if isinstance(value, list) else [value]
            text = text[end:].lstrip()
        write_release_index(out, releases)
    else:
        for wheel in sorted(Path(args.wheelhouse).glob("*.whl")):
            variant = variant_of(wheel.name) or ""
            require(variant, f"{wheel.name} has no +pt{{XY}}{{variant}} label: in no sub-index")
            (out / variant).mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheel, out / variant)
        for folder in out.glob("*"):
            write_index(folder, sorted(folder.glob("*.whl")))
    found = any(out.glob("*/lltm/index.html"))
    require(found, f"no labelled wheels to index in {args.wheelhouse or args.releases}")
    print(out)


def cmd_simple_index(args: argparse.Namespace) -> None:
    """A flat PEP 503 index of every wheel and sdist in DIR, linked in place: a local PyPI."""
    root = Path(args.directory).resolve()
    files = sorted(p for p in root.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    require(files, f"no wheels or sdists in {root}: expected the files of a local PyPI")
    write_index(root, files)


def cmd_metadata_files(args: argparse.Namespace) -> None:
    """Write WHEEL.metadata beside each wheel of the folder (for the release assets)."""
    for wheel in sorted(Path(args.directory).glob("*.whl")):
        write_metadata_file(wheel)


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) while the block runs; yield its URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    hooks.log(f"serving {directory} at {url}/")
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def cmd_try_index(args: argparse.Namespace) -> None:
    """Serve the index, pip install lltm from it into a fresh venv, and test that install."""
    index, venv = Path(args.index).resolve(), Path(args.venv).resolve()
    page = index / args.variant / "lltm" / "index.html"
    require(page.is_file(), f"{page} is missing: run `wheels.py index` (or simple-index) first")
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", *["--system-site-packages"] * args.system_site_packages,
         venv])  # fmt: skip
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    if args.system_site_packages and sys.prefix != sys.base_prefix:
        # This Python is a venv itself (the GPU machine's image): --system-site-packages
        # reaches its base, not it, so a .pth file adds its packages.
        code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        site = run([python, "-c", code], capture_output=True).stdout.strip()
        ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
        Path(site, "lltm-parent-site.pth").write_text("".join(f"{p}\n" for p in ours))
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if args.install:
        run([*pip, "install", "-q", *args.install])
    with serve(index) as url, tempfile.TemporaryDirectory() as tmp:
        # --isolated: no pip configuration or PIP_* variables: everything comes from this index.
        run([*pip, "--isolated", "install", "--no-cache-dir", "--index-url",
             f"{url}/{args.variant}/", "--report", f"{tmp}/report.json", args.spec])  # fmt: skip
        report = json.loads(Path(tmp, "report.json").read_text())
    got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    hooks.log(f"pip installed from {url}/{args.variant}/: {sorted(got.items())}")
    version = got.get("lltm", "")
    expected = {"lltm", "torch"} <= set(got) if args.no_torch else set(got) == {"lltm"}
    require(
        expected,
        f"pip install {args.spec} installed {sorted(got)}: expected lltm alone (the venv's torch "
        "must do), or with --no-torch lltm and torch (the index brings torch)",
    )
    require(
        args.expect_version in {None, version},
        f"pip install {args.spec} installed lltm {version}, expected {args.expect_version}",
    )
    if args.then_install:
        run([*pip, "install", "-q", *args.then_install])
    test = [python, hooks.SCRIPTS / "wheel_hooks.py", "test-installed"]
    if "+" in version:  # a plain (PyPI) version names no variant
        test += ["--expect-variant", args.variant.rstrip("/").rsplit("/", 1)[-1]]
    run([*test, *["--import-only"] * args.import_only, *["--expect-gpu"] * args.expect_gpu])


def add_commands(sub: Any) -> None:
    """The gates', PyPI wheels' and index's commands."""
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
    p = hooks.command(sub, cmd_index, "a PEP 503 index per variant")
    p.add_argument("wheelhouse", nargs="?", help="labelled wheels, copied into the index")
    p.add_argument("--releases", help="GitHub's release list (gh api .../releases), JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--expect-url", help="where it is published: must be the configured index-url")
    p = hooks.command(sub, cmd_simple_index, "a flat local PyPI")
    p.add_argument("directory")
    p = hooks.command(sub, cmd_metadata_files, "WHEEL.metadata beside each wheel (release assets)")
    p.add_argument("directory")
    p = hooks.command(sub, cmd_try_index, "serve the index, install lltm in a fresh venv, test it")
    p.add_argument("--index", required=True)
    p.add_argument("--variant", required=True, help="the index's folder under --index: cpu, ...")
    p.add_argument("--venv", required=True, help="made afresh (removed first if it exists)")
    p.add_argument("--install", nargs="*", default=[], help="what the venv gets first (torch)")
    p.add_argument("--no-torch", action="store_true", help="no torch: the index must bring it")
    p.add_argument("--spec", default="lltm", help="what to pip install: lltm==0.1.0+pt213cpu")
    p.add_argument("--expect-version", help="the lltm version pip must install")
    p.add_argument("--then-install", nargs="*", default=[], help="what the tests need")
    p.add_argument("--system-site-packages", action="store_true", help="reuse this Python's torch")
    p.add_argument("--import-only", action="store_true", help="checks, but not the test suite")
    p.add_argument("--expect-gpu", action="store_true", help="fail unless CUDA can run")
