"""ExecutionHandle: results, callbacks, asyncio, with-blocks, and waiting when a live handle is dropped."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import pytest

import onnx_prepared.scheduler as scheduler_pkg
from onnx_prepared.errors import Cancelled
from onnx_prepared.scheduler import HandleState, Task, TaskState

from .conftest import TIMEOUT, Gate


def test_result_of_a_task_or_a_callable_called_once(sched):
    t = Task(lambda t: 41)
    assert sched.submit([], result=t).result(TIMEOUT) == 41  # the result task joins the submission
    calls = []

    def assemble():
        calls.append(1)
        return {"y": t.result + 1}

    h = sched.submit([Task(lambda x: None)], result=assemble)
    assert h.result(TIMEOUT) == {"y": 42} and h.result() == {"y": 42} and calls == [1]
    assert sched.submit([Task(lambda x: None)]).result(TIMEOUT) is None


def test_result_callable_error_is_raised_each_time(sched):
    def bad():
        raise LookupError("no output")

    h = sched.submit([Task(lambda x: None)], result=bad)
    for _ in range(2):
        with pytest.raises(LookupError):
            h.result(TIMEOUT)


def test_empty_submission_succeeds_immediately(sched):
    h = sched.submit([])
    assert h.is_ready() and h.status is HandleState.SUCCEEDED
    h.wait()


def test_is_ready_status_and_repr(sched):
    gate = Gate()
    h = sched.submit([Task(gate.body())])
    assert gate.started.wait(TIMEOUT)
    assert not h.is_ready() and h.status is HandleState.RUNNING and "RUNNING" in repr(h)
    gate.open()
    h.wait(TIMEOUT)
    assert h.is_ready() and str(h.status) == "SUCCEEDED"


def test_done_callbacks_run_once_after_the_terminal_state(sched):
    gate = Gate()
    h = sched.submit([Task(gate.body())])
    seen: list[tuple[HandleState, bool]] = []
    h.add_done_callback(lambda hh: seen.append((hh.status, hh.is_ready())))
    h.add_done_callback(lambda hh: 1 / 0)  # logged, does not disturb the others
    last = threading.Event()
    h.add_done_callback(lambda hh: (seen.append(("second", hh is h)), hh.wait(), last.set()))
    gate.open()
    h.wait(TIMEOUT)
    assert last.wait(TIMEOUT)  # callbacks run on the completing thread, after waiters were woken
    assert seen == [(HandleState.SUCCEEDED, True), ("second", True)]


def test_await_does_not_block_the_event_loop(sched):
    gate = Gate()
    t = Task(gate.body("done"))
    h = sched.submit([t], result=t)

    async def opener():
        await asyncio.sleep(0)  # runs only if the loop is free while `await h` is pending
        gate.open()
        return "opened"

    async def main():
        return await asyncio.wait_for(asyncio.gather(h, opener()), TIMEOUT)

    assert asyncio.run(main()) == ["done", "opened"]


def test_await_reraises_failures_and_returns_ready_results(sched):
    bad = sched.submit([Task(lambda t: 1 / 0)])
    with pytest.raises(ZeroDivisionError):
        bad.wait(TIMEOUT)
    t = Task(lambda t: 7)
    ok = sched.submit([t], result=t)
    ok.wait(TIMEOUT)

    async def main():
        with pytest.raises(ZeroDivisionError):
            await bad
        return await ok

    assert asyncio.run(main()) == 7


def test_cancelling_the_awaiting_asyncio_task_cancels_the_submission(sched):
    gate = Gate()
    first = Task(gate.body(), name="first")
    second = Task(lambda t: "never", deps=[first], name="second")
    h = sched.submit([second], result=second)

    async def main():
        waiter = asyncio.ensure_future(h)
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(main())
    assert h.status is HandleState.CANCELLING
    gate.open()
    with pytest.raises(Cancelled):
        h.wait(TIMEOUT)
    assert second.state is TaskState.CANCELLED


def test_with_block_waits_on_normal_exit(sched):
    gate = Gate()
    t = Task(gate.body("v"))
    opener = threading.Thread(target=lambda: (gate.started.wait(TIMEOUT), gate.open()))
    opener.start()
    with sched.submit([t]) as h:
        pass
    assert h.is_ready() and t.result == "v"
    opener.join(TIMEOUT)
    with pytest.raises(ZeroDivisionError), sched.submit([Task(lambda t: 1 / 0)]):
        pass


def test_with_block_exception_cancels_joins_and_propagates(sched):
    started = threading.Event()

    def first_body(t):
        # Runs until the with-block's exit has requested cancellation (level-triggered token), then
        # returns normally: the exit must wait for it (joined), and `second` must never start.
        started.set()
        deadline = time.monotonic() + TIMEOUT
        while not t.token.cancelled:
            assert time.monotonic() < deadline, "cancellation never requested"
            time.sleep(0.001)
        return "joined"

    first = Task(first_body, name="first")
    second = Task(lambda t: "never", deps=[first], name="second")
    with pytest.raises(KeyError, match="body"), sched.submit([second]) as h:
        assert started.wait(TIMEOUT)
        raise KeyError("body")
    assert h.is_ready() and h.status is HandleState.CANCELLED  # joined before the block's error escaped
    assert first.state is TaskState.SUCCEEDED and second.state is TaskState.CANCELLED


class _OnWaitLog(logging.Handler):
    """Opens a gate when the handle logs that it is waiting in ``__del__`` (so the test proves it waited)."""

    def __init__(self, gate: Gate):
        super().__init__(logging.DEBUG)
        self.gate = gate

    def emit(self, record: logging.LogRecord) -> None:
        if "dropped before completion" in record.getMessage():
            self.gate.open()


@pytest.mark.parametrize("how", ["del", "gc-cycle"])
def test_dropping_a_live_handle_waits_and_inputs_outlive_the_tasks(sched, how):
    """H1: caller-owned inputs are never released while a task still uses them."""
    assert "waits for its submission" in (scheduler_pkg.__doc__ or "")
    gate = Gate()
    inputs = {"x": bytearray(b"\x01" * 64), "released": False}
    used_after_release: list[bool] = []

    def body(t):
        gate.started.set()
        assert gate.opened.wait(TIMEOUT)
        used_after_release.append(inputs["released"])  # must still be False: the caller is blocked
        return sum(inputs["x"])

    logger = logging.getLogger("onnx_prepared.scheduler")
    handler = _OnWaitLog(gate)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        h = sched.submit([Task(body)], keepalive=inputs)
        assert gate.started.wait(TIMEOUT)
        if how == "del":
            del h
        else:
            cycle: list = [h]
            cycle.append(cycle)
            del h, cycle
            gc.collect()
        inputs["released"] = True  # the caller frees its inputs once the handle is gone
        inputs["x"] = None
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert gate.opened.is_set()  # the drop logged that it waits (and this released the task)
    assert used_after_release == [False]


def test_dropping_a_finished_handle_does_not_log(sched, caplog):
    h = sched.submit([Task(lambda t: None)])
    h.wait(TIMEOUT)
    with caplog.at_level(logging.DEBUG, logger="onnx_prepared.scheduler"):
        del h
    assert not caplog.records


def test_keepalive_is_held_until_terminal_then_dropped(sched):
    import weakref

    class Ctx:
        pass

    ctx = Ctx()
    ref = weakref.ref(ctx)
    gate = Gate()
    h = sched.submit([Task(gate.body())], keepalive=ctx)
    del ctx
    gc.collect()
    assert ref() is not None
    gate.open()
    h.wait(TIMEOUT)
    gc.collect()
    assert ref() is None


def test_task_body_references_are_dropped_at_the_terminal_state(sched):
    import weakref

    class Big:
        pass

    big = Big()
    ref = weakref.ref(big)
    t = Task(lambda t, b=big: None)
    del big
    sched.submit([t]).wait(TIMEOUT)
    gc.collect()
    assert ref() is None and t.fn is None
