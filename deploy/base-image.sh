#!/usr/bin/env bash
# A Debian bookworm base image made from Debian's packages alone, for machines that reach no image registry:
# debootstrap (minbase, plus python3, its venv module and libpython, which the python backend stub links) into a folder, then `docker import`. The host's extra
# certificate authorities (/usr/local/share/ca-certificates: a company's proxy, say) are trusted inside too, so
# pip reaches the package index from where the host does.
#   deploy/base-image.sh [NAME]    (default accscale-base:bookworm; needs root, debootstrap and docker)
# An image of that name already there is kept: delete it to make it again.
set -euo pipefail
name=${1:-accscale-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$name" >/dev/null 2>&1; then
  echo "== $name exists"; exit 0
fi
for tool in debootstrap docker; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    if [ "$tool" = debootstrap ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      echo "== installing debootstrap (apt-get)"; apt-get install -y -q debootstrap >/dev/null
    else
      echo "make image needs $tool: install it (Debian/Ubuntu: sudo apt-get install ${tool/docker/docker.io}), or build on a" \
           "base from a registry: make image BASE=python:3.11-slim" >&2
      exit 1
    fi
  fi
done
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "== debootstrap bookworm into $root"
debootstrap --variant=minbase --include=python3,python3-venv,libpython3.11,ca-certificates bookworm "$root" "$mirror" >"$root.log" 2>&1 \
  || { tail -20 "$root.log"; exit 1; }
rm -f "$root.log"
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
# pip trusts certifi's bundle, not the system's: point it at the system's, which now has the host's authorities
tar -C "$root" -c . | docker import \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' - "$name"
echo "== made $name"
