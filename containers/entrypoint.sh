#!/bin/sh
# The step image's entry point. Dataflow starts an SDK container with Beam's boot flags
# (--id=..., --provision_endpoint=...): those go to Beam's worker boot program, so the image
# doubles as the Dataflow workers' container. Anything else names a module to run with the
# image's Python: `docker run IMAGE components.preprocess --help`. KFP and Vertex AI set their
# own command and never reach this script.
set -e
case "${1:-}" in
  --*) exec "${BEAM_BOOT:-/opt/apache/beam/boot}" "$@" ;;
  "") exec python -m pipelines.cli --help ;;
  *) exec python -m "$@" ;;
esac
