"""New shapes inside a warm bucket compile nothing (TORCH_TPU_DYNAMIC_SHAPES=auto):
fresh tensors filled or copied in place (torch.ones, x.to(dtype)), linear on a
[b, s, h] activation padded in both b and s, and Hugging Face generate() from
prompts of new lengths (Llama, and GPT-2 with its layer norms) and new batch
sizes, left-padded batches included.
Every result is compared with PyTorch on the CPU; compiles are read from
debug.stats()."""
import pytest
import torch
import torch.nn.functional as F

import torch_tpu
from torch_tpu import debug, dynamic


pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py


def test_fills_and_copies_of_fresh_tensors_stop_compiling():
    def step(n):
        mask = torch.ones(2, n, dtype=torch.long, device="tpu")  # empty + fill_
        f = mask.to(torch.float32)                               # empty + copy_ (convert)
        z = torch.zeros(2, n, device="tpu").add_(f)              # in place on a whole storage
        return mask, f, z

    for n in (40, 41):  # the second size makes the signatures dynamic (bucket 44)
        step(n)
    for n in (42, 43, 44):
        debug.reset_stats()
        mask, f, z = step(n)
        assert debug.stats()["compiles"] == 0, (n, debug.stats()["compiles_by_op"])
        assert torch.equal(mask.cpu(), torch.ones(2, n, dtype=torch.long))
        assert torch.equal(f.cpu(), torch.ones(2, n)) and torch.equal(z.cpu(), torch.ones(2, n))
        assert f.untyped_storage().nbytes() == 2 * n * 4 and f.stride() == (n, 1)


def test_copy_of_a_tensor_into_itself_reads_its_old_elements():
    for n in (40, 41, 42):
        x = torch.arange(2 * n, dtype=torch.float32).reshape(2, n)
        d = x.to("tpu")
        d.copy_(d * 2)
        d.copy_(d)  # its own storage: not an overwrite that may skip the old elements
        torch.testing.assert_close(d.cpu(), x * 2, rtol=0, atol=0)


def test_linear_on_rows_padded_in_batch_and_sequence():
    torch.manual_seed(0)
    w, bias = torch.randn(24, 16), torch.randn(24)
    dw, db = w.to("tpu"), bias.to("tpu")

    def run(b, s):
        x = torch.randn(b, s, 16)
        h = torch.exp(x.to("tpu") * 0.5)  # dynamic once b and s changed: padded in both
        return x, F.linear(h, dw), F.linear(h, dw, db)

    for b, s in ((9, 19), (10, 20)):  # dynamic at the second: batch bucket 16, sequence bucket 20
        run(b, s)
    for b, s in ((5, 19), (2, 20), (6, 19)):
        debug.reset_stats()
        x, y, yb = run(b, s)
        assert debug.stats()["compiles"] == 0, ((b, s), debug.stats()["compiles_by_op"])
        h = torch.exp(x * 0.5)
        torch.testing.assert_close(y.cpu(), F.linear(h, w), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(yb.cpu(), F.linear(h, w, bias), rtol=1e-5, atol=1e-5)
        assert y.shape == (b, s, 24) and y.untyped_storage().nbytes() == b * s * 24 * 4
        assert torch_tpu._C._padded_shape(y) == [16, 20, 24]  # the rows' layout, n at the end
        torch.testing.assert_close(y[:, -1].cpu(), F.linear(h, w)[:, -1], rtol=1e-5, atol=1e-5)


def test_linear_weight_gradient_on_rows_padded_in_batch_and_sequence():
    # A linear's weight gradient is mm(grad_output^T, input) over the [b*s]
    # rows of two storages padded in b and s: contracted over all the buffer
    # rows with the padding rows zeroed, the [out, in] result exact, so a new
    # (b, s) inside the buckets compiles no mm.
    torch.manual_seed(0)
    w = torch.randn(24, 16)

    def run(b, s):
        x, g = torch.randn(b, s, 16), torch.randn(b, s, 24)
        h, gd = torch.exp(x.to("tpu") * 0.5), torch.tanh(g.to("tpu"))  # padded in b and s once dynamic
        dw = torch.ops.aten.mm(gd.reshape(-1, 24).t(), h.reshape(-1, 16))
        return x, g, dw

    for b, s in ((9, 19), (10, 20)):
        run(b, s)
    for b, s in ((5, 19), (2, 20), (16, 19)):
        debug.reset_stats()
        x, g, dw = run(b, s)
        assert "mm" not in debug.stats()["compiles_by_op"], ((b, s), debug.stats()["compiles_by_op"])
        assert torch_tpu._C._padded_shape(dw) == []  # exact: [out, in] whatever the rows
        want = torch.tanh(g).reshape(-1, 24).t() @ torch.exp(x * 0.5).reshape(-1, 16)
        torch.testing.assert_close(dw.cpu(), want, rtol=1e-4, atol=1e-4)


def test_linear_backward_on_padded_rows_equals_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Linear(16, 24)
    dev = torch.nn.Linear(16, 24).to("tpu")
    dev.load_state_dict(cpu.state_dict())
    for b, s in ((4, 12), (4, 14), (3, 13), (4, 15)):
        x = torch.randn(b, s, 16)
        cpu.zero_grad(), dev.zero_grad()
        debug.reset_stats()
        (torch.tanh(dev(torch.exp(x.to("tpu") * 0.5))) ** 2).sum().backward()
        compiled = debug.stats()["compiles_by_op"]
        (torch.tanh(cpu(torch.exp(x * 0.5))) ** 2).sum().backward()
        torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dev.bias.grad.cpu(), cpu.bias.grad, rtol=1e-4, atol=1e-4)
        if (b, s) in ((3, 13), (4, 15)):
            assert "mm" not in compiled, ((b, s), compiled)


