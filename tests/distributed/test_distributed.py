"""torch.distributed on "tpu" tensors: the tpu_gloo backend (torch_tpu.distributed).

Each test group spawns 2 processes (TORCH_TPU_CPU_DEVICES=2, rank r on tpu:r,
a TCP store on a free port) and checks collectives, DDP, FSDP2 and DTensor
tensor parallelism against values computed on the CPU. Failures inside a
worker re-raise here with the worker's traceback.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, *args) -> None:
    """Runs fn(rank, *args) in WORLD fresh processes (the environment is theirs only)."""
    env = {"TORCH_TPU_CPU_DEVICES": str(WORLD), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        mp.spawn(fn, args=args, nprocs=WORLD, join=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _init(rank: int, backend) -> torch.device:
    import torch_tpu  # noqa: F401

    assert torch.tpu.device_count() == WORLD
    torch.tpu.set_device(rank)
    dist.init_process_group(backend, rank=rank, world_size=WORLD, timeout=timedelta(seconds=60))
    return torch.device("tpu", rank)


def _no_fallbacks() -> None:
    import torch_tpu

    fallbacks = torch_tpu.debug.stats()["fallbacks"]
    assert not fallbacks, fallbacks


# ------------------------------------------------------------ collectives

def _collectives(rank: int, backend) -> None:
    import torch_tpu
    from torch.distributed import _functional_collectives as funcol

    dev = _init(rank, backend)
    pg = dist.group.WORLD
    assert torch.device("tpu") in pg._device_types and torch.device("cpu") in pg._device_types
    torch_tpu.debug.reset_stats()
    base = [torch.tensor([1.0, -2.0, 3.0, 0.5]), torch.tensor([4.0, 5.0, -6.0, 2.0])]
    mine = base[rank]

    def on_tpu(t: torch.Tensor) -> torch.Tensor:
        out = t.to(dev)
        assert out.device == dev
        return out

    expected = {
        dist.ReduceOp.SUM: base[0] + base[1],
        dist.ReduceOp.AVG: (base[0] + base[1]) / 2,
        dist.ReduceOp.MAX: torch.maximum(base[0], base[1]),
        dist.ReduceOp.MIN: torch.minimum(base[0], base[1]),
        dist.ReduceOp.PRODUCT: base[0] * base[1],
    }
    for op, want in expected.items():
        t = on_tpu(mine)
        storage = t.untyped_storage().data_ptr()
        dist.all_reduce(t, op=op)
        assert t.device == dev and t.untyped_storage().data_ptr() == storage  # in place
        torch.testing.assert_close(t.cpu(), want, msg=f"all_reduce {op}")
    t = on_tpu(mine)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5))
    torch.testing.assert_close(t.cpu(), expected[dist.ReduceOp.AVG], msg="PREMUL_SUM")
    # async_op: a completed Work whose future holds the tensor
    t = on_tpu(mine)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    assert work.get_future().value()[0] is t or torch.equal(work.get_future().value()[0].cpu(), t.cpu())
    torch.testing.assert_close(t.cpu(), expected[dist.ReduceOp.SUM])
    # integer AVG divides like the reference (floor), int SUM is exact
    ti = on_tpu(torch.tensor([rank * 3 + 1, 7], dtype=torch.int64))
    dist.all_reduce(ti)
    assert ti.cpu().tolist() == [1 + 4, 14]

    # broadcast from rank 1
    t = on_tpu(mine.clone())
    dist.broadcast(t, src=1)
    torch.testing.assert_close(t.cpu(), base[1])

    # all_gather (list) and all_gather_into_tensor
    outs = [torch.empty(4, device=dev) for _ in range(WORLD)]
    dist.all_gather(outs, on_tpu(mine))
    for i in range(WORLD):
        torch.testing.assert_close(outs[i].cpu(), base[i])
    flat = torch.empty(WORLD * 4, device=dev)
    dist.all_gather_into_tensor(flat, on_tpu(mine))
    torch.testing.assert_close(flat.cpu(), torch.cat(base))
    stacked = torch.empty(WORLD, 4, device=dev)
    dist.all_gather_into_tensor(stacked, on_tpu(mine))
    torch.testing.assert_close(stacked.cpu(), torch.stack(base))

    # reduce_scatter (list) and reduce_scatter_tensor, SUM and AVG
    full = [torch.arange(8.0) * (rank + 1), torch.arange(8.0, 16.0) - rank]
    total = (torch.arange(8.0) * 1 + torch.arange(8.0) * 2, (torch.arange(8.0, 16.0)) * 2 - 1)
    out = torch.empty(8, device=dev)
    dist.reduce_scatter(out, [on_tpu(x) for x in full])
    torch.testing.assert_close(out.cpu(), total[rank])
    inp = on_tpu(torch.cat(full))
    out = torch.empty(8, device=dev)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(out.cpu(), total[rank] / 2)
    torch.testing.assert_close(inp.cpu(), torch.cat(full))  # input untouched

    # all_to_all_single, even and uneven splits
    src = on_tpu(torch.arange(4.0) + 10 * rank)
    dst = torch.empty(4, device=dev)
    dist.all_to_all_single(dst, src)
    want = torch.tensor([0.0, 1.0, 10.0, 11.0]) if rank == 0 else torch.tensor([2.0, 3.0, 12.0, 13.0])
    torch.testing.assert_close(dst.cpu(), want)
    in_splits = [1, 3] if rank == 0 else [2, 2]
    out_splits = [1, 2] if rank == 0 else [3, 2]
    dst = torch.empty(sum(out_splits), device=dev)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    want = torch.tensor([0.0, 10.0, 11.0]) if rank == 0 else torch.tensor([1.0, 2.0, 3.0, 12.0, 13.0])
    torch.testing.assert_close(dst.cpu(), want)

    # send / recv
    if rank == 0:
        dist.send(on_tpu(torch.tensor([7.0, 8.0])), dst=1)
    else:
        r = torch.zeros(2, device=dev)
        dist.recv(r, src=0)
        torch.testing.assert_close(r.cpu(), torch.tensor([7.0, 8.0]))
    dist.barrier()

    # functional collectives (DTensor's path) on tpu tensors
    r = funcol.all_reduce(on_tpu(mine), "sum", pg)
    torch.testing.assert_close(r.cpu(), expected[dist.ReduceOp.SUM])
    g = funcol.all_gather_tensor(on_tpu(mine), 0, pg)
    torch.testing.assert_close(g.cpu(), torch.cat(base))
    rs = funcol.reduce_scatter_tensor(on_tpu(torch.cat(full)), "sum", 0, pg)
    torch.testing.assert_close(rs.cpu(), total[rank])

    # CPU tensors still go to gloo; objects too
    c = mine.clone()
    dist.all_reduce(c)
    torch.testing.assert_close(c, expected[dist.ReduceOp.SUM])
    objs = [None] * WORLD
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": 0}, {"rank": 1}]

    # tpu:1 holds rank 1's data; the collectives ran no op on the CPU
    _no_fallbacks()
    backend_obj = pg._get_backend(torch.device("tpu"))
    assert isinstance(backend_obj, torch_tpu._C._StagingBackend) and backend_obj.name() == "tpu_gloo"
    assert pg._get_backend(torch.device("cpu")).name() == "gloo"
    dist.destroy_process_group()


def test_collectives_gloo_routing():
    """init_process_group("gloo"): tpu tensors get tpu_gloo, CPU tensors gloo."""
    _spawn(_collectives, "gloo")


# ------------------------------------------------------------ training

def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)


STEPS = 3
LR = 0.1


def _cpu_reference() -> dict[str, torch.Tensor]:
    """Single-process CPU training on the full batch."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = _data()
    for _ in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _train(model, dev, rank, steps=STEPS):
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = _data()
    xs, ys = x.chunk(WORLD)[rank].to(dev), y.chunk(WORLD)[rank].to(dev)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xs), ys).backward()
        opt.step()


