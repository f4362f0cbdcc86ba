"""The PEP 503 index per variant, written by dumb-pypi, and pip installing lltm from it.

dumb-pypi writes the pages: #sha256= links, PEP 658 metadata, Requires-Python.
The index of every GitHub release links each asset where its release serves
it; try-index serves an index on 127.0.0.1 and installs lltm from it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import html
import http.server
import json
import os
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
from wheel_hooks import SCRIPTS, WheelError, log, run, tool
from wheel_matrix import load_matrix


def sha256(data: bytes) -> str:
    """The SHA-256 of ``data``, hex."""
    return hashlib.sha256(data).hexdigest()


def write_metadata_file(wheel: Path) -> bytes:
    """WHEEL.metadata beside the wheel: its METADATA, which pip reads before downloading."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name)
    wheel.with_name(f"{wheel.name}.metadata").write_bytes(metadata)
    return metadata


def local_entry(path: Path) -> dict[str, str]:
    """dumb-pypi's entry for a wheel or sdist on disk: its hashes and what it needs."""
    entry = {"filename": path.name, "hash": f"sha256={sha256(path.read_bytes())}"}
    if path.suffix == ".whl":
        metadata = write_metadata_file(path)
        entry["core_metadata"] = f"sha256={sha256(metadata)}"
        requires_python = Metadata.from_email(metadata, validate=False).requires_python
        entry |= {"requires_python": str(requires_python)} if requires_python else {}
    return entry


def write_index(out: Path, entries: list[dict[str, str]]) -> None:
    """A PEP 503 index at ``out`` (out/<project>/index.html) of files that lie in ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "packages.json"
        listing.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
        site = Path(tmp) / "site"
        dumb_pypi = [*tool("dumb_pypi.main", "dumb-pypi"), "--package-list-json", listing]
        options = ["--output-dir", site, "--packages-url", ".."]  # from out/<project>/
        run([*dumb_pypi, *options, "--no-generate-timestamp"], capture_output=True)
        shutil.copytree(site / "simple", out, dirs_exist_ok=True)


def cmd_simple_index(args: argparse.Namespace) -> None:
    """A flat PEP 503 index of every wheel and sdist in DIR, linked in place: a local PyPI."""
    root = Path(args.directory).resolve()
    files = sorted(p for p in root.iterdir() if p.name.endswith((".whl", ".tar.gz")))
    if not files:
        msg = f"no wheels or sdists in {root}: expected the files of a local PyPI"
        raise WheelError(msg)
    write_index(root, [local_entry(path) for path in files])
    log(f"{root}: {len(files)} file(s)")


def cmd_metadata_files(args: argparse.Namespace) -> None:
    """Write WHEEL.metadata beside each wheel of the folder (for the release assets)."""
    for wheel in sorted(Path(args.directory).glob("*.whl")):
        write_metadata_file(wheel)
    log(f"metadata files written in {args.directory}")


def variant_of(filename: str) -> str | None:
    """The variant a wheel's local label names (cpu, cu130), or None for a plain version."""
    try:
        local = parse_wheel_filename(filename)[1].local
    except InvalidWheelFilename:
        local = "?"
    if (label := LABEL_RE.fullmatch(local or "")) is None and local is not None:
        msg = (
            f"{filename}: expected a +pt{{XY}}{{variant}} label or a plain version "
            "(did an upload rename it? GitHub once turned + into .)"
        )
        raise WheelError(msg)
    return label["variant"] if label else None


def read_releases(path: Path) -> list[dict[str, Any]]:
    """GitHub's releases: `gh api --paginate .../releases --jq '.[]'` (one per line), or a list."""
    values = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for value in values for r in (value if isinstance(value, list) else [value])]


def write_release_index(out: Path, releases: list[dict[str, Any]]) -> None:
    """Per variant, a page linking each labelled wheel of every release where GitHub serves it.

    Written here: dumb-pypi links all files under one --packages-url, and
    release assets lie under one URL per tag.
    """
    links: dict[str, dict[str, str]] = {}
    for release in (r for r in releases if not r.get("draft")):
        assets = {asset["name"]: asset for asset in release.get("assets", [])}
        for name, asset in sorted(assets.items()):
            if not name.endswith(".whl") or (variant := variant_of(name)) is None:
                continue  # the plain version is PyPI's
            if name in links.setdefault(variant, {}):
                msg = f"{name} is in two releases: expected each file once"
                raise WheelError(msg)
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


