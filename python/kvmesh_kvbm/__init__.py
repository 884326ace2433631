"""kvmesh's KV block manager inside a real engine.

The engine loads ``kvmesh_kvbm.vllm`` (vLLM's ``--kv-transfer-config``) or
``kvmesh_kvbm.trtllm`` (TensorRT-LLM's ``kv_connector_config``). The
scheduler side forwards every connector call to the ``kvmesh worker``
sidecar over its Unix socket (``KVMESH_KVBM_SOCKET``); the worker side
copies KV blocks between the engine's tensors and the sidecar's shared
arena. Matching, tiers, checksums and KV events stay in the sidecar.

Only the standard library is imported here: numpy, torch and the engines
are imported when a worker registers its KV cache.
"""

from .wire import Client, SidecarError, default_socket

__all__ = ["Client", "SidecarError", "default_socket"]
