"""The engine harness's shutdown (helpers/vllm_engine_run.py): an engine process that misses its SIGTERM is
signalled again, so a test waits seconds instead of vLLM's whole shutdown timeout. A real child process that acts
only on its second SIGTERM stands in for the EngineCore; the stand-in client signals once, as vLLM's does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

from helpers import vllm_engine_run

# Acts on the second SIGTERM only, like an EngineCore idle in input_queue.get whose first wakeup was lost.
_DEAF_ONCE = """
import signal, sys, time
seen = []
def on_term(signum, frame):
    seen.append(signum)
    if len(seen) >= 2:
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""

_CLIENT_WAIT_S = 20.0


class _Proc:
    """What the harness reads of a vLLM engine process (multiprocessing's BaseProcess): pid and is_alive()."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def is_alive(self) -> bool:
        return self.popen.poll() is None


class _Client:
    """vLLM's client shutdown: one SIGTERM per engine process, then wait for the exit (capped here)."""

    def __init__(self, procs):
        self.resources = SimpleNamespace(engine_manager=SimpleNamespace(processes=procs))
        self.timeouts = []

    def shutdown(self, timeout=None):
        self.timeouts.append(timeout)
        procs = self.resources.engine_manager.processes
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
        end = time.monotonic() + min(timeout, _CLIENT_WAIT_S)
        while time.monotonic() < end and any(p.is_alive() for p in procs):
            time.sleep(0.05)


def test_an_engine_that_misses_its_sigterm_is_signalled_again():
    popen = subprocess.Popen([sys.executable, "-c", _DEAF_ONCE], stdout=subprocess.PIPE, text=True)
    try:
        assert popen.stdout.readline().strip() == "ready"
        client = _Client([_Proc(popen)])
        llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=client))
        start = time.monotonic()
        vllm_engine_run._shut_down(llm, resignal_after_s=0.5)
        waited = time.monotonic() - start
        # Ended by the second signal, inside the client's wait: not by the test's kill below.
        assert popen.poll() == 0, "the engine stand-in was still running when the harness's shutdown returned"
        assert waited < _CLIENT_WAIT_S
        assert client.timeouts == [600]
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait()


def test_a_shutdown_error_reaches_the_caller():
    class Broken:
        def shutdown(self, timeout=None):
            raise RuntimeError("engine manager gone")

    llm = SimpleNamespace(llm_engine=SimpleNamespace(engine_core=Broken()))
    try:
        vllm_engine_run._shut_down(llm, resignal_after_s=0.5)
    except RuntimeError as exc:
        assert "engine manager gone" in str(exc)
    else:
        raise AssertionError("the shutdown's error was swallowed")
