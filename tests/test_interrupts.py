"""kljax.boundary.interrupts: a Ctrl-C is raised once, never inside an import, and never after it was reported."""

from __future__ import annotations

import _thread
import importlib
import signal
import sys
import threading
import time

import pytest

from kljax.boundary import interrupts

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="SIGINT handlers run in the main thread only")


def _spin(seconds: float) -> None:
    """Run bytecode for `seconds` (the main thread runs pending signal handlers between bytecodes)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(100))


def test_ctrl_c_inside_an_import_is_raised_after_it(tmp_path, monkeypatch):
    (tmp_path / "slow_module_for_sigint.py").write_text(
        "import signal, time\n"
        "signal.raise_signal(signal.SIGINT)\n"  # the handler runs here, inside the import
        "end = time.monotonic() + 0.3\n"
        "while time.monotonic() < end:\n"
        "    sum(range(100))\n"
        "finished = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        with interrupts.sticky_sigint():
            importlib.import_module("slow_module_for_sigint")
            _spin(5.0)  # re-delivered 50 ms after the import: this never runs to its end
            pytest.fail("the Ctrl-C was not raised after the import")
    assert sys.modules["slow_module_for_sigint"].finished  # the import itself ran to its end
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_after_it_was_reported_is_not_raised_again():
    with interrupts.sticky_sigint():
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            _spin(1.0)
        interrupts.reported()
        _thread.interrupt_main()  # a re-delivery that raced the report, or a second Ctrl-C
        signal.raise_signal(signal.SIGINT)
        _spin(0.2)
        interrupts.check()
    _spin(0.2)  # nothing left to run once the default handler is back
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and not interrupts.pending()


def test_a_redelivery_that_races_the_blocks_end_is_dropped(monkeypatch):
    """The re-delivery thread calls interrupt_main; the block ends before the handler runs: the
    default handler must not raise it later (the command already returned 130)."""
    with pytest.raises(KeyboardInterrupt, match="the reported one"):
        with interrupts.sticky_sigint():
            try:
                raise KeyboardInterrupt("the reported one")
            finally:
                interrupts.reported()
                _thread.interrupt_main()  # tripped, not yet run when the block's finally restores the handler
    _spin(0.2)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_no_redelivery_after_the_block_ended(monkeypatch):
    monkeypatch.setattr(interrupts, "REDELIVER_S", 0.2)
    calls = []
    monkeypatch.setattr(interrupts, "_unsafe", lambda frame: not calls.append(1))  # every SIGINT is deferred
    with pytest.raises(KeyboardInterrupt):
        with interrupts.sticky_sigint():
            signal.raise_signal(signal.SIGINT)  # deferred: re-delivery due in 0.2 s
            interrupts.check()  # a safe point raises it first
    _spin(0.5)  # the re-delivery thread finds the block ended and does nothing
    interrupts._redeliver()  # nor does one that runs now, however late
    _spin(0.2)
    assert calls == [1]
