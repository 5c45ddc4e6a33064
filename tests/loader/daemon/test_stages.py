"""``run_in_pool``: a cancelled stage waits for its thread's job, and a job that then fails is not left for
the garbage collector to report ("Future exception was never retrieved", issue 27)."""

import asyncio
import gc
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from loader.daemon.stages import run_in_pool


class Boom(Exception):
    pass


def test_a_job_that_fails_after_its_stage_was_cancelled_leaves_no_unretrieved_exception():
    started, release = threading.Event(), threading.Event()
    landed: list[bool] = []

    def job() -> None:
        started.set()
        release.wait()
        landed.append(True)
        raise Boom("the corrupt block, read by a stage that another stage's failure cancelled")

    reports: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: reports.append(context))
        with ThreadPoolExecutor(1) as pool:
            stage = asyncio.ensure_future(run_in_pool(pool, job))
            await asyncio.get_running_loop().run_in_executor(None, started.wait)
            stage.cancel()
            # the job fails only once the stage has been cancelled and waits for it
            asyncio.get_running_loop().call_soon(release.set)
            with pytest.raises(asyncio.CancelledError):
                await stage
            assert landed == [True]  # the stage did not end before its job
            del stage
            gc.collect()  # an unretrieved exception is reported (to the handler) when its future is collected

    asyncio.run(main())
    assert [r.get("message") for r in reports] == []


def test_a_job_that_fails_while_its_stage_waits_raises_in_the_stage():
    async def main() -> None:
        with ThreadPoolExecutor(1) as pool, pytest.raises(Boom):
            await run_in_pool(pool, _fail)

    asyncio.run(main())


def _fail() -> None:
    raise Boom("read failed")
