# syntax=docker/dockerfile:1
# The oncely gateway in a small image: built with the official Rust image, run on
# debian:bookworm-slim as the unprivileged user `oncely`.
#
#   docker build -t oncely .
#   docker run -p 8080:8080 -p 9090:9090 \
#       -v "$PWD/oncely.toml:/etc/oncely/oncely.toml:ro" -v oncely-state:/var/lib/oncely \
#       -e ONCELY_ADMIN_TOKEN=... oncely
#
# The command line puts the gateway on 0.0.0.0:8080 and the admin API (/healthz,
# /metrics) on 0.0.0.0:9090, whatever the config says; the ledger defaults to
# /var/lib/oncely (a volume). `docker kill -s HUP` reloads the config.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p oncely

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system oncely \
    && useradd --system --gid oncely --home-dir /var/lib/oncely --shell /usr/sbin/nologin oncely \
    && install -d -o oncely -g oncely -m 0700 /var/lib/oncely
COPY --from=build /src/target/release/oncely /usr/bin/oncely
COPY deploy/debian/oncely.toml /etc/oncely/oncely.toml
USER oncely
WORKDIR /var/lib/oncely
VOLUME /var/lib/oncely
EXPOSE 8080 9090
STOPSIGNAL SIGTERM
# The image has no curl: bash asks the admin listener's /healthz over /dev/tcp.
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9090 && printf 'GET /healthz HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/usr/bin/oncely"]
CMD ["serve", "--config", "/etc/oncely/oncely.toml", "--listen", "0.0.0.0:8080", "--admin-listen", "0.0.0.0:9090", "--store", "sqlite:///var/lib/oncely/oncely.db"]
