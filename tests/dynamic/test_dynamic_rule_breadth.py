"""Rules beyond the Transformer's hot path that run bounded-dynamic: max/min along a
dim, scans (cumprod, cummax, cummin, logcumsumexp), glu, flip and roll of the other
dims, repeat, index_select and index_add along a new index length, the piecewise
losses (huber, smooth L1, binary cross entropy) and log-sigmoid with their
backward, and a diff's two windows of one storage (`x[:, 1:] - x[:, :-1]`).

Each case runs at lengths 12 and 14 (the second makes its signatures dynamic, bucket
16), then at 13, 15 and 11: results equal PyTorch's on the CPU, and those three
compile nothing. A dim a rule keeps static (the one a flip reverses) still compiles
per size, and debug.stats() says why."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug

pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py

WARM, NEW = (12, 14), (13, 15, 11)


def _run(fn, make, n, seed):
    """fn on the CPU and on tpu for the inputs make(n, generator): (tpu results, CPU results)."""
    args = make(n, torch.Generator().manual_seed(seed))
    return fn(*[a.to("tpu") for a in args]), fn(*args)


def activation(x):
    """x as an activation that requires grad (a leaf that requires grad is a
    parameter, whose sizes stay static): x times a scalar parameter."""
    return x * torch.ones((), device=x.device, requires_grad=True)


def _as_list(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def new_lengths_compile_nothing(fn, make, tol=1e-5):
    for i, n in enumerate(WARM):
        _run(fn, make, n, i)
    for i, n in enumerate(NEW):
        debug.reset_stats()
        got, want = _run(fn, make, n, 10 + i)
        for g, w in zip(_as_list(got), _as_list(want)):
            assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape)
            torch.testing.assert_close(g.cpu(), w, rtol=tol, atol=tol)
        s = debug.stats()
        assert s["compiles"] == 0, (n, s["compiles_by_op"], s["exact_reasons"])
        assert s["fallbacks"] == {}, s["fallbacks"]


def rows(n, g):
    return (torch.randn(3, n, 7, generator=g),)


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_along_a_dim_give_values_and_indices(op, dim):
    new_lengths_compile_nothing(lambda x: tuple(getattr(x, op)(dim=dim)), rows)
    new_lengths_compile_nothing(lambda x: tuple(getattr(x, op)(dim=dim, keepdim=True)), rows)


@pytest.mark.parametrize("dim", [1, 2])
def test_scans_along_the_dynamic_dim_and_another(dim):
    new_lengths_compile_nothing(lambda x: (x * 0.2 + 1).cumprod(dim), rows)
    new_lengths_compile_nothing(lambda x: tuple(x.cummax(dim)), rows)
    new_lengths_compile_nothing(lambda x: tuple(x.cummin(dim)), rows)
    new_lengths_compile_nothing(lambda x: x.logcumsumexp(dim), rows)


def test_glu_and_its_backward_over_a_static_dim():
    def fn(x):
        h = activation(x)
        y = F.glu(h, dim=-1)
        return y.detach(), torch.autograd.grad((y * y).sum(), h)[0]

    new_lengths_compile_nothing(fn, lambda n, g: (torch.randn(2, n, 8, generator=g),))


def test_flip_roll_and_repeat_of_the_other_dims():
    new_lengths_compile_nothing(lambda x: x.flip(0, 2), rows)
    new_lengths_compile_nothing(lambda x: x.roll(2, 2), rows)
    new_lengths_compile_nothing(lambda x: x.roll((1, -2), (0, 2)), rows)
    new_lengths_compile_nothing(lambda x: x.repeat(2, 1, 3), rows)
    new_lengths_compile_nothing(lambda x: x.repeat(2, 1, 1, 1), rows)


def test_flipping_the_dynamic_dim_keeps_exact_shapes_and_says_why():
    for i, n in enumerate(WARM + NEW):
        debug.reset_stats()
        got, want = _run(lambda x: x.flip(1), rows, n, i)
        assert torch.equal(got.cpu(), want)
        s = debug.stats()
        assert s["compiles"] == 1, (n, s)
        if i > 0:
            assert s["exact_reasons"] == {"flip": {"the dims it flips": 1}}, s["exact_reasons"]


def test_index_select_and_index_add_along_a_new_index_length():
    def select(x, idx):
        return x.index_select(0, idx), x.index_select(1, idx % 5)

    new_lengths_compile_nothing(select, lambda n, g: (torch.randn(6, 5, generator=g),
                                                      torch.randint(0, 6, (n,), generator=g)))

    def add(base, idx, src):
        return base.index_add(1, idx, src, alpha=0.5)

    new_lengths_compile_nothing(add, lambda n, g: (torch.randn(3, 5, generator=g),
                                                   torch.randint(0, 5, (n,), generator=g),
                                                   torch.randn(3, n, generator=g)))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_piecewise_losses_and_their_backward(reduction):
    def fn(x, t):
        h = activation(x)
        losses = [F.huber_loss(h, t, reduction=reduction, delta=0.7),
                  F.smooth_l1_loss(h, t, reduction=reduction, beta=0.4),
                  F.binary_cross_entropy(torch.sigmoid(h), torch.sigmoid(t), reduction=reduction)]
        grad = torch.autograd.grad(sum(loss.sum() for loss in losses), h)[0]
        return [loss.detach() for loss in losses] + [grad]

    new_lengths_compile_nothing(fn, lambda n, g: (torch.randn(4, n, generator=g),
                                                  torch.randn(4, n, generator=g)), tol=2e-5)


def test_log_sigmoid_and_its_backward():
    def fn(x):
        h = activation(x)
        y = F.logsigmoid(h * 3)
        return y.detach(), torch.autograd.grad(y.sum(), h)[0]

    new_lengths_compile_nothing(fn, lambda n, g: (torch.randn(2, n, 5, generator=g),))


def test_a_diff_reads_two_windows_of_one_storage():
    # x[:, 1:] needs the storage's dim padded past its bucket; x[:, :-1] fits it as it
    # is: the call takes one layout both read.
    new_lengths_compile_nothing(lambda x: x[:, 1:] - x[:, :-1], rows)
    new_lengths_compile_nothing(lambda x: torch.diff(x, dim=1), rows)
    new_lengths_compile_nothing(lambda x: x[:, 2:] * x[:, :-2], rows)


def test_a_window_past_a_padded_buffers_end_reads_it_in_place():
    # h[:, 1:] of a padded result (rows in bucket 16) at the window's bucket 16 runs past
    # the buffer's end: the module reads to the end and zeros after, and h keeps its
    # buffer (no copy into a larger layout).
    def fn(x):
        h = torch.exp(x)
        d = h[:, 1:] - h[:, :-1]
        if h.device.type == "tpu":
            padded = torch_tpu._C._padded_shape(h)  # [] for the first length's exact storage
            assert padded in ([], [3, 16, 7]), padded
        return d

    new_lengths_compile_nothing(fn, rows)
