# One image for the worker (hashq-worker), the coordinator (hashq-coordinator) and the admin
# command (hashq): the package installed from a wheel built here, run as a user without rights.
#
#   docker build -t hashq:0.1.0 .                          # the runtime image
#   docker build --target example -t hashq-example:0.1.0 . # plus examples/ (compose's demo)
#
# An application adds its handler on top:
#
#   FROM hashq:0.1.0
#   COPY myapp /app/myapp
#   CMD ["hashq-worker", "myapp.jobs:handle"]
#
# (owned by root, so that the user 10001 the processes run as reads the code but cannot change it)
#
# docs/operations.md ("Deploying") says what was checked without a Docker engine.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
RUN pip install --no-cache-dir "build==1.2.2.post1"
COPY pyproject.toml README.md LICENSE ./
COPY hashq ./hashq
COPY coordinator ./coordinator
RUN python -m build --wheel --outdir /wheels

FROM ${PYTHON_IMAGE} AS runtime
# otel: OpenTelemetry's API, so that an application's SDK sees hashq's spans (hashq.tracing);
# uvloop: the faster event loop, HASHQ_EVENT_LOOP=uvloop.
ARG EXTRAS=otel,uvloop
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HASHQ_METRICS_PORT=9471
RUN groupadd --system --gid 10001 hashq \
    && useradd --system --uid 10001 --gid hashq --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin hashq
COPY --from=wheel /wheels /wheels
# DL3013 asks for pinned versions: this is the wheel just built, its dependencies bounded in
# pyproject.toml.
# hadolint ignore=DL3013
RUN wheel="$(ls /wheels/hashq-*.whl)" \
    && pip install --no-cache-dir "${wheel}[${EXTRAS}]" \
    && rm -rf /wheels
WORKDIR /app
USER 10001:10001
# /metrics, /livez and /readyz of a worker or a coordinator (HASHQ_METRICS_PORT).
EXPOSE 9471
# SIGTERM drains (a worker finishes what it holds and releases its buckets); see
# terminationGracePeriodSeconds in deploy/kubernetes/worker.yaml.
STOPSIGNAL SIGTERM
CMD ["hashq", "--help"]

FROM runtime AS example
COPY examples /app/examples
CMD ["hashq-worker", "examples.videos:transcode"]
