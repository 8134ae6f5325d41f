# Dockerfile — Kiln, whose jails run from the default runtime image (docs/runtimes.md).
#
# Stage 1 builds the `kiln` binary with the toolchain rust-toolchain.toml pins; stage 2 is a small
# Debian 12 image with the binary, tini as PID 1 and debootstrap. The language runtimes are not
# installed into the container: its first start builds the default runtime image (Debian 13 with
# every language, resources/runtime/recipe.toml) with `kiln runtime build`, the same command and
# recipe scripts/serve.sh and scripts/test.sh use, into the /var/lib/kiln/runtimes volume (about
# 15 minutes and 4 GB, its progress in the container's log); later starts find it there in well
# under a second, and a Kiln whose recipe changed builds the new one. Kiln builds its own jail for
# every run, so the container must be allowed to create namespaces, mount inside them and write
# its cgroups: docs/container.md lists each privilege and why (compose: docker-compose.example.yml).
#
#   docker build -t kiln .
#   docker run --cap-add SYS_ADMIN --security-opt systempaths=unconfined \
#     --security-opt apparmor=unconfined --cgroupns=private -p 127.0.0.1:8000:8000 \
#     -v kiln_data:/data -v kiln_runtimes:/var/lib/kiln/runtimes kiln
#
# scripts/container-test.sh builds and runs it with podman on a Debian 12 base made by
# debootstrap and runs LibreChat's own client against it (docs/container.md). With podman, build
# with `--format docker`: the OCI image format has no HEALTHCHECK.
#
# The base images are arguments so a registry mirror, or images built locally (as
# scripts/container-test.sh does), can stand in for Docker Hub's.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG BASE_IMAGE=debian:12-slim

# ---- build ----------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kiln \
    && install -D -m 0755 target/release/kiln /out/kiln

# ---- runtime --------------------------------------------------------------------------
FROM ${BASE_IMAGE}
# tini is PID 1: it reaps every orphan that ends up with it (a jail's processes whose parent
# died) and passes SIGTERM on to Kiln, which then drains its runs (shutdown_grace_secs).
# debootstrap (and the CA bundle it fetches with) builds the runtime image at the first start.
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       tini debootstrap ca-certificates \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
# Outside /usr on purpose: jails see the image's /usr (read-only), and need not see Kiln.
COPY --from=build /out/kiln /opt/kiln/kiln
# Makes the container's own cgroup controllers writable when the runtime mounted them read-only
# and the container has CAP_SYS_ADMIN (the narrow privilege set), then execs kiln.
# Then, before `serve`, it builds (or finds) the runtime image.
COPY scripts/container-entrypoint.sh /opt/kiln/entrypoint.sh
ENV KILN_LISTEN=0.0.0.0:8000 \
    KILN_DATA_DIR=/data \
    KILN_RUNTIME_DIR=/var/lib/kiln/runtimes
VOLUME /data
VOLUME /var/lib/kiln/runtimes
EXPOSE 8000
# `kiln health` asks GET /health (no auth) at KILN_LISTEN; no curl needed in the image. The
# start period covers the first start's image build (a start that finds it is healthy at the
# first check, 30 s in).
HEALTHCHECK --interval=30s --timeout=5s --start-period=45m --retries=3 \
    CMD ["/opt/kiln/kiln", "health"]
STOPSIGNAL SIGTERM
# -s: reap orphans even when something else is PID 1 (compose's `init: true`, Kubernetes).
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "/opt/kiln/entrypoint.sh"]
CMD ["serve"]
