"""The ops of a Transformer's training step that used to compile per sequence length
now run bounded-dynamic (TORCH_TPU_DYNAMIC_SHAPES=auto): a new length inside a warm
bucket compiles nothing. constant_pad_nd (the label shift of a causal LM's loss).
Every result is
compared with PyTorch on the CPU; compiles are read from debug.stats()."""
import pytest
import torch
import torch.nn.functional as F

from torch_tpu import debug


pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def _compiles():
    s = debug.stats()
    return s["compiles"], s["compiles_by_op"], s["exact_reasons"]


def test_label_shift_pad_on_new_lengths_compiles_nothing():
    # A causal LM's loss: labels padded by one ignore_index on the right, then shifted.
    def shift(labels):
        padded = F.pad(labels, (0, 1), value=-100)
        return padded, padded[..., 1:].contiguous()

    def run(n, seed):
        labels = torch.randint(0, 50, (4, n), generator=torch.Generator().manual_seed(seed))
        dev = shift(torch.exp(labels.to("tpu", torch.float32) * 0.01).to(torch.long) + labels.to("tpu"))
        cpu = shift(torch.exp(labels.float() * 0.01).to(torch.long) + labels)
        return dev, cpu

    for i, n in enumerate((12, 14)):  # the second length makes the signatures dynamic (bucket 16)
        run(n, i)
    for i, n in enumerate((13, 15, 11, 16)):
        debug.reset_stats()
        dev, cpu = run(n, 10 + i)
        compiles, by_op, reasons = _compiles()
        for d, c in zip(dev, cpu):
            assert d.shape == c.shape and torch.equal(d.cpu(), c), n
        assert compiles == 0, (n, by_op, reasons)


def test_pads_on_both_sides_and_crops_equal_cpu():
    # Non-negative pads of a dynamic dim run dynamic (on both sides, in two dims); a
    # crop keeps its dim static: cropping another dim still runs dynamic, cropping
    # the dynamic dim compiles exact shapes, and debug.stats() says why.
    pads = [(2, 3), (1, 0, 0, 2), (-1, 2), (0, 0, -1, 1)]

    def run(n, seed):
        x = torch.randn(3, n, 6, generator=torch.Generator().manual_seed(seed))
        h = torch.exp(x.to("tpu") * 0.5)  # dynamic in n from the second length: padded
        for p in pads:
            got = F.pad(h, p, value=1.5)
            want = F.pad(torch.exp(x * 0.5), p, value=1.5)
            assert got.shape == want.shape
            torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)

    for i, n in enumerate((12, 14)):
        run(n, i)
    for i, n in enumerate((13, 15, 11)):
        debug.reset_stats()
        run(n, 10 + i)
        compiles, by_op, reasons = _compiles()
        assert by_op == {"constant_pad_nd": 1}, (n, by_op, reasons)  # the crop of n
        assert reasons == {"constant_pad_nd": {"a negative pad (a crop) keeps its dim static": 1}}
