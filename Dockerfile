# syntax=docker/dockerfile:1
#
# dra-claim-controller container image.
#
#   docker build -t ghcr.io/dra-claim-controller/dra-claim-controller:0.1.0 .
#
# The dependency graph is compiled in a layer of its own (cargo-chef), which
# stays cached until Cargo.toml or Cargo.lock change; the runtime image is
# distroless (glibc, CA certificates, no shell) and runs as uid/gid 65532.

FROM rust:1.95-bookworm AS chef
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0
RUN cargo install cargo-chef --version 0.1.78 --locked
WORKDIR /build

# Reduce the workspace to a recipe: manifests, lockfile and target layout.
FROM chef AS planner
COPY . .
RUN cargo chef prepare --recipe-path recipe.json --bin dra-claim-controller

FROM chef AS builder
COPY --from=planner /build/recipe.json recipe.json
# Dependency layer: rebuilt only when the recipe changes.
RUN cargo chef cook --release --locked --recipe-path recipe.json --bin dra-claim-controller
# Application layer.
COPY . .
RUN cargo build --release --locked --bin dra-claim-controller \
 && install -D -m 0755 target/release/dra-claim-controller /out/dra-claim-controller

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="dra-claim-controller" \
      org.opencontainers.image.description="Dynamic Resource Allocation ResourceClaim lifecycle controller (resource.k8s.io/v1)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/dra-claim-controller /usr/local/bin/dra-claim-controller
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/dra-claim-controller"]
