#!/usr/bin/env bash
# Makes the wheelhouse of an offline image build: every wheel containers/Dockerfile installs,
# so that `--build-arg WHEELHOUSE=wheels` builds the image without reaching a package index
# (behind a firewall, or where the build's TLS trust differs from the host's).
#
#   containers/make_wheelhouse.sh [DIR]        # default DIR: wheels (in the repository root)
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
# machine with the CUDA 12.1 toolkit (the cache is then bypassed: its wheels are CPU builds).
# About 3.5 GB, mostly torch and its CUDA libraries. Running it again refreshes DIR in place.
set -euo pipefail

dir=${1:-wheels}
python=${PYTHON:-.venv/bin/python}
[ -f requirements/lock.txt ] && [ -f requirements/source-builds.txt ] \
    || { echo "make_wheelhouse.sh: run it from the repository root (requirements/ not found)" >&2; exit 2; }
command -v "$python" > /dev/null || [ -x "$python" ] \
    || { echo "make_wheelhouse.sh: no Python at $python: run make setup first, or set PYTHON" >&2; exit 2; }
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$version" = 3.11 ] || { echo "make_wheelhouse.sh: $python is Python $version; the image needs 3.11 wheels" >&2; exit 2; }
pip=("$python" -m pip --disable-pip-version-check)
mkdir -p "$dir"

echo "==> pip and requirements/lock.txt into $dir"
"${pip[@]}" wheel --no-deps --wheel-dir "$dir" pip==24.3.1 -r requirements/lock.txt

# name==version lines of requirements/source-builds.txt
mapfile -t builds < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' requirements/source-builds.txt | grep '==')
cache=$("${pip[@]}" cache dir)/wheels
for requirement in "${builds[@]}"; do
    name=${requirement%%==*}
    release=${requirement#*==}
    # Wheel file names spell the project name with underscores.
    stem="${name//-/_}-${release}-cp311-cp311-"
    found=""
    if [ -z "${FORCE_CUDA:-}" ] && [ -d "$cache" ]; then
        found=$(find "$cache" -name "${stem}*.whl" -printf '%T@ %p\n' | sort -rn | sed -n '1s/^[^ ]* //p')
    fi
    if [ -n "$found" ]; then
        echo "==> $requirement: the wheel make setup built, from pip's cache ($found)"
        rm -f "$dir/${stem}"*.whl
        cp "$found" "$dir/"
    else
        echo "==> $requirement: not in pip's cache (or FORCE_CUDA set): compiling it against the installed torch"
        "${pip[@]}" wheel --no-deps --no-build-isolation ${FORCE_CUDA:+--no-cache-dir} --wheel-dir "$dir" "$requirement"
    fi
done

# The image installs with --no-index from DIR alone: check that every pinned file is there and
# installs on this Python (no index, no pip configuration, no installed packages consulted).
echo "==> checking that $dir alone satisfies the lock and the source builds"
env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "${pip[@]}" install --dry-run --quiet --no-deps --ignore-installed --no-index --find-links "$dir" \
    pip==24.3.1 -r requirements/lock.txt -r requirements/source-builds.txt
echo "==> wheelhouse ready: $dir ($(find "$dir" -name '*.whl' | wc -l) wheels, $(du -sh "$dir" | cut -f1))"