def cpu_and_tpu_models(model_class, cfg):
    """The same random weights on the CPU and on tpu, greedy without an EOS stop."""
    torch.manual_seed(0)
    cpu = model_class(cfg).eval()
    dev = model_class(cfg).eval()
    dev.load_state_dict(cpu.state_dict())
    dev = dev.to("tpu")
    for m in (cpu, dev):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    return cpu, dev


@pytest.fixture(scope="module")
def llama():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return cpu_and_tpu_models(transformers.LlamaForCausalLM, cfg)


@pytest.fixture(scope="module")
def gpt2():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                  bos_token_id=1, eos_token_id=1)
    return cpu_and_tpu_models(transformers.GPT2LMHeadModel, cfg)


def generate(model, ids, mask):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)


def prompt(b, n, seed, left_pad=()):
    ids = torch.randint(2, 256, (b, n), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones(b, n, dtype=torch.long)
    for row, pad in enumerate(left_pad):
        ids[row, :pad] = 0
        mask[row, :pad] = 0
    return ids, mask


def check_generate(llama, b, n, seed, left_pad=()):
    cpu, dev = llama
    ids, mask = prompt(b, n, seed, left_pad)
    debug.reset_stats()
    got = generate(dev, ids.to("tpu"), mask.to("tpu")).cpu()
    compiles = debug.stats()["compiles"]
    stats = debug.stats()
    assert torch.equal(got, generate(cpu, ids, mask)), (b, n)
    # On a compile, say which ops and why they ran with exact shapes.
    return compiles, {"compiles": stats["compiles_by_op"], "dynamic": stats["dynamic_compiles_by_op"],
                      "exact": stats["exact_reasons"] if compiles else {}}


def test_generate_new_prompt_lengths_compile_nothing(llama):
    # Warm-ups: 9 (static), 10 (dynamic), 14 (the KV cache reaches 19, bucket 20).
    for n in (9, 10, 14):
        check_generate(llama, 1, n, seed=n)
    for n in (11, 12, 13):
        compiles, by_op = check_generate(llama, 1, n, seed=n)
        assert compiles == 0, (n, by_op)


def test_generate_with_layer_norm_new_prompt_lengths_compile_nothing(gpt2):
    # GPT-2: LayerNorm, learned positions, fused QKV (addmm on [b*s, h] rows).
    for n in (9, 10, 14):
        check_generate(gpt2, 1, n, seed=n)
    for n in (11, 12, 13):
        compiles, by_op = check_generate(gpt2, 1, n, seed=n)
        assert compiles == 0, (n, by_op)


def test_generate_new_batch_sizes_compile_nothing(llama):
    for b in (4, 5):  # batch 5 makes the batch dim dynamic (bucket 8: 3, 6 and 7 reuse it)
        check_generate(llama, b, 10, seed=b)
    for b in (3, 6, 7):
        compiles, by_op = check_generate(llama, b, 10, seed=b)
        assert compiles == 0, (b, by_op)


def test_a_new_batch_size_at_a_new_prompt_length_compiles_nothing(llama):
    # Prompts at batch 1 make the sequence dims dynamic (bucket 12: 9..12, the
    # KV cache growing to 17 in bucket 18). Batch 4 then starts with them
    # bounded (its signatures are new: the batch dim is no longer 1), batch 5
    # makes the batch dim dynamic (bucket 8). A batch of 3 at prompt 11 is
    # then inside warm buckets in both dims.
    for b, n in ((1, 9), (1, 10), (1, 12), (4, 10), (5, 10)):
        check_generate(llama, b, n, seed=n + b)
    for b, n in ((3, 11), (6, 9), (2, 11)):
        compiles, by_op = check_generate(llama, b, n, seed=n + b)
        assert compiles == 0, (b, n, by_op)


def test_a_new_batch_size_at_a_shorter_prompt_takes_the_warm_longer_bucket(llama):
    # Batches 4 and 5 ran prompt 26 (sequence bucket 26, the KV cache to 33);
    # batch 3 at prompt 23 has its own sequence bucket 24, uncompiled at any
    # batch > 1. It takes the warm 26-bucket (1.08x its tokens): the batch
    # dim's padding (3 in bucket 8) does not count against that choice.
    for b, n in ((1, 22), (1, 24), (1, 26), (4, 26), (5, 26)):
        check_generate(llama, b, n, seed=n + b)
    for b, n in ((3, 23), (6, 25)):
        compiles, by_op = check_generate(llama, b, n, seed=n + b)
        assert compiles == 0, (b, n, by_op)


def test_generate_left_padded_batches(llama):
    for pads in ((0, 3, 1), (2, 0, 4)):
        check_generate(llama, 3, 11, seed=sum(pads), left_pad=pads)
    compiles, by_op = check_generate(llama, 3, 11, seed=7, left_pad=(5, 1, 0))
    assert compiles == 0, by_op


def static_generate(model, ids, new_tokens=6, **kw):
    """Greedy generate() with a StaticCache (its decode step compiled unless disable_compile)."""
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              do_sample=False, cache_implementation="static", **kw)


