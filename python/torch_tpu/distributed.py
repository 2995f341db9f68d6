"""``torch.distributed`` on "tpu" tensors.

A c10d backend named ``"tpu_gloo"`` (``torch_tpu._C._StagingBackend``, C++)
serves tpu tensors: every collective copies its tpu tensors to host memory,
runs the collective on a gloo ``ProcessGroupGloo`` it wraps, and copies the
results back into the tpu tensors in place. It is not a PJRT collective: data
moves through the host, one collective at a time (each returns a completed
``Work``). ``ReduceOp.AVG`` and ``PREMUL_SUM`` (which gloo lacks) run as SUM
with a division after / a multiplication before.

Routing, set up by :func:`_install` when torch_tpu is imported (``import
torch`` has already imported ``torch.distributed``, so this costs nothing):

* ``Backend.register_backend("tpu_gloo", ..., devices=["tpu"])``: the default
  backend of the "tpu" device (``Backend.default_device_backend_map["tpu"]``),
  so ``init_process_group(device_id=torch.device("tpu", r))`` picks it.
* ``BackendConfig.__init__`` (the per-device backend table every
  ``init_process_group`` / ``new_group`` builds) is wrapped:

  - a table that maps some device to ``gloo`` (``backend="gloo"``) gets
    ``"tpu": "tpu_gloo"`` added;
  - a table that has ``tpu_gloo`` but no ``"cpu"`` entry
    (``init_process_group()`` with no backend, which torch resolves from the
    accelerator, "tpu"; or ``backend="tpu_gloo"``) gets ``"cpu": "gloo"``;
  - in both cases a ``"cuda"`` entry is dropped when CUDA is not available
    (otherwise torch would create a second, unused gloo context for it).

  So ``init_process_group("gloo")`` and ``init_process_group()`` give a process
  group with gloo for CPU tensors and tpu_gloo for tpu tensors; users change
  nothing.
"""
from __future__ import annotations

import torch

BACKEND_NAME = "tpu_gloo"
_installed = False


def _create_backend(store, rank: int, size: int, timeout):
    from torch.distributed.distributed_c10d import ProcessGroupGloo

    from . import _C

    gloo = ProcessGroupGloo(store, rank, size, timeout)
    return _C._StagingBackend(gloo)


def _patch_backend_config() -> None:
    from torch.distributed import distributed_c10d as c10d

    config_cls = c10d.BackendConfig
    if getattr(config_cls.__init__, "_torch_tpu", False):
        return
    original = config_cls.__init__

    def __init__(self, backend):  # noqa: N807
        original(self, backend)
        table = self.device_backend_map
        values = {str(v) for v in table.values()}
        changed = False
        if "tpu" not in table and c10d.Backend.GLOO in values:
            table["tpu"] = c10d.Backend(BACKEND_NAME)
            changed = True
        if table.get("tpu") == BACKEND_NAME and "cpu" not in table:
            table["cpu"] = c10d.Backend(c10d.Backend.GLOO)
            changed = True
        if changed and "cuda" in table and not torch.cuda.is_available():
            del table["cuda"]

    __init__._torch_tpu = True  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    config_cls.__init__ = __init__


def _install() -> None:
    """Registers the backend and the routing (idempotent)."""
    global _installed
    if _installed:
        return
    import torch.distributed as dist

    if not dist.is_available():
        return
    _installed = True
    from . import _C

    _C._init_distributed()
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["tpu"])
    _patch_backend_config()
