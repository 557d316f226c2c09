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

The PostgreSQL store runs its calls the same way on up to one thread per pooled
connection (`StoreThread(name, threads=n)`): a call wakes a sleeping thread, or starts
one while fewer than `n` run; the calls then run as threads come free, not in order.
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
    """The calls waiting for the threads; shared by the threads and their owner (the
    threads hold this, not the owner, so that an owner nobody closed can be collected)."""

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
        #: The wake-up locks of the threads asleep for want of a call: each is held
        #: until a call (or `stop`) takes it off this list and releases it, once.
        self.idle: list[threading.Lock] = []
        self.stopping = False

    def take(self, wake: threading.Lock) -> _Call | None:
        """In a thread (`wake`: its own lock, held): the next call, sleeping until there
        is one; None once stopped and every call made has been taken."""
        while True:
            with self.mutex:
                if self.calls:
                    return self.calls.popleft()
                if self.stopping:
                    return None
                self.idle.append(wake)
            wake.acquire()  # until a call (or `stop`) releases it

    def stop(self) -> None:
        """Let the calls already made run, then end the threads."""
        with self.mutex:
            self.stopping = True
            idle, self.idle = self.idle, []
        for wake in idle:
            wake.release()


def _serve(queue: _Queue) -> None:
    wake = threading.Lock()
    wake.acquire()
    try:
        while (call := queue.take(wake)) is not None:
            run_one(*call[:4], call[4].post)
            del call  # nothing of a finished call stays alive while the thread sleeps
    finally:
        _live.discard(queue)  # stopped: the other threads end too


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
    """One thread that runs calls from event loops (see the module); or, `threads` > 1,
    up to that many, started as calls find none free (the PostgreSQL store's: one per
    pooled connection), each call run by the first free one."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self._queue = _Queue()
        self._inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = (
            weakref.WeakKeyDictionary()
        )
        self._name = name
        self._max_workers = threads
        self._threads: list[threading.Thread] = []
        self._started = 1  # threads started or being started (under the queue's mutex)
        _live.add(self._queue)
        self._start()
        # An owner nobody shut down: its threads end when it is collected.
        weakref.finalize(self, self._queue.stop)

    @property
    def _thread(self) -> threading.Thread:
        return self._threads[0]

    def _start(self) -> None:
        thread = threading.Thread(
            target=_serve, args=(self._queue,), name=self._name, daemon=_register_atexit is None
        )
        self._threads.append(thread)
        thread.start()

    def resize(self, threads: int) -> None:
        """Run up to `threads` calls at once from now on (threads started beyond it stay,
        idle when not needed)."""
        self._max_workers = threads

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a thread, after the calls made before it (with one thread: in
        their order)."""
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
            wake = queue.idle.pop() if queue.idle else None
            more = wake is None and self._started < self._max_workers
            if more:
                self._started += 1
        if wake is not None:
            wake.release()
        elif more:
            self._start()
        return await fut

    def shutdown(self, wait: bool = True) -> None:
        """Run the calls already made, end the threads and (`wait`) wait for them; then
        stop watching the eventfds (the running loop's at once, another loop's on its
        own thread). Without `wait` the eventfds are left to their loops."""
        self._queue.stop()
        if not wait:
            return
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
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
