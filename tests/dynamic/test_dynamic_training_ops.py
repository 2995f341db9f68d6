"""The ops of a Transformer's training step that used to compile per sequence length
now run bounded-dynamic (TORCH_TPU_DYNAMIC_SHAPES=auto): a new length inside a warm
bucket compiles nothing. constant_pad_nd (the label shift of a causal LM's loss),
attention that saves its logsumexp for backward and its backward, and the loss on
the [b*s, V] logits (log_softmax, nll_loss and their backward on padded rows).
Every result is compared with PyTorch on the CPU; compiles are read from
debug.stats()."""
import math

import pytest
import torch
import torch.nn.functional as F

from torch_tpu import debug


pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def _compiles():
    s = debug.stats()
    return s["compiles"], s["compiles_by_op"], s["exact_reasons"]


def _new_lengths_equal_cpu_and_compile_nothing(run, tol):
    """`run(n, seed)` returns (tpu results, CPU results) at length n: after lengths
    12 and 14 (the second makes the signatures dynamic, bucket 16), lengths 13,
    15 and 11 give CPU's results and compile nothing."""
    for i, n in enumerate((12, 14)):
        run(n, i)
    for i, n in enumerate((13, 15, 11)):
        debug.reset_stats()
        got, want = run(n, 10 + i)
        compiles, by_op, reasons = _compiles()
        for d, c in zip(got, want):
            torch.testing.assert_close(d.cpu(), c, rtol=tol, atol=tol)
        assert compiles == 0, (n, by_op, reasons)


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


