"""The shared failure database: a counterexample found by one runner replays first on another.

Starts a real `redis-server` on a free loopback port (no persistence) and stops it at
teardown; skipped when `redis-server` or the `redis` Python package is missing.
"""

import shutil
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, MultiplexedDatabase

from rs_verify.engine import database, runner
from rs_verify.properties import Property, PropertyFailure

pytest_plugins = ["pytester"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install -y redis-server)")
    try:
        import redis
    except ImportError:
        pytest.skip("the redis Python package is not installed (pip install 'rs-verify[redis]')")
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield url
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Toy:
    name = "toy-sampler"


def _toy_property(calls: list) -> Property:
    """Fails for x >= 1000 (shrinks to exactly 1000); the simplest input, 0, passes."""

    def check(ctx, x):
        calls.append(x)
        if x >= 1000:
            raise PropertyFailure(f"x = {x} >= 1000")

    return Property("toy_shared_failure", "toy", "toy", check, strategy=lambda ctx: st.integers(0, 2**20))


def _run(prop, db):
    ctx = runner.make_context(_Toy(), profile="dev", device="cpu")
    base = settings(max_examples=300, derandomize=False, deadline=None, database=db)
    return runner.run(prop, ctx, base)


def test_a_failure_found_on_one_runner_replays_first_on_another(redis_url, tmp_path):
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    calls = []
    prop = _toy_property(calls)

    # Control: a runner with only a fresh local database does not start with the failure.
    first = _run(prop, DirectoryBasedExampleDatabase(tmp_path / "control"))
    assert first.status == "failed" and calls[0] < 1000 and calls.index(next(c for c in calls if c >= 1000)) > 0

    # Runner 1 finds the failure and shrinks it; the shared database records it in Redis and locally.
    calls.clear()
    res1 = _run(prop, database.shared_database(redis_url, local_dir=str(tmp_path / "runner1")))
    assert res1.status == "failed" and "x = 1000 " in res1.message + " "
    keys = client.keys(database.KEY_PREFIX + b"*")
    assert keys, "the failing example was not written to Redis"
    stored = set().union(*(client.smembers(k) for k in keys if client.type(k) == b"set"))
    assert stored, "Redis holds no example"
    assert any((tmp_path / "runner1").rglob("*")), "the local directory database was not written too"

    # Runner 2: another machine (its own empty local database), same Redis: the first call fails.
    calls.clear()
    res2 = _run(prop, database.shared_database(redis_url, local_dir=str(tmp_path / "runner2")))
    assert res2.status == "failed"
    assert calls[0] == 1000, f"first input was {calls[0]}, not the shared counterexample"


def test_url_overrides_a_profile_without_database(redis_url):
    settings.register_profile("rs-verify-redis-test", parent=settings.get_profile("ci"))
    assert settings.get_profile("rs-verify-redis-test").database is None
    db = database.apply(redis_url, profiles=["rs-verify-redis-test"])
    got = settings.get_profile("rs-verify-redis-test").database
    assert got is db and isinstance(got, MultiplexedDatabase)
    assert settings.get_profile("ci").database is None  # only the named profiles were touched


def test_unreachable_server_is_a_clear_error():
    with pytest.raises(database.DatabaseError, match="cannot reach"):
        database.redis_database(f"redis://127.0.0.1:{_free_port()}/0")


def test_env_var_is_the_default(monkeypatch):
    monkeypatch.setenv(database.ENV_VAR, "redis://example:6379/1")
    assert database.redis_url() == "redis://example:6379/1"
    assert database.redis_url("redis://other:1/0") == "redis://other:1/0"
    monkeypatch.delenv(database.ENV_VAR)
    assert database.redis_url() is None


def test_plugin_option_points_every_profile_at_redis(redis_url, pytester):
    """`pytest --rs-redis URL --rs-profile ci`: the ci profile's database=None is overridden."""
    pytester.makepyfile(test_db="""
        from hypothesis import settings
        from hypothesis.database import MultiplexedDatabase

        def test_database():
            assert settings.get_current_profile_name() == "ci"
            db = settings().database
            assert isinstance(db, MultiplexedDatabase), db
            assert any(type(d).__name__ == "RedisExampleDatabase" for d in db._wrapped)
    """)
    result = pytester.runpytest_subprocess("-p", "rs_verify", "--rs-profile", "ci", "--rs-redis", redis_url,
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_cli_check_with_redis(redis_url, tmp_path):
    out = subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", "--sampler", "reference", "--only", "planner",
                          "--profile", "ci", "--device", "cpu", "--redis", redis_url, "--no-bundles"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Redis" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "rs_verify.frontends.cli", "check", "--only", "planner", "--device", "cpu",
                          "--redis", f"redis://127.0.0.1:{_free_port()}/0"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert bad.returncode == 2 and "cannot reach" in bad.stdout + bad.stderr
