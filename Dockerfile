# syntax=docker/dockerfile:1
# kvmesh container image: one static binary on distroless, run as non-root.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t kvmesh:dev .
#
# The same image is described for ko in .ko.yaml; keep the two in step
# (base image, -trimpath, CGO_ENABLED=0, the ldflags).

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
# .git is not in the build context (.dockerignore), so VCS stamping is off
# and VERSION is what `kvmesh version` prints.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS:-linux} GOARCH=${TARGETARCH} \
    go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/kvmesh ./cmd/kvmesh

# distroless/static carries CA certificates, /etc/passwd with "nonroot"
# (65532) and tzdata, and nothing else: no shell, no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvmesh /usr/local/bin/kvmesh
USER 65532:65532
# 8000: frontend HTTP API; 9000: worker gRPC; 9100: worker control
# endpoint (peer KV transfer, +1 per DP rank); 9090: worker /metrics.
EXPOSE 8000 9000 9100 9090
ENTRYPOINT ["kvmesh"]
CMD ["--help"]
