"""``child.stale_memory.poison`` against a SIMULATED caching allocator (a stand-in for torch's CUDA
one: freed blocks are cached by size and handed out again, newest first; new memory is reserved only
when no cached block fits). The real allocator is exercised by the GPU red team
(``benchmarks/checked_gpu.py``: a change that returns ``torch.empty`` under a profiler)."""
from __future__ import annotations

import math

import pytest
from cutile_perf.child import stale_memory


class FakeOOM(Exception):
    pass


class Block:
    def __init__(self, allocator, size):
        self.allocator, self.size, self.value = allocator, size, "correct result"


class FakeTensor:
    def __init__(self, allocator, shape):
        self.allocator, self.shape, self.dtype = allocator, shape, "float16"
        self.device = type("Device", (), {"type": "cuda"})()
        self.block = allocator.take(math.prod(shape))

    def is_floating_point(self):
        return True

    def is_complex(self):
        return False

    def __del__(self):
        if hasattr(self, "block"):  # not when taking it failed
            self.allocator.cached.append(self.block)


class FakeTorch:
    """SIMULATED: ``cached`` free blocks (each holding an earlier call's correct result) and a reserve."""
    bool = "bool"

    def __init__(self, cached_blocks: int, size: int, limit: int | None = None):
        self.cached = [Block(self, size) for _ in range(cached_blocks)]
        self.reserved, self.limit = cached_blocks * size, limit
        outer = self

        class Cuda:
            OutOfMemoryError = FakeOOM

            @staticmethod
            def memory_reserved(device):
                return outer.reserved

        self.cuda = Cuda

    def take(self, size):
        for block in reversed(self.cached):
            if block.size == size:
                self.cached.remove(block)
                return block
        if self.limit is not None and self.reserved + size > self.limit:
            raise FakeOOM
        self.reserved += size
        return Block(self, size)

    def full(self, shape, value, dtype, device):
        tensor = FakeTensor(self, shape)
        tensor.block.value = value
        return tensor


def test_every_cached_block_of_the_size_is_poisoned_then_freed():
    torch = FakeTorch(cached_blocks=5, size=64)
    result = FakeTensor(torch, (8, 8))  # the kept result holds one block (not poisoned: it is in use)
    taken = stale_memory.poison(torch, [result])
    assert taken == 5  # the 4 cached blocks and one from new memory, which ends the search
    assert len(torch.cached) == 5 and all(math.isnan(b.value) for b in torch.cached)
    skipped_work = FakeTensor(torch, (8, 8))  # a call that returns torch.empty of the result's shape
    assert math.isnan(skipped_work.block.value)


def test_one_poisoned_block_was_not_enough():
    """The control: the old rule (one block filled) leaves a correct result where ``empty`` finds it
    once the skipped call's own small allocation took the poisoned block."""
    torch = FakeTorch(cached_blocks=3, size=64)
    poisoned = torch.full((8, 8), float("nan"), "float16", None)
    del poisoned
    one_row = FakeTensor(torch, (8, 8))  # stands for the one-row kernel call taking the poisoned block
    skipped_work = FakeTensor(torch, (8, 8))
    assert math.isnan(one_row.block.value) and skipped_work.block.value == "correct result"


def test_out_of_memory_ends_the_search():
    torch = FakeTorch(cached_blocks=2, size=64, limit=128)
    assert stale_memory.poison(torch, [FakeTensor(torch, (8, 8))]) == 1


def test_cpu_tensors_get_one_block():
    torch = pytest.importorskip("torch")

    assert stale_memory.poison(torch, [torch.zeros(4, 4), torch.zeros(3, dtype=torch.int32)]) == 2
