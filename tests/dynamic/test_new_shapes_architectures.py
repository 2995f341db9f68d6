"""New shapes in other Hugging Face architectures compile nothing inside warm buckets
(TORCH_TPU_DYNAMIC_SHAPES=auto): the ops they add run dynamic (Falcon's masked
attention calls _safe_softmax, Bloom's ALiBi scores baddbmm, predicates such as
isneginf and where with a scalar, Mixtral's router topk; Phi-3's rotary cuts an
empty view and cats it; BERT gathers its token types),
and a new batch size at a new length finds its
buckets (Qwen3's per-head norms keep their head count static). Every result is
compared with PyTorch on the CPU; compiles are read from debug.stats()."""
import pytest
import torch

from torch_tpu import debug
from test_new_shapes_generate import cpu_and_tpu_models  # the same weights on the CPU and on tpu

pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def run_sizes(fn, make, sizes, atol=1e-6):
    """Runs fn on tpu and on the CPU at each size; returns the compiles of each tpu call."""
    compiles = []
    for n in sizes:
        args = make(n)
        want = fn(*args)
        debug.reset_stats()
        got = fn(*[a.to("tpu") for a in args]).cpu()
        compiles.append(debug.stats()["compiles"])
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1.3e-6, atol=atol, equal_nan=True)
    return compiles


def with_special_values(n):
    x = torch.randn(3, n)
    x[0, 1], x[1, 2], x[2, 0] = float("-inf"), float("inf"), float("nan")
    return (x,)


@pytest.mark.parametrize("fn", [torch.isneginf, torch.isposinf, torch.isnan, torch.isinf, torch.isfinite,
                                torch.signbit, lambda x: torch.where(x > 0, x, 0.5),
                                lambda x: torch.where(x > 0, -1.0, x)])
def test_predicates_and_scalar_where_stop_compiling(fn):
    # 9 compiles static, 10 the 16-bucket; 12 and 15 run in it.
    compiles = run_sizes(fn, with_special_values, (9, 10, 12, 15))
    assert compiles[2:] == [0, 0], compiles


ELEMENTWISE = {
    "rsub (T5's 1 - mask)": lambda x: torch.rsub(x, 1.0),
    "rsub.Tensor": lambda x: torch.rsub(x, x * 0.5),
    "clamp_min": lambda x: x.clamp_min(0.25), "clamp_max": lambda x: x.clamp_max(0.25),
    "clamp.Tensor": lambda x: x.clamp(torch.tensor(-0.5), torch.tensor(0.5)),
    "atan2": lambda x: torch.atan2(x, x * -0.7 + 0.1), "hypot": lambda x: torch.hypot(x, x * 2),
    "copysign": lambda x: torch.copysign(x.abs(), x * -0.7 + 0.1),
    "remainder.Scalar_Tensor": lambda x: torch.remainder(2.5, x.abs() + 0.5),
    "pow.Scalar": lambda x: torch.pow(2.0, x), "round.decimals": lambda x: torch.round(x * 10, decimals=1),
    "tril (a causal mask)": lambda x: torch.tril(x), "triu": lambda x: torch.triu(x, 1),
    "masked_fill.Tensor": lambda x: x.masked_fill(x > 0, torch.tensor(-1.0, device=x.device)),
    "erfc": torch.erfc, "sinc": torch.sinc, "nan_to_num": lambda x: torch.nan_to_num(x / 0.0, 7.0),
    "logaddexp": lambda x: torch.logaddexp(x, x * 3), "xlogy": lambda x: torch.xlogy(x, x.abs()),
    "fmax": lambda x: torch.fmax(x, x * -0.7 + 0.1), "lerp": lambda x: torch.lerp(x, x * 3, 0.3),
    "addcmul": lambda x: torch.addcmul(x, x, x, value=0.5), "addcdiv": lambda x: torch.addcdiv(x, x, x.abs() + 1),
    "threshold": lambda x: torch.nn.functional.threshold(x, 0.1, 20.0),
    "hardshrink": lambda x: torch.nn.functional.hardshrink(x), "i0": torch.i0,
}


