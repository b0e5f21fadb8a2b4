"""lowtide.common.ticker: a timer thread that survives a failing tick and stops when told."""

from __future__ import annotations

import threading

from lowtide.common.ticker import Ticker


def test_a_ticker_keeps_ticking_after_a_tick_raises_and_stops_when_told():
    calls = []
    third = threading.Event()

    def tick() -> None:
        calls.append(1)
        if len(calls) == 3:
            third.set()
        if len(calls) == 1:
            raise RuntimeError("one bad group")

    ticker = Ticker(name="t", interval_s=0.01, tick=tick)
    ticker.start()
    assert third.wait(5), calls
    ticker.stop()
    assert ticker.stopped
    after = len(calls)
    threading.Event().wait(0.05)  # five intervals
    assert len(calls) == after, "a tick came after stop returned"