def write_wheelhouse_index(out: Path, wheelhouse: Path) -> None:
    """Per variant, the wheels of a local folder, copied into OUT/<variant>/ and indexed there."""
    by_variant: dict[str, list[Path]] = {}
    for wheel in sorted(wheelhouse.glob("*.whl")):
        if (variant := variant_of(wheel.name)) is None:
            msg = f"{wheel.name} has no +pt{{XY}}{{variant}} label: it belongs in no sub-index"
            raise WheelError(msg)
        (out / variant).mkdir(parents=True, exist_ok=True)
        by_variant.setdefault(variant, []).append(Path(shutil.copy2(wheel, out / variant)))
    for variant, wheels in by_variant.items():
        write_index(out / variant, [local_entry(wheel) for wheel in wheels])
        log(f"{variant}/: {len(wheels)} wheel(s)")


def release_manifest(root: Path, base_url: str) -> list[dict[str, Any]]:
    """GitHub's release list, for releases laid out as ROOT/<tag>/<assets> (the local proof)."""
    return [
        {
            "tag_name": folder.name,
            "assets": [
                {
                    "name": asset.name,
                    "browser_download_url": f"{base_url.rstrip('/')}/{folder.name}/{asset.name}",
                    "digest": f"sha256:{sha256(asset.read_bytes())}",
                }
                for asset in sorted(folder.iterdir())
                if asset.is_file()
            ],
        }
        for folder in sorted(p for p in root.iterdir() if p.is_dir())
    ]


def cmd_release_manifest(args: argparse.Namespace) -> None:
    """Print GitHub's release list (JSON) for local release folders ROOT/<tag>/."""
    print(json.dumps(release_manifest(Path(args.root), args.base_url), indent=1))


def check_index_url(configured: str, published: str) -> None:
    """The configured index-url is where the index is published (host names in lowercase)."""

    def lower_host(url: str) -> str:
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        return parts._replace(scheme=parts.scheme.lower(), netloc=parts.netloc.lower()).geturl()

    if lower_host(configured) != lower_host(published):
        msg = (
            f"[tool.lltm.wheels] index-url is {configured!r}, but this index is published "
            f"at {published!r}: set index-url to it (the install lines of docs/building.md use it)"
        )
        raise WheelError(msg)


def cmd_index(args: argparse.Namespace) -> None:
    """Write a PEP 503 index per variant, like PyTorch's: OUT/cpu/, OUT/cu130/, ...

    Of the wheels of WHEELHOUSE (copied into the index: the local proof), or of
    every release in --releases (linked where GitHub serves them: the publish
    workflow, so that the index keeps every version). OUT/cu130/ is the
    --index-url, OUT/cu130/lltm/ the project page.
    """
    if args.expect_url is not None:
        check_index_url(load_matrix().index_url, args.expect_url)
    if (args.wheelhouse is None) == (args.releases is None):
        msg = "give a WHEELHOUSE or --releases RELEASES.json (one of the two)"
        raise WheelError(msg)
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    if args.releases is not None:
        write_release_index(out, read_releases(Path(args.releases)))
    else:
        write_wheelhouse_index(out, Path(args.wheelhouse))
    if not any(out.glob("*/lltm/index.html")):
        msg = f"no labelled wheels to index in {args.wheelhouse or args.releases}"
        raise WheelError(msg)
    print(out)


# --- serving and installing from the index ---------------------------------------------


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) while the block runs; yield its URL."""

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            log(f"index: {fmt % args}")

    handler = functools.partial(Handler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    log(f"serving {directory} at {url}/")
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


def installed_version(python: Path, distribution: str) -> str | None:
    """The version of ``distribution`` in ``python``'s environment, or None."""
    code = (
        "import importlib.metadata as m, sys\n"
        "try: print(m.version(sys.argv[1]))\n"
        "except m.PackageNotFoundError: print('')"
    )
    return run([python, "-c", code, distribution], capture_output=True).stdout.strip() or None