@pytest.mark.parametrize("name", list(ELEMENTWISE))
def test_more_elementwise_ops_stop_compiling(name):
    # Elementwise: each result element from the inputs' elements at its index (tril/triu
    # by its position), so the module runs on the buckets' arrays unmasked.
    compiles = run_sizes(ELEMENTWISE[name], lambda n: (torch.randn(n, n) * 2,), (9, 10, 12, 15), atol=1e-5)
    assert compiles[2:] == [0, 0], compiles


REDUCTIONS = {
    "var": lambda x: x.var(1), "std, correction 0": lambda x: x.std(1, correction=0),
    "var of bfloat16": lambda x: x.bfloat16().var(1).float(),  # counted off the uncast input
    "var_mean of all": lambda x: torch.var_mean(x), "std_mean along the kept size": lambda x: torch.std_mean(x, 2),
    "logsumexp": lambda x: x.logsumexp(1), "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=1),
    "vector_norm inf": lambda x: torch.linalg.vector_norm(x, float("inf"), dim=(0, 1)),
    "vector_norm -inf": lambda x: torch.linalg.vector_norm(x, float("-inf"), dim=1),
    "vector_norm 0": lambda x: torch.linalg.vector_norm(x, 0, dim=1), "norm of all": lambda x: x.norm(),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_variance_logsumexp_and_norms_stop_compiling(name):
    # Reduced along the new size: XLA's padder masks the padding (max with -inf, sums
    # with 0, min with +inf); var and std count their real elements at run time.
    def both(x):
        r = REDUCTIONS[name](x)
        return torch.cat([t.reshape(-1) for t in r]) if isinstance(r, tuple) else r

    compiles = run_sizes(both, lambda n: (torch.randn(3, n, 5) * 2,), (9, 10, 12, 15, 11), atol=1e-5)
    assert compiles[2:] == [0, 0, 0], compiles


def test_safe_softmax_zeroes_fully_masked_rows_and_stops_compiling():
    def make(n):
        x = torch.randn(2, 3, n) * 3
        x[0, 1, :] = float("-inf")  # a row masked whole: zeros, not nan
        x[1, :, n // 2:] = float("-inf")
        return (x,)

    def safe_softmax(x):
        return torch.ops.aten._safe_softmax(x, -1)

    compiles = run_sizes(safe_softmax, make, (9, 10, 12, 15))
    assert compiles[2:] == [0, 0], compiles
    got = safe_softmax(make(11)[0].to("tpu")).cpu()
    assert torch.equal(got[0, 1], torch.zeros(11))
    # dtype= converts first; a rank-0 input is its own row.
    x = torch.randn(4, 9, dtype=torch.bfloat16)
    torch.testing.assert_close(torch.ops.aten._safe_softmax(x.to("tpu"), 1, torch.float32).cpu(),
                               torch.ops.aten._safe_softmax(x, 1, torch.float32))
    for v in (float("-inf"), 2.0):
        s = torch.tensor(v)
        assert torch.equal(torch.ops.aten._safe_softmax(s.to("tpu"), 0).cpu(), torch.ops.aten._safe_softmax(s, 0))


def test_safe_softmax_backward_equals_cpu():
    x = torch.randn(2, 7, 9, requires_grad=True)
    xd = x.detach().to("tpu").requires_grad_()
    g = torch.randn(2, 7, 9)
    torch.ops.aten._safe_softmax(x, -1).backward(g)
    torch.ops.aten._safe_softmax(xd, -1).backward(g.to("tpu"))
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


@pytest.mark.parametrize("fn", [lambda x: torch.topk(x, 2, dim=-1)[0], lambda x: torch.topk(x, 2, dim=-1)[1],
                                lambda x: torch.sort(x, dim=1, stable=True)[1],
                                lambda x: torch.floor_divide(x * 10, 3)])
def test_router_ops_on_new_token_counts_stop_compiling(fn):
    # Mixtral's router: topk over the experts of each token (rows: the tokens).
    compiles = run_sizes(fn, lambda n: (torch.randn(n, 8),), (9, 10, 12, 15))
    assert compiles[2:] == [0, 0], compiles


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_sort_along_a_new_size_stops_compiling(dtype, descending):
    # Along the dim it sorts, XLA's padder sorts the padding after the real elements
    # (Mixtral sorts its tokens' expert ids): values and indices equal the CPU's, ties
    # (few distinct ints) in their stable order, NaN first descending and last ascending.
    def make(n):
        x = torch.randint(0, 4, (n, 3)) if dtype == torch.int64 else torch.randn(n, 3)
        if dtype == torch.float32:
            x[1, 0], x[4, 2] = float("nan"), float("-inf")
        return (x,)

    def both(x):
        v, i = torch.sort(x, dim=0, stable=True, descending=descending)
        return torch.cat([v.double(), i.double()])

    compiles = run_sizes(both, make, (9, 10, 12, 11, 16))
    assert compiles[2:] == [0, 0, 0], compiles


def set_columns(x, i):
    x = x.clone()
    x[:, i] = -float("inf")  # a logits processor's banned tokens: index_put_ with indices (None, i)
    return x


def add_at_rows_and_columns(x, i):
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    return x.clone().index_put_([rows, i], torch.ones((), device=x.device), accumulate=True)


@pytest.mark.parametrize("fn", [lambda x, i: x[:, i] * 2.0, set_columns, add_at_rows_and_columns,
                                lambda x, i: x.view(x.shape[0], 16, 16)[:, :, i[:1]] + 1.0],
                         ids=["index", "index_put", "index_put_accumulate", "index_3d"])
def test_indexing_behind_a_full_slice_stops_compiling(fn):
    # A None index (the `:` of x[:, i]) came boxed as an undefined tensor; the
    # meta kernel at the bucket's sizes failed on it, and the signature ran
    # exact shapes from then on: one compile per batch size.
    idx = torch.tensor([3, 7])
    compiles = run_sizes(fn, lambda b: (torch.randn(b, 256), idx), (4, 5, 3, 6, 7), atol=1e-5)
    assert compiles[2:] == [0, 0, 0], compiles


def test_gather_at_new_index_lengths_stops_compiling_and_checks_its_bound():
    # BERT's token types: a [1, 40] buffer expanded to the batch, gathered at each position.
    table = torch.arange(40).reshape(1, 40) % 3

    def gather(t, pos):
        return torch.gather(t.expand(pos.shape[0], -1), 1, pos)

    compiles = run_sizes(gather, lambda n: (table, torch.arange(n).expand(4, n).contiguous()), (9, 10, 12, 15))
    assert compiles[2:] == [0, 0], compiles
    bad = torch.arange(13).expand(4, 13).contiguous()
    bad[2, 5] = 40  # past the gathered dim: raises at a new size too
    with pytest.raises(IndexError, match="gather: index out of range for dimension 1 of size 40"):
        gather(table.to("tpu"), bad.to("tpu")).cpu()


def relative_shift(x):
    # XLNet's rel_shift_bnij keeps the first q of a [b, h, q, 2q - 1] score's
    # columns: index_select along a dim whose size moves with the length.
    q = x.shape[2]
    return torch.index_select(x, 3, torch.arange(q, device=x.device)) * 2.0


def gather_columns(x):
    # A gather along a dim that moves with the length too (positions relative to each query).
    q = x.shape[1]
    pos = (torch.arange(q, device=x.device)[:, None] + torch.arange(q, device=x.device)[None, :]) % x.shape[2]
    return torch.gather(x, 2, pos.expand(x.shape[0], q, q))


@pytest.mark.parametrize("fn, make", [(relative_shift, lambda q: (torch.randn(2, 3, q, 2 * q - 1),)),
                                      (gather_columns, lambda q: (torch.randn(2, q, 2 * q),))],
                         ids=["index_select", "gather"])
def test_selecting_along_a_dim_that_moves_with_the_length_stops_compiling(fn, make):
    # The dim they select along was kept static (the indices' bound), so each
    # new length compiled: 10 static, 12 the buckets 16 (and 24), 11 and 9 run in them.
    compiles = run_sizes(fn, make, (10, 12, 11, 9))
    assert compiles[2:] == [0, 0], compiles


def test_an_index_past_the_real_size_inside_the_bucket_raises():
    # Checked against the dim's runtime size, not its bucket's: 25 is inside
    # the 26-bucket of a dim of 25.
    for q in (10, 12, 13):
        relative_shift(torch.randn(2, 3, q, 2 * q - 1, device="tpu")).cpu()
    x = torch.randn(2, 3, 13, 25, device="tpu")
    with pytest.raises(IndexError, match="index_select: index out of range for dimension 3"):
        torch.index_select(x, 3, torch.tensor([3, 25], device="tpu")).cpu()
    with pytest.raises(IndexError, match="gather: index out of range for dimension 3"):
        torch.gather(x, 3, torch.full((2, 3, 13, 2), 25, device="tpu")).cpu()
    # The same call with every index inside the real size runs and agrees with the CPU.
    good = torch.tensor([0, 24], device="tpu")
    torch.testing.assert_close(torch.index_select(x, 3, good).cpu(), torch.index_select(x.cpu(), 3, good.cpu()))


def test_small_eye_at_new_sizes_compiles_nothing():
    # XLNet's target mask -eye(q) at each new length: computed on the host
    # while small (64 KiB), as arange is; a large one compiles as before.
    for n, m in ((7, None), (9, None), (5, 8), (300, None)):
        want = torch.eye(n) if m is None else torch.eye(n, m)
        debug.reset_stats()
        got = (torch.eye(n, device="tpu") if m is None else torch.eye(n, m, device="tpu")).cpu()
        assert torch.equal(got, want)
        assert debug.stats()["compiles"] == (1 if n == 300 else 0), (n, m)
    half = torch.eye(6, 4, dtype=torch.bfloat16, device="tpu")
    assert half.dtype == torch.bfloat16 and torch.equal(half.cpu(), torch.eye(6, 4, dtype=torch.bfloat16))


def topk_backward(v, i):
    # topk's backward (Mixtral's router in training): zeros[n, E].scatter_(1, idx[n, k], grad[n, k])
    return torch.zeros(v.shape[0], 8, device=v.device).scatter_(1, i, v)


def router_choices(n):
    g = torch.Generator().manual_seed(n)
    return torch.randn(n, 2, generator=g), torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(n)])