class _Attention(torch.nn.Module):
    """Token embedding, then grouped-query self-attention (4 query heads, 2 key/value
    heads, head dim 8), as a language model's first block: the embedding's result is
    [b, s, h] padded in s, which the projections' mm runs on (padded_rows.cpp)."""

    def __init__(self, vocab=40, hidden=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.q = torch.nn.Linear(hidden, heads * self.dim, bias=False)
        self.kv = torch.nn.Linear(hidden, 2 * kv_heads * self.dim, bias=False)
        self.o = torch.nn.Linear(heads * self.dim, hidden, bias=False)

    def forward(self, ids, causal, mask=None):
        x = self.embed(ids)
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


def _on_cpu_and_tpu(module_class):
    """Two instances with the same random weights (seed 0): one on the CPU, one on tpu."""
    torch.manual_seed(0)
    cpu = module_class()
    dev = module_class()
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev.to("tpu")


@pytest.mark.parametrize("causal", [True, False])
def test_attention_training_on_new_lengths_compiles_nothing(causal):
    # Forward (saving its logsumexp) and backward of attention, batch 3: the output
    # and the parameters' gradients equal CPU's, and lengths 13, 15, 11 after 12 and
    # 14 compile no executable at all. Not causal: a key-padding mask (bool).
    cpu, dev = _on_cpu_and_tpu(_Attention)

    def run(n, seed):
        ids = torch.randint(0, 40, (3, n), generator=torch.Generator().manual_seed(seed))
        mask = None
        if not causal:  # the last keys of rows 2 and 3 hidden
            keep = torch.arange(n)[None, :] < torch.tensor([n, n - 2, n - 5])[:, None]
            mask = keep[:, None, None, :]
        results = []
        for model, device in ((dev, "tpu"), (cpu, "cpu")):
            model.zero_grad()
            y = model(ids.to(device), causal, None if mask is None else mask.to(device))
            (y * y).sum().backward()
            results.append([y.detach()] + [p.grad for p in model.parameters()])
        return results

    _new_lengths_equal_cpu_and_compile_nothing(run, tol=1e-4)


def test_saved_logsumexp_equals_cpu_at_new_lengths():
    # The logsumexp the forward saves for backward: [b, h, L rounded up to 32], its
    # real rows equal CPU's and the rest zeros, at bounded-dynamic lengths too: 31 in
    # the 32-bucket (the bucket is the rounded size: the padding row must read 0),
    # then 32 in it, 33 (64 rows).
    torch.manual_seed(0)
    op = torch.ops.aten._scaled_dot_product_efficient_attention

    def run(n):
        q, k, v = (torch.randn(2, 4, n, 8) for _ in range(3))
        h = [torch.exp(t.to("tpu") * 0.1) for t in (q, k, v)]  # not parameters: dims may turn dynamic
        out, lse, _, _ = op(*h, None, True, 0.0, True)
        qc, kc, vc = (torch.exp(t * 0.1) for t in (q, k, v))
        scores = (qc @ kc.transpose(-1, -2)) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        want = torch.zeros(2, 4, (n + 31) // 32 * 32)
        want[..., :n] = torch.logsumexp(scores, -1)
        torch.testing.assert_close(lse.cpu(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(qc, kc, vc, is_causal=True),
                                   rtol=1e-5, atol=1e-5)

    for n in (12, 14):
        run(n)
    for n in (13, 11, 31, 32, 33):
        debug.reset_stats()
        run(n)
        compiles, by_op, reasons = _compiles()
        if n in (13, 11, 32):  # inside a warm bucket (16; 32, which 31 compiled)
            assert compiles == 0, (n, by_op, reasons)


def test_attention_backward_at_a_whole_and_a_cut_logsumexp_in_one_bucket():
    # Grouped-query attention's training step (Mistral's: a transposed query,
    # enable_gqa, causal) at batch 5 and lengths 36, then 32: both run in the
    # bucket (8, 36), but the backward gets its logsumexp cut to 36 of its 64
    # rows at 36 (a view: an offset parameter) and whole at 32. They keyed
    # one executable: "Execution supplied 25 buffers but compiled program
    # expected 26" at 32 (the first random training probe of this model).
    torch.manual_seed(0)
    weights = [torch.randn(32, n) * 0.2 for n in (32, 16, 16)]

    def run(b, s, device):
        x = torch.randn(b, s, 32, generator=torch.Generator().manual_seed(100 * b + s)).to(device)
        ws = [w.clone().to(device).requires_grad_() for w in weights]
        q = (x @ ws[0]).view(b, s, 4, 8).transpose(1, 2)
        k, v = (((x @ w).view(b, s, 2, 8).transpose(1, 2) * 1).contiguous() for w in ws[1:])
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, scale=0.35)
        out.square().sum().backward()
        return [out.detach().cpu()] + [w.grad.cpu() for w in ws]

    for b, s in [(3, 12), (4, 15), (5, 36), (5, 32), (5, 33)]:
        for got, want in zip(run(b, s, "tpu"), run(b, s, "cpu")):
            torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


class _LMHead(torch.nn.Module):
    """Embedding, RMS norm and an lm_head: logits [b, s, V] padded in s (and b)."""

    def __init__(self, vocab=48, hidden=16):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.norm = torch.nn.RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        return self.head(self.norm(self.embed(ids)))


def _causal_lm_loss(logits, labels, reduction):
    # transformers' ForCausalLMLoss: labels padded by ignore_index and shifted, both
    # flattened to rows: the logits' [b*s, V] view folds dims padded in b and s.
    labels = F.pad(labels, (0, 1), value=-100)[..., 1:].contiguous()
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                           reduction=reduction)
    return loss if reduction != "none" else loss.sum() / 7


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_causal_lm_loss_on_padded_rows_compiles_nothing(reduction):
    # log_softmax, nll_loss and their backward run on all the buffer rows of the
    # [b*s, V] logits (the padding rows' targets ignored); losses and every
    # gradient equal CPU's, new lengths and batch sizes compile nothing (mean, sum).
    cpu, dev = _on_cpu_and_tpu(_LMHead)

    def run(b, n, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 48, (b, n), generator=g)
        labels = ids.masked_fill(torch.rand(b, n, generator=g) < 0.2, -100)  # padding tokens
        results = []
        for model, device in ((dev, "tpu"), (cpu, "cpu")):
            model.zero_grad()
            loss = _causal_lm_loss(model(ids.to(device)), labels.to(device), reduction)
            loss.backward()
            results.append([loss.detach()] + [p.grad for p in model.parameters()])
        return results

    for i, (b, n) in enumerate(((4, 12), (4, 14), (3, 12))):  # lengths and batch sizes turn dynamic
        run(b, n, i)
    for i, (b, n) in enumerate(((4, 13), (4, 15), (3, 11), (2, 16))):
        debug.reset_stats()
        got, want = run(b, n, 10 + i)
        compiles, by_op, reasons = _compiles()
        for d, c in zip(got, want):
            torch.testing.assert_close(d.cpu(), c, rtol=1e-5, atol=1e-5)
        if reduction != "none":  # none sums the [b*s] losses: an exact sum of a view of their rows
            assert compiles == 0, ((b, n), by_op, reasons)


def test_writes_into_part_of_a_padded_storage_compile_nothing():
    # RoPE's backward: slice_backward is zeros, then a copy into one half of the
    # head dim; in-place ops on a window of a storage padded in its sequence dim
    # write into its padded layout (the other half and the padding untouched).
    torch.manual_seed(0)

    def run(n, seed):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(2, 3, n, 8, generator=g), torch.randn(2, 3, n, 8, generator=g)
        out = []
        for device in ("tpu", "cpu"):
            a, b = torch.exp(x.to(device) * 0.5), torch.exp(y.to(device) * 0.5)  # dynamic: padded in n
            z = a.new_zeros(2, 3, n, 16)
            z[..., 8:].copy_(a)                 # copy_ into a window (slice_backward's form)
            z[..., :8].add_(b)                  # an elementwise update of the other half
            z[:, 1:2].mul_(2.0)                 # a window in a static dim: all of n
            w = torch.cat([a, b], -1)
            w[..., 4:12] = b                    # index assignment: copy_ into the middle
            out.append((z, w, torch.ops.aten.slice_backward(a, [2, 3, n, 16], 3, 0, 8, 1) * 1.0))
        return out

    _new_lengths_equal_cpu_and_compile_nothing(run, tol=1e-6)


@pytest.mark.parametrize("rotary", [8, 4])
def test_rotary_gradients_of_two_models_compile_nothing_at_new_sizes(rotary):
    # Two models' RoPE backward in one process: GPT-NeoX rotates a quarter of its
    # head dim (2 of 8), then Mistral all of it (8) or Phi half (4). slice_backward
    # copies into windows of the head dim: `[..., :2]` then `[..., :4]` of 8 (one
    # copy_ signature seen at two widths turns the width dynamic, but a window short
    # of its dim's end cannot run dynamic: the signature keeps that dim static and
    # runs bounded in batch and length), and, at 8, `[..., 8:]`, an empty window
    # (nothing to compute). Before: 2 (at 8) or 1 compiles at every new size.
    def run(b, n, rot, seed):
        x = torch.randn(b, n, 32, generator=torch.Generator().manual_seed(seed))
        angle = torch.arange(n)[:, None] * torch.linspace(0.1, 1.0, rot)[None]
        out = []
        for device in ("tpu", "cpu"):
            h = x.to(device) * torch.ones((), device=device, requires_grad=True)
            q = h.view(b, n, 4, 8).transpose(1, 2)
            q_rot, q_pass = q[..., :rot], q[..., rot:]
            x1, x2 = q_rot[..., : rot // 2], q_rot[..., rot // 2 :]
            cos, sin = angle.cos().to(device), angle.sin().to(device)
            y = torch.cat([q_rot * cos + torch.cat((-x2, x1), -1) * sin, q_pass], -1)
            out.append(torch.autograd.grad((y * y).sum(), h)[0])
        return out

    for rot in (2, rotary):
        for i, (b, n) in enumerate(((4, 12), (4, 14), (3, 14))):
            run(b, n, rot, i)
    for i, (b, n) in enumerate(((4, 13), (4, 15), (3, 13), (2, 10))):
        debug.reset_stats()
        got, want = run(b, n, rotary, 20 + i)
        compiles, by_op, reasons = _compiles()
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        assert compiles == 0, ((b, n), by_op, reasons)


def test_writes_into_part_of_a_padded_dim():
    # A window of the padded dim itself. To its end (rows 2.. of n + 2: BART's
    # `shifted[:, 1:] = ids[:, :-1]`), the result's padding lands past the real rows:
    # dynamic. Short of its end (rows ..n of n + 2), it would land on real rows: exact
    # shapes. Values equal CPU's.
    def run(n, seed):
        x = torch.randn(3, n, 4, generator=torch.Generator().manual_seed(seed))
        out = []
        for device in ("tpu", "cpu"):
            a = torch.exp(x.to(device) * 0.5)
            z = a.new_zeros(3, n + 2, 4)
            z[:, 2:].copy_(a)
            z[:, :n].add_(a)
            out.append(z)
        return out

    for i, n in enumerate((10, 12, 11, 13, 14)):  # n + 2 in the bucket 16
        debug.reset_stats()
        got, want = run(n, i)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
        if i >= 2:
            s = debug.stats()
            assert s["exact_reasons"] == {"add_.Tensor": {"in-place write to part of a storage, a dynamic dim not to its end": 1}}, s
            assert s["compiles_by_op"] == {"add_.Tensor": 1}, s


def test_shifting_labels_right_compiles_nothing():
    # An encoder-decoder's decoder inputs (BART's shift_tokens_right; T5, Marian, Pegasus
    # and Whisper shift alike): a read of ids[:, :-1] and a write into shifted[:, 1:],
    # windows cut one element short of the dim at either end.
    from transformers.models.bart.modeling_bart import shift_tokens_right

    def run(n, seed):
        labels = torch.randint(0, 50, (4, n), generator=torch.Generator().manual_seed(seed))
        labels[:, -2:] = -100
        return [shift_tokens_right(labels.to("tpu"), 1, 2)], [shift_tokens_right(labels, 1, 2)]

    _new_lengths_equal_cpu_and_compile_nothing(run, tol=0)
