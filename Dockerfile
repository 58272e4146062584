# syntax=docker/dockerfile:1
#
# The `tenure` container image, a drop-in for gcr.io/google_containers/leader-elector:0.5.
# Why this shape: one static musl binary in an empty image (no shell, no libc, nothing else to
# patch), run as a non-root user, with ENTRYPOINT `tenure elect` so that manifests written for
# leader-elector:0.5 keep their `args` (--election=... --http=... --election-namespace=...
# --ttl=...).
# deploy/check-image-build.sh runs the same build natively, where no Docker engine is at hand.
#
#   docker build -t tenure:latest .
#
# Builds for x86_64 (linux/amd64) only.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
# musl-tools gives musl-gcc, the C compiler the cc crate uses for the musl target. The workspace
# is Rust only today, but a dependency that compiles C (ring, under rustls, for the Kubernetes
# client) needs it; without it such a build fails with "failed to find tool musl-gcc".
# Not version-pinned: the image tag fixes the Debian release, and a pinned package version would
# break the build at Debian's next point release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile sidecar --locked --target x86_64-unknown-linux-musl --bin tenure -p tenure-cli \
 && install -D -m 0755 target/x86_64-unknown-linux-musl/sidecar/tenure /out/tenure \
 && mkdir -m 1777 /out/tmp

FROM scratch
COPY --from=build /out/tenure /tenure
# A writable /tmp, for the file lock's default place when the image is tried outside Kubernetes.
COPY --from=build /out/tmp /tmp
# CA roots, for TLS to servers whose CA is not given explicitly (in a cluster, the API server's CA
# comes from the service account instead).
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/tenure", "elect"]