def fewer_index_rows(n):
    # index has fewer rows than self: its padding rows must not reach self's real rows
    g = torch.Generator().manual_seed(n)
    return torch.randn(n + 3, 5, generator=g), torch.randint(0, 5, (n, 3), generator=g), torch.randn(n + 2, 4, generator=g)


@pytest.mark.parametrize("fn, make", [
    (topk_backward, router_choices),
    (lambda x, i, s: x.scatter(1, i, s), fewer_index_rows),
    (lambda x, i, s: x.scatter(1, i, 2.5), fewer_index_rows),
    (lambda x, i, s: x.scatter_add(1, i, s), fewer_index_rows),
    (lambda x, i, s: x.scatter(1, i, s, reduce="multiply"), fewer_index_rows),
    # along dim 0, duplicates accumulating: the index's padding columns must add nothing
    (lambda x, i, s: x.scatter_add(0, i, s),
     lambda n: (torch.randn(6, n + 1), torch.randint(0, 6, (n, n), generator=torch.Generator().manual_seed(n)),
                torch.randn(n, n + 1))),
])
@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
def test_scatter_at_new_index_sizes_stops_compiling(fn, make):
    compiles = run_sizes(fn, make, (9, 10, 11, 12))  # 11 and 12 in the warm 16-bucket
    assert compiles[2:] == [0, 0], compiles


