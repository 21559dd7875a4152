#!/usr/bin/env bash
# Proves the step image's Dataflow-worker contract without Dataflow: preprocess and serialize of
# the bundled demo graph with `preprocess.engine: beam` on Beam's PortableRunner
# (job_endpoint=embed, environment_type=DOCKER, environment_config=IMAGE), so that every SDK
# harness runs in a container of IMAGE started through its entry point and Beam's boot program,
# as Dataflow starts its workers; the published outputs are compared byte for byte with the
# local engine's (containers/dataflow_worker_check.py). Run as root from the repository:
#
#   containers/check_dataflow_worker.sh [IMAGE] [WORKDIR]
#   # defaults: localhost/gnnflow-check/step:cpu (containers/check_image.sh builds it),
#   #           /var/tmp/gnnflow-dataflow-check
#
# No Docker daemon is needed: a `docker` script first on PATH runs podman with the runc runtime
# and ulimits this machine allows (CONTAINERS_CONF), logs every command Beam issues, and gives
# each `docker run` two things Dataflow provides otherwise: a label (the containers Beam leaves
# behind are removed at the end) and WORKDIR bind-mounted at the same path (Dataflow workers
# share GCS with the launcher; here the demo's files are local). Files are created group-writable
# (umask 002): the image's user is uid 1000 in group 0. The Beam run is made once as the image's
# user and once more for each uid in AS_USERS (default 0: root, the user Dataflow runs boot as;
# the wrapper then adds `--user 0` to Beam's `docker run`), each compared with the local run.
# Prints the `docker run` commands Beam issued (and what the wrapper ran), the containers' users
# and boot log lines (every container's log is kept in WORKDIR/container-logs/), the durations
# and PASS or FAIL (also in WORKDIR/result.txt); exits non-zero on FAIL.
# Environment: PYTHON (default .venv/bin/python), AS_USERS (default "0"; "" for the image's user
# only), KEEP=1 (keep WORKDIR's outputs).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
image=${1:-localhost/gnnflow-check/step:cpu}
work=${2:-/var/tmp/gnnflow-dataflow-check}
python=${PYTHON:-$repo/.venv/bin/python}
label=gnnflow-dataflow-check
read -r -a as_users <<< "${AS_USERS-0}"
started=$(date +%s)

die() { echo "check_dataflow_worker.sh: FAILED: $*" >&2; exit 1; }
step() { echo; echo "==> [$(date -u +%H:%M:%S)] $*"; }

# shellcheck source=containers/podman_common.sh
source "$repo/containers/podman_common.sh"
podman_prerequisites "$image" "$python"

rm -rf "$work"
mkdir -p "$work/bin" "$work/data"
chmod 2775 "$work/data"
write_containers_conf "$work/containers.conf"
cat > "$work/bin/docker" <<EOF
#!/usr/bin/env bash
# docker → podman for Beam's DockerSdkWorkerHandler; see containers/check_dataflow_worker.sh.
echo "docker \$*" >> "$work/docker-commands.log"
export CONTAINERS_CONF="$work/containers.conf"
if [ "\${1:-}" = run ]; then
    shift
    set -- run --label $label --volume "$work/data:$work/data" \${GNNFLOW_DOCKER_USER:+--user "\$GNNFLOW_DOCKER_USER"} "\$@"
    echo "  → podman \$*" >> "$work/docker-commands.log"
fi
exec podman "\$@"
EOF
chmod 755 "$work/bin/docker"

cleanup() {
    mapfile -t left < <(podman ps -a -q --filter "label=$label")
    if [ "${#left[@]}" -gt 0 ]; then
        podman rm -f "${left[@]}" > /dev/null 2>&1 || true
        echo "removed ${#left[@]} container(s) Beam left behind"
    fi
}
trap cleanup EXIT
cleanup

step "image $image: user $(podman image inspect --format '{{.Config.User}}' "$image"), entry point $(podman image inspect --format '{{json .Config.Entrypoint}}' "$image")"
podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$image" | grep -E '^RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT=' \
    || echo "(the image does not set RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT)"

step "preprocess + serialize of the demo graph: local engine, then Beam PortableRunner with the DOCKER environment"
run_started=$(date +%s)
status=0
(
    umask 0002
    cd "$repo"
    PATH="$work/bin:$PATH" "$python" containers/dataflow_worker_check.py "$image" "$work/data" "${as_users[@]}"
) 2>&1 | tee "$work/run.log" || status=$?
run_seconds=$(( $(date +%s) - run_started ))

