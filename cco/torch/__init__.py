"""CCO for PyTorch: the "cco" torch.distributed backend and a DDP communication hook.

``import cco.torch`` registers the backend; from then on a script written for Gloo
runs over CCO by naming it::

    import cco.torch
    import torch.distributed as dist
from torch._C._distributed_c10d import Store

    dist.init_process_group("cco")        # under torchrun: RANK, WORLD_SIZE, env://

and is started with the CCO services beside it, on one machine by one command::

    cco-node standalone -- torchrun --nproc-per-node 4 train.py

Where the settings come from (``CCO_CONFIG``, ``CCO_*`` variables, ``pg_options=``)
is :mod:`cco.torch.options`; the process group itself is
:mod:`cco.torch.process_group`; the DDP hook with a chosen wire width is
:mod:`cco.torch.hooks`.  Tensors must be dense CPU tensors; results are exact and
bit-identical on every rank.
"""

from __future__ import annotations

import atexit
import os
import threading
import weakref
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import Store

from cco.client import BlockingCommunicator, GroupSpec
from cco.torch.options import Options, Settings, settings
from cco.torch.process_group import BACKEND_NAME, ProcessGroupCCO, Work
from cco.wire.registries import GROUP_ID_SIZE

__all__ = ["BACKEND_NAME", "Options", "ProcessGroupCCO", "Work", "create"]

_STORE_PREFIX = "cco"
_CREDENTIAL_SIZE = 16


def create(backend_options: Any, pg_options: Options | None) -> ProcessGroupCCO:
    """The backend's constructor, as torch calls it (``extended_api``): join a new CCO
    group with this process group's ranks, agreeing on its id through torch's store."""
    if pg_options is not None and not isinstance(pg_options, Options):
        raise TypeError(
            f"pg_options for the cco backend is a cco.torch.Options, not {type(pg_options).__name__}"
        )
    store: Store = backend_options.store
    rank, size = int(backend_options.group_rank), int(backend_options.group_size)
    timeout: timedelta = backend_options.timeout
    group_name = str(backend_options.group_id)
    global_ranks = list(backend_options.global_ranks_in_group)
    resolved = settings(
        pg_options,
        global_rank=global_ranks[rank] if global_ranks else rank,
        group_name=group_name,
        default_group=not global_ranks,  # torch's default group lists no ranks
    )
    group_id, credential = _agree(store, rank, size, resolved)
    spec = GroupSpec(
        group_id=group_id,
        world_size=size,
        credential=credential,
        rank=rank,
        labels=resolved.labels,
        rendezvous=resolved.rendezvous,
        rendezvous_id=resolved.rendezvous_id,
    )
    join_timeout = resolved.join_timeout if resolved.join_timeout is not None else timeout.total_seconds()
    transport = (resolved.transport, *resolved.stripes) if resolved.stripes else resolved.transport
    comm = BlockingCommunicator(
        spec, resolved.node_id, transport, join_timeout, busy_poll_us=resolved.busy_poll_us
    )
    group = ProcessGroupCCO(rank, size, comm, width=resolved.width, nonfinite=resolved.nonfinite)
    _close_at_exit(group)
    return group


def _agree(store: Store, rank: int, size: int, resolved: Settings) -> tuple[bytes, bytes]:
    """The group id and credential every rank of this process group uses: rank 0 draws
    them and the others read them from the store (each init a new generation, so a
    store that outlives a group never hands out its id again)."""
    if resolved.group_id is not None:
        return resolved.group_id, resolved.credential or b""
    generation = (store.add(f"{_STORE_PREFIX}/joined", 1) - 1) // size
    key = f"{_STORE_PREFIX}/group/{generation}"
    if rank == 0:
        store.set(key, os.urandom(GROUP_ID_SIZE + _CREDENTIAL_SIZE).hex())
    agreed = bytes.fromhex(store.get(key).decode())  # waits for rank 0, within the store's timeout
    return bytes(agreed[:GROUP_ID_SIZE]), bytes(agreed[GROUP_ID_SIZE:])


_open_groups: weakref.WeakSet[ProcessGroupCCO] = weakref.WeakSet()
_exit_lock = threading.Lock()


def _close_at_exit(group: ProcessGroupCCO) -> None:
    """A script that never calls destroy_process_group still leaves its groups at exit,
    collectively (its last collectives complete on every rank first)."""
    with _exit_lock:
        if not _open_groups:
            atexit.register(_close_all)
        _open_groups.add(group)


def _close_all() -> None:
    for group in list(_open_groups):
        group.shutdown()


def register() -> None:
    """Register the "cco" backend with torch.distributed (done on import)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu"])


register()
