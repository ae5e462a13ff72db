"""Run an iterator ahead of its consumer in a background thread, stoppable at any time.

Used twice by the reader: one thread reads file pieces (h5py releases the GIL
while HDF5 reads), another builds batches from them (numpy releases it while
copying), so reading, copying and the consumer's compute overlap.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any


class PrefetchError(RuntimeError):
    """The producing thread ended before the consumer got what it asked for."""


class Prefetcher:
    """Runs `items` in a thread, at most `depth` results ahead; its errors reach `get()`."""

    def __init__(self, items: Iterator[Any], depth: int, name: str = "hpcdp-reader") -> None:
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._items = items
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._items:
                if self._stop.is_set():
                    return
                self._put(("ok", item))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, re-raised there
            self._put(("error", exc))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:  # run the generator's own clean-up in its own thread
                with contextlib.suppress(Exception):
                    close()

    def _put(self, item: tuple[str, Any]) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def get(self) -> Any:
        """The next item, waiting for it; re-raises the producer's exception."""
        while True:
            try:
                kind, value = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._stop.is_set() or not self._thread.is_alive():
                    raise PrefetchError("the prefetch thread stopped early") from None
                continue
            if kind == "error":
                raise value
            return value

    def stop(self) -> None:
        """Stop the thread and wait for it (it finishes the item in hand first)."""
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=30)


class Inline:
    """The same interface without a thread (prefetch disabled)."""

    def __init__(self, items: Iterator[Any]) -> None:
        self._items = items

    def get(self) -> Any:
        return next(self._items)

    def stop(self) -> None:
        close = getattr(self._items, "close", None)
        if close is not None:
            close()
