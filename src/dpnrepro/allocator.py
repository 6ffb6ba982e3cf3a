"""Host memory of streamed evaluation: hand the heap's free pages back to the system after every batch.

glibc's ``malloc`` serves blocks at or above its mmap threshold with their own ``mmap`` and returns them
on ``free``. The threshold is dynamic: each freed mmapped block raises it to that block's size (up to
32 MiB). After the first evaluation batches are freed, later batch buffers and activations come from the
heap, whose free fragments stay resident, and RSS grows with the number of batches although nothing of
the split is kept (``reports/eval_memory.md``: +13 to +23 % peak at 10x the smoke splits, 56 px).

Two fixes were measured side by side on the same evaluation (``python -m dpnrepro.benchmarks.eval_memory``):
fixing the threshold at 128 KiB (``mallopt``, as ``MALLOC_MMAP_THRESHOLD_`` does) bounds the peak, but
on the CPU every activation of the forward pass then gets fresh pages (faults and zeroing): evaluation ran
1.6x to 2.5x slower. ``malloc_trim(0)`` after each batch (:class:`HeapTrimmed`, what
:func:`data.loader.eval_batches` returns) releases the free pages in place and keeps the allocator's fast
path: +8 % peak at 10x (56 px) for 6-12 % more time (measured on the CPU). Elsewhere than glibc (musl, macOS, a preloaded jemalloc
or tcmalloc, which return memory themselves) the trim is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

ENABLED = True  # the benchmark's switch for measuring the allocator without the trim


@functools.cache
def _malloc_trim():
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_free_heap() -> bool:
    """``malloc_trim(0)``: give the heap's free pages back to the system; True when glibc released any."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None and ENABLED else False


class HeapTrimmed:
    """``batches`` (a sized iterable, e.g. a ``DataLoader``) with :func:`release_free_heap` after each batch
    is consumed; ``len`` is the wrapped one's, so progress bars keep their total."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            yield batch
            del batch
            release_free_heap()
