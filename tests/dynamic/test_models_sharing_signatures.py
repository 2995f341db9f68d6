"""Models run one after the other in one process share op signatures.

A new signature joins its family (the same op at other unit dims) and starts
with the dims its nearest sibling made dynamic (csrc/aten/dynamic.cpp,
InheritDynamicDims). A dim that was 1 in the sibling tells nothing of itself:
it turns dynamic with the inherited dims of its size, so that it never meets
a padded dim of another input exact. Before: LayoutLM's attention backward
after DistilBERT's (a `[b, 1, 1, s]` mask where the sibling's bias was
`[1, 1, 1, 1]`) and GPT-J's rotary `add` after Funnel's (`[b, s, h, d]` +
`[b, s, h, d]` where the sibling added `[b, s, 1, d]`) could not build their
bounded modules and ran exact shapes for good: one compile per step. And
an elementwise call's dims that meet (aligned from the right, one size) are
padded in every input or in none (AlignElementwiseDims), whichever dims each
input inherited; the product bucket of a merged dim (an image's h*w tokens)
reaches only the dims aligned with it (ProductBuckets), not every dim of its
size (GPT-J's `add_` after 19 other models).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import debug, dynamic

RAISED = "building the bounded module raised"


@pytest.fixture(autouse=True)
def auto_mode():
    dynamic.forget_sizes()
    with dynamic.dynamic_shapes("auto"):
        yield
    dynamic.forget_sizes()


def no_failed_builds(stats):
    return not any(RAISED in reason for reasons in stats["exact_reasons"].values() for reason in reasons)


def attention_step(b, s, masked):
    """Forward and backward of a BERT-style attention on tpu and CPU; the tpu stats."""
    g = torch.Generator().manual_seed(100 * b + s)
    q, k, v = (torch.randn(b, 4, s, 8, generator=g) for _ in range(3))
    mask = torch.randn(b, 1, 1, s, generator=g) if masked else None
    results = []
    debug.reset_stats()
    for device in ("tpu", "cpu"):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
        # Activations, not leaves: a leaf that requires grad never turns dynamic.
        out = F.scaled_dot_product_attention(*(t * 1 for t in leaves),
                                             attn_mask=None if mask is None else mask.to(device))
        out.square().sum().backward()
        results.append([t.detach().cpu() for t in [out] + [leaf.grad for leaf in leaves]])
        if device == "tpu":
            stats = debug.stats()
    for got, expected in zip(*results):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    return stats


def test_a_masked_attention_after_an_unmasked_one_runs_bounded():
    for b, s in [(4, 12), (4, 14), (3, 14)]:
        attention_step(b, s, masked=False)
    first = attention_step(4, 12, masked=True)
    assert no_failed_builds(first), first["exact_reasons"]
    attention_step(4, 14, masked=True)
    for b, s in [(3, 13), (4, 11)]:  # warm buckets: nothing new
        stats = attention_step(b, s, masked=True)
        assert no_failed_builds(stats), stats["exact_reasons"]
        assert stats["compiles_by_op"].get("_scaled_dot_product_efficient_attention_backward", 0) == 0, stats


def add_step(shape_a, shape_b):
    a, b = torch.randn(shape_a), torch.randn(shape_b)
    debug.reset_stats()
    got = (a.to("tpu") * 1 + b.to("tpu") * 1).cpu()
    stats = debug.stats()
    torch.testing.assert_close(got, a + b)
    return stats


def test_an_add_whose_sibling_broadcast_a_unit_dim_runs_bounded():
    # The sibling: [3, s, h, 4] + [3, s, 1, 4], its s and h dynamic.
    for s, h in [(12, 5), (14, 6), (13, 5)]:
        add_step((3, s, h, 4), (3, s, 1, 4))
    # GPT-J's rotary halves: both inputs [3, s, 4, 4]; h = 4 is within 2x of
    # the sibling's 5, so it starts dynamic in the first input and must in
    # the second.
    for s in (12, 14, 13, 15):
        stats = add_step((3, s, 4, 4), (3, s, 4, 4))
        assert no_failed_builds(stats), stats["exact_reasons"]
        if s != 12:
            assert stats["compiles_by_op"].get("add.Tensor", 0) == 0, stats


def test_an_add_whose_inherited_dims_disagree_across_its_inputs_runs_bounded():
    # Found by replaying the adds of Funnel's, XLNet's and GPT-J's training
    # steps in one process: after a sibling that broadcast [1, s, h, 1] against
    # [s, s, 1, 1], GPT-J's [4, 12, 4, 4] + [4, 12, 4, 4] inherits the 4 of the
    # first input's batch (a size the sibling's heads had), but not the second
    # input's (its sibling dim was 13, not within 2x). An elementwise call's
    # dims that meet are padded alike (AlignElementwiseDims); before, the meta
    # kernel refused to broadcast 16 against 4 and the add ran exact for good.
    add_step((1, 13, 3, 1), (13, 13, 1, 1))
    add_step((1, 10, 2, 1), (10, 10, 1, 1))
    for s in (12, 14, 13):
        stats = add_step((4, s, 4, 4), (4, s, 4, 4))
        assert no_failed_builds(stats), stats["exact_reasons"]


def image_tokens_plus(b, hw, c):
    """An image padded in h and w, read as [b, h*w, c] tokens, plus a fresh tensor."""
    x, y = torch.randn(b, hw, hw, c), torch.randn(b, hw * hw, c)
    debug.reset_stats()
    image = x.to("tpu") * 2
    got = (image.view(b, hw * hw, c) + y.to("tpu") * 1).cpu()
    stats = debug.stats()
    torch.testing.assert_close(got, (x * 2).view(b, hw * hw, c) + y)
    return stats


def test_an_image_s_tokens_added_where_its_channels_have_their_count_run_bounded():
    # The tokens' dim takes the product of the image's buckets (64 for 5x5);
    # at 25 channels the other input's channel dim, of the same size but not
    # meeting the tokens, took 64 too while the image's own channels kept 26:
    # the add failed its bounded module and ran exact for good (GPT-J's add_
    # after 19 other models in one process: a reshaped read's merged dim).
    for hw, c in [(6, 30), (7, 33), (6, 34)]:
        image_tokens_plus(3, hw, c)
    for hw, c in [(5, 25), (7, 25), (5, 30)]:
        stats = image_tokens_plus(3, hw, c)
        assert no_failed_builds(stats), stats["exact_reasons"]
