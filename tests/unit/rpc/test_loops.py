"""rpc/loops.py: which event loop the request paths run on (``--event-loop``)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from lowtide.rpc import loops


@pytest.fixture(autouse=True)
def restore_choice(monkeypatch):
    monkeypatch.delenv(loops.EVENT_LOOP_ENV, raising=False)
    saved = loops._chosen
    yield
    loops._chosen = saved


def make_and_close(kind_check) -> None:
    loop = loops.new_event_loop()
    try:
        assert kind_check(loop), type(loop)
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()


def test_auto_makes_uvloop_loops_when_uvloop_is_installed():
    assert loops.use_event_loop("auto") == "uvloop"
    make_and_close(lambda loop: isinstance(loop, uvloop.Loop))


def test_asyncio_makes_the_standard_librarys_loop():
    assert loops.use_event_loop("asyncio") == "asyncio"
    make_and_close(lambda loop: not isinstance(loop, uvloop.Loop) and isinstance(loop, asyncio.BaseEventLoop))


def test_the_environment_decides_when_no_flag_was_given(monkeypatch):
    loops._chosen = None
    monkeypatch.setenv(loops.EVENT_LOOP_ENV, "asyncio")
    assert loops.loop_kind() == "asyncio"
    monkeypatch.setenv(loops.EVENT_LOOP_ENV, "UVLOOP")
    assert loops.loop_kind() == "uvloop"


def test_an_unknown_choice_is_refused_naming_the_choices_and_changes_nothing():
    loops.use_event_loop("asyncio")
    with pytest.raises(ValueError, match="auto, uvloop, asyncio"):
        loops.use_event_loop("trio")
    assert loops.loop_kind() == "asyncio"
