"""Bench probe: every Ray worker process prints its main thread's stack every $STACK_PROBE_EVERY_S seconds.

Put this folder first on PYTHONPATH (`bash bench/gpu_suite.sh launch5_stacks` does) to see what a worker runs in a
stretch of its start-up that logs nothing (issue #30 goal 4: the colocated vLLM engine's ~19 s after its CUDA-graph
capture). Python imports `sitecustomize` at start in every process; only Ray's worker processes are probed. A daemon
thread samples `sys._current_frames()` (faulthandler's watchdog crashed a worker inside torch.compile's frames)."""

import os
import sys

_EVERY_S = os.environ.get("STACK_PROBE_EVERY_S")
if _EVERY_S and any(arg.endswith("default_worker.py") for arg in sys.argv[:1]):
    import threading
    import time
    import traceback

    def _sample(main_id: int, every_s: float) -> None:
        while True:
            time.sleep(every_s)
            frame = sys._current_frames().get(main_id)
            if frame is None:
                return
            lines = traceback.format_stack(frame, limit=14)
            print(f"STACK_PROBE {time.strftime('%H:%M:%S')} pid {os.getpid()}\n" + "".join(lines), file=sys.stderr,
                  flush=True)

    threading.Thread(target=_sample, args=(threading.main_thread().ident, float(_EVERY_S)), daemon=True,
                     name="stack-probe").start()
