# Dockerfile — Kiln with every language runtime, on Debian 12.
#
# Stage 1 builds the `kiln` binary with the toolchain rust-toolchain.toml pins; stage 2 is a
# Debian 12 image with the runtimes the jails execute, installed by the same script a host uses
# (scripts/install-runtimes.sh), and the binary. The container must be allowed to create
# namespaces, mount inside them and write cgroups: see docs/container.md (short version:
# `privileged: true`, as in docker-compose.example.yml).
#
#   docker build -t kiln .
#   docker run --privileged --cgroupns=private -p 8000:8000 -e KILN_API_KEY=change-me kiln
#
# Unverified: no Docker engine ran on the machine this was written on (docs/container.md).

# ---- build ----------------------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kiln \
    && install -D -m 0755 target/release/kiln /out/kiln

# ---- runtime --------------------------------------------------------------------------
FROM debian:12-slim
# Runtimes first: the slowest layer, and it changes only with the installer.
COPY scripts/install-runtimes.sh /opt/kiln/install-runtimes.sh
RUN /opt/kiln/install-runtimes.sh \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /root/.cache
# Outside /usr on purpose: jails see the host's /usr (read-only), and need not see Kiln.
COPY --from=build /out/kiln /opt/kiln/kiln
ENV KILN_LISTEN=0.0.0.0:8000 \
    KILN_DATA_DIR=/data
VOLUME /data
EXPOSE 8000
# /health needs no auth; bash's /dev/tcp avoids adding curl to the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000 && printf 'GET /health HTTP/1.0\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["/opt/kiln/kiln"]
CMD ["serve"]
