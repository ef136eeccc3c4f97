#!/usr/bin/env bash
# The object-store tests run against Ceph's RADOS Gateway (radosgw) on a private one-node cluster that
# tests/s3server.py starts. Install Debian's packages when they are missing.
set -euo pipefail
if command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "Ceph's radosgw is missing: install Debian's packages (sudo apt-get install -y --no-install-recommends radosgw ceph-mon ceph-osd)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends radosgw ceph-mon ceph-osd >/dev/null
command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null
