#!/usr/bin/env bash
# Proves the step image's KFP container contract without a cluster: the compiled DAG of the
# bundled demo runs through kfp.local's DockerRunner (`gnnflow run --via kfp-docker`), every task
# in a container of IMAGE as the image's own user, and its metrics must equal those of the plain
# local run (`gnnflow run`) of the same demo config. Every task of the compiled DAG (`gnnflow
# compile` with the run's resolved config) must have run in a container of its own: it fails
# naming the tasks that did not (containers/dag_tasks_ran.py). Run as root from the repository:
#
#   containers/check_kfp_docker.sh [IMAGE] [WORKDIR]
#   # defaults: localhost/gnnflow-check/step:cpu (containers/check_image.sh builds it),
#   #           /var/tmp/gnnflow-kfp-docker-check
#
# No Docker daemon is needed: podman's Docker-compatible API (`podman system service`, on a
# socket under WORKDIR, with the runc runtime and ulimits this machine allows) serves
# DOCKER_HOST. Prints the durations, the tasks' containers, both runs' metrics and PASS or FAIL
# (also in WORKDIR/result.txt); exits non-zero on FAIL. Environment: PYTHON (default
# .venv/bin/python), EXTRA_SET (more --set KEY=VALUE for both runs, space-separated).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
image=${1:-localhost/gnnflow-check/step:cpu}
work=${2:-/var/tmp/gnnflow-kfp-docker-check}
python=${PYTHON:-$repo/.venv/bin/python}
started=$(date +%s)

die() { echo "check_kfp_docker.sh: FAILED: $*" >&2; exit 1; }
step() { echo; echo "==> [$(date -u +%H:%M:%S)] $*"; }

# shellcheck source=containers/podman_common.sh
source "$repo/containers/podman_common.sh"
podman_prerequisites "$image" "$python"
"$python" -c "import docker" 2> /dev/null || die "the Python package docker is not installed in $python (requirements/lock.txt)"

rm -rf "$work"
mkdir -p "$work"
write_containers_conf "$work/containers.conf"
socket=$work/podman.sock
step "podman system service on unix://$socket"
CONTAINERS_CONF=$work/containers.conf podman system service --time=0 "unix://$socket" > "$work/podman-service.log" 2>&1 &
service=$!
stop_service() { kill "$service" 2> /dev/null || true; wait "$service" 2> /dev/null || true; }
trap stop_service EXIT
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.2; done
[ -S "$socket" ] || die "podman system service did not start (log: $work/podman-service.log)"
export DOCKER_HOST=unix://$socket
"$python" -c "import docker; c = docker.from_env(); print('Docker API:', c.version()['Components'][0]['Name'], c.version()['Version'])"

sets=()
for item in ${EXTRA_SET:-}; do sets+=(--set "$item"); done

step "gnnflow run (direct, this environment) on the demo"
direct_started=$(date +%s)
(cd "$repo" && "$python" -m pipelines.cli run --output "$work/direct" "${sets[@]}") > "$work/direct.log" 2>&1 \
    || { tail -n 30 "$work/direct.log"; die "gnnflow run failed (log: $work/direct.log)"; }
direct_seconds=$(( $(date +%s) - direct_started ))
tail -n 8 "$work/direct.log"

step "gnnflow run --via kfp-docker (kfp.local DockerRunner, every task in $image)"
kfp_started=$(date +%s)
# Unbuffered: kfp.local logs "Executing task" to stderr and prints "Found image" to stdout, and
# dag_tasks_ran.py reads their order.
(cd "$repo" && PYTHONUNBUFFERED=1 "$python" -m pipelines.cli run --via kfp-docker --image "$image" --output "$work/kfp" "${sets[@]}") \
    > "$work/kfp.log" 2>&1 || { tail -n 40 "$work/kfp.log"; die "gnnflow run --via kfp-docker failed (log: $work/kfp.log)"; }
kfp_seconds=$(( $(date +%s) - kfp_started ))
tail -n 14 "$work/kfp.log"
owners=$(find "$work/kfp" -mindepth 1 -newer "$work/containers.conf" -user 1000 | wc -l)
echo "($owners file(s) and folder(s) of the run written by uid 1000, the image's user)"

step "every task of the compiled DAG ran in a container of $image"
# The same DAG kfp.local ran: the run's resolved config decides the export step.
(cd "$repo" && "$python" -m pipelines.cli compile -o "$work/pipeline.yaml" --image "$image" --config "$work/kfp/config.resolved.yaml") \
    > "$work/compile.log" 2>&1 || { cat "$work/compile.log"; die "gnnflow compile failed (log: $work/compile.log)"; }
sed 's/\x1b\[[0-9;]*m//g' "$work/kfp.log" > "$work/kfp.plain.log"
tasks=$("$python" "$repo/containers/dag_tasks_ran.py" "$work/pipeline.yaml" "$work/kfp.plain.log" "$work/kfp") \
    || { echo "$tasks"; die "$(tail -n 1 <<< "$tasks")"; }
echo "$tasks"
tasks=$(tail -n 1 <<< "$tasks")

step "metrics"
kfp_metrics=$(sed -n 's/^metrics: //p' "$work/kfp.log" | tail -n 1)
[ -f "$kfp_metrics" ] || die "no metrics file in the kfp-docker run's summary"
comparison=$("$python" - "$work/direct/report/metrics.json" "$kfp_metrics" <<'EOF'
import json, sys
direct, kfp = (json.load(open(p)) for p in sys.argv[1:3])
keys = sorted(set(direct) | set(kfp))
differ = [k for k in keys if direct.get(k) != kfp.get(k)]
for k in keys:
    print(f"  {k:<28} direct={direct.get(k)!r:<24} kfp-docker={kfp.get(k)!r}{'   <- differs' if k in differ else ''}")
print(f"{len(keys) - len(differ)} of {len(keys)} metrics equal" + (f"; differ: {', '.join(differ)}" if differ else ""))
EOF
)
echo "$comparison"

result=FAIL
if [ "$owners" -gt 0 ] && ! grep -q "differ:" <<< "$comparison"; then result=PASS; fi
total_seconds=$(( $(date +%s) - started ))
{
    echo "date:          $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(nproc) cores; podman $(podman --version | awk '{print $3}')"
    echo "image:         $image (user $(podman image inspect --format '{{.Config.User}}' "$image"))"
    echo "direct run:    ${direct_seconds} s"
    echo "kfp-docker:    ${kfp_seconds} s, $owners path(s) written by uid 1000"
    echo "tasks:         $tasks"
    echo "metrics:       $(tail -n 1 <<< "$comparison")"
    echo "total:         ${total_seconds} s"
    echo "RESULT:        $result"
} | tee "$work/result.txt"
[ "$result" = PASS ]
