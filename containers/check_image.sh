#!/usr/bin/env bash
# Builds the CPU step image for real, without a Docker daemon or a registry, and runs the
# pipeline inside it. Run as root from anywhere in the repository, on a Debian/Ubuntu machine:
#
#   containers/check_image.sh [WORKDIR]     # default WORKDIR: /var/tmp/gnnflow-image-check
#
# 1. podman and debootstrap from apt if missing;
# 2. a Debian bookworm base (debootstrap --variant=minbase from the Debian mirror apt already
#    uses, then `podman import`): registries are not needed, and bookworm's python3 is 3.11;
# 3. the wheelhouse (containers/make_wheelhouse.sh: the lock and the two source builds as
#    wheels, from the host's pip), so the build installs with --no-index;
# 4. `podman build --isolation=chroot` of containers/Dockerfile with BASE_IMAGE=that base and
#    WHEELHOUSE=wheels. Beam's SDK image (the source of Beam's worker boot program) cannot be
#    pulled either: a stand-in stage whose boot program only says so takes its place, so the
#    Dataflow-worker path of the image is not checked here;
# 5. the image's root filesystem exported (`podman run` needs cgroups and rlimits that
#    sandboxes often refuse) and, with chroot, as the image's user, with its environment:
#    (a) `gnnflow run` on the bundled demo with 2 workers, checking test_accuracy in the
#        report's metrics.json (at least MIN_TEST_ACCURACY, default 0.85);
#    (b) one step through the image's entry point: `components.preprocess --help`.
# Prints the durations, the image size and the result; exits non-zero on any failure.
# Environment: PYTHON (the Python 3.11 that makes the wheelhouse, default .venv/bin/python),
# DEBIAN_MIRROR (default: read from /etc/apt/sources.list*), FRESH=1 (rebuild the base image),
# CLEAN=1 (remove the images and the wheelhouse at the end; the exported root filesystem and
# the build context are always removed).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/gnnflow-image-check}
min_accuracy=${MIN_TEST_ACCURACY:-0.85}
base_image=localhost/gnnflow-check/debian:bookworm
beam_image=localhost/gnnflow-check/beam-boot-absent:2.77.0
image=localhost/gnnflow-check/step:cpu
root=$work/rootfs
ctx=$work/context
started=$(date +%s)

die() { echo "check_image.sh: FAILED: $*" >&2; exit 1; }
step() { echo; echo "==> [$(date -u +%H:%M:%S)] $*"; }

[ "$(id -u)" = 0 ] || die "run as root (debootstrap, podman storage and chroot need it)"
cd "$repo"
mkdir -p "$work"

step "tools"
if ! command -v podman > /dev/null || ! command -v debootstrap > /dev/null; then
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y podman debootstrap
fi
podman --version