def test_static_cache_generate_compiles_no_op(llama):
    # StaticCache sizes its cache per prompt (prompt + new tokens, rounded up
    # to a size bucket on tpu: torch_tpu.hf): the cache update (index_copy_)
    # and attention run dynamic in the prompt's dim, the cache positions
    # (arange) are uploaded.
    cpu, dev = llama

    for n in (33, 34, 35):
        ids = prompt(1, n, seed=n)[0]
        debug.reset_stats()
        got = static_generate(dev, ids.to("tpu")).cpu()
        stats = debug.stats()
        assert torch.equal(got, static_generate(cpu, ids)), n
        if n == 35:  # inside the warm buckets (prompt 36, cache 40)
            assert stats["compiles_by_op"] == {}, stats["compiles_by_op"]
            assert stats["dynamic_compiles_by_op"] == {}, stats["dynamic_compiles_by_op"]


def test_static_cache_compiled_decode_new_prompt_lengths_compile_nothing(llama):
    # generate() compiles its decode step (torch.compile, backend "tpu") for a
    # StaticCache, and Dynamo specialises on the cache's length. torch_tpu.hf
    # rounds the length generate() asks for (prompt + new tokens - 1) up to a
    # size bucket: prompts 49-51 with 6 new tokens all get a cache of 56, so
    # after the first two the third compiles no graph and no op.
    from torch_tpu import compile as tpu_compile

    cpu, dev = llama
    dev.__dict__.pop("_previous_max_cache_length", None)  # earlier tests' caches
    # Dynamo's caches are the process's: another test file's StaticCache decode
    # (the same LlamaForCausalLM.forward) may have made its length dynamic already.
    torch._dynamo.reset()

    for n in (49, 50, 51):
        ids = prompt(1, n, seed=n)[0]
        debug.reset_stats()
        tpu_compile.reset_stats()
        got = static_generate(dev, ids.to("tpu")).cpu()
        graphs, compiles = tpu_compile.stats()["graphs"], debug.stats()["compiles_by_op"]
        assert torch.equal(got, static_generate(cpu, ids)), n
        assert dev._previous_max_cache_length == 56, (n, dev._previous_max_cache_length)
        if n == 49:
            assert graphs == 1  # the decode step, once for the bucket
        if n == 51:
            assert (graphs, compiles) == (0, {}), (n, graphs, compiles)


