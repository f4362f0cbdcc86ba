"""The index per variant: pip finds, checks and downloads the wheels it links."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from wheel_scripts import load, make_wheel

hooks = load("wheel_hooks")
wi = load("wheel_release")
wheels = load("wheels")

CPU_INFO = 'VERSION = "0.1.0+pt213cpu"\nTORCH_VERSION = "2.13.0+cpu"\nCUDA_VERSION = None\n'


def pip_download(index_url: str, spec: str, dest: Path) -> list[str]:
    """What pip downloads of ``spec`` from the index: it checks each #sha256= and PEP 658 hash."""
    cmd = [sys.executable, "-m", "pip", "--isolated", "download", "--no-deps", "--no-cache-dir"]
    cmd += ["--only-binary=:all:", "--python-version", "3.12", "--platform"]
    cmd += ["manylinux_2_28_x86_64", "--index-url", index_url, "-d", str(dest), spec]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return sorted(p.name for p in dest.iterdir())


def test_index_per_variant(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    cu130 = make_wheel(house)
    make_wheel(house, "0.1.0+pt213cpu", "torch==2.13.*", CPU_INFO)
    out = tmp_path / "index"
    assert wheels.main(["index", str(house), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["cpu", "cu130"]
    page = (out / "cu130" / "lltm" / "index.html").read_text()
    digest = hashlib.sha256(cu130.read_bytes()).hexdigest()
    assert f'href="../{cu130.name}#sha256={digest}"' in page
    assert 'data-requires-python="&gt;=3.10"' in page
    assert "pt213cpu" not in page
    assert pip_download((out / "cu130").as_uri() + "/", "lltm", tmp_path / "dl") == [cu130.name]
    (house / "lltm-0.1.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert wheels.main(["index", str(house), "--out", str(out)]) == 1


def test_simple_index_of_a_local_pypi(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, "0.1.0", "torch==2.14.*")
    (tmp_path / "lltm-0.1.0.tar.gz").write_bytes(b"an sdist")
    assert wheels.main(["simple-index", str(tmp_path)]) == 0
    assert "lltm-0.1.0.tar.gz" in (tmp_path / "lltm" / "index.html").read_text()
    assert pip_download(tmp_path.as_uri() + "/", "lltm", tmp_path / "dl") == [wheel.name]


def _asset(
    tag: str, name: str, digest: str = "ab" * 32, base: str = "https://github.com/o/lltm"
) -> dict[str, str]:
    url = f"{base}/releases/download/{tag}/{name}"
    return {"name": name, "browser_download_url": url, "digest": f"sha256:{digest}"}


def test_index_of_every_release(tmp_path: Path) -> None:
    wheel = "lltm-{}-cp312-cp312-manylinux_2_28_x86_64.whl"
    releases: list[dict[str, Any]] = [
        {
            "tag_name": "v0.2.0",
            "assets": [
                _asset("v0.2.0", wheel.format("0.2.0+pt214cu130")),
                _asset("v0.2.0", wheel.format("0.2.0+pt214cu130") + ".metadata", "cd" * 32),
                _asset("v0.2.0", wheel.format("0.2.0")),  # PyPI's: not in the variant index
            ],
        },
        {"tag_name": "v0.1.0", "assets": [_asset("v0.1.0", wheel.format("0.1.0+pt214cu130"))]},
        {
            "tag_name": "v0.3.0",
            "draft": True,
            "assets": [_asset("v0.3.0", wheel.format("0.3.0+pt214cu130"))],
        },
    ]
    # gh api --paginate --jq '.[]': one release per line.
    listing = tmp_path / "releases.jsonl"
    listing.write_text("".join(json.dumps(r) + "\n" for r in releases))
    assert wheels.main(["index", "--releases", str(listing), "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "cu130" / "lltm" / "index.html").read_text()
    for version in ("0.1.0", "0.2.0"):
        url = f"https://github.com/o/lltm/releases/download/v{version}/" + wheel.format(
            f"{version}+pt214cu130"
        )
        assert f'href="{url}#sha256={"ab" * 32}"' in page
    assert f'data-core-metadata="sha256={"cd" * 32}"' in page
    assert "0.3.0" not in page  # a draft
    assert wheel.format("0.2.0") + "<" not in page
    assert sorted(p.name for p in (tmp_path / "site").iterdir()) == ["cu130"]
    assert 'href="lltm/"' in (tmp_path / "site" / "cu130" / "index.html").read_text()
    # A list per page (gh api --paginate without --jq), or indented releases, read the same.
    pages = json.dumps(releases[:2]) + json.dumps(releases[2:])
    for text in (pages, "\n".join(json.dumps(r, indent=1) for r in releases)):
        listing.write_text(text)
        out = tmp_path / "again"
        assert wheels.main(["index", "--releases", str(listing), "--out", str(out)]) == 0
        assert (out / "cu130" / "lltm" / "index.html").read_text() == page


def test_index_refuses_a_renamed_asset(tmp_path: Path) -> None:
    renamed = "lltm-0.1.0.pt214cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    listing = tmp_path / "releases.json"
    listing.write_text(json.dumps([{"tag_name": "v0.1.0", "assets": [_asset("v0.1.0", renamed)]}]))
    assert wheels.main(["index", "--releases", str(listing), "--out", str(tmp_path / "o")]) == 1


def test_two_local_releases_side_by_side(tmp_path: Path) -> None:
    """As `nox -s wheels_local` lays them out: ROOT/<tag>/, served; pip picks either version."""
    root = tmp_path / "releases" / "download"
    first = make_wheel(root / "v0.1.0")
    assert wheels.main(["relabel", str(first), "--version", "0.2.0+pt214cu130",
                           "--out", str(root / "v0.2.0")]) == 0  # fmt: skip
    for folder in ("v0.1.0", "v0.2.0"):
        assert wheels.main(["metadata-files", str(root / folder)]) == 0
    # GitHub's release list, of the assets as the server below serves them.
    releases = [
        {"tag_name": tag.name, "assets": [
            _asset(tag.name, a.name, hashlib.sha256(a.read_bytes()).hexdigest(), base="")
            for a in sorted(tag.iterdir())
        ]}
        for tag in sorted(root.iterdir())
    ]  # fmt: skip
    listing = tmp_path / "releases.json"
    listing.write_text(json.dumps(releases))
    assert wheels.main(["index", "--releases", str(listing), "--out", str(tmp_path / "whl")]) == 0
    with wi.serve(tmp_path) as url:
        index = f"{url}/whl/cu130/"
        assert pip_download(index, "lltm", tmp_path / "new") == [
            "lltm-0.2.0+pt214cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
        ]
        assert pip_download(index, "lltm==0.1.0+pt214cu130", tmp_path / "old") == [first.name]
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{url}/whl/cpu/", timeout=10)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="pyproject.toml: tomllib")
def test_index_url_hosts_compare_in_lowercase(tmp_path: Path) -> None:
    """The publish workflow checks that the configured index-url is where Pages serves it."""
    listing = tmp_path / "releases.json"
    wheel = "lltm-0.1.0+pt214cu130-cp312-cp312-manylinux_2_28_x86_64.whl"
    listing.write_text(json.dumps([{"tag_name": "v0.1.0", "assets": [_asset("v0.1.0", wheel)]}]))
    index = ["index", "--releases", str(listing), "--out", str(tmp_path / "o"), "--expect-url"]
    assert wheels.main([*index, "https://owner.github.io/lltm/whl/"]) == 0  # OWNER in pyproject
    for published in ("https://owner.github.io/LLTM/whl", "https://other.github.io/lltm/whl"):
        assert wheels.main([*index, published]) == 1
