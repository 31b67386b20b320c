# trioha in a container: the CLI as entry point, running as a non-root user, the store on a volume.
#
#   docker build -t trioha .
#   docker run --rm -v trioha-store:/var/lib/trioha -p 10911:10911 -p 10912:10912 trioha \
#       master --store-dir /var/lib/trioha/store --listen 0.0.0.0:10911 --ha-listen 0.0.0.0:10912
#
# compose.yaml runs a name server, a SYNC_MASTER and a slave from this image.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY trioha ./trioha
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[metrics,fast]"

FROM python:3.11-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/trioha --create-home trioha
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links /wheels "trioha[metrics,fast]" && rm -rf /wheels
USER trioha
WORKDIR /var/lib/trioha
VOLUME ["/var/lib/trioha"]
# 9876 name server, 10911 broker (clients), 10912 HA, 10909 VIP channel, 9100 metrics
EXPOSE 9100 9876 10909 10911 10912
# SIGTERM stops a broker cleanly: store closed, abort marker removed.
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "trioha"]
CMD ["--help"]
