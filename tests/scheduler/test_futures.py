"""The waiter boundary: handles behave like futures (rules W1-W4 of ``onnx_prepared.scheduler``).

Each test quotes the rule it proves. Ordering is controlled with gates, never with sleeps.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import re

import pytest

from onnx_prepared.errors import Cancelled, CancelledError
from onnx_prepared.scheduler import HandleState, Task, TaskState

from .conftest import TIMEOUT, Gate


def quote(rule: str) -> str:
    """The rule's text from the package docstring, whitespace collapsed (fails if it stops stating it)."""
    import onnx_prepared.scheduler as pkg

    m = re.search(rf"\n{rule}\. (.*?)(?=\n[A-Z]\d\. |\n\n|\Z)", pkg.__doc__ or "", re.S)
    assert m is not None, rule
    return " ".join(m.group(1).split())


def _cancelled_handle(sched):
    gate = Gate()
    first = Task(gate.body(), name="first")
    second = Task(lambda t: "never", deps=[first], name="second")
    h = sched.submit([second], result=second)
    assert gate.started.wait(TIMEOUT)
    h.cancel()
    gate.open()
    h._sub.done.wait(TIMEOUT)
    return h


def test_rules_are_stated_once():
    import onnx_prepared.scheduler as pkg

    for rule in ("W1", "W2", "W3", "W4"):
        assert (pkg.__doc__ or "").count(f"\n{rule}. ") == 1, rule


def test_W1_tasks_see_cancelled_waiters_see_a_futures_cancelled_error(sched):
    """W1. Trio inside, futures outside: task bodies see the bare ``Cancelled`` (a ``BaseException``); a
    waiter sees ``CancelledError``, which is a ``concurrent.futures.CancelledError`` (an ``Exception``) and
    still a ``Cancelled``."""
    assert "Trio inside, futures outside" in quote("W1")
    seen: list[type] = []
    gate = Gate()

    def body(t):
        gate.started.set()
        gate.opened.wait(TIMEOUT)
        try:
            t.token.check()
        except BaseException as e:
            seen.append(type(e))
            raise

    h = sched.submit([Task(body, name="body")])
    assert gate.started.wait(TIMEOUT)
    h.cancel()
    gate.open()
    try:  # a server's broad handler contains it
        h.result(TIMEOUT)
    except Exception as e:
        caught = e
    assert seen == [Cancelled] and not issubclass(Cancelled, Exception)
    assert isinstance(caught, concurrent.futures.CancelledError) and isinstance(caught, Cancelled)
    assert isinstance(caught, CancelledError) and "cancelled" in str(caught)
    with pytest.raises(concurrent.futures.CancelledError):
        h.wait(TIMEOUT)
    with pytest.raises(concurrent.futures.CancelledError), h:
        pass


def test_W2_await_raises_asyncio_cancelled_error(sched):
    """W2. ``await handle`` on a cancelled submission raises ``asyncio.CancelledError``."""
    assert "asyncio.CancelledError" in quote("W2")
    gate = Gate()
    first = Task(gate.body(), name="first")
    h = sched.submit([Task(lambda t: 1, deps=[first])])

    async def main():
        waiter = asyncio.ensure_future(_await(h))
        assert await asyncio.to_thread(gate.started.wait, TIMEOUT)
        h.cancel()  # cancelled by someone else, not by the awaiting task
        gate.open()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        with pytest.raises(asyncio.CancelledError):  # already terminal
            await h

    asyncio.run(main())
    assert h.cancelled()


async def _await(h):
    return await h