def accumulating_columns(n):
    # along dim 0 with duplicates: the index's padding columns (zeros in the
    # buffer: row 0 of self) must neither add to nor count at row 0
    g = torch.Generator().manual_seed(n)
    return torch.randn(6, n + 1, generator=g), torch.randint(0, 6, (n, n), generator=g), torch.randn(n, n + 1, generator=g)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim, make", [(1, fewer_index_rows), (0, accumulating_columns)], ids=["dim1", "dim0"])
def test_scatter_reduce_at_new_index_sizes_stops_compiling(reduce, include_self, dim, make):
    fn = lambda x, i, s: x.scatter_reduce(dim, i, s, reduce, include_self=include_self)  # noqa: E731
    compiles = run_sizes(fn, make, (9, 10, 11, 12), atol=1e-5)  # 11 and 12 in the warm 16-bucket
    assert compiles[2:] == [0, 0], compiles


def test_scatter_at_a_new_size_checks_its_bound():
    for n in (9, 10, 11):
        topk_backward(*[t.to("tpu") for t in router_choices(n)]).cpu()
    v, i = router_choices(11)
    i[4, 1] = 8  # past the dim it scatters along
    with pytest.raises(IndexError, match="scatter: index out of range for a dimension of size 8"):
        topk_backward(v.to("tpu"), i.to("tpu")).cpu()


