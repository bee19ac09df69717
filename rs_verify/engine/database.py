"""A shared Hypothesis example database, so a counterexample found on one runner replays first
on every other.

Point rs-verify at a Redis server with the environment variable `RS_VERIFY_REDIS_URL`, the
pytest option `--rs-redis=redis://host:port/db` or `rs-verify check --redis URL`. Hypothesis
then reads and writes `hypothesis.extra.redis.RedisExampleDatabase` through a
`MultiplexedDatabase` that also writes the local directory database (`.hypothesis/examples`),
so local replays keep working when the server is away. Without a URL the local directory
database stays the default (the `ci` profile has none at all); a URL overrides every
rs-verify profile, `ci` included.

Needs the `redis` Python package (`pip install "rs-verify[redis]"`), imported only when a URL
is given.
"""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis.configuration import storage_directory
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase, MultiplexedDatabase

from .profiles import PROFILE_NAMES

ENV_VAR = "RS_VERIFY_REDIS_URL"
KEY_PREFIX = b"hypothesis-example:"


class DatabaseError(RuntimeError):
    """The shared database cannot be used (no redis package, server unreachable, bad URL)."""


def redis_url(explicit: str | None = None) -> str | None:
    """The Redis URL in force: `explicit`, else `$RS_VERIFY_REDIS_URL`, else None."""
    url = explicit or os.environ.get(ENV_VAR) or None
    return url.strip() if url else None


def local_directory() -> str:
    """Hypothesis's local example directory (`.hypothesis/examples` unless configured otherwise)."""
    where = storage_directory("examples", intent_to_write=False)
    return str(getattr(where, "path", where))  # a StorageDirectory (Hypothesis >= 6.150) or a path


def redis_database(url: str, *, key_prefix: bytes = KEY_PREFIX, ping: bool = True) -> ExampleDatabase:
    """`RedisExampleDatabase` on the server at `url` (checked with a PING unless `ping=False`)."""
    try:  # lazy: redis is an optional extra (`rs-verify[redis]`)
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError as exc:
        raise DatabaseError(f"a Redis example database needs the redis package: pip install 'rs-verify[redis]' "
                            f"({exc})") from exc
    try:
        client = redis.Redis.from_url(url)
    except ValueError as exc:
        raise DatabaseError(f"bad Redis URL {url!r}: {exc}") from exc
    if ping:
        try:
            client.ping()
        except redis.exceptions.RedisError as exc:
            raise DatabaseError(f"cannot reach the Redis example database at {url}: {exc}") from exc
    return RedisExampleDatabase(client, key_prefix=key_prefix)


def shared_database(url: str, local_dir: str | None = None, **kwargs) -> MultiplexedDatabase:
    """The local directory database and the Redis one, both read and written."""
    local = DirectoryBasedExampleDatabase(local_dir or local_directory())
    return MultiplexedDatabase(local, redis_database(url, **kwargs))


def apply(url: str, *, local_dir: str | None = None, profiles=None, **kwargs) -> ExampleDatabase:
    """Make the shared database at `url` the `database` setting of Hypothesis profiles.

    `profiles` defaults to every rs-verify profile plus the active one; each is
    re-registered with the database (overriding, e.g., the `ci` profile's `None`), and the
    active profile takes the change at once. Returns the database.
    """
    db = shared_database(url, local_dir, **kwargs)
    active = settings.get_current_profile_name()
    names = list(profiles) if profiles is not None else [*PROFILE_NAMES, active]
    for name in dict.fromkeys(names):
        settings.register_profile(name, parent=settings.get_profile(name), database=db)
    settings.load_profile(active)
    return db


def describe(db) -> str:
    """A short description of the database in force, for progress lines."""
    if db is None:
        return "none"
    return type(db).__name__ if not isinstance(db, MultiplexedDatabase) else (
        "local directory + Redis (shared)")
