"""`tests/map_limit.py`: a pytest process past half the kernel's mapping limit clears jax's
caches between modules, so its executables are unmapped before LLVM's JIT runs out of
mappings (docs/testing.md, "A worker that ran out of mappings")."""

import jax
import jax.numpy as jnp
import map_limit


def _compiled():
    f = jax.jit(lambda x: x * 3 + 1)
    f(jnp.ones(4)).block_until_ready()
    assert f._cache_size() == 1
    return f


def test_past_half_the_limit_the_caches_are_cleared(monkeypatch):
    monkeypatch.setattr(map_limit, "limit", lambda: 2)  # any process holds more than 1
    f, before = _compiled(), map_limit.STATE["clears"]
    assert map_limit.relieve()
    assert f._cache_size() == 0 and map_limit.STATE["clears"] == before + 1
    assert float(f(jnp.ones(4))[0]) == 4.0  # compiles again


def test_under_half_the_limit_nothing_is_cleared(monkeypatch):
    monkeypatch.setattr(map_limit, "limit", lambda: 10 ** 9)
    f = _compiled()
    assert not map_limit.relieve() and f._cache_size() == 1


def test_the_limit_and_the_count_are_this_machines():
    # Linux's default is 65,530; a process holds at least its own code and stacks
    assert map_limit.limit() > 1000 and 10 < map_limit.mappings() < map_limit.limit()