def test_baddbmm_stops_compiling():
    def make(n):
        return torch.randn(8, 1, n), torch.randn(8, n, 16), torch.randn(8, 16, n)

    compiles = run_sizes(lambda s, a, b: torch.baddbmm(s, a, b, beta=0.5, alpha=0.25), make, (9, 10, 12, 15))
    assert compiles[2:] == [0, 0], compiles


def test_cat_with_an_empty_view_stops_compiling():
    # Phi-3's partial rotary at factor 1: q[..., 16:] is empty, cat after the rotated half.
    w = torch.randn(64, 192)

    def rope(x, w):
        q = (x @ w)[..., :64].view(1, -1, 4, 16).transpose(1, 2)
        rot, rest = q[..., :16], q[..., 16:]
        return torch.cat((rot * 2, rest), dim=-1)

    compiles = run_sizes(lambda x: rope(x, w.to(x.device)), lambda n: (torch.randn(1, n, 64),), (9, 10, 12, 15),
                         atol=1e-5)  # sums of 64 products
    assert compiles[2:] == [0, 0], compiles


def test_histc_at_new_sizes_stops_compiling():
    # Mixtral counts its routed tokens per expert: the padding is counted in no bin and,
    # with min == max, bounds no range (all real values here are above the padding's 0).
    def make(n):
        g = torch.Generator().manual_seed(n)
        return (torch.rand(n, 2, generator=g) * 3 + 2,)

    for lo, hi in ((2.0, 5.0), (0.0, 0.0)):
        compiles = run_sizes(lambda x: torch.histc(x, bins=7, min=lo, max=hi), make, (9, 10, 12, 15, 11))
        assert compiles[2:] == [0, 0, 0], (lo, hi, compiles)


def grouped_rows(a, w, offs):
    """_grouped_mm's 2d x 3d product by hand: rows of group g times w[g] (PyTorch's CPU
    kernel wants 16-byte aligned strides)."""
    out, start = torch.zeros(a.shape[0], w.shape[2]), 0
    for g, end in enumerate(offs.tolist()):
        out[start:end] = a[start:end] @ w[g]
        start = end
    return out


