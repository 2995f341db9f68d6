"""generate() on "tpu": greedy tokens equal CPU's; beam search; seeded sampling; DynamicCache and StaticCache."""
import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (scripts/install.sh installs it)")

import torch_tpu  # noqa: E402
import torch_tpu.hf  # noqa: E402
from _models import build, prompt  # noqa: E402

NEW = 4
_models = {}


def _get(name):
    if name not in _models:
        _models[name] = build(name)
    return _models[name]


def _gen(model, ids, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids.to(model.device), max_new_tokens=NEW, **kw).cpu()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt2", "qwen3_moe", "gemma3", "t5"])
def test_greedy_equals_cpu(name, cache):
    cpu, dev = _get(name)
    ids = prompt()
    kw = {"cache_implementation": "static"} if cache == "static" else {}
    ref = _gen(cpu, ids, do_sample=False, **kw)
    out = _gen(dev, ids, do_sample=False, **kw)
    assert out.tolist() == ref.tolist()
    assert out.shape[-1] == (1 if name == "t5" else ids.shape[-1]) + NEW


@pytest.mark.parametrize("name", ["gpt2"])
def test_beam_search_equals_cpu(name):
    cpu, dev = _get(name)
    ids = prompt(batch=1, length=4)
    ref = _gen(cpu, ids, num_beams=2, do_sample=False)
    assert _gen(dev, ids, num_beams=2, do_sample=False).tolist() == ref.tolist()


def test_sampling_seeded_reproducible():
    _, dev = _get("llama")
    ids = prompt()
    outs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        outs.append(_gen(dev, ids, do_sample=True, top_k=20, temperature=1.0))
    assert outs[0].tolist() == outs[1].tolist()
    assert outs[0][0, : ids.shape[-1]].tolist() == ids[0].tolist()
    assert all(0 <= t < dev.config.vocab_size for t in outs[0].flatten().tolist())
    assert outs[0].tolist() != outs[2].tolist()


def _our_warnings(rec):
    return [str(w.message) for w in rec if str(w.message).startswith("torch_tpu:") and "eagerly" in str(w.message)]


def test_static_cache_auto_compile_without_backend_warns_once(monkeypatch):
    # As before torch_tpu registered its TorchDynamo backend "tpu".
    monkeypatch.setattr(torch_tpu.hf, "_backend_registered", lambda backend: False)
    monkeypatch.setattr(torch_tpu.hf, "_warned_compile", False)
    cpu, dev = _get("llama")
    ids = prompt()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        a = dev.generate(ids.to("tpu"), max_new_tokens=NEW, cache_implementation="static").cpu()
        b = dev.generate(ids.to("tpu"), max_new_tokens=NEW, cache_implementation="static").cpu()
    assert len(_our_warnings(rec)) == 1, [str(w.message) for w in rec]
    assert a.tolist() == b.tolist() == _gen(cpu, ids, cache_implementation="static").tolist()
    # disable_compile=True: no warning at all
    monkeypatch.setattr(torch_tpu.hf, "_warned_compile", False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        dev.generate(ids.to("tpu"), max_new_tokens=2, cache_implementation="static", disable_compile=True)
    assert not _our_warnings(rec)


def test_static_cache_auto_compile_backend_failure_falls_back(monkeypatch):
    from transformers import CompileConfig

    def broken_backend(gm, example_inputs, **kwargs):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(torch_tpu.hf, "_warned_compile", False)
    cpu, dev = build("llama")
    ids = prompt()
    cfg = CompileConfig(backend=broken_backend, dynamic=False, fullgraph=False)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        a = dev.generate(ids.to("tpu"), max_new_tokens=NEW, cache_implementation="static", compile_config=cfg).cpu()
        b = dev.generate(ids.to("tpu"), max_new_tokens=NEW, cache_implementation="static", compile_config=cfg).cpu()
    msgs = _our_warnings(rec)
    assert len(msgs) == 1 and "broken on purpose" in msgs[0], [str(w.message) for w in rec]
    assert a.tolist() == b.tolist() == _gen(cpu, ids, cache_implementation="static").tolist()


def test_explicit_static_cache_object():
    from transformers import StaticCache

    cpu, dev = _get("llama")
    ids = prompt()
    ref = _gen(cpu, ids, past_key_values=StaticCache(config=cpu.config, max_cache_len=16), disable_compile=True)
    cache = StaticCache(config=dev.config, max_cache_len=16)
    out = _gen(dev, ids, past_key_values=cache, disable_compile=True)
    assert out.tolist() == ref.tolist()
