"""Random draws at new sizes (TORCH_TPU_DYNAMIC_SHAPES=auto).

Every random bit on tpu is ThreeFry-2x32-20 of the generator's seed (the key) and its
offset plus the element's row-major index among the real elements (the counter;
csrc/lowering/random_bits.cpp). So a draw does not depend on the shape it was computed
at: dropout and attention's dropout run on bounded-dynamic executables at new sizes and
draw, for the real elements, exactly what the exact-shape executables draw. A seeded run
gives the same numbers whichever executables served it.
"""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug
from test_new_shapes_generate import llama, prompt  # noqa: F401 (llama: a fixture)


pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py

M32 = 0xFFFFFFFF


def threefry(key, counter):
    """ThreeFry-2x32 with 20 rounds (Salmon et al., Random123): two 32-bit words."""
    k0, k1 = key & M32, key >> 32
    ks = [k0, k1, k0 ^ k1 ^ 0x1BD11BDA]
    x0, x1 = (counter & M32) + ks[0] & M32, (counter >> 32) + ks[1] & M32
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    for i in range(5):
        for r in rotations[i % 2]:
            x0 = x0 + x1 & M32
            x1 = ((x1 << r | x1 >> 32 - r) & M32) ^ x0
        x0 = x0 + ks[(i + 1) % 3] & M32
        x1 = x1 + ks[(i + 2) % 3] + i + 1 & M32
    return x0, x1


def test_the_reference_is_random123s_threefry():
    # Random123's known-answer vectors for threefry2x32_20 (key and counter as 64-bit ints).
    assert threefry(0, 0) == (0x6B200159, 0x99BA4EFE)
    assert threefry(M32 << 32 | M32, M32 << 32 | M32) == (0x1CB996FC, 0xBB002BE7)
    assert threefry(0x03707344 << 32 | 0x13198A2E, 0x85A308D3 << 32 | 0x243F6A88) == (0xC4923A9C, 0x483DF7A0)


