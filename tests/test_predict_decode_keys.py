"""The cost model's decode reads the keys locojax's engine reads (`phases.Ctx.decode_keys`,
`--kv-read static`): checked against the engine's own cache geometry (`KVCache.empty`) and
block count (`CacheBlocks.count`), not against a restated formula."""

import dataclasses

import numpy as np
import pytest

from locojax.model import config
from locojax.model.attention import BLOCK, CacheBlocks, KVCache
from locojax.predict import hardware, phases
from locojax.predict.workload import Lengths, Workload


def _ctx(prompt: int, new: int, kv_read: str = "static") -> phases.Ctx:
    wl = Workload("w", 4, 4, prompt, new, Lengths.fixed(new, "test"))
    return phases.Ctx(config.tiny(), "tiny", wl, hardware.parse_cluster("v5e-1"),
                      dtype="float32", kv_read=kv_read)


def _engine_keys(prompt: int, new: int, steps: int) -> float:
    """The slots the engine's attention reads per decode step, averaged over `steps` steps:
    its whole cache where the cache is short, else the blocks [0, count) up to the last
    written slot (left padding skipped by `CacheBlocks.first` is counted: the model pads
    every prompt to P)."""
    cache = KVCache.empty(config.tiny(), 1, prompt + new - 1)
    slots, block = cache.v.shape[3], cache.block
    if slots // block <= 5:  # attention.WHOLE_BLOCKS
        return float(slots)
    reads = []
    for i in range(steps):  # step i writes slot P + i, then reads every block up to it
        at = dataclasses.replace(cache, index=np.int32(prompt + i + 1))
        blocks = CacheBlocks(at, np.int32(0), 1)
        reads.append(int(blocks.count) * block)
    return float(np.mean(reads))


@pytest.mark.parametrize("prompt,new", [(16, 32), (48, 96), (128, 128), (192, 256)])
def test_static_reads_what_the_engine_reads(prompt, new):
    """A block count rounds the written slots up to a whole block: on average (b - 1) / 2
    slots past them over whole blocks, never more than b past them; the model adds b / 2, so
    it is within b / 2 + 1 of the engine's mean at any number of steps."""
    keys = _ctx(prompt, new).decode_keys(new - 1)[0]
    engine = _engine_keys(prompt, new, new - 1)
    assert abs(keys - engine) <= BLOCK / 2 + 1, (keys, engine)
    assert keys <= prompt + new - 1 + BLOCK  # never past the cache


@pytest.mark.parametrize("prompt,new", [(16, 32), (48, 96), (128, 128), (192, 256)])
def test_the_attention_loop_takes_the_blocks_it_reads(prompt, new):
    """A chip pays per block of the attention loop (`calibrated.py`): none where the engine
    reads its cache whole, else the keys read over the engine's own block size."""
    keys, loop = _ctx(prompt, new).decode_keys(new - 1)
    cache = KVCache.empty(config.tiny(), 1, prompt + new - 1)
    whole = cache.v.shape[3] // cache.block <= 5  # attention.WHOLE_BLOCKS
    assert loop == (0.0 if whole else pytest.approx(keys / cache.block))


def test_actual_reads_the_filled_part():
    assert _ctx(128, 128, "actual").decode_keys(127)[0] == 128 + 127 / 2
