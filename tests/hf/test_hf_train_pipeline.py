"""Trainer on "tpu" (matches CPU for 3 steps, loss decreases) and pipeline("text-generation", device="tpu")."""
import warnings

import pytest
import torch

pytest.importorskip("transformers", reason="transformers not installed (scripts/install.sh installs it)")
pytest.importorskip("accelerate", reason="Trainer needs accelerate (scripts/install.sh installs it)")

import torch_tpu  # noqa: E402
from _models import build, tokenizer  # noqa: E402


class _Data(torch.utils.data.Dataset):
    def __init__(self, n=16, length=8):
        g = torch.Generator().manual_seed(0)
        base = torch.randint(3, 20, (n, length), generator=g)  # small sub-vocabulary: learnable
        self.ids = base

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i].clone()}


def _train(model, use_cpu, tmp_path, steps=3):
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / ("cpu" if use_cpu else "tpu")), use_cpu=use_cpu,
                             max_steps=steps, per_device_train_batch_size=4, learning_rate=5e-3,
                             logging_steps=1, report_to=[], save_strategy="no", seed=0,
                             lr_scheduler_type="constant", warmup_steps=0, dataloader_num_workers=0,
                             disable_tqdm=True, optim="adamw_torch")
    trainer = Trainer(model=model, args=args, train_dataset=_Data())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert trainer.args.device.type == ("cpu" if use_cpu else "tpu")
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer.model


def test_trainer_matches_cpu(tmp_path):
    cpu, dev = build("llama")
    cpu.train()
    dev.to("cpu").train()  # the Trainer moves it to args.device itself
    ref, cpu_trained = _train(cpu, True, tmp_path)
    out, dev_trained = _train(dev, False, tmp_path)
    assert next(dev_trained.parameters()).device.type == "tpu"
    assert len(out) == len(ref) == 3
    assert out[-1] < out[0]
    torch.testing.assert_close(torch.tensor(out), torch.tensor(ref), rtol=2e-3, atol=2e-3)
    for (k, a), (_, b) in zip(sorted(cpu_trained.state_dict().items()), sorted(dev_trained.state_dict().items())):
        torch.testing.assert_close(b.cpu(), a, rtol=2e-3, atol=2e-3, msg=k)


def test_pipeline_text_generation():
    from transformers import pipeline

    tok = tokenizer()
    cpu, dev = build("llama")
    text = "w1 w5 w9 w2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pipeline("text-generation", model=cpu, tokenizer=tok, device="cpu")(
            text, max_new_tokens=4, do_sample=False)
        pipe = pipeline("text-generation", model=dev, tokenizer=tok, device="tpu")
        out = pipe(text, max_new_tokens=4, do_sample=False)
    assert pipe.device.type == "tpu" and pipe.model.device.type == "tpu"
    assert out == ref
    generated = out[0]["generated_text"]
    assert generated.startswith(text) and len(generated) > len(text)