def uniform_f32(seed, offset, n):
    """torch.rand's f32 values: element j takes word j % 2 of counter offset + j // 2."""
    words = np.array([threefry(seed, offset + j // 2)[j % 2] for j in range(n)], dtype=np.uint32)
    return (words >> 9 | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)


def uniform_f64(seed, offset, n):
    """float64: element j takes both words of counter offset + j."""
    bits = np.array([(lambda w: w[1] << 32 | w[0])(threefry(seed, offset + j)) for j in range(n)], dtype=np.uint64)
    return (bits >> np.uint64(12) | np.uint64(0x3FF0000000000000)).view(np.float64) - 1.0


def test_the_stream_is_threefry_of_the_seed_and_each_elements_index():
    torch.manual_seed(7)
    a = torch.rand(5, 3, device="tpu")
    b = torch.rand(4, device="tpu")  # the generator advanced by a's 15 elements + 1
    c = torch.rand(3, dtype=torch.float64, device="tpu")  # 64-bit: two counters per element drawn
    d = torch.rand(2, device="tpu")
    np.testing.assert_array_equal(a.cpu().numpy().ravel(), uniform_f32(7, 0, 15))
    np.testing.assert_array_equal(b.cpu().numpy(), uniform_f32(7, 16, 4))
    np.testing.assert_array_equal(c.cpu().numpy(), uniform_f64(7, 21, 3))
    np.testing.assert_array_equal(d.cpu().numpy(), uniform_f32(7, 28, 2))


def test_a_float32_normal_takes_both_words_of_one_counter():
    torch.manual_seed(11)
    z = torch.randn(6, device="tpu").cpu().numpy().astype(np.float64)
    w = np.array([threefry(11, j) for j in range(6)], dtype=np.uint32)
    u1, u2 = ((w >> 9 | np.uint32(0x3F800000)).view(np.float32) - np.float32(1)).astype(np.float64).T
    np.testing.assert_allclose(z, np.sqrt(-2 * np.log(1 - u1)) * np.cos(2 * np.pi * u2), rtol=1e-5, atol=1e-6)


def test_consecutive_float64_normals_share_no_counters():
    # Box-Muller draws two 64-bit uniforms per element: the generator advances by 2n + 1,
    # so the next call's uniforms are not this call's second half.
    torch.manual_seed(3)
    x = torch.randn(1000, dtype=torch.float64, device="tpu").cpu()
    y = torch.randn(1000, dtype=torch.float64, device="tpu").cpu()
    assert abs(np.corrcoef(x.numpy(), y.numpy())[0, 1]) < 0.1
    assert not np.isin(x.numpy(), y.numpy()).any()


def in_mode(mode, fn):
    before = torch_tpu._C._dynamic_shapes()
    torch_tpu.dynamic.set_mode(mode)
    try:
        return fn()
    finally:
        torch_tpu.dynamic.set_mode(before)


def factory_draws(n):
    torch.manual_seed(n)
    drawn = [torch.rand(n, 3, device="tpu"), torch.randn(2, n, device="tpu"),
             torch.randn(n, dtype=torch.float64, device="tpu"), torch.randint(0, 10, (n,), device="tpu"),
             torch.bernoulli(torch.full((n, 2), 0.3, device="tpu")), torch.empty(n, 4, device="tpu").uniform_(-2, 2),
             torch.empty(n, 2, device="tpu").exponential_(2.0),
             torch.empty(3, n, device="tpu").log_normal_(0.5, 0.3),
             # normal with tensor mean / std: drawn at their broadcast real sizes (n from mean, n - 1 from std)
             torch.normal(torch.arange(n * 2.0, device="tpu").reshape(n, 2), 2.0),
             torch.normal(torch.zeros(n, 1, device="tpu") + 1, torch.ones(1, n - 1, device="tpu") * 2),
             # complex fills: both parts at the real sizes
             torch.randn(3, n, dtype=torch.complex64, device="tpu"),
             torch.rand(n, 2, dtype=torch.complex128, device="tpu")]
    return [t.cpu() for t in drawn]


def test_random_fills_at_new_sizes_compile_nothing_and_draw_what_exact_shapes_draw():
    # rand, randn (f32 and f64), randint, bernoulli, uniform_, exponential_, log_normal_,
    # complex randn / rand: each a fill of its destination drawn at its real sizes;
    # normal with tensor mean / std, at the real sizes of its operands broadcast.
    for n in (9, 10):
        factory_draws(n)
    for n in (12, 11, 16):
        debug.reset_stats()
        got = factory_draws(n)
        s = debug.stats()
        assert s["compiles"] == 0, (n, s["compiles_by_op"], s["exact_reasons"])
        want = in_mode("0", lambda: factory_draws(n))
        for g, w in zip(got, want):
            assert torch.equal(g, w), n
        assert 0 <= got[0].min() and got[0].max() < 1 and 0 <= got[3].min() and got[3].max() < 10


def dropout_step(n, seed):
    g = torch.Generator().manual_seed(100 + n)
    x = torch.randn(3, n, 16, generator=g).to("tpu")
    torch.manual_seed(seed)
    y, mask = torch.ops.aten.native_dropout(x, 0.3, True)
    grad = torch.ops.aten.native_dropout_backward(torch.ones_like(y), mask, 1 / 0.7)
    return y.cpu(), mask.cpu(), grad.cpu()


def test_dropout_at_new_sizes_compiles_nothing_and_draws_what_exact_shapes_draw():
    for n in (9, 10):  # the second size makes the sequence dim dynamic (bucket 16)
        dropout_step(n, 0)
    for n in (12, 11, 13, 16):
        debug.reset_stats()
        y, mask, grad = dropout_step(n, n)
        s = debug.stats()
        assert s["compiles"] == 0, (n, s["compiles_by_op"], s["exact_reasons"])
        y0, mask0, grad0 = in_mode("0", lambda: dropout_step(n, n))
        assert torch.equal(mask, mask0) and torch.equal(y, y0) and torch.equal(grad, grad0), n
        assert 0.15 < 1 - mask.float().mean().item() < 0.45, n


def attention_step(n, w, seed, p=0.25):
    # q, k, v come out of a matmul (an input, not a parameter: parameters never turn dynamic).
    g = torch.Generator().manual_seed(200 + n)
    x = torch.randn(1, n, 32, generator=g).to("tpu")  # its n rows: all in the 16-bucket
    qkv = (x @ w).view(1, n, 3, 4, 8).permute(2, 0, 3, 1, 4)
    torch.manual_seed(seed)
    out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], dropout_p=p)
    (grad,) = torch.autograd.grad(out.square().sum(), w)
    return out.detach().cpu(), grad.cpu()


def test_attention_dropout_at_new_sizes_compiles_nothing_and_matches_exact_shapes():
    w = (torch.randn(32, 96, generator=torch.Generator().manual_seed(0)) / 6).to("tpu").requires_grad_()
    for n in (9, 10):
        attention_step(n, w, 0)
    assert not torch.allclose(attention_step(10, w, 0)[0], attention_step(10, w, 0, p=0)[0])
    for n in (12, 11, 14):
        debug.reset_stats()
        out, grad = attention_step(n, w, n)
        s = debug.stats()
        assert s["compiles"] == 0, (n, s["compiles_by_op"], s["exact_reasons"])
        out0, grad0 = in_mode("0", lambda: attention_step(n, w, n))
        # The same mask: a different one would change whole rows (dropout_p 0.25).
        torch.testing.assert_close(out, out0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad, grad0, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("arch", ["bert", "roberta"])
def test_training_with_dropout_at_new_lengths_compiles_nothing_and_matches_exact_shapes(arch):
    # Hugging Face's default dropout (0.1: hidden states and attention probabilities), trained
    # at padded lengths a warm bucket holds; BERT's pooler reads token 0 (its backward writes
    # row 0 of a padded zeros). The exact-shape run from the same weights and seeds draws the
    # same masks: the losses agree step by step.
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    if arch == "bert":
        model = transformers.BertForSequenceClassification(transformers.BertConfig(max_position_embeddings=128, **common))
    else:
        model = transformers.RobertaForSequenceClassification(
            transformers.RobertaConfig(max_position_embeddings=130, **common))
    torch.manual_seed(0)
    models = {mode: copy.deepcopy(model).to("tpu").train() for mode in ("auto", "0")}
    opts = {mode: torch.optim.AdamW(m.parameters(), lr=1e-3) for mode, m in models.items()}

    def step(mode, n, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(2, 256, (8, n), generator=g)
        mask = torch.ones(8, n, dtype=torch.long)
        mask[0, -3:] = 0  # a padded row
        labels = torch.randint(0, 2, (8,), generator=g)

        def run():
            torch.manual_seed(1000 + i)
            loss = models[mode](input_ids=ids.to("tpu"), attention_mask=mask.to("tpu"), labels=labels.to("tpu")).loss
            loss.backward()
            opts[mode].step()
            opts[mode].zero_grad()
            return loss.item()

        return in_mode(mode, run)

    for i, n in enumerate((12, 14)):
        assert step("auto", n, i) == pytest.approx(step("0", n, i), rel=1e-4)
    for i, n in enumerate((13, 11, 15), start=2):
        debug.reset_stats()
        loss = step("auto", n, i)
        s = debug.stats()
        assert s["compiles"] == 0, (n, s["compiles_by_op"], s["exact_reasons"])
        assert s["fallbacks"] == {}
        assert loss == pytest.approx(step("0", n, i), rel=1e-4), n


def test_sampling_generate_at_new_batch_sizes_compiles_nothing_and_matches_exact_shapes(llama):
    # generate(do_sample=True): top-k, softmax and multinomial over [b, vocab] rows; a new
    # batch size samples, under the same seed, the exact-shape run's tokens.
    _, dev = llama

    def sample(b, n):
        ids, mask = prompt(b, n, seed=n + b)
        torch.manual_seed(7 * b)
        with torch.no_grad():
            return dev.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=6, do_sample=True,
                                top_k=20).cpu()

    for b, n in ((1, 9), (1, 10), (4, 10), (5, 10)):
        sample(b, n)
    for b, n in ((3, 11), (6, 10)):
        debug.reset_stats()
        tokens = sample(b, n)
        s = debug.stats()
        assert s["compiles"] == 0, (b, n, s["compiles_by_op"], s["exact_reasons"])
        assert torch.equal(tokens, in_mode("0", lambda: sample(b, n))), (b, n)
