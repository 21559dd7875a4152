# Shared by the podman evidence scripts (check_dataflow_worker.sh, check_kfp_docker.sh): the
# tools they need, and the containers.conf that makes plain `podman run` work on machines whose
# cgroups and rlimits refuse podman's default runtime (crun): runc, and ulimits no higher than
# the machine's (../shared/STACK.md). Source it after defining die().

# podman_prerequisites IMAGE PYTHON
podman_prerequisites() {
    [ "$(id -u)" = 0 ] || die "run as root (podman storage)"
    command -v podman > /dev/null || die "podman is not installed (apt-get install -y podman runc)"
    command -v runc > /dev/null || die "runc is not installed (apt-get install -y runc): podman's default crun fails here"
    [ -x "$2" ] || die "no $2: run make setup (or set PYTHON)"
    podman image exists "$1" || die "no image $1: build it with containers/check_image.sh"
}

# write_containers_conf FILE
write_containers_conf() {
    cat > "$1" <<'CONF'
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]

[engine]
runtime = "runc"
CONF
}
