"""Bounded dynamic dims for jax_op (torch_tpu.pallas): which dims of a call
run dynamic, and the bounded exports that serve them.

The policy is strict eager's (csrc/aten/dynamic.cpp, torch_tpu.dynamic):

- a call's *family* is the op with its static arguments, each tensor's dtype,
  rank and which dims are 1; the first sizes a family sees run exact (one
  export and compile per shape, as before);
- under TORCH_TPU_DYNAMIC_SHAPES=auto (the default) a dim seen at a second
  size turns dynamic for the family (sticky); under "1" every dim of size > 1
  is dynamic from the first call; under "0" none is;
- ``torch_tpu.mark_dynamic`` / ``mark_static`` hints are honoured in every
  mode; ``torch_tpu.dynamic.forget_sizes()`` forgets the sizes seen here too;
- dynamic dims of equal size share one symbol (a KV cache's keys and values
  have one length); each symbol is bounded by its size's bucket
  (``_C._dynamic_bucket``, strict eager's), and the export of a bucket
  (``jax_bounds.export_bounded``) runs every size in it: the cache key is
  the family, which dims share which symbol, each symbol's bucket and the
  static sizes;
- a function that does not export symbolically (shape-dependent Python
  control flow, an op XLA cannot pad) runs exact shapes for that key: the
  fallback is counted once with its reason in ``torch_tpu.debug.stats()``
  (``exact_reasons["jax_op:<name>"]``, ``dynamic_exact_fallbacks``) and
  listed by :func:`fallbacks`;
- fused eager (``torch_tpu.fused()``) keeps exact shapes, so that a call
  still joins the chain being recorded.
"""
from __future__ import annotations

import hashlib
import weakref
from typing import Any, Optional

from . import _C
from .jax_types import _avals_of, _jax_dtype, _torch_dtype

_POLICIES: "weakref.WeakSet[DynamicPolicy]" = weakref.WeakSet()
_FALLBACKS: dict[str, str] = {}  # op name -> the last reason it ran exact
_HINTS = [False]  # some tensor was marked (torch_tpu.dynamic.mark_dynamic / mark_static)


def forget() -> None:
    """Forgets the sizes every jax_op family has seen (exports are kept)."""
    for p in list(_POLICIES):
        p.families.clear()


def fallbacks() -> dict[str, str]:
    """jax_op name -> why its last bounded export failed (it runs exact there)."""
    return dict(_FALLBACKS)


class _Bounded:
    """One bounded export: its runtime handle and its symbolic result shapes."""

    def __init__(self, handle: int, out_shapes: list) -> None:
        self.handle, self.out_shapes = handle, out_shapes


class _Family:
    def __init__(self, first: list) -> None:
        self.first = first
        self.dynamic: set = set()  # (flat tensor index, dim)


