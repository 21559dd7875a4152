#!/usr/bin/env bash
# Makes the wheelhouse of an offline image build: every wheel containers/Dockerfile installs,
# so that `--build-arg WHEELHOUSE=wheels` builds the image without reaching a package index
# (behind a firewall, or where the build's TLS trust differs from the host's).
#
#   containers/make_wheelhouse.sh [DIR]          # default DIR: wheels (in the repository root)
#   containers/make_wheelhouse.sh --check [DIR]  # only the final check, of a wheelhouse made before
#   docker build -f containers/Dockerfile --build-arg WHEELHOUSE=wheels -t IMAGE .
#
# Run it from the repository root, on a machine with the image's platform (x86_64, glibc no
# newer than the base image's: Debian bookworm's 2.36 for the CPU image), with the Python 3.11
# that `make setup` installed (.venv; override with PYTHON=...). It writes:
#   - pip 24.3.1 and every line of requirements/lock.txt as wheels (`pip wheel --no-deps`: the
#     lock is complete, and the few packages published only as source are built to wheels here,
#     so the image build compiles nothing);
#   - torch-scatter and torch-sparse (requirements/source-builds.txt) as wheels: taken from pip's
#     wheel cache, where `make setup` left them after compiling them, or else compiled now
#     against the installed torch (about 17 minutes on 2 cores).
# For containers/Dockerfile.cuda, those two must be CUDA builds: run with FORCE_CUDA=1 on a
# machine with the CUDA toolkit of torch's CUDA version (12.1; nvcc, CUDA_HOME), ideally inside
# the Dockerfile's CUDA_DEVEL_IMAGE. They are then always compiled from their source
# distributions: pip's cache (whose wheels are CPU builds), find-links folders and DIR are never
# read for them. Each gets a local version naming torch's CUDA (torch_scatter-2.1.2+cu121-...;
# still satisfies torch-scatter==2.1.2) and must pass containers/check_cuda_extensions.py (CUDA
# kernels of torch's CUDA version) before it stays in DIR. Without FORCE_CUDA=1, a cached wheel
# that holds CUDA modules is not taken, and CUDA wheels (+cu...) of the two releases are removed
# from DIR, so a wheelhouse never holds both kinds.
# It ends by resolving the lock and the source builds from DIR alone WITH their dependencies, as
# the image build installs them: in a fresh virtualenv of the same Python (seeded, as the
# image's `python3 -m venv` is, with an old setuptools and pip), pip 24.3.1 from DIR, then
# `pip install --dry-run --no-index --find-links DIR`. So a lock that misses a package the
# install needs (a dependency `pip freeze` left out, such as setuptools) fails here, in about a
# minute, and not twenty minutes into the image build.
# About 3.5 GB, mostly torch and its CUDA libraries. Running it again refreshes DIR in place.
set -euo pipefail

check_only=""
if [ "${1:-}" = --check ]; then check_only=1; shift; fi
dir=${1:-wheels}
python=${PYTHON:-.venv/bin/python}
[ -f requirements/lock.txt ] && [ -f requirements/source-builds.txt ] \
    || { echo "make_wheelhouse.sh: run it from the repository root (requirements/ not found)" >&2; exit 2; }