def make_venv(venv: Path, *, system_site_packages: bool) -> Path:
    """A fresh venv (this Python's packages seen with ``system_site_packages``); its python."""
    shutil.rmtree(venv, ignore_errors=True)
    run([sys.executable, "-m", "venv", *(["--system-site-packages"] * system_site_packages), venv])
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if system_site_packages and sys.prefix != sys.base_prefix:
        # This Python is a venv itself (as on the GPU machine's image), whose
        # packages --system-site-packages does not reach: a .pth file adds them.
        site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   capture_output=True).stdout.strip()  # fmt: skip
        ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
        (Path(site) / "lltm-parent-site.pth").write_text("".join(f"{p}\n" for p in ours))
    return python


def check_install(args: argparse.Namespace, report: dict[str, Any], url: str) -> str:
    """What pip installed from the index (its --report) is what try-index asked for; the version."""
    installed = {i["metadata"]["name"].lower(): i for i in report["install"]}
    log(f"pip installed: {sorted((n, i['metadata']['version']) for n, i in installed.items())}")
    if "lltm" not in installed or (not args.no_torch and len(installed) != 1):
        msg = f"pip install {args.spec} from {url}/{args.variant}/ installed {sorted(installed)}: expected lltm alone"
        raise WheelError(msg)
    if strays := [f"{n} from {i['download_info']['url']}" for n, i in installed.items()
                  if not i["download_info"]["url"].startswith(url)]:  # fmt: skip
        msg = f"installed from outside the index {url}/: {strays}"
        raise WheelError(msg)
    version = installed["lltm"]["metadata"]["version"]
    if args.expect_version and version != args.expect_version:
        msg = f"pip install {args.spec} installed lltm {version}, expected {args.expect_version}"
        raise WheelError(msg)
    if args.no_torch and "torch" not in installed:
        msg = f"pip install {args.spec} into a venv without torch did not install torch"
        raise WheelError(msg)
    log(f"lltm {version} from {installed['lltm']['download_info']['url']}")
    return version


def cmd_try_index(args: argparse.Namespace) -> None:
    """Serve the index, pip install lltm from it into a fresh venv, and test that install.

    The venv holds torch (--install, --system-site-packages) and pip must leave
    it alone; or, with --no-torch, it holds none, as on a clean machine, and pip
    must bring torch from the same index: the PyPI layout.
    """
    index = Path(args.index).resolve()
    if not (page := index / args.variant / "lltm" / "index.html").is_file():
        msg = f"{page} is missing: run `wheels.py index` (or simple-index) first"
        raise WheelError(msg)
    python = make_venv(Path(args.venv).resolve(), system_site_packages=args.system_site_packages)
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    if args.install:
        run([*pip, "install", "-q", *args.install])
    torch_before = installed_version(python, "torch")
    if args.no_torch == (torch_before is not None):
        msg = (
            f"--no-torch is {args.no_torch}, and the venv has torch {torch_before}: give "
            "--install 'torch==X.Y.Z' or --system-site-packages, or --no-torch and no torch"
        )
        raise WheelError(msg)
    with serve(index) as url, tempfile.TemporaryDirectory() as tmp:
        # --isolated: no pip configuration or PIP_* variables, so lltm (and, with
        # --no-torch, torch and its dependencies) can only come from this index.
        report = Path(tmp) / "report.json"
        run([*pip, "--isolated", "install", "--no-cache-dir", "--index-url",
             f"{url}/{args.variant}/", "--report", report, args.spec])  # fmt: skip
        version = check_install(args, json.loads(report.read_text()), url)
    torch_after = installed_version(python, "torch")
    if not args.no_torch and torch_after != torch_before:
        msg = f"installing lltm changed torch from {torch_before} to {torch_after}"
        raise WheelError(msg)
    log(f"torch {torch_after}" + (" from the same index" if args.no_torch else " unchanged"))
    if args.then_install:
        run([*pip, "install", "-q", *args.then_install])
    test = [python, SCRIPTS / "wheel_hooks.py", "test-installed"]
    if "+" in version:  # a plain (PyPI) version names no variant
        test += ["--expect-variant", args.variant.rstrip("/").rsplit("/", 1)[-1]]
    test += ["--import-only"] * args.import_only + ["--expect-gpu"] * args.expect_gpu
    run([*test, *(["--", *args.pytest_args] if args.pytest_args else [])])
