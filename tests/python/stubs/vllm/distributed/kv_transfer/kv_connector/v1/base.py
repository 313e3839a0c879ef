# SPDX-License-Identifier: MIT
"""Stand-in for vllm.distributed.kv_transfer.kv_connector.v1.base: the
three names kvclient.vllm imports, as vLLM documents them (the base class
of a v1 KV connector, its role, its scheduler-to-worker metadata). The
base keeps the metadata vLLM's model runner binds before each forward pass
and clears after it; every other method is the connector's."""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0	# in the scheduler process
    WORKER = 1		# in each worker process


class KVConnectorMetadata(ABC):  # noqa: B024
    """What the scheduler-side connector hands the workers each step."""


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    @property
    def requires_kv_delivery(self) -> bool:
        # vLLM's default: a producer's KV must reach its consumer.
        return self._kv_transfer_config.is_kv_producer

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        # vLLM's default: full CUDA graphs allowed (no layer-wise calls).
        return False

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def register_kv_caches(self, kv_caches) -> None:
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None: ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None: ...

    @abstractmethod
    def wait_for_save(self) -> None: ...

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self) -> set:
        return set()

    def shutdown(self) -> None:
        return None

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int): ...

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int): ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata: ...

    def request_finished(self, request, block_ids):
        return False, None
