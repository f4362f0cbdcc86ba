"""The README's examples run as written, and the docs' links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import lltm

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = [
    README,
    ROOT / "CONTRIBUTING.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

pytestmark = pytest.mark.skipif(not README.is_file(), reason="needs the checkout's README.md")

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.MULTILINE)


def blocks(path: Path, language: str) -> list[str]:
    return [m[2] for m in FENCE.finditer(path.read_text()) if m[1] == language]


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings."""
    text = FENCE.sub("", path.read_text())
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        slugs.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return slugs


def test_readme_python_blocks_run() -> None:
    """The API and sequence examples, in order, in one namespace: as a reader pastes them."""
    source = "\n".join(blocks(README, "python"))
    assert "lltm.LLTMLayer" in source
    assert "lltm_cpp.backward" in source
    namespace: dict[str, object] = {}
    exec(compile(source, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    output = namespace["output"]
    assert isinstance(output, torch.Tensor)
    assert output.shape == (64, 16, 128)


def test_readme_error_example_is_the_real_message() -> None:
    (shown,) = [line for b in blocks(README, "") for line in b.splitlines() if "Error:" in line]
    kind, _, message = shown.partition(": ")
    h = torch.zeros(16, 128)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - the README names the type
        lltm.lltm(torch.randn(16, 32), torch.randn(384, 161), torch.randn(1, 384), h, h)
    assert type(raised.value).__name__ == kind
    assert str(raised.value) == message


def test_readme_keeps_the_commands_ci_runs() -> None:
    commands = "\n".join(blocks(README, "bash"))
    # .ci/run runs this line as the README's test command.
    assert "python3 -m pip install nox && python3 -m nox -s tests\n" in commands
    assert "pip install --no-build-isolation . && python -m lltm.benchmark\n" in commands


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_exist(doc: Path) -> None:
    if not doc.is_file():
        pytest.skip(f"{doc.name} is not in this checkout")
    text = FENCE.sub("", doc.read_text())
    broken = []
    for match in LINK.finditer(text):
        target = match[1] or match[2]
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        if not path.exists() or (path.suffix == ".md" and anchor and anchor not in anchors(path)):
            broken.append(target)
    assert not broken, f"{doc.name}: broken links {broken}"
