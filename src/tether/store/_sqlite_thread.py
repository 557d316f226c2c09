"""The SQLite store's one thread: it owns the connection and runs every store call.

Each call is a hop from the event loop to this thread and back, twice per round of a
run, so the hop's cost on the loop's thread is the store's cost there (issue 22).
`run_in_executor` over a `ThreadPoolExecutor` spends, per call: a concurrent future
(with its `Condition`), a work item, the pool's idle-semaphore check and a `SimpleQueue`
put; and on the way back a `call_soon_threadsafe` (a write to the loop's self-pipe, then
two `recv`s there, the second ending in `BlockingIOError`). Here a call is a tuple put on
a deque, and the thread is woken (one futex) only when it sleeps; its results reach the
loop through an eventfd the loop watches: one write for the results that end before the
loop takes them, one read on the loop's side, then all of them set in one pass.
Where there is no eventfd (not Linux) or the loop cannot watch one, the results go back
with one `call_soon_threadsafe` per batch instead.

What a call does is what `run_in_executor` did: it runs in the thread in a copy of the
caller's context; its exception is raised in the caller; a call cancelled before the
thread took it up never runs (one under way finishes, its result dropped); calls run in
the order they were made. `shutdown` lets the calls already made run, then ends the
thread; a call after it raises `RuntimeError`. At interpreter exit the thread finishes
its calls before the process ends, as the executor's thread did.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from tether.store._handback import run_one, settle

T = TypeVar("T")
_Result = tuple["asyncio.Future[Any]", BaseException | None, Any]


class _Inbox:
    """The results ready for one event loop, handed over with one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._ready: list[_Result] = []
        self._signalled = False
        self._fd = -1
        eventfd = getattr(os, "eventfd", None)
        if eventfd is None:
            return
        fd: int = eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            loop.add_reader(fd, self._drain)
        except (NotImplementedError, RuntimeError, ValueError):  # a loop without readers
            os.close(fd)
        else:
            self._fd = fd
            # A store never shut down: the descriptor goes with the inbox.
            self._closer = weakref.finalize(self, _close_fd, fd)

    def post(self, fut: asyncio.Future[Any], exc: BaseException | None, value: Any) -> None:
        """From the thread: `fut` ends with `exc` or `value` at the loop's next pass."""
        with self._lock:
            self._ready.append((fut, exc, value))
            if self._signalled:
                return  # the wake-up already on its way takes this one too
            self._signalled = True
            fd = self._fd
        if fd >= 0:
            with contextlib.suppress(OSError):  # shut down meanwhile: nobody waits
                os.eventfd_write(fd, 1)
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for it
            self.loop.call_soon_threadsafe(self._flush)

    def _drain(self) -> None:
        # The counter is read (reset) before the results are taken: a result posted
        # after the take writes again, so none is left behind.
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._fd)
        self._flush()

    def _flush(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
            self._signalled = False
        settle(ready)

    def close(self) -> None:
        """On the loop's thread, once the thread has ended: stop watching the eventfd
        and hand over what is left."""
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            if not self.loop.is_closed():
                self.loop.remove_reader(fd)
            self._closer()  # closes it once, and not again when the inbox goes
        if not self.loop.is_closed():
            self._flush()


_Call = tuple[
    "asyncio.Future[Any]", contextvars.Context, Callable[..., Any], tuple[Any, ...], _Inbox
]


def _close_fd(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


class _Queue:
    """The calls waiting for the thread; shared by the thread and its owner (the thread
    holds this, not the owner, so that an owner nobody closed can be collected)."""

    def __init__(self) -> None:
        self.calls: deque[
            tuple[
                asyncio.Future[Any],
                contextvars.Context,
                Callable[..., Any],
                tuple[Any, ...],
                _Inbox,
            ]
        ] = deque()
        self.mutex = threading.Lock()
        # Held while nobody wakes the thread; released once to wake it from `sleeping`.
        self.wake = threading.Lock()
        self.wake.acquire()
        self.sleeping = False
        self.stopping = False

    def take(self) -> _Call | None:
        """In the thread: the next call, sleeping until there is one; None once stopped
        and every call made has been taken."""
        while True:
            with self.mutex:
                if self.calls:
                    return self.calls.popleft()
                if self.stopping:
                    return None
                self.sleeping = True
            self.wake.acquire()  # until a call (or `stop`) releases it

    def stop(self) -> None:
        """Let the calls already made run, then end the thread."""
        with self.mutex:
            self.stopping = True
            wake, self.sleeping = self.sleeping, False
        if wake:
            self.wake.release()


def _serve(queue: _Queue) -> None:
    try:
        while (call := queue.take()) is not None:
            run_one(*call[:4], call[4].post)
            del call  # nothing of a finished call stays alive while the thread sleeps
    finally:
        _live.discard(queue)


#: The queues of running threads: told to stop at interpreter exit, before it waits for
#: the threads (`threading._register_atexit`, as `concurrent.futures` does).
_live: set[_Queue] = set()


def _stop_all() -> None:
    for queue in list(_live):
        queue.stop()


_register_atexit = getattr(threading, "_register_atexit", None)
if _register_atexit is not None:
    _register_atexit(_stop_all)


class StoreThread:
    """One thread that runs calls from event loops (see the module)."""

    def __init__(self, name: str) -> None:
        self._queue = _Queue()
        self._inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = (
            weakref.WeakKeyDictionary()
        )
        _live.add(self._queue)
        self._thread = threading.Thread(
            target=_serve, args=(self._queue,), name=name, daemon=_register_atexit is None
        )
        self._thread.start()
        # An owner nobody shut down: its thread ends when it is collected.
        weakref.finalize(self, self._queue.stop)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in the thread, after the calls made before it."""
        loop = asyncio.get_running_loop()
        inbox = self._inboxes.get(loop)
        if inbox is None:
            inbox = self._inboxes[loop] = _Inbox(loop)
        fut: asyncio.Future[T] = loop.create_future()
        queue = self._queue
        with queue.mutex:
            if queue.stopping:
                raise RuntimeError("cannot schedule new futures after shutdown")
            queue.calls.append((fut, contextvars.copy_context(), fn, args, inbox))
            wake, queue.sleeping = queue.sleeping, False
        if wake:
            queue.wake.release()
        return await fut

    def shutdown(self) -> None:
        """Run the calls already made, end the thread and wait for it; then stop watching
        the eventfds (the running loop's at once, another loop's on its own thread)."""
        self._queue.stop()
        if self._thread is not threading.current_thread():
            self._thread.join()
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, inbox in list(self._inboxes.items()):
            if loop is running or loop.is_closed():
                inbox.close()
            else:
                with contextlib.suppress(RuntimeError):  # closed meanwhile
                    loop.call_soon_threadsafe(inbox.close)
        self._inboxes.clear()