# The first bookworm mirror apt is configured with, under $1 (/etc/apt): one-line sources
# (deb [opts] URI SUITE ...) and deb822 .sources (Types/URIs/Suites paragraphs).
debian_mirror() {
    local file found
    for file in "$1/sources.list" "$1"/sources.list.d/*.list; do
        [ -f "$file" ] || continue
        found=$(awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                     if ($(i + 1) == "bookworm") { print $i; exit } }' "$file")
        [ -n "$found" ] && { echo "$found"; return; }
    done
    for file in "$1"/sources.list.d/*.sources; do
        [ -f "$file" ] || continue
        found=$(awk 'BEGIN { RS = "" } {
                    types = ""; uris = ""; suites = ""; n = split($0, lines, "\n")
                    for (j = 1; j <= n; j++) {
                        if (lines[j] ~ /^Types:/) types = lines[j]
                        if (lines[j] ~ /^URIs:/) uris = lines[j]
                        if (lines[j] ~ /^Suites:/) suites = lines[j] " "
                    }
                    if (types ~ /[ \t]deb([ \t]|$)/ && suites ~ /[ \t]bookworm[ \t]/) { split(uris, u, /[ \t]+/); print u[2]; exit }
                }' "$file")
        [ -n "$found" ] && { echo "$found"; return; }
    done
    return 0
}

step "base image $base_image"
if [ -n "${FRESH:-}" ] || ! podman image exists "$base_image"; then
    mirror=${DEBIAN_MIRROR:-$(debian_mirror /etc/apt)}
    [ -n "$mirror" ] || die "no bookworm mirror in /etc/apt/sources.list*: set DEBIAN_MIRROR"
    echo "debootstrap from $mirror"
    rm -rf "$work/base-rootfs"
    debootstrap --variant=minbase bookworm "$work/base-rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 \
        || { tail -n 20 "$work/debootstrap.log" >&2; die "debootstrap failed (log: $work/debootstrap.log)"; }
    tar -C "$work/base-rootfs" -c . | podman import - "$base_image"
    rm -rf "$work/base-rootfs"
else
    echo "reusing it (FRESH=1 rebuilds it)"
fi

step "stand-in for Beam's SDK image $beam_image"
if ! podman image exists "$beam_image"; then
    mkdir -p "$work/beam-context"
    cat > "$work/beam-context/Containerfile" <<EOF
FROM $base_image
RUN mkdir -p /opt/apache/beam && printf '%s\n' '#!/bin/sh' \
    'echo "this image was built by containers/check_image.sh without Beam boot program (no registry): it cannot be a Dataflow worker" >&2' \
    'exit 1' > /opt/apache/beam/boot && chmod 755 /opt/apache/beam/boot
EOF
    podman build --isolation=chroot --network=host -q -t "$beam_image" "$work/beam-context" > /dev/null
fi

step "wheelhouse $work/wheels"
containers/make_wheelhouse.sh "$work/wheels"

step "build context $ctx (a snapshot of the tree and the wheelhouse)"
rm -rf "$ctx"
mkdir -p "$ctx"
cp -a .dockerignore pyproject.toml README.md requirements components pipelines containers "$ctx/"
cp -al "$work/wheels" "$ctx/wheels" 2> /dev/null || cp -a "$work/wheels" "$ctx/wheels"

step "podman build $image"
# What the build adds besides the image (the build stage and its cached layers), for CLEAN=1.
images_before=$(podman images -a -q --no-trunc | sort -u)
build_started=$(date +%s)
podman build --isolation=chroot --network=host \
    --build-arg BASE_IMAGE="$base_image" --build-arg BEAM_SDK_IMAGE="$beam_image" \
    --build-arg WHEELHOUSE=wheels -f containers/Dockerfile -t "$image" "$ctx" \
    || die "podman build failed"
build_seconds=$(( $(date +%s) - build_started ))
size_bytes=$(podman image inspect --format '{{.Size}}' "$image")
size=$(awk -v b="$size_bytes" 'BEGIN { printf "%.2f GB (%.0f bytes)", b / 1e9, b }')
echo "built in ${build_seconds} s; image size $size"
rm -rf "$ctx"

step "root filesystem $root"
grep -q " $root/" /proc/mounts && die "something is still mounted under $root"
rm -rf "$root"
mkdir -p "$root"
container=$(podman create "$image" /bin/true)
trap 'podman rm -f "$container" > /dev/null 2>&1 || true' EXIT
podman export "$container" | tar -x -C "$root"
podman rm -f "$container" > /dev/null

# The image's own settings, as `docker run` would apply them.
user=$(podman image inspect --format '{{.Config.User}}' "$image")
workdir=$(podman image inspect --format '{{.Config.WorkingDir}}' "$image")
mapfile -t entrypoint < <(podman image inspect --format '{{range .Config.Entrypoint}}{{println .}}{{end}}' "$image" | grep .)
mapfile -t environment < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | grep .)
home=$(awk -F: -v uid="${user%%:*}" '$3 == uid { print $6 }' "$root/etc/passwd")
[ -n "$home" ] || die "the image's user $user has no entry in its /etc/passwd"
environment+=("HOME=$home")

# Runs a command in the exported image: its user, working directory and environment, with
# /proc, /dev (a private /dev/shm), /sys, /etc/hosts and /etc/resolv.conf mounted in a private
# mount namespace, which takes every mount with it when the command ends.
in_image() {
    unshare --mount --propagation private -- /bin/bash -c '
        root=$1 user=$2 workdir=$3; shift 3
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"
        mount --rbind /sys "$root/sys"
        for file in /etc/hosts /etc/resolv.conf; do
            [ -e "$root$file" ] || touch "$root$file"
            mount --bind "$file" "$root$file"
        done
        separator=0; for a in "$@"; do [ "$a" = -- ] && break; separator=$((separator + 1)); done
        exec chroot --userspec="$user" "$root" /usr/bin/env -i "${@:1:separator}" \
            /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$workdir" "${@:separator+2}"
    ' in_image "$root" "$user" "$workdir" "${environment[@]}" -- "$@"
}

python_version=$(in_image python --version)
echo "the image's Python: $python_version (as $user in $workdir)"
case "$python_version" in "Python 3.11."*) ;; *) die "the image's Python is $python_version, not 3.11" ;; esac

step "(a) gnnflow run on the demo with 2 workers, inside the image"
run_started=$(date +%s)
in_image timeout 3600 gnnflow run --output runs/image-check --set resources.world_size=2 \
    || die "gnnflow run failed inside the image"
run_seconds=$(( $(date +%s) - run_started ))
metrics_file=$root$workdir/runs/image-check/report/metrics.json
[ -f "$metrics_file" ] || die "no $metrics_file"
accuracy=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["test_accuracy"])' "$metrics_file")
echo "metrics.json: $(python3 -c 'import json, sys; m = json.load(open(sys.argv[1])); print(", ".join(f"{k}={v:.4g}" for k, v in sorted(m.items()) if k.startswith("test_")))' "$metrics_file")"
awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }' \
    || die "test_accuracy $accuracy is below $min_accuracy"

step "(b) one step through the entry point: ${entrypoint[*]} components.preprocess --help"
help=$(in_image "${entrypoint[@]}" components.preprocess --help) || die "components.preprocess --help failed inside the image"
echo "$help" | head -n 3
case "$help" in *usage:*) ;; *) die "components.preprocess --help printed no usage" ;; esac

grep -q " $root/" /proc/mounts && die "something is still mounted under $root"
rm -rf "$root"
if [ -n "${CLEAN:-}" ]; then
    podman rmi -f "$image" "$beam_image" "$base_image" > /dev/null
    mapfile -t added < <(comm -13 <(echo "$images_before") <(podman images -a -q --no-trunc | sort -u))
    [ "${#added[@]}" = 0 ] || podman rmi -f "${added[@]}" > /dev/null
    rm -rf "$work/wheels"
fi

total_seconds=$(( $(date +%s) - started ))
{
    echo "date:          $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(nproc) cores"
    echo "image:         $image from containers/Dockerfile, BASE_IMAGE=$base_image, WHEELHOUSE=wheels"
    echo "image size:    $size"
    echo "build:         ${build_seconds} s"
    echo "python:        $python_version"
    echo "demo run:      ${run_seconds} s, 2 workers, test_accuracy=$accuracy (threshold $min_accuracy)"
    echo "single step:   ${entrypoint[*]} components.preprocess --help: ok"
    echo "total:         ${total_seconds} s"
    echo "RESULT:        PASS"
} | tee "$work/result.txt"
