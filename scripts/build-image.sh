#!/usr/bin/env bash
# Builds the tritond CPU image (localhost/tritond:latest) without pulling from a registry:
# the base is a Debian root filesystem made by debootstrap from Debian's packages, imported
# into podman once (localhost/tritond-base:bookworm); then the Containerfile builds on it
# (the set-up inside installs from PyPI). Needs root, podman and debootstrap
# (apt-get install podman debootstrap). Prints how long each part took.
# Usage: bash scripts/build-image.sh [--rebuild-base] [extra podman build arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=localhost/tritond-base:bookworm
IMAGE=${TRITOND_IMAGE:-localhost/tritond:latest}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is not installed (apt-get install $tool)" >&2; exit 1; }
done
if [ "${1:-}" = "--rebuild-base" ]; then
  shift
  podman image rm -f "$BASE" >/dev/null 2>&1 || true
fi
start=$(date +%s)
if ! podman image exists "$BASE"; then
  rootfs=$(mktemp -d /var/tmp/tritond-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 \
    || { tail -20 "$rootfs.log" >&2; exit 1; }
  rm -f "$rootfs.log"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  echo "build-image: base $BASE made in $(( $(date +%s) - start ))s"
fi
mid=$(date +%s)
opts=$(bash scripts/podman-opts.sh "$BASE") || exit 1
# A host that reaches PyPI through a TLS-inspecting proxy names its CA bundle in PIP_CERT:
# the set-up inside the build uses it too (mounted for the build only, not in the image).
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  opts="$opts --volume $PIP_CERT:/run/tritond-build-ca.pem:ro --build-arg PIP_CERT=/run/tritond-build-ca.pem"
fi
# shellcheck disable=SC2086
podman build --pull=never --network=host $opts --build-arg BASE="$BASE" -t "$IMAGE" -f Containerfile "$@" .
echo "build-image: $IMAGE built in $(( $(date +%s) - mid ))s (total $(( $(date +%s) - start ))s)"
