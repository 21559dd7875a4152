"""requirements/lock.txt is closed under dependencies: every package a pinned package requires
(on this platform and Python, with the extras something asks for) is pinned too, at a version
that satisfies the requirement. The image installs the lock with dependencies resolved, from a
wheelhouse made of the lock's pins alone, onto a virtualenv seeded with an old setuptools; a pin
missing from the lock (such as setuptools, which `pip freeze` leaves out and grpcio-tools needs)
breaks that build, twenty minutes in. This finds it in a second, from the installed
distributions' metadata (make test installs the lock first).

Also runnable on another lock file: ``python tests/test_lock.py LOCK`` prints what is unmet."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

REPO = pathlib.Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "lock.txt"
SOURCE_BUILDS = REPO / "requirements" / "source-builds.txt"
PYPROJECT = REPO / "pyproject.toml"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


@dataclass(frozen=True)
class Pin:
    name: str  # as the file spells it
    version: Version
    source: str  # the file and line, for messages


def read_pins(*paths: pathlib.Path) -> dict[NormalizedName, Pin]:
    """The ``name==version`` lines of requirement files, by PEP 503 name; anything else is refused."""
    pins: dict[NormalizedName, Pin] = {}
    for path in paths:
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            match = PIN.match(line)
            if match is None:
                raise ValueError(f"{path.name}:{number}: not a name==version pin: {raw!r}")
            name = canonicalize_name(match.group(1))
            if name in pins:
                raise ValueError(f"{path.name}:{number}: {match.group(1)} is pinned twice (also {pins[name].source})")
            pins[name] = Pin(match.group(1), Version(match.group(2)), f"{path.name}:{number}")
    return pins


def project_requirements(pyproject: pathlib.Path) -> list[Requirement]:
    """What the project asks for: its dependencies, every optional group (make setup installs
    them all from the lock) and its build requirements (the image builds it without isolation,
    with the lock's setuptools)."""
    data = tomllib.loads(pyproject.read_text())
    texts = list(data["project"]["dependencies"]) + list(data["build-system"]["requires"])
    for group in data["project"].get("optional-dependencies", {}).values():
        texts += group
    return [Requirement(text) for text in texts]


def applies(requirement: Requirement, extras: Iterable[str]) -> bool:
    """Whether a requirement holds here (this platform and Python) for one of the requested extras."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras))


def unmet_requirements(
    lock: pathlib.Path = LOCK, source_builds: pathlib.Path = SOURCE_BUILDS, pyproject: pathlib.Path = PYPROJECT
) -> list[str]:
    """One line per requirement the pins of ``lock`` and ``source_builds`` leave unmet, read from
    the installed distributions of those pins; empty when the lock is closed."""
    pins = read_pins(lock, source_builds)
    problems: list[str] = []

    def check(requirer: str, requirement: Requirement) -> None:
        name = canonicalize_name(requirement.name)
        pin = pins.get(name)
        if pin is None:
            problems.append(f"{requirer} requires {requirement}, and {lock.name} pins no {requirement.name}")
        elif not requirement.specifier.contains(pin.version, prereleases=True):
            problems.append(f"{requirer} requires {requirement}, and {pin.source} pins {pin.name}=={pin.version}")

    # Extras asked for, by package: the project's, then whatever a checked requirement asks for,
    # until nothing new is asked (an extra can pull in a requirement that asks for another extra).
    requested: dict[NormalizedName, set[str]] = {}
    for requirement in project_requirements(pyproject):
        if applies(requirement, ()):
            check("pyproject.toml", requirement)
            requested.setdefault(canonicalize_name(requirement.name), set()).update(requirement.extras)
    requires: dict[NormalizedName, list[Requirement]] = {}
    for name, pin in pins.items():
        try:
            installed = importlib.metadata.distribution(pin.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{pin.source}: {pin.name} is not installed in {sys.prefix}: run make setup")
            continue
        if Version(installed.version) != pin.version:
            problems.append(f"{pin.source}: {pin.name}=={pin.version}, but {installed.version} is installed: run make setup")
            continue
        requires[name] = [Requirement(text) for text in installed.requires or []]
    checked: set[tuple[NormalizedName, str]] = set()
    pending = True
    while pending:
        pending = False
        for name, requirements in requires.items():
            for extra in ("", *sorted(requested.get(name, set()))):
                if (name, extra) in checked:
                    continue
                checked.add((name, extra))
                pending = True
                requirer = f"{pins[name].name}=={pins[name].version}" + (f"[{extra}]" if extra else "")
                for requirement in requirements:
                    if requirement.marker is not None and not requirement.marker.evaluate({"extra": extra}):
                        continue
                    check(requirer, requirement)
                    requested.setdefault(canonicalize_name(requirement.name), set()).update(requirement.extras)
    return sorted(set(problems))


def test_the_lock_is_closed_under_dependencies():
    assert unmet_requirements() == []


def test_a_lock_without_a_dependency_fails(tmp_path):
    """The check can fail: the lock as it was before setuptools was pinned (grpcio-tools needs
    setuptools>=77.0.1, the project builds with setuptools>=68), and a pin at a version a
    requirement excludes."""
    lines = LOCK.read_text().splitlines()
    assert any(line.startswith("setuptools==") for line in lines), "the lock pins setuptools"
    without = tmp_path / "lock.txt"
    without.write_text("\n".join(line for line in lines if not line.startswith("setuptools==")) + "\n")
    problems = unmet_requirements(without)
    grpcio_tools = next(line for line in lines if line.startswith("grpcio-tools=="))
    assert f"{grpcio_tools} requires setuptools>=77.0.1, and lock.txt pins no setuptools" in problems
    assert "pyproject.toml requires setuptools>=68, and lock.txt pins no setuptools" in problems
    assert all("setuptools" in problem for problem in problems), problems

    # A pin at a version the requirement excludes.
    downgraded = tmp_path / "downgraded.txt"
    downgraded.write_text(LOCK.read_text().replace("\nsetuptools==84.2.1\n", "\nsetuptools==76.0.0\n"))
    number = lines.index("setuptools==84.2.1") + 1
    expected = f"{grpcio_tools} requires setuptools>=77.0.1, and downgraded.txt:{number} pins setuptools==76.0.0"
    assert expected in unmet_requirements(downgraded)


def test_the_project_and_the_source_builds_count(tmp_path):
    """pyproject.toml's dependencies must be pinned at their own versions, and the source builds'
    requirements (torch-sparse needs scipy) must be met by the lock."""
    lock = LOCK.read_text()
    assert "\nkfp==2.17.0\n" in lock and "\nscipy==" in lock
    other = tmp_path / "lock.txt"
    other.write_text(re.sub(r"(?m)^scipy==.*\n", "", lock.replace("\nkfp==2.17.0\n", "\nkfp==2.16.0\n")))
    problems = unmet_requirements(other)
    assert "pyproject.toml requires kfp==2.17.0, and lock.txt:" in " ".join(problems)
    assert any(p.startswith("torch-sparse==0.6.18 requires scipy") and p.endswith("pins no scipy") for p in problems), problems


def test_pins_are_normalized_and_refuse_other_lines(tmp_path):
    """PEP 503 names (the lock spells PyYAML, Requires-Dist pyyaml); a name pinned twice or a
    range is refused by line."""
    lock = tmp_path / "lock.txt"
    lock.write_text("# a comment\nPyYAML==6.0.3\nzope.interface==7.0\n")
    assert set(read_pins(lock)) == {"pyyaml", "zope-interface"}
    lock.write_text("pyyaml==6.0.3\nPyYAML==6.0.3\n")
    with pytest.raises(ValueError, match=re.escape("lock.txt:2: PyYAML is pinned twice (also lock.txt:1)")):
        read_pins(lock)
    lock.write_text("requests>=2\n")
    with pytest.raises(ValueError, match=re.escape("lock.txt:1: not a name==version pin: 'requests>=2'")):
        read_pins(lock)


if __name__ == "__main__":
    unmet = unmet_requirements(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else LOCK)
    print("\n".join(unmet) or "closed: every requirement is pinned")
    sys.exit(1 if unmet else 0)