class DynamicPolicy:
    """The dynamic-dims state of one jax_op."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.families: dict[tuple, _Family] = {}
        self.exports: dict[tuple, Optional[_Bounded]] = {}  # None: runs exact
        _POLICIES.add(self)

    def run(self, values: list, sig: tuple, tensors: list, donate: list) -> Any:
        """The call's outputs run bounded dynamic, or None (run it exact)."""
        mode = _C._dynamic_shapes()
        if _HINTS[0]:
            hints = [_C._dim_hints(t) for t in tensors]
            hinted = any("dynamic" in h for h in hints)
        else:  # no tensor was ever marked: skip the look-ups
            hints, hinted = [("",) * t.dim() for t in tensors], False
        if (mode == "0" and not hinted) or _C._fusion_enabled():
            return None
        shapes = [tuple(t.shape) for t in tensors]
        dyn = self._dynamic_dims(sig, shapes, hints, mode)
        if not dyn:
            return None
        symbols = {}  # real size -> symbol index
        for i, d in dyn:
            symbols.setdefault(shapes[i][d], len(symbols))
        layout = tuple((i, d, symbols[shapes[i][d]]) for i, d in dyn)
        buckets = _bounds(tensors, shapes, layout, [_C._dynamic_bucket(s) for s in symbols])
        key = (_family_of(sig), layout, buckets, _static_sizes(shapes, dyn))
        if key not in self.exports:
            self.exports[key] = self._export(sig, shapes, layout, buckets)
        e = self.exports[key]
        if e is None:
            return None
        env = {f"s{k}": size for size, k in symbols.items()}
        from .jax_bounds import evaluate  # noqa: PLC0415

        out_real = [evaluate(s, env) for s in e.out_shapes]
        try:
            return _C._run_custom_module_padded(e.handle, tensors, out_real, donate)
        except RuntimeError as err:
            if "compiling the bounded dynamic module failed" not in str(err):
                raise
            # XLA's dynamic padder refuses the module: exact shapes for this key.
            self.exports[key] = None
            _fallback(self.op.name, "XLA could not pad the module: " + _first_line(err))
            return None

    def _dynamic_dims(self, sig: tuple, shapes: list, hints: list, mode: str) -> list:
        fam_key = _family_of(sig)
        fam = self.families.get(fam_key)
        if fam is None:
            fam = self.families[fam_key] = _Family(shapes)
        for i, s in enumerate(shapes):
            for d, n in enumerate(s):
                if n <= 1 or hints[i][d] == "static":
                    continue
                if mode == "1" or hints[i][d] == "dynamic" or (mode == "auto" and n != fam.first[i][d]):
                    fam.dynamic.add((i, d))
        return sorted((i, d) for i, d in fam.dynamic
                      if shapes[i][d] > 1 and hints[i][d] != "static")

    def _export(self, sig: tuple, shapes: list, layout: tuple, buckets: tuple) -> Optional[_Bounded]:
        """The bounded export for one key, or None (counted, with its reason)."""
        import jax  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from . import jax_bounds  # noqa: PLC0415

        op = self.op
        names = [f"s{k}" for k in range(len(buckets))]
        dims = jax.export.symbolic_shape(", ".join(names))
        sym = {(i, d): dims[k] for i, d, k in layout}
        structs = [jax.ShapeDtypeStruct(tuple(sym.get((i, d), n) for d, n in enumerate(a[2])),
                                        _jax_dtype(a[1], op.name))
                   for i, a in enumerate(_avals_of(sig))]
        bounds = dict(zip(names, buckets))
        try:
            with op._x64(sig):
                text, out_avals = jax_bounds.export_bounded(op.flat_fn(sig), structs, bounds,
                                                            torch.tpu.get_platform())
        except Exception as e:  # noqa: BLE001  (JAX raises many types)
            _fallback(op.name, f"no bounded export: {type(e).__name__}: {_first_line(e)}")
            return None
        outputs, out_dynamic, out_shapes = [], [], []
        for a in out_avals:
            outputs.append((_torch_dtype(a.dtype, op.name), jax_bounds.evaluate(a.shape, bounds)))
            out_dynamic.append([type(d) is not int for d in a.shape])
            out_shapes.append(tuple(a.shape))
        in_dynamic = [[(i, d) in sym for d in range(len(s))] for i, s in enumerate(shapes)]
        bucket_of = {(i, d): buckets[k] for i, d, k in layout}
        in_bucket = [[bucket_of.get((i, d), n) for d, n in enumerate(s)] for i, s in enumerate(shapes)]
        digest = hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        handle = _C._custom_module_padded_handle(f"{op.name}|{digest}", text, in_dynamic, in_bucket,
                                                 outputs, out_dynamic)
        return _Bounded(handle, out_shapes)


def _bounds(tensors: list, shapes: list, layout: tuple, buckets: list) -> tuple:
    """Each symbol's bound: its size's bucket, or the padded size of an
    input's storage that a dynamic op left larger (a KV cache grown by a
    dynamic cat keeps its buffer at the bucket of its bound, often the next
    one): reading that buffer as it is keeps one executable per buffer size
    instead of two keys (bucket, buffer) per step."""
    for i, d, k in layout:
        padded = _C._padded_shape(tensors[i])
        if len(padded) != len(shapes[i]) or not buckets[k] < padded[d] <= 2 * buckets[k]:
            continue
        if all(p == n for j, (p, n) in enumerate(zip(padded, shapes[i])) if j != d
               and (i, j) not in {(a, b) for a, b, _ in layout}):
            buckets[k] = padded[d]
    return tuple(buckets)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else ""


def _fallback(name: str, reason: str) -> None:
    """Counts (once per key) that jax_op `name` runs exact shapes, and why."""
    _FALLBACKS[name] = reason
    _C._count_exact_fallback(f"jax_op:{name}", reason)


def _family_of(sig: tuple) -> tuple:
    """A signature with each tensor's shape replaced by its rank and 1-dims."""
    def aval(a: tuple) -> tuple:
        return ("T", a[1], tuple(n == 1 for n in a[2]))
    out = []
    for s in sig:
        if s is None or s[0] == "S":
            out.append(s)
        elif s[0] == "T":
            out.append(aval(s))
        else:
            out.append(("L", tuple(aval(a) for a in s[1])))
    return tuple(out)


def _static_sizes(shapes: list, dyn: list) -> tuple:
    dynamic = set(dyn)
    return tuple(tuple(-1 if (i, d) in dynamic else n for d, n in enumerate(s)) for i, s in enumerate(shapes))
