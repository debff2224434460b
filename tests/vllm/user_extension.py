"""A user's own worker extension class (vLLM's `worker_extension_cls`), given to the engine beside
the plugin's in test_vllm_plugin.py: vLLM takes one class, so the plugin makes one of both; the
user's method must still be reachable by collective_rpc, as the plugin's are."""

import os


class UserExtension:
    def user_extension_echo(self, value: str) -> dict:
        """What the engine's worker is, seen from the user's method: its class, whether it has
        the plugin's methods too, and the process it runs in."""
        return {"value": value, "worker": type(self).__name__, "pid": os.getpid(),
                "plugin_methods": sorted(m for m in dir(type(self))
                                         if m.startswith("probe_sidecar_"))}


class ClashingExtension:
    """One that defines a method the plugin adds: refused, naming it."""

    def probe_sidecar_state(self) -> dict:
        return {}
