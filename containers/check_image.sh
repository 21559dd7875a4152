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
#    WHEELHOUSE=wheels. Beam's worker boot program is compiled from Beam's source of the locked
#    release: BEAM_SOURCE names it here (a tarball or a source tree), built with GO_IMAGE. By
#    default that is a local image with Debian trixie's Go and Go libraries (golang-go,
#    golang-google-grpc-dev, golang-google-protobuf-dev and what they pull in), plus GO_SOURCES
#    (a folder laid out as GOPATH's src/, for imports Debian does not package: Beam's log package
#    imports github.com/golang-cz/devslog), and the boot program is built in GOPATH mode
#    (BEAM_GO_DEPS=gopath, no module proxy needed). With GO_IMAGE given, BEAM_GO_DEPS defaults
#    to modules: vendored (GOFLAGS=-mod=vendor) or reachable through GOPROXY. A source of another
#    version than the lock's is refused unless BEAM_SOURCE_VERSION names it; the result then says
#    loudly which version the boot program comes from. Without BEAM_SOURCE the image is built with
#    BEAM_BOOT=none: no boot program, so the Dataflow-worker path is NOT checked, and it says so;
# 5. the image's root filesystem exported (`podman run` needs cgroups and rlimits that
#    sandboxes often refuse) and, with chroot, as the image's user, with its environment:
#    (a) `gnnflow run` on the bundled demo with 2 workers, checking test_accuracy in the
#        report's metrics.json (at least MIN_TEST_ACCURACY, default 0.85);
#    (b) one step through the image's entry point: `components.preprocess --help`;
#    (c) the worker contract: RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1, and (with BEAM_SOURCE)
#        Beam's boot program answering --help.
# The Dataflow-worker path itself (Beam starting the image as its SDK harness through boot) is
# checked by containers/check_dataflow_worker.sh.
# Prints the durations, the image size and the result; exits non-zero on any failure.
# Environment: PYTHON (the Python 3.11 that makes the wheelhouse, default .venv/bin/python),
# DEBIAN_MIRROR (default: read from /etc/apt/sources.list*), FRESH=1 (rebuild the base image),
# BEAM_SOURCE, BEAM_SOURCE_SHA256 (needed for a tarball), BEAM_SOURCE_VERSION, BEAM_GO_DEPS, GO_IMAGE,
# GO_SOURCES, GOFLAGS, GOPROXY (step 4),
# IMAGE (the tag, default below),
# CLEAN=1 (remove the images and the wheelhouse at the end; the exported root filesystem and
# the build context are always removed).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-/var/tmp/gnnflow-image-check}
min_accuracy=${MIN_TEST_ACCURACY:-0.85}
base_image=localhost/gnnflow-check/debian:bookworm
go_image=${GO_IMAGE:-localhost/gnnflow-check/go:trixie-gopath}
go_deps=${BEAM_GO_DEPS:-$([ -n "${GO_IMAGE:-}" ] && echo modules || echo gopath)}
beam_source_version=${BEAM_SOURCE_VERSION:-}
image=${IMAGE:-localhost/gnnflow-check/step:cpu}
beam_source=${BEAM_SOURCE:-}
beam_source_sha256=${BEAM_SOURCE_SHA256:-}
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

mirror=${DEBIAN_MIRROR:-$(debian_mirror /etc/apt)}
step "base image $base_image"
if [ -n "${FRESH:-}" ] || ! podman image exists "$base_image"; then
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

if [ -n "$beam_source" ]; then
    [ -e "$beam_source" ] || die "BEAM_SOURCE=$beam_source does not exist"
    # Checked by the build itself (sha256sum -c in containers/build_beam_boot.sh); refused here
    # already when missing, before the long steps.
    [ -d "$beam_source" ] || [ -n "$beam_source_sha256" ] \
        || die "BEAM_SOURCE=$beam_source is an archive: set BEAM_SOURCE_SHA256 to its sha256 (from where you took it)"
    step "Go toolchain image $go_image (Beam's boot program is compiled with it; Go dependencies: $go_deps)"
    if [ -n "${GO_IMAGE:-}" ]; then
        podman image exists "$go_image" || die "GO_IMAGE=$go_image is not a local image (no registry is assumed)"
    else
        # Debian trixie's Go and Go libraries (GOPATH mode reads /usr/share/gocode), and
        # GO_SOURCES at /go/src. Rebuilt from cached layers when nothing changed.
        rm -rf "$work/go-context"
        mkdir -p "$work/go-context/src"
        if [ -n "${GO_SOURCES:-}" ]; then
            [ -d "$GO_SOURCES" ] || die "GO_SOURCES=$GO_SOURCES is not a folder"
            cp -a "$GO_SOURCES/." "$work/go-context/src/"
        fi
        {
            echo "FROM $base_image"
            echo "RUN echo 'deb $mirror trixie main' > /etc/apt/sources.list.d/trixie.list \\"
            echo "    && printf 'Package: *\\nPin: release n=trixie\\nPin-Priority: 100\\n' > /etc/apt/preferences.d/trixie \\"
            echo "    && apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\"
            echo "        -t trixie golang-go golang-google-grpc-dev golang-google-protobuf-dev ca-certificates git \\"
            echo "    && rm -rf /var/lib/apt/lists/*"
            echo "COPY src /go/src"
        } > "$work/go-context/Containerfile"
        podman build --isolation=chroot --network=host -q -t "$go_image" "$work/go-context" > /dev/null \
            || die "building the Go toolchain image failed"
        rm -rf "$work/go-context"
    fi
    if [ -n "$beam_source_version" ]; then
        echo "WARNING: BEAM_SOURCE_VERSION=$beam_source_version: the boot program is built from Beam $beam_source_version, not from the release in requirements/lock.txt"
    fi