step "what Beam ran"
grep -A1 -E '^docker run ' "$work/docker-commands.log" 2> /dev/null | grep -v '^--$' || echo "(Beam ran no docker run)"
runs=$(grep -c '^docker run ' "$work/docker-commands.log" 2> /dev/null || true)
echo "($runs docker run command(s) in all: $work/docker-commands.log)"

step "the SDK containers: users and boot's log lines (first container of each user)"
mapfile -t containers < <(podman ps -a -q --filter "label=$label")
mkdir -p "$work/container-logs"
booted=0
declare -A shown=() users=()
for container in "${containers[@]}"; do
    user=$(podman inspect --format '{{.Config.User}}' "$container" 2> /dev/null || echo '?')
    podman logs "$container" > "$work/container-logs/$container.log" 2>&1 || true
    users[$user]=$(( ${users[$user]:-0} + 1 ))
    if grep -qE 'Provision info|Initializing python harness|Executing Python' "$work/container-logs/$container.log"; then
        booted=$((booted + 1))
    fi
    if [ -z "${shown[$user]:-}" ]; then
        shown[$user]=1
        echo "-- container ${container:0:12}, user ${user:-(the image user)}: $(wc -l < "$work/container-logs/$container.log") log lines; boot's:"
        grep -vE '^(pipeline_options|[[:space:]]*$)' "$work/container-logs/$container.log" | grep -E '^[0-9]{4}/[0-9]{2}/[0-9]{2} ' \
            | cut -c1-220 | head -n 12 || true
    fi
done
echo "-- boot's log entries over the Fn API logging service (runner log, DEBUG severity; $(grep -c '^boot: ' "$work/run.log" || true) in all, package lists left out here):"
grep '^boot: ' "$work/run.log" | grep -vE '^boot: ([A-Za-z0-9_.-]+ ?(==|@ )|Python 3\.)' | sort | uniq -c | sort -rn | cut -c1-220 | head -n 20 || true
# Every worker Beam started must have had its SDK harness started by boot.
started_ids=$(grep -oE '^docker run .* --id=[^ ]+' "$work/docker-commands.log" 2> /dev/null | sed 's/.*--id=//' | sort -u || true)
harnessed=0 unharnessed=""
for id in $started_ids; do
    if grep -qF "boot: Executing Python (worker $id): python -m apache_beam.runners.worker.sdk_worker_main" "$work/run.log"; then
        harnessed=$((harnessed + 1))
    else
        unharnessed="$unharnessed $id"
    fi
done
echo "(workers whose SDK harness boot started: $harnessed of $(echo "$started_ids" | grep -c . || true)${unharnessed:+; not:$unharnessed})"
user_counts=$(for u in "${!users[@]}"; do printf '%s as %s; ' "${users[$u]}" "${u:-the image user}"; done)
echo "(${#containers[@]} container(s): ${user_counts:-none}$booted with Beam boot's start-up lines; logs in $work/container-logs/)"

result=FAIL
if [ "$status" = 0 ] && [ "$runs" -gt 0 ] && [ "$booted" = "${#containers[@]}" ] && [ "$harnessed" = "$runs" ] && [ -z "$unharnessed" ]; then
    result=PASS
fi
total_seconds=$(( $(date +%s) - started ))
{
    echo "date:          $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(nproc) cores; podman $(podman --version | awk '{print $3}')"
    echo "image:         $image"
    echo "docker runs:   $runs (SDK harness containers Beam started): ${user_counts:-none}with boot start-up lines: $booted; SDK harness started by boot: $harnessed"
    echo "comparison:    $(grep -E '^(preprocess|serialize)( \([^)]*\))?: ' "$work/run.log" | tr '\n' ';' || true)"
    echo "durations:     $(grep -E '^durations: ' "$work/run.log" | cut -d' ' -f2- || true) (steps, s); run ${run_seconds} s"
    echo "total:         ${total_seconds} s"
    echo "RESULT:        $result"
} | tee "$work/result.txt"
[ -n "${KEEP:-}" ] || rm -rf "$work/data"
[ "$result" = PASS ]
