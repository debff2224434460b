"""The plugin's `callback` in the vLLM tests: every ProbeRecord, appended as one JSON line to
$RECORDS_PATH (in the engine's process, on the taps' delivery threads)."""

import json
import os
import threading

_lock = threading.Lock()


def record(r) -> None:
    line = json.dumps({"request_id": r.request_id, "position": r.position,
                       "probe_set": r.probe_set, "scores": [float(s) for s in r.scores],
                       "fired": [bool(f) for f in r.fired]})
    with _lock, open(os.environ["RECORDS_PATH"], "a") as file:
        file.write(line + "\n")
