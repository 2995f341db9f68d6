"""Output specs of new sizes without PyTorch's meta kernel (csrc/aten/spec_model.cpp).

After one call of a dynamic signature through the meta kernel, the
signature knows how its output sizes follow its input sizes; a later size
inside a warm bucket derives them. Every test here runs with the check on:
each derived spec is compared with the meta kernel's (a difference raises),
and the results with PyTorch's CPU results, shapes and strides included.
Calls whose dims group otherwise (two sizes that must agree, and do not)
still reach the meta kernel and raise CPU's errors.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic


@pytest.fixture(autouse=True)
def auto_mode_checked():
    dynamic.forget_sizes()
    torch_tpu._C._check_derived_specs(True)
    try:
        with dynamic.dynamic_shapes("auto"):
            yield
    finally:
        torch_tpu._C._check_derived_specs(False)


def run_sizes(fn, make, warm=(33, 34), new=(35, 36)):
    """fn on tpu at the warm sizes, then at each new size (compared with CPU:
    values, shape, strides). Returns the stats of the new sizes' calls."""
    def check(n, compare):
        args = make(n)
        got = fn(*[t.to("tpu") for t in args])
        want = fn(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            host = g.contiguous().cpu()
            if compare:
                assert g.shape == w.shape and g.stride() == w.stride(), (n, g.shape, g.stride(), w.stride())
                torch.testing.assert_close(host, w, atol=1e-5, rtol=1e-5)

    for n in warm:
        check(n, False)
    debug.reset_stats()
    for n in new:
        check(n, True)
    return debug.stats()


CASES = {
    "broadcast add": (lambda a, b: a + b, lambda n: [torch.randn(2, n, 16), torch.randn(n, 1)]),
    "transposed mul keeps its strides": (lambda a: (a.transpose(0, 1) * 2.0).exp(), lambda n: [torch.randn(n, 24)]),
    "softmax": (lambda a: torch.softmax(a, -1), lambda n: [torch.randn(3, n, n)]),
    "sum over the dynamic dim": (lambda a: a.sum(1), lambda n: [torch.randn(3, n, 8)]),
    "matmul of two dynamic dims": (lambda a, b: a @ b, lambda n: [torch.randn(2, n, 16), torch.randn(2, 16, n - 1)]),
    "cat of one size twice": (lambda a: torch.cat([a, a * 2], 1), lambda n: [torch.randn(2, n, 4)]),
    "cat of two sizes": (lambda a, b: torch.cat([a, b], 0), lambda n: [torch.randn(n, 4), torch.randn(n - 1, 4)]),
    "constant pad": (lambda a: F.pad(a, (1, 2, 3, 0)), lambda n: [torch.randn(2, n, 5)]),
    "cumsum": (lambda a: a.cumsum(1), lambda n: [torch.randn(2, n)]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_new_sizes_derive_the_meta_kernels_specs(case):
    fn, make = CASES[case]
    s = run_sizes(fn, make)
    assert s["compiles"] == 0, s["compiles_by_op"]
    assert s["dynamic_derived_specs"] > 0, s


@pytest.mark.parametrize("fn", [lambda q, c: q.transpose(1, 2) * c, lambda q, c: -q.transpose(1, 2)[..., 8:]])
def test_ops_on_permuted_views_derive_their_specs(fn):
    # RoPE on q.transpose(1, 2): the result follows the view's dim order, so the meta
    # kernel's inputs at the model's other sizes are laid out in that order too (laid
    # out contiguous, they gave other strides and the model was unusable).
    def derived_at(n):
        q, c = torch.randn(2, n, 4, 16), torch.randn(1, 1, n, 16)
        dq, dc = q.to("tpu"), c.to("tpu")
        debug.reset_stats()
        got = fn(dq, dc)
        derived = debug.stats()["dynamic_derived_specs"]
        want = fn(q, c)
        assert got.shape == want.shape and got.stride() == want.stride()
        torch.testing.assert_close(got.cpu(), want)
        return derived

    for n in (33, 34):
        derived_at(n)
    assert [derived_at(n) for n in (35, 36)] == [1, 1]


def test_a_rule_with_its_own_output_types_needs_no_model():
    """Layer norm states its outputs (RuleEntry::output_types): no meta
    kernel to skip, nothing derived, the same results."""
    s = run_sizes(lambda a: F.layer_norm(a, (16,)), lambda n: [torch.randn(2, n, 16)])
    assert s["compiles"] == 0 and s["dynamic_derived_specs"] == 0, s


def test_embedding_and_its_index_check_at_a_derived_size():
    w = torch.randn(50, 8)
    dw = w.to("tpu")

    def make(n):
        return [torch.randint(0, 50, (2, n))]

    s = run_sizes(lambda i: F.embedding(i, dw if i.device.type == "tpu" else w) * 3.0, make)
    assert s["dynamic_derived_specs"] > 0, s
    bad = torch.randint(0, 50, (2, 35))
    bad[1, 7] = 50
    with pytest.raises(IndexError, match="index out of range"):
        (F.embedding(bad.to("tpu"), dw) * 3.0).cpu()


def test_sizes_that_must_agree_and_do_not_still_raise_cpus_error():
    for n in (33, 34, 35):  # static, then the 36-bucket; 35's specs derived
        (torch.randn(n, 16).to("tpu") + torch.randn(n, 16).to("tpu")).cpu()
    a, b = torch.randn(35, 16), torch.randn(34, 16)
    with pytest.raises(RuntimeError, match="35"):
        a + b
    with pytest.raises(RuntimeError, match=r"35.*34|34.*35"):  # the meta kernel's words
        (a.to("tpu") + b.to("tpu")).cpu()


def test_a_contraction_of_sizes_that_differ_raises():
    for k in (33, 34, 35):
        (torch.randn(4, k).to("tpu") @ torch.randn(k, 6).to("tpu")).cpu()
    with pytest.raises(RuntimeError, match=r"35.*34"):
        (torch.randn(4, 35).to("tpu") @ torch.randn(34, 6).to("tpu")).cpu()


def test_a_parameters_dim_stays_fixed():
    lin = torch.nn.Linear(36, 8)  # in_features 36: the activations' 36-wide dim is the parameter's
    dev = torch.nn.Linear(36, 8).to("tpu")
    dev.load_state_dict(lin.state_dict())
    s = run_sizes(lambda x: (dev if x.device.type == "tpu" else lin)(x).relu() * 2.0,
                  lambda n: [torch.randn(n, 36)], new=(35, 34 + 1, 36))
    assert s["dynamic_derived_specs"] > 0, s


def test_a_size_equal_to_a_parameters_dim_asks_the_meta_kernel():
    """n = 16 after n = 33..35 in x[n, 16] @ w[16, 16]: the class takes a
    parameter's size, a grouping the model has not seen."""
    w = torch.nn.Parameter(torch.randn(16, 16))
    dw = torch.nn.Parameter(w.detach().to("tpu"))
    for n in (17, 18, 19):
        (torch.randn(n, 16).to("tpu") @ dw).detach().cpu()
    debug.reset_stats()
    x = torch.randn(16, 16)
    got = (x.to("tpu") @ dw).detach().cpu()
    torch.testing.assert_close(got, (x @ w).detach(), atol=1e-5, rtol=1e-5)
    assert debug.stats()["dynamic_derived_specs"] == 0


def test_stepped_outputs_keep_the_meta_kernel():
    """A strided convolution's output steps with its input (33 and 34 give
    17): its specs always come from the meta kernel, and stay right."""
    conv = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
    dev = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1).to("tpu")
    dev.load_state_dict(conv.state_dict())
    with torch.no_grad():
        run_sizes(lambda x: (dev if x.device.type == "tpu" else conv)(x), lambda n: [torch.randn(1, 3, n, n)],
                  warm=(33, 34), new=(35, 36))


def test_generate_at_a_new_prompt_length_derives_specs():
    import transformers as tf
    from test_new_shapes_generate import cpu_and_tpu_models

    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    cpu, dev = cpu_and_tpu_models(tf.LlamaForCausalLM, cfg)

    def gen(m, ids):
        with torch.no_grad():
            return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, do_sample=False)

    for n in (33, 34):
        gen(dev, torch.randint(2, 128, (1, n)).to("tpu"))
    debug.reset_stats()
    ids = torch.randint(2, 128, (1, 35), generator=torch.Generator().manual_seed(3))
    assert torch.equal(gen(dev, ids.to("tpu")).cpu(), gen(cpu, ids))
    s = debug.stats()
    assert s["compiles"] == 0, s["compiles_by_op"]
    assert s["dynamic_derived_specs"] >= 20, s



@pytest.mark.parametrize("lse", [False, True], ids=["no_logsumexp", "logsumexp"])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2)], ids=["mha", "gqa"])
def test_attention_states_its_results_instead_of_the_python_meta_kernel(heads, lse):
    """Attention's meta kernel is a Python function (about 100 us a call, at
    each new KV length of a decode loop); its rule states its results
    (`derived_outputs`): the fixture compares them with that kernel's at
    every call, out's strides included ([B, L, H, Ev] in memory), the
    logsumexp's rows rounded up to 32. Values equal CPU's SDPA."""
    hq, hk = heads

    def make(n):  # a decode step: 1 query row over n keys, with a mask
        mask = torch.zeros(2, 1, 1, n)
        mask[1, :, :, : n // 3] = -float("inf")
        return torch.randn(2, hq, 1, 16), torch.randn(2, hk, n, 16), torch.randn(2, hk, n, 8), mask

    for n in (33, 34, 35, 36):  # exact, then the 36-bucket
        q, k, v, mask = make(n)
        debug.reset_stats()
        out, logsumexp, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q.to("tpu"), k.to("tpu"), v.to("tpu"), mask.to("tpu"), lse)
        assert out.stride() == (hq * 8, 8, hq * 8, 1) and logsumexp.shape == (2, hq, 32 if lse else 0)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hq != hk)
        torch.testing.assert_close(out.cpu(), want, atol=1e-5, rtol=1e-5)
        assert debug.stats()["dynamic_derived_specs"] == 1, debug.stats()
        assert n < 35 or debug.stats()["compiles"] == 0, debug.stats()["compiles_by_op"]


def test_attention_with_inconsistent_shapes_raises():
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 4, 9, 16), torch.randn(3, 4, 9, 8)  # v's batch differs
    with pytest.raises(RuntimeError):
        torch.ops.aten._scaled_dot_product_efficient_attention(q.to("tpu"), k.to("tpu"), v.to("tpu"), None, False)[0].cpu()
