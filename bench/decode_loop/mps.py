"""An environment for one MPS setting: with MPS, a private MPS control daemon; without, a private
pipe directory that no daemon listens on, so that no daemon elsewhere on the host (the default
pipe directory) can take the processes in.

The sidecar and the worker must both be started with the returned environment, after the daemon.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time

CONTROL = "nvidia-cuda-mps-control"


@contextlib.contextmanager
def environment(enabled: bool):
    with tempfile.TemporaryDirectory(prefix="decode-loop-mps-") as root:
        env = dict(os.environ,
                   CUDA_MPS_PIPE_DIRECTORY=os.path.join(root, "pipe"),
                   CUDA_MPS_LOG_DIRECTORY=os.path.join(root, "log"))
        os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
        os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
        if not enabled:
            yield env
            return
        # -d forks the daemon and returns; it then serves clients on the pipe directory.
        subprocess.run([CONTROL, "-d"], env=env, check=True, timeout=30)
        try:
            yield env
        finally:
            subprocess.run([CONTROL], input="quit\n", text=True, env=env, timeout=30,
                           check=False)
            # quit returns before the daemon and its server have gone: give them a moment, so
            # that whatever runs next on the GPU does not meet them.
            control = os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "control")
            for _ in range(20):
                if not os.path.exists(control):
                    break
                time.sleep(0.1)


def log_tail(env: dict, lines: int = 20) -> str:
    """The end of the daemon's control log (why a client was refused, for instance)."""
    path = os.path.join(env["CUDA_MPS_LOG_DIRECTORY"], "control.log")
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