def test_W3_future_questions(sched):
    """W3. A handle answers ``concurrent.futures.Future``'s questions: ``done()``, ``cancelled()``,
    ``running()``, ``result(timeout)``, ``exception(timeout)`` (the error ``result`` would raise, or None;
    ``CancelledError`` if cancelled; ``TimeoutError`` first), ``add_done_callback``."""
    assert "exception(timeout)" in quote("W3")
    gate = Gate()
    t = Task(gate.body(42), name="t")
    h = sched.submit([t], result=t)
    assert not h.done() and h.running() and not h.cancelled()
    with pytest.raises(TimeoutError):
        h.exception(timeout=0)
    with pytest.raises(TimeoutError):
        h.result(timeout=0)
    called = []
    h.add_done_callback(lambda x: called.append(x.result()))
    gate.open()
    assert h.result(TIMEOUT) == 42 and h.exception(TIMEOUT) is None and h.done() and not h.running()
    assert called == [42]
    assert h.cancel() is False  # terminal: nothing to cancel

    bad = sched.submit([Task(lambda t: 1 / 0)])
    assert isinstance(bad.exception(TIMEOUT), ZeroDivisionError) and not bad.cancelled()

    c = _cancelled_handle(sched)
    assert c.done() and c.cancelled() and c.status is HandleState.CANCELLED
    with pytest.raises(CancelledError):
        c.exception(TIMEOUT)


def test_W3_a_running_submission_can_be_cancelled_and_may_still_succeed(sched):
    """W3. ``cancel()`` returns whether the submission was still live; unlike a ``Future``, a running
    submission can be cancelled, and one whose started tasks all finish anyway ends SUCCEEDED."""
    assert "can be cancelled" in quote("W3")
    gate = Gate()
    t = Task(gate.body("done anyway"), name="t")  # never checks its token: its effect happens
    h = sched.submit([t], result=t)
    assert gate.started.wait(TIMEOUT)
    assert h.cancel() is True
    gate.open()
    assert h.result(TIMEOUT) == "done anyway" and not h.cancelled()


def test_W4_the_future_works_with_wait_as_completed_and_wrap_future(sched):
    """W4. ``handle.future`` is a ``concurrent.futures.Future`` given the same outcome (result, exception or
    cancellation) once the submission is terminal, for ``concurrent.futures.wait`` / ``as_completed`` and
    ``asyncio.wrap_future``. Cancelling it cancels the submission; it is done only when the submission is."""
    assert "concurrent.futures.wait" in quote("W4")
    gates = [Gate() for _ in range(3)]
    tasks = [Task(g.body(i), name=f"t{i}") for i, g in enumerate(gates)]
    handles = [sched.submit([t], result=t) for t in tasks]
    futures = [h.future for h in handles]
    assert handles[0].future is futures[0] and isinstance(futures[0], concurrent.futures.Future)
    gates[1].open()
    done, _ = concurrent.futures.wait(futures, timeout=TIMEOUT, return_when=concurrent.futures.FIRST_COMPLETED)
    assert done == {futures[1]} and futures[1].result() == 1
    gates[0].open()
    gates[2].open()
    assert sorted(f.result() for f in concurrent.futures.as_completed(futures, timeout=TIMEOUT)) == [0, 1, 2]

    bad = sched.submit([Task(lambda t: 1 / 0)])
    assert isinstance(bad.future.exception(TIMEOUT), ZeroDivisionError)
    c = _cancelled_handle(sched)
    assert c.future.cancelled()
    (d,), _ = concurrent.futures.wait([c.future], timeout=TIMEOUT)
    assert d is c.future

    # cancelling the future cancels the submission, and it is done only once the submission is terminal
    gate = Gate()
    first = Task(gate.body(), name="first")
    second = Task(lambda t: "never", deps=[first], name="second")
    h = sched.submit([second], result=second)
    assert gate.started.wait(TIMEOUT)
    assert h.future.cancel() is True
    assert h.status is HandleState.CANCELLING and not h.future.done()
    gate.open()
    with pytest.raises(CancelledError):
        h.wait(TIMEOUT)
    assert h.future.cancelled() and second.state is TaskState.CANCELLED


def test_W4_asyncio_wrap_future(sched):
    """W4. ... ``asyncio.wrap_future``."""
    assert "asyncio.wrap_future" in quote("W4")
    gate = Gate()
    t = Task(gate.body("v"), name="t")
    h = sched.submit([t], result=t)

    async def main():
        wrapped = asyncio.wrap_future(h.future)
        gate.open()
        return await wrapped

    assert asyncio.run(main()) == "v"