command -v "$python" > /dev/null || [ -x "$python" ] \
    || { echo "make_wheelhouse.sh: no Python at $python: run make setup first, or set PYTHON" >&2; exit 2; }
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$version" = 3.11 ] || { echo "make_wheelhouse.sh: $python is Python $version; the image needs 3.11 wheels" >&2; exit 2; }
pip=("$python" -m pip --disable-pip-version-check)
cuda=""
if [ "${FORCE_CUDA:-0}" = 1 ]; then
    # cu121 for CUDA 12.1. Refuses early (not after the download and an hour of compiling)
    # without a CUDA torch, or without a toolkit (nvcc) of exactly torch's CUDA version.
    cuda=$("$python" -c '
import os, re, subprocess, sys, torch
from torch.utils.cpp_extension import CUDA_HOME
if torch.version.cuda is None:
    sys.exit("make_wheelhouse.sh: FORCE_CUDA=1, but torch " + torch.__version__ + " is a CPU-only build")
if CUDA_HOME is None:
    sys.exit("make_wheelhouse.sh: FORCE_CUDA=1, but no CUDA toolkit found (set CUDA_HOME, or put nvcc on PATH)")
nvcc = os.path.join(CUDA_HOME, "bin", "nvcc")
if not os.access(nvcc, os.X_OK):
    sys.exit("make_wheelhouse.sh: FORCE_CUDA=1, but the CUDA toolkit in " + CUDA_HOME + " has no bin/nvcc")
found = re.search(r"release (\d+\.\d+)", subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout)
if found is None or found.group(1) != torch.version.cuda:
    sys.exit("make_wheelhouse.sh: FORCE_CUDA=1, but " + nvcc + " is CUDA " + (found.group(1) if found else "?")
             + "; torch " + torch.__version__ + " needs CUDA " + torch.version.cuda)
print("cu" + "".join(torch.version.cuda.split(".")[:2]))')
fi
# Removes the scratch folders (the unpacked CUDA wheels, the check's virtualenv) on exit.
scratch=()
trap 'rm -rf "${scratch[@]}"' EXIT

# The wheelhouse must resolve as the image build resolves it: see the header.
check_wheelhouse() {
    [ -d "$dir" ] || { echo "make_wheelhouse.sh: no wheelhouse at $dir" >&2; exit 2; }
    echo "==> checking that $dir alone satisfies the lock and the source builds, with their dependencies"
    local venv seeded
    venv=$(mktemp -d)
    scratch+=("$venv")
    "$python" -m venv "$venv/venv"
    seeded=$("$venv/venv/bin/python" -c 'import importlib.metadata as m; print(", ".join(f"{d} {m.version(d)}" for d in ("pip", "setuptools")))' 2> /dev/null || true)
    echo "    a fresh virtualenv of $("$python" -c 'import sys; print(sys._base_executable)'), seeded with ${seeded:-nothing}"
    local offline=(env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT -u PIP_NO_DEPS
                   PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
                   "$venv/venv/bin/python" -m pip install --quiet --no-index --find-links "$dir")
    "${offline[@]}" pip==24.3.1 \
        || { echo "make_wheelhouse.sh: $dir has no pip 24.3.1 the image build can install" >&2; exit 1; }
    "${offline[@]}" --dry-run -r requirements/lock.txt -r requirements/source-builds.txt \
        || { echo "make_wheelhouse.sh: the image build would fail: $dir does not satisfy requirements/lock.txt and requirements/source-builds.txt with their dependencies (pin what pip names above in requirements/lock.txt: make lock)" >&2; exit 1; }
    echo "==> wheelhouse ready: $dir ($(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1))"
}
if [ -n "$check_only" ]; then
    check_wheelhouse
    exit 0
fi
mkdir -p "$dir"

echo "==> pip and requirements/lock.txt into $dir"
"${pip[@]}" wheel --no-deps --wheel-dir "$dir" pip==24.3.1 -r requirements/lock.txt

# name==version lines of requirements/source-builds.txt
mapfile -t builds < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' requirements/source-builds.txt | grep '==')
cache=$("${pip[@]}" cache dir)/wheels
# Whether a wheel holds CUDA extension modules (torch_scatter/_scatter_cuda.so, ...).
cuda_modules() {
    "$python" -c 'import sys, zipfile; sys.exit(0 if any(n.endswith("_cuda.so") for n in zipfile.ZipFile(sys.argv[1]).namelist()) else 1)' "$1"
}
# Gives a wheel the local version +LABEL (file name, dist-info folder, METADATA, RECORD).
add_local_version() {
    "$python" - "$1" "$2" <<'PY'
import base64, hashlib, pathlib, re, sys, zipfile
wheel, label = pathlib.Path(sys.argv[1]), sys.argv[2]
name, version, rest = wheel.name.split("-", 2)
tagged = f"{version}+{label}"
old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{tagged}.dist-info/"
target = wheel.with_name(f"{name}-{tagged}-{rest}")
with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
    record, lines = new_info + "RECORD", []
    for info in source.infolist():
        path = new_info + info.filename[len(old_info):] if info.filename.startswith(old_info) else info.filename
        if path == record:
            continue
        data = source.read(info)
        if path == new_info + "METADATA":
            data = re.sub(rb"(?m)^Version: .*$", f"Version: {tagged}".encode(), data, count=1)
        entry = zipfile.ZipInfo(path, info.date_time)
        entry.external_attr = info.external_attr  # file modes
        out.writestr(entry, data, zipfile.ZIP_DEFLATED)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    out.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
wheel.unlink()
print(target)
PY
}
built=()
for requirement in "${builds[@]}"; do
    name=${requirement%%==*}
    release=${requirement#*==}
    # Wheel file names spell the project name with underscores; CUDA builds carry +cuXYZ.
    stem="${name//-/_}-${release}-cp311-cp311-"
    rm -f "$dir/${stem}"*.whl "$dir/${name//-/_}-${release}+"*.whl
    found=""
    if [ -z "$cuda" ] && [ -d "$cache" ]; then
        while read -r candidate; do
            if ! cuda_modules "$candidate"; then found=$candidate; break; fi
            echo "==> $requirement: skipping $candidate in pip's cache: a CUDA build"
        done < <(find "$cache" -name "${stem}*.whl" -printf '%T@ %p\n' | sort -rn | sed 's/^[^ ]* //')
    fi
    if [ -n "$found" ]; then
        echo "==> $requirement: the wheel make setup built, from pip's cache ($found)"
        cp "$found" "$dir/"
    elif [ -z "$cuda" ]; then
        echo "==> $requirement: not in pip's cache: compiling it against the installed torch"
        "${pip[@]}" wheel --no-deps --no-build-isolation --wheel-dir "$dir" "$requirement"
    else
        echo "==> $requirement: compiling it with CUDA kernels (FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-every GPU torch supports}), from source, no cache"
        "${pip[@]}" wheel --no-deps --no-build-isolation --no-cache-dir --no-binary "$name" --wheel-dir "$dir" "$requirement"
        built+=("$(add_local_version "$(find "$dir" -maxdepth 1 -name "${stem}*.whl")" "$cuda")")
    fi
done
if [ -n "$cuda" ]; then
    echo "==> checking the CUDA builds: containers/check_cuda_extensions.py on ${built[*]}"
    unpacked=$(mktemp -d)
    scratch+=("$unpacked")
    for wheel in "${built[@]}"; do "$python" -m zipfile -e "$wheel" "$unpacked"; done
    PYTHONPATH="$unpacked" "$python" containers/check_cuda_extensions.py \
        || { rm -f "${built[@]}"; echo "make_wheelhouse.sh: removed ${built[*]}: not CUDA builds of torch's CUDA version" >&2; exit 1; }
fi

check_wheelhouse
