"""Fixtures for tests on the real Redis and PostgreSQL servers of this machine
(EMBER_REDIS_URL, EMBER_POSTGRES_URL; a missing service fails, it does not skip)."""

import importlib.util
import os
import uuid

import psycopg
import pytest
import redis

from ember.bench.memory import RssSampler
from ember.connectors.external import postgres_url, redis_url


@pytest.fixture
def r():
    client = redis.Redis.from_url(redis_url())
    client.ping()
    return client


@pytest.fixture
def prefix(r):
    name = f"ember:test:{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(r.scan_iter(f"{name}*"))
    if keys:
        r.delete(*keys)


@pytest.fixture
def table():
    name = f"ember_test_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(postgres_url(), autocommit=True) as conn:
        conn.execute(f'drop table if exists "{name}"')


@pytest.fixture
def rss_sampler():
    return RssSampler


EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


@pytest.fixture
def load_example():
    """``load_example("name")``: the module of ``examples/name.py``, loaded fresh (not run as a script)."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