def routed_rows(n):
    """Mixtral's experts on their routed rows: [n, 16] rows for 4 experts' [16, 8] weights,
    the group ends moving with the token count (the number of groups stays 4)."""
    a = torch.randn(n, 16, generator=torch.Generator().manual_seed(n))
    w = torch.randn(4, 16, 8, generator=torch.Generator().manual_seed(0))
    return a, w, torch.tensor([n // 4, n // 2, n // 2 + 1, n], dtype=torch.int32)


def test_grouped_mm_at_new_token_counts_stops_compiling():
    compiles = []
    for n in (9, 10, 12, 15, 11):
        a, w, offs = routed_rows(n)
        debug.reset_stats()
        got = torch._grouped_mm(a.to("tpu"), w.to("tpu"), offs.to("tpu")).cpu()
        compiles.append(debug.stats()["compiles"])
        torch.testing.assert_close(got, grouped_rows(a, w, offs), rtol=1e-5, atol=1e-5)
    assert compiles[2:] == [0, 0, 0], compiles


def test_grouped_mm_backward_at_new_token_counts_stops_compiling():
    # Training Mixtral's experts: the gradients of x and of the experts' weights contract
    # over the routed rows (2d x 2d grouped by rows: [16, n] x [n, 8] -> [4, 16, 8]).
    compiles = []
    for n in (9, 10, 12, 15, 11):
        a, w, offs = routed_rows(n)
        ca, cw = a.clone().requires_grad_(), w.clone().requires_grad_()
        grouped_rows(ca, cw, offs).square().sum().backward()
        wd, proj = w.to("tpu").requires_grad_(), torch.eye(16, device="tpu", requires_grad=True)
        debug.reset_stats()
        x = a.to("tpu") @ proj  # x = a, not a parameter (parameters never turn dynamic)
        x.retain_grad()
        torch._grouped_mm(x, wd, offs.to("tpu")).square().sum().backward()
        torch.testing.assert_close(x.grad.cpu(), ca.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(wd.grad.cpu(), cw.grad, rtol=1e-4, atol=1e-4)
        compiles.append((debug.stats()["compiles"], debug.stats()["exact_reasons"]))
    assert [c for c, _ in compiles[2:]] == [0, 0, 0], compiles


def model_and_config(name):
    transformers = pytest.importorskip("transformers")
    common = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    if name == "falcon":
        return transformers.FalconForCausalLM, transformers.FalconConfig(**common)
    if name == "phi3":
        return transformers.Phi3ForCausalLM, transformers.Phi3Config(intermediate_size=128, num_key_value_heads=2,
                                                                     pad_token_id=0, **common)
    if name == "mixtral":  # experts: topk, sort, histc, _grouped_mm over the routed tokens
        return transformers.MixtralForCausalLM, transformers.MixtralConfig(
            intermediate_size=128, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=128, **common)
    if name == "t5":  # an encoder-decoder: the decoder's length meets batch sizes
        return transformers.T5ForConditionalGeneration, transformers.T5Config(
            vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, decoder_start_token_id=0,
            pad_token_id=0)
    if name == "bloom":
        return transformers.BloomForCausalLM, transformers.BloomConfig(vocab_size=256, hidden_size=64, n_layer=2,
                                                                       n_head=4)
    return transformers.Qwen3ForCausalLM, transformers.Qwen3Config(intermediate_size=128, num_key_value_heads=2,
                                                                   head_dim=16, max_position_embeddings=128, **common)


def check_generate(models, b, n, left_pad=0):
    """generate() on both; the second row (of a batch) left-padded by `left_pad`."""
    cpu, dev = models
    ids = torch.randint(2, 256, (b, n), generator=torch.Generator().manual_seed(n + 100 * b))
    mask = torch.ones_like(ids)
    if b > 1 and left_pad:
        ids[1, :left_pad], mask[1, :left_pad] = 0, 0
    with torch.no_grad():
        want = cpu.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        debug.reset_stats()
        got = dev.generate(ids.to("tpu"), attention_mask=mask.to("tpu"), max_new_tokens=6, do_sample=False).cpu()
    s = debug.stats()
    assert torch.equal(got, want), (b, n)
    return s["compiles"], s["compiles_by_op"]


def pair(name):
    return cpu_and_tpu_models(*model_and_config(name))


@pytest.mark.parametrize("name", ["falcon", "bloom", "phi3", "mixtral"])
def test_generate_new_prompt_lengths_compile_nothing(name):
    models = pair(name)
    for n in (9, 10, 14):  # the cache reaches 19: buckets 16 and 20
        check_generate(models, 1, n)
    for n in (11, 12, 13):
        compiles, by_op = check_generate(models, 1, n)
        assert compiles == 0, (name, n, by_op)


@pytest.mark.parametrize("name, new, pad", [("qwen3", ((3, 11), (6, 9)), 0), ("falcon", ((3, 10), (6, 10)), 2),
                                            ("bloom", ((3, 10),), 2), ("t5", ((3, 11), (6, 9)), 0)])
def test_new_batch_size_at_a_new_length_compiles_nothing(name, new, pad):
    # Qwen3 normalizes q and k per head: [b, s, h, d] and [b, h, s, d] reads share
    # signatures, and batch 4's must not take batch 1's dynamic sequence dim for
    # its head count (XLA cannot pad a dim the norm's weight broadcasts along).
    # Falcon's mask `where` (a left-padded row) follows its input's buffer (10)
    # into a result kept at Bucket(10) = 16: padded as a masked module, not
    # refused for its signature from then on.
    # Falcon and Bloom run attention as bmm on [b*h, s, d]: at batch 3, b*h = 12 meets
    # a KV length of 12; s keeps its own bucket (16), not b*h's product bucket (32).
    # T5's decoder ids grow 1..7 while the batch is 3 or 6: a batch and a length
    # of one size share the larger bucket, a combination no warm call ran; each
    # dim's own bucket has an executable (TakeUnsharedSmallBuckets).
    models = pair(name)
    for b, n in ((1, 9), (1, 10), (1, 12), (4, 10), (5, 10)):
        check_generate(models, b, n, pad)
    for b, n in new:
        compiles, by_op = check_generate(models, b, n, pad)
        assert compiles == 0, (b, n, by_op)
