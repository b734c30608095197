# One image for every process of the control plane: web (manage.py serve), workers, reaper.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DJANGO_SETTINGS_MODULE=controlplane.settings

WORKDIR /app

# Dependencies first, so code changes do not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

# Only what runs (no virtualenv, database file or tests from the build context).
COPY manage.py ./
COPY controlplane ./controlplane
COPY jobs ./jobs
COPY workers ./workers
COPY dashboard ./dashboard
COPY templates ./templates
# Bytecode now: PYTHONDONTWRITEBYTECODE keeps processes from writing it, so without
# this every worker, reaper and web process compiles ~70 modules at each start
# (about 0.2 s of CPU before a worker can claim).
RUN python -m compileall -q manage.py controlplane jobs workers dashboard

RUN useradd --create-home --uid 10001 app && chown -R app /app
USER app

EXPOSE 8000

# The web process; docker-compose.yml runs the workers and the reaper from this image too.
CMD ["python", "manage.py", "serve", "--host", "0.0.0.0", "--port", "8000"]