def test_static_cache_compiled_decode_new_batch_sizes_compile_nothing(llama):
    # A new batch size makes a new StaticCache, and Transformers compiles its
    # decode step with dynamic=False on "tpu" (one graph per batch size).
    # torch_tpu.hf turns that into Dynamo's automatic dynamic shapes: the
    # second batch size traces the step once more with the batch symbolic,
    # one bounded module per bucket (the cache, updated in place, keeps its
    # padded layout); batches 3, 6 and 7 then reuse the 8-bucket: no graph,
    # no executable, eager prefill included.
    from torch_tpu import compile as tpu_compile

    cpu, dev = llama
    torch._dynamo.reset()  # as in a fresh process (see above)
    for b in (4, 5, 3, 6, 7):
        ids = prompt(b, 17, seed=b)[0]
        debug.reset_stats()
        tpu_compile.reset_stats()
        got = static_generate(dev, ids.to("tpu")).cpu()
        s = tpu_compile.stats()
        graphs = s["graphs"], s["bucket_modules"], s["exact_shape_modules"]
        compiles = debug.stats()["compiles_by_op"]
        assert torch.equal(got, static_generate(cpu, ids)), b
        if b in (3, 6, 7):
            assert (graphs, compiles) == ((0, 0, 0), {}), (b, graphs, compiles, tpu_compile.symbolic_fallbacks())


def test_static_cache_length_is_exact_with_exact_shapes(llama):
    # TORCH_TPU_DYNAMIC_SHAPES=0 keeps Transformers' own length, and a CPU
    # model is never touched.
    cpu, dev = llama
    ids = prompt(1, 21, seed=3)[0]
    for model, x in ((cpu, ids), (dev, ids.to("tpu"))):
        model.__dict__.pop("_previous_max_cache_length", None)
        with torch_tpu.dynamic.dynamic_shapes("0"):
            static_generate(model, x, new_tokens=3, disable_compile=True)
        assert model._previous_max_cache_length == 21 + 3 - 1
    dev.__dict__.pop("_previous_max_cache_length", None)
    static_generate(dev, ids.to("tpu"), new_tokens=3, disable_compile=True)
    assert dev._previous_max_cache_length == 24  # 23 -> its bucket


def test_arange_at_new_lengths_and_starts_compiles_nothing():
    # arange has no tensor input: its length and start are its cache key (a
    # decode step's cache position is a new start every step). A small result
    # is computed by PyTorch's CPU kernel and uploaded (host_factory.cpp),
    # before any planning: no compile, no meta kernel; its empty out tensor is
    # resized without a module.
    for start, end, step, dtype in ((0, 50, 1, torch.long), (3, 55, 1, torch.long), (0.5, 7.3, 0.1, torch.float32),
                                    (-2.0, 9.0, 0.25, torch.bfloat16), (1, 40, 3, torch.int32), (41, 42, 1, torch.long)):
        debug.reset_stats()
        got = torch.arange(start, end, step, dtype=dtype, device="tpu")
        assert debug.stats()["compiles"] == 0, debug.stats()["compiles_by_op"]
        expected = torch.arange(start, end, step, dtype=dtype)
        assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected), (start, end, step, dtype)
    out = torch.empty(0, device="tpu")
    torch.arange(4.0, out=out)  # out= on a user's empty tensor
    assert torch.equal(out.cpu(), torch.arange(4.0))
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.arange(3.0, out=out)  # a non-empty out resized: PyTorch's warning
    assert torch.equal(out.cpu(), torch.arange(3.0))
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        torch.arange(0, 4, 0, device="tpu")
    debug.reset_stats()
    big = torch.arange(20000, device="tpu")  # past 64 KiB: compiled on the device
    assert debug.stats()["compiles_by_op"] == {"arange.start_out": 1}
    assert torch.equal(big.cpu(), torch.arange(20000))


def test_arange_compiles_with_exact_shapes():
    with dynamic.dynamic_shapes("0"):  # mode 0: today's behaviour, one module per length
        debug.reset_stats()
        got = torch.arange(62, device="tpu")
        assert debug.stats()["compiles_by_op"] == {"arange.start_out": 1}
    assert torch.equal(got.cpu(), torch.arange(62))
