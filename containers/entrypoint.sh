#!/bin/sh
# The step image's entry point. Dataflow starts an SDK container with Beam's boot flags
# (--id=..., --provision_endpoint=...): those go to Beam's worker boot program, so the image
# doubles as the Dataflow workers' container. A dotted name is a module to run with the image's
# Python: `docker run IMAGE components.preprocess --help`. A program (a path, or a plain name on
# PATH, such as `sh`) runs as given: KFP and Vertex AI replace the entry point with their own
# command, but kfp.local's DockerRunner hands its command (`sh -ec ...`) to the entry point.
set -e
case "${1:-}" in
  --*)
    boot="${BEAM_BOOT:-/opt/apache/beam/boot}"
    if [ ! -x "$boot" ]; then
      echo "gnnflow-entrypoint: no Beam boot program at $boot: this image was built with BEAM_BOOT=none" \
        "(containers/Dockerfile), so it cannot be a Beam SDK worker container" >&2
      exit 1
    fi
    exec "$boot" "$@" ;;
  "") exec python -m pipelines.cli --help ;;
  */*) exec "$@" ;;
  *.*) exec python -m "$@" ;;
  *)
    if command -v "$1" > /dev/null 2>&1; then exec "$@"; fi
    exec python -m "$@" ;;
esac