def _assert_state(state: dict, ref: dict, what: str) -> None:
    assert state.keys() == ref.keys(), (what, state.keys())
    for k, v in ref.items():
        torch.testing.assert_close(state[k], v, rtol=1e-5, atol=1e-6, msg=f"{what}: {k}")


def _training(rank: int, backend) -> None:
    import torch_tpu
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.nn.parallel import DistributedDataParallel as DDP

    dev = _init(rank, backend)
    ref = _cpu_reference()
    torch_tpu.debug.reset_stats()

    # DDP, device_ids=[rank]: gradients averaged by the tpu_gloo allreduce;
    # find_unused_parameters stages its used map through pinned host memory
    ddp = DDP(_mlp().to(dev), device_ids=[rank], find_unused_parameters=True)
    assert next(ddp.parameters()).device == dev
    _train(ddp, dev, rank)
    _assert_state({k: v.cpu() for k, v in ddp.module.state_dict().items()}, ref, "DDP")

    # FSDP2: parameters sharded over a 1-D tpu mesh
    mesh = init_device_mesh("tpu", (WORLD,))
    model = _mlp().to(dev)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    w = model[0].weight
    assert isinstance(w, DTensor) and w.to_local().device == dev
    assert w.to_local().shape == (16 // WORLD, 8)
    _train(model, dev, rank)
    state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).cpu()
             for k, v in model.state_dict().items()}
    _assert_state(state, ref, "FSDP2")

    # DTensor tensor parallelism: column- then row-wise sharded Linear pair
    torch.manual_seed(0)
    cpu_model = _mlp()
    x, _ = _data()
    cpu_out = cpu_model(x)
    cpu_out.sum().backward()
    tp = _mlp().to(dev)
    parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert tp[0].weight.to_local().shape == (16 // WORLD, 8)
    assert tp[2].weight.to_local().shape == (4, 16 // WORLD)
    out = tp(x.to(dev))
    assert not isinstance(out, DTensor) and out.device == dev
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    for name in ("0.weight", "2.weight", "2.bias"):
        grad = tp.get_parameter(name).grad.full_tensor().cpu()
        torch.testing.assert_close(grad, cpu_model.get_parameter(name).grad, rtol=1e-5, atol=1e-6,
                                   msg=name)
    _no_fallbacks()
    dist.destroy_process_group()


def test_ddp_fsdp2_tensor_parallel():
    """init_process_group() with no backend: DDP, FSDP2 and TP equal CPU training."""
    _spawn(_training, None)
