#!/usr/bin/env bash
# Builds Beam's worker boot program (/opt/apache/beam/boot) from Beam's source: the one build
# step of the `beam-boot-source` stage of containers/Dockerfile and containers/Dockerfile.cuda,
# run inside GO_IMAGE, so both images build it the same way from the same source.
#
# Reads what the stage's `ADD ${BEAM_SOURCE} /tmp/beam-source/` placed there:
#   - an archive (*.tar.gz: a downloaded release tarball, or a tarball inside a folder of the
#     build context): its sha256 must equal BEAM_SOURCE_SHA256 (`sha256sum -c`), or the build
#     stops before anything is unpacked. An archive without a BEAM_SOURCE_SHA256 is refused.
#   - a source tree (a folder of the build context holding sdks/; a local tarball named directly
#     as BEAM_SOURCE is unpacked by ADD and arrives as a tree too): the builder's own files, not a
#     download, so there is no archive to check; refused when BEAM_SOURCE_SHA256 is set (the
#     checksum would silently go unchecked), recorded as unchecked otherwise.
# Then checks that sdks/python/apache_beam/version.py says BEAM_SOURCE_VERSION, compiles
# ./python/container (static, no cgo; BEAM_GO_DEPS=modules or gopath, see containers/Dockerfile),
# copies Beam's LICENSE and NOTICE beside the program, and records the source, its checksum,
# the Go version and every import from outside Beam in /opt/apache/beam/boot-source.txt.
# Environment (the stage's build arguments): BEAM_VERSION, BEAM_SOURCE_VERSION, BEAM_SOURCE,
# BEAM_SOURCE_SHA256, BEAM_GO_DEPS, GOFLAGS, GOPROXY.
set -euo pipefail

# The stage's paths (other folders only for tests/test_containers.py).
incoming=${BEAM_BOOT_INCOMING:-/tmp/beam-source}
src=${BEAM_BOOT_WORK:-/src/beam}
out=${BEAM_BOOT_OUT:-/opt/apache/beam}
die() { echo "build_beam_boot.sh: $*" >&2; exit 1; }

case "$BEAM_GO_DEPS" in modules | gopath) ;; *) die "BEAM_GO_DEPS is modules or gopath, not $BEAM_GO_DEPS" ;; esac
mkdir -p "$src" "$out"
archive=$(find "$incoming" -maxdepth 1 -type f -name '*.tar.gz' -print -quit)
if [ -n "$archive" ]; then
    [ -n "${BEAM_SOURCE_SHA256:-}" ] \
        || die "BEAM_SOURCE ($BEAM_SOURCE) is an archive and BEAM_SOURCE_SHA256 is empty: give the archive's sha256 (--build-arg BEAM_SOURCE_SHA256=...), taken from a source you trust"
    echo "$BEAM_SOURCE_SHA256  $archive" | sha256sum -c - \
        || die "BEAM_SOURCE ($BEAM_SOURCE) has sha256 $(sha256sum "$archive" | cut -d' ' -f1), not BEAM_SOURCE_SHA256=$BEAM_SOURCE_SHA256: refusing to build from it"
    checksum="sha256 $BEAM_SOURCE_SHA256 (verified)"
    tar -xzf "$archive" -C "$src" --strip-components=1
else
    [ -z "${BEAM_SOURCE_SHA256:-}" ] \
        || die "BEAM_SOURCE ($BEAM_SOURCE) arrived as a source tree, not an archive, so BEAM_SOURCE_SHA256 cannot be checked (ADD unpacks a local tarball named directly: put it in a folder of the build context and name the folder)"
    top=$(find "$incoming" -maxdepth 2 -name sdks -type d -print -quit)
    [ -n "$top" ] || die "BEAM_SOURCE ($BEAM_SOURCE) holds neither a *.tar.gz archive nor a source tree with sdks/"
    checksum="none: a source tree in the build context, not an archive"
    echo "WARNING: BEAM_SOURCE ($BEAM_SOURCE) is a source tree: no checksum checked" >&2
    cp -a "$(dirname "$top")/." "$src/"
fi
rm -rf "$incoming"

cd "$src"
found=$(sed -n "s/^__version__ = '\\(.*\\)'$/\\1/p" sdks/python/apache_beam/version.py)
[ "$found" = "$BEAM_SOURCE_VERSION" ] \
    || die "BEAM_SOURCE is Beam ${found:-of no known version}, not $BEAM_SOURCE_VERSION (BEAM_SOURCE_VERSION; the release in requirements/lock.txt is $BEAM_VERSION)"
if [ "$BEAM_SOURCE_VERSION" != "$BEAM_VERSION" ]; then
    echo "WARNING: Beam's boot program is built from Beam $BEAM_SOURCE_VERSION, NOT from $BEAM_VERSION (the release in requirements/lock.txt): BEAM_SOURCE_VERSION=$BEAM_SOURCE_VERSION was given" >&2
fi

# GOPATH mode: the import path github.com/apache/beam/sdks/v2 is sdks/'s place under /go/src.
sdks="$src/sdks"
if [ "$BEAM_GO_DEPS" = gopath ]; then
    sdks=/go/src/github.com/apache/beam/sdks/v2
    mkdir -p "${sdks%/*}"
    mv "$src/sdks" "$sdks"
    export GO111MODULE=off GOPATH=/go:/usr/share/gocode
fi
CGO_ENABLED=0 GOTOOLCHAIN=local go build -C "$sdks" -trimpath -ldflags="-s -w" -o "$out/boot" ./python/container
cp "$src/LICENSE" "$src/NOTICE" "$out/"
usage=$("$out/boot" --help 2>&1 || true)
case "$usage" in *-provision_endpoint*) ;; *) die "the built $out/boot --help lists no -provision_endpoint flag" ;; esac

# The imports from outside Beam, by module (modules) or by GOPATH root folder and the Debian
# package that installed it (gopath).
go list -C "$sdks" -deps -f '{{if not .Standard}}{{with .Module}}{{.Path}}@{{.Version}}{{else}}{{.Dir}}{{end}}{{end}}' ./python/container \
    | sed -e '/^$/d' -e '/github.com\/apache\/beam\//d' -e 's|/src/\(github.com/[^/]*/[^/]*\).*|/src/\1|' \
        -e 's|/src/\(golang.org/x/[^/]*\).*|/src/\1|' -e 's|/src/\(google.golang.org/[^/]*\).*|/src/\1|' \
    | sort -u > /tmp/roots
{
    echo "Beam boot program $out/boot, built from Beam's source:"
    echo "source: $BEAM_SOURCE"
    echo "checksum: $checksum"
    echo "version.py: $BEAM_SOURCE_VERSION (the release in requirements/lock.txt: $BEAM_VERSION)"
    echo "go: $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH), CGO_ENABLED=0, static; Go dependencies: $BEAM_GO_DEPS"
    echo "imports outside Beam (module, or GOPATH folder and the Debian package holding it):"
    while read -r dep; do
        case "$dep" in
            /*)
                owner=$(dpkg-query -S "$dep" 2> /dev/null || true)
                owner=${owner%%:*}
                if [ -n "$owner" ]; then echo "  $dep: $owner $(dpkg-query -W -f '${Version}' "$owner")"
                else echo "  $dep: not from a Debian package"; fi ;;
            *) echo "  $dep" ;;
        esac
    done < /tmp/roots
} > "$out/boot-source.txt"
rm -f /tmp/roots
cat "$out/boot-source.txt"
