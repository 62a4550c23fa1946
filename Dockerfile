# syntax=docker/dockerfile:1
# Mailroom's image: the product only (no dev group), installed from uv.lock as a wheel.
# `docker build -t mailroom .` then `docker run mailroom worker`; docker-compose.yml runs every
# process from it. The same install is smoke-tested in CI (.ci/run, mailroom.devtools.prod_smoke).

# The builder and the runtime share one Python at /usr/local/bin: the venv's interpreter link
# points there, so both stages must be the same Python release on the same Debian.
FROM ghcr.io/astral-sh/uv:python3.11-bookworm-slim AS builder
# Bytecode now, so containers on a read-only filesystem start without writing .pyc;
# copy, since the uv cache is a mount that the venv must not link into.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=0
WORKDIR /app
# Dependencies first: this layer survives every change to Mailroom's own code.
RUN --mount=type=cache,target=/root/.cache/uv \
    --mount=type=bind,source=uv.lock,target=uv.lock \
    --mount=type=bind,source=pyproject.toml,target=pyproject.toml \
    uv sync --locked --no-dev --no-install-project --no-editable
COPY . /app
# --no-editable: Mailroom goes into the venv as a built wheel, so the runtime needs no checkout.
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-editable

FROM python:3.11-slim-bookworm
# A fixed numeric id, so orchestrators can check runAsNonRoot without resolving names.
RUN groupadd --system --gid 10001 mailroom \
    && useradd --system --uid 10001 --gid mailroom --home-dir /var/lib/mailroom \
       --create-home --shell /usr/sbin/nologin mailroom
# Owned by root: the app user can run the code but not change it.
COPY --from=builder /app/.venv /app/.venv
ENV PATH="/app/.venv/bin:$PATH" \
    PYTHONUNBUFFERED=1 \
    MAILROOM_STATE_DIR=/var/lib/mailroom
WORKDIR /var/lib/mailroom
USER 10001:10001
ENTRYPOINT ["mailroom"]
CMD ["--help"]
