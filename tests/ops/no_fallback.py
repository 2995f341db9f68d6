"""``with native(): ...`` asserts that no CPU fallback ran inside the block.

Shared by the op test files of this directory (pytest puts it on sys.path).
"""
from __future__ import annotations

import torch_tpu


def _fallbacks() -> dict:
    return dict(torch_tpu.debug.stats()["fallbacks"])


class native:  # noqa: N801  (used like a function: `with native():`)
    def __enter__(self) -> None:
        self.before = _fallbacks()

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            assert _fallbacks() == self.before, "a CPU fallback ran"
