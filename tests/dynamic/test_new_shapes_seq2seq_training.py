"""Encoder-decoder training steps at new lengths and batch sizes inside warm buckets
compile nothing (TORCH_TPU_DYNAMIC_SHAPES=auto): tiny T5 and BART, labels shifted right
into decoder inputs (a write into `shifted[:, 1:]`), T5's relative position bias and
its gradient through attention (the bias gradient, which PyTorch's meta kernel lays
out with gaps), cross entropy, backward and an SGD step. Losses equal PyTorch's on
the CPU at every step; compiles are read from debug.stats()."""
import pytest
import torch

from torch_tpu import debug

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("auto_dynamic_shapes")  # conftest.py

WARM = ((4, 12), (4, 14), (3, 14), (4, 13))  # the second length makes the dims dynamic
NEW = ((4, 15), (4, 11), (3, 13), (2, 10))


def _config(name):
    if name == "t5":
        return transformers.T5ForConditionalGeneration, transformers.T5Config(
            vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
            decoder_start_token_id=0, pad_token_id=0)
    return transformers.BartForConditionalGeneration, transformers.BartConfig(
        vocab_size=128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_new_lengths_and_batches_compile_nothing(name):
    cls, config = _config(name)
    torch.manual_seed(0)
    models = {"cpu": cls(config).eval()}  # eval: no dropout, so the two runs can agree
    models["tpu"] = cls(config).eval()
    models["tpu"].load_state_dict(models["cpu"].state_dict())
    models["tpu"].to("tpu")
    opts = {d: torch.optim.SGD(m.parameters(), lr=0.05) for d, m in models.items()}

    def step(b, n, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, 128, (b, n), generator=g)
        labels = torch.randint(3, 128, (b, n // 2), generator=g)
        losses = {}
        for device, model in models.items():
            if device == "tpu":
                debug.reset_stats()
            out = model(input_ids=ids.to(device), attention_mask=torch.ones_like(ids).to(device),
                        labels=labels.to(device))
            out.loss.backward()
            opts[device].step()
            opts[device].zero_grad()
            losses[device] = out.loss.detach().cpu()
        return losses, debug.stats()

    for i, (b, n) in enumerate(WARM):
        step(b, n, i)
    for i, (b, n) in enumerate(NEW):
        losses, s = step(b, n, 10 + i)
        torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-4, atol=1e-5)
        assert s["compiles"] == 0, ((b, n), s["compiles_by_op"], s["exact_reasons"])
        assert s["fallbacks"] == {}, s["fallbacks"]
