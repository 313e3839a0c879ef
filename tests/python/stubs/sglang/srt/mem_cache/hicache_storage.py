# SPDX-License-Identifier: MIT
"""Stand-in for sglang.srt.mem_cache.hicache_storage: the names
kvclient.sglang imports, as SGLang documents them (HiCache's storage
backend interface: a key-value store of KV pages, the configuration each
rank's backend is built with, the extra information passed with a batch)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, List, Optional


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key: str, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None): ...

    @abstractmethod
    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None): ...

    @abstractmethod
    def set(self, key: str, value: Optional[Any] = None,
            target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> bool: ...

    @abstractmethod
    def batch_set(self, keys: List[str], values: Optional[Any] = None,
                  target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None
