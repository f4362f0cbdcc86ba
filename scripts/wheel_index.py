"""The PEP 503 index per variant (dumb-pypi writes it), and pip installing lltm from it."""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import html
import http.server
import json
import shutil
import sys
import sysconfig
import tempfile
import threading
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packaging.metadata import Metadata
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from wheel_gates import LABEL_RE
from wheel_hooks import SCRIPTS, command, log, require, run, tool
from wheel_matrix import load_matrix


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
    log(f"{out}: {len(files)} file(s)")


def variant_of(filename: str) -> str | None:
    """The variant a wheel's local label names (cpu, cu130), or None for a plain version."""
    local: str | None = "?"
    with contextlib.suppress(InvalidWheelFilename):
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
        log(f"{variant}/: {len(anchors)} wheel(s) of {len(releases)} release(s)")


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
    log(f"serving {directory} at {url}/")
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
    log(f"pip installed from {url}/{args.variant}/: {sorted(got.items())}")
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
    test = [python, SCRIPTS / "wheel_hooks.py", "test-installed"]
    if "+" in version:  # a plain (PyPI) version names no variant
        test += ["--expect-variant", args.variant.rstrip("/").rsplit("/", 1)[-1]]
    run([*test, *["--import-only"] * args.import_only, *["--expect-gpu"] * args.expect_gpu])


def add_commands(sub: Any) -> None:
    """The index commands."""
    p = command(sub, cmd_index, "a PEP 503 index per variant")
    p.add_argument("wheelhouse", nargs="?", help="labelled wheels, copied into the index")
    p.add_argument("--releases", help="GitHub's release list (gh api .../releases), JSON")
    p.add_argument("--out", required=True)
    p.add_argument("--expect-url", help="where it is published: must be the configured index-url")
    p = command(sub, cmd_simple_index, "a flat local PyPI")
    p.add_argument("directory")
    p = command(sub, cmd_metadata_files, "WHEEL.metadata beside each wheel (release assets)")
    p.add_argument("directory")
    p = command(sub, cmd_try_index, "serve the index, install lltm in a fresh venv, test it")
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
