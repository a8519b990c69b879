# The countlimit service: a static binary in an otherwise empty image, run
# as an unprivileged user (65532), serving on 0.0.0.0:8080.
#
# From source, on the official Go image (needs a registry; Docker's default
# builder, BuildKit, skips the prebuilt stage):
#
#	docker build -t countlimit .
#
# Offline, from a binary built on the host (how CI builds it):
#
#	CGO_ENABLED=0 go build -trimpath -o bin/countlimit ./cmd/countlimit
#	cp /etc/ssl/certs/ca-certificates.crt bin/
#	docker build --target prebuilt -t countlimit .
#
# Beyond loopback the API needs a bearer token (or --insecure, to serve
# without one); /healthz never does:
#
#	docker run -p 8080:8080 -e COUNTLIMIT_TOKEN="$(openssl rand -hex 32)" \
#		countlimit serve --store 'postgres://user:pass@db/app' --migrate
#
# No HEALTHCHECK: the image has no shell or HTTP client to run one with.
# Probe GET /healthz from outside (a Kubernetes httpGet probe, a load
# balancer): 200 while the store answers, 503 otherwise.

FROM scratch AS runtime
# serve's default --addr; loopback would be unreachable from outside.
ENV COUNTLIMIT_ADDR=0.0.0.0:8080
EXPOSE 8080
USER 65532:65532
ENTRYPOINT ["/countlimit"]
CMD ["serve"]

FROM runtime AS prebuilt
COPY bin/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY bin/countlimit /countlimit

FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o /out/countlimit ./cmd/countlimit

FROM runtime
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/countlimit /countlimit
