# The S3-compatible artifact store for docker-compose.yml's "s3" profile: Ceph's RADOS Gateway on a one-node
# Ceph cluster (Debian's packages; docker/s3-entrypoint.sh sets it up on first start and keeps its state in
# /var/lib/flexdsa-s3). Build from the repository root: docker build -f docker/s3.Dockerfile .
FROM debian:bookworm-slim

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends radosgw ceph-mon ceph-osd \
    && rm -rf /var/lib/apt/lists/*

COPY docker/s3-entrypoint.sh /usr/local/bin/flexdsa-s3
VOLUME /var/lib/flexdsa-s3
EXPOSE 7480
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD bash -c 'exec 3<>/dev/tcp/127.0.0.1/7480'
CMD ["flexdsa-s3"]
