# The Prometheus of the compose test: Debian's package on the locally made base (no registry is
# reachable here, so prom/prometheus cannot be pulled). It takes compose.yaml's command as it is.
#   docker build --network=host -f tests/deploy/prometheus.Dockerfile tests/deploy
ARG BASE=debian:bookworm
FROM ${BASE}
# policy-rc.d: the package's scripts must not start a service inside the build.
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \
    && apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus \
    && rm -rf /var/lib/apt/lists/* /usr/sbin/policy-rc.d \
    && install -d -o prometheus -g prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
