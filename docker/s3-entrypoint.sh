#!/usr/bin/env bash
# A one-node Ceph cluster serving S3 through the RADOS Gateway: the artifact store of docker-compose.yml's
# "s3" profile (the same gateway the tests run, tests/s3server.py). State lives in S3_DATA_DIR (a volume),
# so objects survive restarts. The S3 user's keys come from S3_ACCESS_KEY / S3_SECRET_KEY.
# Authentication inside the cluster is off: monitor and OSD listen on 127.0.0.1 only; the gateway on
# S3_PORT (all interfaces: it is what the workers and clients reach).
set -euo pipefail
DIR=${S3_DATA_DIR:-/var/lib/flexdsa-s3}
PORT=${S3_PORT:-7480}
MON_PORT=${S3_MON_PORT:-3300}
BLOCK_GIB=${S3_BLOCK_GIB:-100}
: "${S3_ACCESS_KEY:?set S3_ACCESS_KEY}" "${S3_SECRET_KEY:?set S3_SECRET_KEY}"
CONF=$DIR/ceph.conf
mkdir -p "$DIR"/run "$DIR"/log "$DIR"/mon/ceph-a "$DIR"/osd/ceph-0

if [ ! -f "$CONF" ]; then
  cat > "$CONF" <<CONF
[global]
fsid = $(cat /proc/sys/kernel/random/uuid)
mon host = [v2:127.0.0.1:$MON_PORT]
mon initial members = a
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
ms mon client mode = crc secure
ms client mode = crc secure
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd pool default pg num = 16
osd pool default pgp num = 16
mon max pg per osd = 1000
osd crush chooseleaf type = 0
mon osd full ratio = .99
mon osd backfillfull ratio = .98
mon osd nearfull ratio = .97
mon data avail crit = 1
mon data avail warn = 2
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon data = $DIR/mon/\$cluster-\$id
osd data = $DIR/osd/\$cluster-\$id
keyring = $DIR/keyring
osd objectstore = bluestore
bluestore block path = $DIR/osd/\$cluster-\$id.block
bluestore block create = true
bluestore block size = $((BLOCK_GIB << 30))
bluestore block db create = false
bluestore block wal create = false
osd memory target = 939524096
client mount timeout = 60

[client.rgw]
rgw frontends = beast endpoint=0.0.0.0:$PORT
rgw thread pool size = 128
CONF
fi

pids=()
stop() {
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "${pids[@]}" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "${pids[@]}" 2>/dev/null || true  # radosgw may wait minutes for in-flight requests
}
trap stop TERM INT

if [ ! -f "$DIR/mon/ceph-a/kv_backend" ]; then
  fsid=$(awk '/^fsid/ {print $3}' "$CONF")
  ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  monmaptool --create --clobber --addv a "[v2:127.0.0.1:$MON_PORT]" --fsid "$fsid" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap"
fi
ceph-mon -f -c "$CONF" -i a & pids+=($!)
ceph -c "$CONF" --connect-timeout 60 status >/dev/null

if [ ! -f "$DIR/osd/ceph-0/whoami" ]; then
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph -c "$CONF" osd new "$uuid")
  ceph-osd -c "$CONF" -i "$id" --mkfs --osd-uuid "$uuid"
fi
ceph-osd -f -c "$CONF" -i 0 & pids+=($!)
until ceph -c "$CONF" osd dump -f json | grep -q '"up":1'; do sleep 1; done

radosgw -f -c "$CONF" -n client.rgw & pids+=($!)
until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do sleep 1; done
if ! radosgw-admin -c "$CONF" user info --uid flexdsa >/dev/null 2>&1; then
  radosgw-admin -c "$CONF" user create --uid flexdsa --display-name Flex-DSA \
    --access-key "$S3_ACCESS_KEY" --secret "$S3_SECRET_KEY" >/dev/null
fi
echo "S3 ready on port $PORT"
# Any daemon that exits takes the container down with it, for the restart policy to bring it back.
wait -n "${pids[@]}"
stop
exit 1