fi

step "wheelhouse $work/wheels"
containers/make_wheelhouse.sh "$work/wheels"

step "build context $ctx (a snapshot of the tree and the wheelhouse)"
rm -rf "$ctx"
mkdir -p "$ctx"
cp -a .dockerignore pyproject.toml README.md requirements components pipelines containers "$ctx/"
cp -al "$work/wheels" "$ctx/wheels" 2> /dev/null || cp -a "$work/wheels" "$ctx/wheels"
boot_args=(--build-arg BEAM_BOOT=none)
if [ -n "$beam_source" ]; then
    # The folder beam-source/ of the context: a tree as it is, a tarball inside it (ADD would
    # unpack a tarball named directly, and its checksum could not be checked).
    if [ -d "$beam_source" ]; then
        cp -a "$beam_source" "$ctx/beam-source"
    else
        mkdir "$ctx/beam-source" && cp -a "$beam_source" "$ctx/beam-source/"
    fi
    boot_args=(--build-arg BEAM_BOOT=source --build-arg BEAM_SOURCE=beam-source
               --build-arg BEAM_SOURCE_SHA256="$beam_source_sha256" --build-arg GO_IMAGE="$go_image"
               --build-arg BEAM_GO_DEPS="$go_deps" --build-arg GOFLAGS="${GOFLAGS:-}" --build-arg GOPROXY="${GOPROXY:-}")
    [ -z "$beam_source_version" ] || boot_args+=(--build-arg BEAM_SOURCE_VERSION="$beam_source_version")
else
    echo "no BEAM_SOURCE: building with BEAM_BOOT=none (no Beam boot program; the Dataflow-worker path is not checked)"
fi

step "podman build $image"
# What the build adds besides the image (the build stage and its cached layers), for CLEAN=1.
images_before=$(podman images -a -q --no-trunc | sort -u)
build_started=$(date +%s)
podman build --isolation=chroot --network=host \
    --build-arg BASE_IMAGE="$base_image" "${boot_args[@]}" \
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

step "(c) the Beam worker contract"
printf '%s\n' "${environment[@]}" | grep -qx 'RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1' \
    || die "the image does not set RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1"
echo "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=1; user $user"
if [ -n "$beam_source" ]; then
    [ -x "$root/opt/apache/beam/boot" ] || die "no /opt/apache/beam/boot in the image"
    usage=$(in_image /opt/apache/beam/boot --help 2>&1 || true)
    case "$usage" in *provision_endpoint*) echo "/opt/apache/beam/boot: Beam's boot program (--help lists its flags)" ;;
        *) die "/opt/apache/beam/boot --help printed no boot flags" ;; esac
    [ -f "$root/opt/apache/beam/boot-source.txt" ] || die "no /opt/apache/beam/boot-source.txt in the image"
    sed 's/^/    /' "$root/opt/apache/beam/boot-source.txt"
    built_version=$(sed -n 's/^version.py: \([^ ]*\).*/\1/p' "$root/opt/apache/beam/boot-source.txt")
    checksum=$(sed -n 's/^checksum: //p' "$root/opt/apache/beam/boot-source.txt")
    boot_result="/opt/apache/beam/boot built from $beam_source (Beam $built_version, checksum: $checksum, Go dependencies: $go_deps)"
    if [ -n "$beam_source_version" ]; then
        boot_result="$boot_result; NOT the locked release: built from Beam $built_version (BEAM_SOURCE_VERSION)"
    fi
else
    [ ! -e "$root/opt/apache/beam/boot" ] || die "BEAM_BOOT=none, yet the image has /opt/apache/beam/boot"
    refused=$(in_image "${entrypoint[@]}" --id=1 2>&1 || true)
    case "$refused" in *"no Beam boot program"*) echo "entry point with boot flags: $refused" ;;
        *) die "the entry point of an image without boot did not refuse boot flags: $refused" ;; esac
    boot_result="NOT CHECKED: built with BEAM_BOOT=none (no BEAM_SOURCE), no boot program in the image"
fi

grep -q " $root/" /proc/mounts && die "something is still mounted under $root"
rm -rf "$root"
if [ -n "${CLEAN:-}" ]; then
    podman rmi -f "$image" "$base_image" > /dev/null
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
    echo "beam boot:     $boot_result"
    echo "total:         ${total_seconds} s"
    echo "RESULT:        PASS"
} | tee "$work/result.txt"
