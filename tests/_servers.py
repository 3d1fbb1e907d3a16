"""Real PostgreSQL and Redis servers for the backend tests (no mocks of their clients).

Each server comes from an environment variable or is started for the test session:

- PostgreSQL: ``CTXSCORE_PG_DSN`` (a ``postgresql://`` URL of a database the user may create
  schemas in), else a throwaway cluster: ``initdb`` into a temporary folder and ``pg_ctl`` on a free
  loopback port (as the ``postgres`` user when the tests run as root: PostgreSQL refuses root).
- Redis: ``CTXSCORE_REDIS_URL``, else ``redis-server --port N --save ''`` on a free loopback port.

Every test gets its own PostgreSQL schema (dropped afterwards) and Redis key prefix (deleted
afterwards). Without a server the tests are skipped with the reason; with ``CI=true`` a missing
server fails them instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ENV = "CTXSCORE_PG_DSN"
REDIS_ENV = "CTXSCORE_REDIS_URL"


def in_ci() -> bool:
    """True when ``CI`` is set to true/1/yes (a missing server is then a failure)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def unavailable(reason: str) -> None:
    """Skip the test with ``reason``, or fail it under ``CI=true``."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true: the backend servers must be there)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


def _run_as(user: str | None, args: list[str], **kw) -> subprocess.CompletedProcess:
    if user is not None:
        args = ["runuser", "-u", user, "--", *args]
    return subprocess.run(args, capture_output=True, text=True, **kw)


class ThrowawayPostgres:
    """A PostgreSQL cluster in a temporary folder on a free port (trust auth on loopback)."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            raise RuntimeError(f"no PostgreSQL server binaries (initdb, pg_ctl) and no {PG_ENV}; install "
                               "postgresql (apt-get install postgresql) or set the variable")
        self.user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("tests run as root and there is no 'postgres' user to run PostgreSQL as "
                                   f"(it refuses root); set {PG_ENV}") from None
            self.user = "postgres"
        self.dir = Path(tempfile.mkdtemp(prefix="ctxscore-pg-"))
        if self.user:
            shutil.chown(self.dir, self.user)
        self.port = free_port()
        data = self.dir / "data"
        r = _run_as(self.user, [self.initdb, "-D", str(data), "-U", "ctxscore", "--auth=trust", "-E", "UTF8",
                                "--locale=C.UTF-8", "--no-sync"], timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-500:]}")
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c max_connections=200"
        r = _run_as(self.user, [self.pg_ctl, "-D", str(data), "-o", opts, "-l", str(self.dir / "log"), "-w",
                                "-t", "60", "start"], timeout=90)
        if r.returncode != 0:
            log = (self.dir / "log").read_text(errors="replace")[-800:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log}")
        self.dsn = f"postgresql://ctxscore@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        _run_as(self.user, [self.pg_ctl, "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"], timeout=60)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A reachable PostgreSQL URL (``CTXSCORE_PG_DSN`` or a throwaway cluster)."""
    try:
        import psycopg
    except ImportError:
        unavailable("psycopg is not installed (pip install '.[postgres]')")
    env = os.environ.get(PG_ENV)
    if env:
        try:
            psycopg.connect(env, connect_timeout=5).close()
        except psycopg.Error as exc:
            unavailable(f"{PG_ENV}={env.split('@')[-1]} is not reachable: {str(exc).strip().splitlines()[0]}")
        yield env
        return
    try:
        server = ThrowawayPostgres()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        unavailable(str(exc))
    try:
        yield server.dsn
    finally:
        server.stop()


def with_query(url: str, **params: str) -> str:
    """``url`` with query parameters added."""
    sep = "&" if "?" in url else "?"
    return url + sep + "&".join(f"{k}={v}" for k, v in params.items())


@pytest.fixture
def pg_url(pg_dsn: str) -> Iterator[str]:
    """A store URL in a fresh schema of its own (dropped after the test)."""
    import psycopg

    schema = "t_" + uuid.uuid4().hex[:12]
    yield with_query(pg_dsn, schema=schema)
    try:
        with psycopg.connect(pg_dsn, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    except psycopg.Error:
        pass


class ThrowawayRedis:
    """``redis-server`` on a free loopback port, nothing saved to disk."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if not exe:
            raise RuntimeError(f"no redis-server binary and no {REDIS_ENV}; install redis-server "
                               "(apt-get install redis-server) or set the variable")
        self.port = free_port()
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        import redis

        end = time.monotonic() + 20
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.RedisError:
                if time.monotonic() > end or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    """A reachable Redis URL (``CTXSCORE_REDIS_URL`` or a throwaway server)."""
    try:
        import redis
    except ImportError:
        unavailable("redis-py is not installed (pip install '.[postgres]')")
    env = os.environ.get(REDIS_ENV)
    if env:
        try:
            redis.Redis.from_url(env, socket_connect_timeout=5).ping()
        except redis.RedisError as exc:
            unavailable(f"{REDIS_ENV}={env} is not reachable: {exc}")
        yield env
        return
    try:
        server = ThrowawayRedis()
    except (RuntimeError, OSError) as exc:
        unavailable(str(exc))
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_prefix(redis_server_url: str) -> Iterator[str]:
    """A key prefix of the test's own; its keys are deleted after the test."""
    import redis

    prefix = "ctxtest-" + uuid.uuid4().hex[:10]
    yield prefix
    client = redis.Redis.from_url(redis_server_url)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
