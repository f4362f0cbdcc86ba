"""The wheel matrix of pyproject.toml: cibuildwheel's CPython x platform, lltm's torch x variant.

The standard library only (the workflows run it before installing anything), Python >= 3.11.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from wheel_hooks import ROOT, VARIANT_RE, command, log, require, run

PLANS = ("pr", "full")
# A CUDA job builds nvcc code for a dozen architectures, after a 3 GB torch; a
# CPU job takes minutes. A hung job fails at this bound, not GitHub's 6 hours.
TIMEOUT_MINUTES = {"cpu": 45, "cuda": 100}
# cibuildwheel's platform tags: by system, or on Windows by arch.
TAGS = {"linux": "manylinux_{}", "macos": "macosx_{}", "AMD64": "win_amd64", "ARM64": "win_arm64"}


@dataclass(frozen=True)
class Platform:
    """One cibuildwheel platform and arch (``linux-x86_64`` is its key), and what it builds."""

    key: str
    runner: str
    variants: tuple[str, ...]

    def identifier(self, python: str) -> str:
        """The cibuildwheel identifier of CPython ``python`` ("3.12") here."""
        name, arch = self.key.split("-")
        return f"cp{python.replace('.', '')}-{(TAGS.get(arch) or TAGS[name]).format(arch)}"


@dataclass(frozen=True)
class Matrix:
    """The wheel matrix: cibuildwheel's Python x platform, lltm's torch x variant."""

    pythons: tuple[str, ...]
    torch: tuple[str, ...]
    platforms: tuple[Platform, ...]
    wheels: dict[str, Any]  # [tool.lltm.wheels]: size-budget-mb, index-url, pypi, ...

    @property
    def newest_torch(self) -> str:
        """The torch minor of the PyPI wheels and of the pull-request builds."""
        return self.torch[-1]

    def _job(self, platform: Platform, python: str, torch: str, variant: str) -> dict[str, Any]:
        only, policy = platform.identifier(python), self.wheels.get("pypi", {})
        # This job also makes the plain-version wheel for PyPI (wheels.py pypi).
        pypi = torch == self.newest_torch and policy.get(platform.key) == variant
        return {
            "name": f"{only} torch {torch} {variant}" + (" (+PyPI)" if pypi else ""),
            "runner": platform.runner,
            "only": only,
            "torch": torch,
            "variant": variant,
            "artifact": f"wheel-{only}-pt{torch.replace('.', '')}{variant}",
            "pypi": pypi,
            "timeout": TIMEOUT_MINUTES["cpu" if variant == "cpu" else "cuda"],
        }

    def jobs(self, plan: str = "full") -> list[dict[str, Any]]:
        """The wheels workflow's jobs: every identifier x torch x variant, or the PR's subset."""
        require(plan in PLANS, f"plan {plan!r}: expected one of pr, full (LLTM_WHEEL_PLAN)")
        pr = self.wheels.get("pull-request", {})
        require(plan == "full" or pr, "pyproject.toml has no [tool.lltm.wheels.pull-request]")
        newest, gil = self.newest_torch, [p for p in self.pythons if not p.endswith("t")]
        jobs = []
        for p in self.platforms:
            if plan == "full":
                combos = [(py, t, v) for py in self.pythons for t in self.torch for v in p.variants]
            elif p.key == pr.get("platform", "linux-x86_64"):
                combos = [(py, newest, v) for py in pr["pythons"] for v in pr["variants"]]
            else:
                combos = [(gil[-1], newest, "cpu")]
            jobs += [self._job(p, *combo) for combo in combos]
        return jobs


def load_matrix(config: dict[str, Any] | None = None) -> Matrix:
    """Read and check the wheel matrix from pyproject.toml (or ``config``, its contents)."""
    if config is None:
        import tomllib  # noqa: PLC0415 - Python >= 3.11; a given config needs none

        config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tool = config["tool"]
    cibw, wheels = tool.get("cibuildwheel", {}), tool.get("lltm", {}).get("wheels")
    require(wheels, "pyproject.toml has no [tool.lltm.wheels] table (the torch x variant matrix)")
    # One CPython per entry, so that the matrix is explicit; cp314t-*: free-threaded, "3.14t".
    builds = [(b, re.fullmatch(r"cp3(\d+)(t?)-\*", b)) for b in cibw.get("build", [])]
    bad = [b for b, match in builds if match is None]
    require(builds and not bad, f"[tool.cibuildwheel] build {bad}: expected one CPython per entry")
    pythons = tuple(f"3.{match[1]}{match[2]}" for _, match in builds if match)
    variants, runners = wheels.get("variants", {}), wheels.get("runners", {})
    platforms = []
    for name in ("linux", "macos", "windows"):
        for arch in cibw.get(name, {}).get("archs", []):
            key = f"{name}-{arch}"
            require(
                key in variants and key in runners,
                f"[tool.cibuildwheel.{name}] archs has {arch!r}, but [tool.lltm.wheels] "
                f"variants or runners has no {key!r}",
            )
            require(
                all(map(VARIANT_RE.fullmatch, variants[key]))
                and (name == "linux" or variants[key] == ["cpu"]),
                f"[tool.lltm.wheels] variants {key!r} = {variants[key]}: expected 'cpu' and "
                "'cuNNN' entries, and only 'cpu' off Linux (no CUDA toolkit is set up there)",
            )
            platforms.append(Platform(key, runners[key], tuple(variants[key])))
    stray = sorted(set(variants) - {p.key for p in platforms})
    require(
        not stray, f"[tool.lltm.wheels] variants has {stray}, built by no [tool.cibuildwheel] archs"
    )
    torch = tuple(wheels.get("torch", []))
    ok = torch and all(re.fullmatch(r"\d+\.\d+", t) for t in torch)
    require(ok, f"[tool.lltm.wheels] torch = {list(torch)}: expected minor releases like '2.14'")
    by_key, pypi = {p.key: p.variants for p in platforms}, wheels.get("pypi", {})
    for key, variant in pypi.items():
        require(
            variant in by_key.get(key, ()),
            f"[tool.lltm.wheels.pypi] {key} = {variant!r}: expected a platform of the matrix "
            f"and one of its variants ({list(by_key.get(key, ()))})",
        )
    missing = sorted(set(by_key) - set(pypi)) if pypi else []
    require(not missing, f"[tool.lltm.wheels.pypi] has no variant for {missing}: one per platform")
    if (pr := wheels.get("pull-request")) is not None:
        main = pr.get("platform", "linux-x86_64")
        pr_pythons, pr_variants = pr.get("pythons", []), pr.get("variants", [])
        require(
            main in by_key and pr_pythons and pr_variants,
            f"[tool.lltm.wheels.pull-request]: platform {main!r}, pythons {pr_pythons}, variants "
            f"{pr_variants}: expected a platform of the matrix and non-empty lists",
        )
        stray = sorted(set(pr_pythons) - set(pythons) | set(pr_variants) - set(by_key[main]))
        require(not stray, f"[tool.lltm.wheels.pull-request] has {stray}, outside the full matrix")
    return Matrix(pythons, torch, tuple(platforms), wheels)


def format_job(job: dict[str, Any]) -> str:
    """One readable line per job."""
    line = f"{job['runner']:18} {job['only']:26} torch {job['torch']:5} {job['variant']:6} "
    return line + f"{job['timeout']:3} min" + (" +PyPI" if job["pypi"] else "")


def cmd_matrix(args: argparse.Namespace) -> None:
    """Print the jobs of --plan, else $LLTM_WHEEL_PLAN (set per event), else full."""
    matrix = load_matrix()
    jobs = matrix.jobs(args.plan or os.environ.get("LLTM_WHEEL_PLAN") or "full")
    if args.pythons:
        print(json.dumps(list(matrix.pythons)))
    elif args.github:
        print(json.dumps({"include": jobs}, separators=(",", ":")))
    else:
        print("\n".join(map(format_job, jobs)))


def cmd_plan(_args: argparse.Namespace) -> None:
    """Print both plans, the pull-request subset and the full matrix, job by job, with counts."""
    events = ["pull requests that touch the build (path filters in wheels.yml)",
              "version tags, the weekly schedule, a manual run"]  # fmt: skip
    for plan, event in zip(PLANS, events, strict=True):
        jobs = load_matrix().jobs(plan)
        cuda, pypi = sum(j["variant"] != "cpu" for j in jobs), sum(j["pypi"] for j in jobs)
        print(f"== {plan}: {len(jobs)} jobs ({cuda} CUDA, {len(jobs) - cuda} CPU; {pypi} also "
              f"make a PyPI wheel), for {event}")  # fmt: skip
        print("\n".join(f"  {format_job(job)}" for job in jobs))


def cmd_check_identifiers(_args: argparse.Namespace) -> None:
    """Check, per platform, that cibuildwheel selects exactly the intended builds."""
    matrix = load_matrix()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CIBW_")}
    failures = []
    for p in matrix.platforms:
        options = ["--platform", *p.key.replace("-", " --archs ").split(), ROOT]
        cmd = ["cibuildwheel", "--print-build-identifiers", *options]
        actual = sorted(run(cmd, capture_output=True, env=env).stdout.split())
        expected = sorted(p.identifier(python) for python in matrix.pythons)
        print(f"{p.key}: {' '.join(actual)}")
        if actual != expected:
            failures.append(
                f"{p.key}: cibuildwheel selects {actual}, the matrix intends {expected}: "
                "fix [tool.cibuildwheel] build/skip, or cibuildwheel's version"
            )
    require(not failures, "\n".join(failures))
    log(f"cibuildwheel selects exactly the intended {len(matrix.jobs())}-job full matrix")


def add_commands(sub: Any) -> None:
    """The matrix commands."""
    p = command(sub, cmd_matrix, "the wheel jobs of a plan")
    p.add_argument("--github", action="store_true", help="as a GitHub Actions matrix (JSON)")
    p.add_argument("--pythons", action="store_true", help="only the Python versions (JSON)")
    p.add_argument("--plan", choices=PLANS, help="default: $LLTM_WHEEL_PLAN, else full")
    command(sub, cmd_plan, "both plans (pull request, full), job counts")
    command(sub, cmd_check_identifiers, "cibuildwheel selects exactly the intended builds")
