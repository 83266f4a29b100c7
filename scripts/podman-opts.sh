#!/usr/bin/env bash
# Prints the extra `podman run`/`podman build` options this host needs, found by trying a
# container from the given image: none on most hosts; on hosts whose cgroups crun cannot use
# (hybrid v1/v2) runc, and where the container may not raise its limits, lower ones.
# Exits 1, saying why, when no container can run here.
set -uo pipefail
image=${1:?usage: podman-opts.sh IMAGE}
candidates=(
  ""
  "--runtime runc"
  "--runtime runc --ulimit nofile=8192:8192 --ulimit nproc=8192:8192"
)
for opts in "${candidates[@]}"; do
  # shellcheck disable=SC2086
  if err=$(podman run --rm --network host $opts --entrypoint true "$image" 2>&1); then
    echo "$opts"
    exit 0
  fi
done
echo "podman-opts: no container can run here: $err" >&2
exit 1
