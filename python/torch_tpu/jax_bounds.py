"""A JAX function exported with bounded dynamic dims (jax_op's dynamic path).

``export_bounded`` exports the function with ``jax.export`` on symbolic
shapes (``jax.export.symbolic_shape``) and makes the module one that XLA's
dynamic padder compiles once for every size up to a bound:

- every ``?`` dim of every tensor type gets a ``#stablehlo.bounds<...>``
  encoding: JAX's own symbolic expression of that dim (``T``, ``2*T``,
  ``b*S``) evaluated at the bound of each symbol (its bucket, the padded
  size strict eager uses, ``_C._dynamic_bucket``);
- the shape-polymorphism plumbing JAX adds stays valid:
  ``get_dimension_size`` reads the real sizes (the runtime passes them
  with ``set_dimension_size``), ``shape_assertion`` custom calls (checks of
  the symbolic specification the caller's sizes satisfy by construction)
  are dropped, and the ops XLA cannot translate with bounded types
  (``dynamic_broadcast_in_dim``, ``dynamic_iota``) become their static form
  at the bound followed by ``set_dimension_size`` with the size JAX computed.

Modules that still hold an op XLA cannot pad raise :class:`NotBounded`
(the caller runs exact shapes then).
"""
from __future__ import annotations

import contextlib
import re
from typing import Any, Callable, Iterator, Sequence

# Ops with shape operands that the dynamic padder takes as they are.
_KEPT = {"stablehlo.dynamic_reshape", "stablehlo.get_dimension_size", "stablehlo.set_dimension_size"}
_STATIC_FORM = {"stablehlo.dynamic_broadcast_in_dim", "stablehlo.dynamic_iota"}


class NotBounded(Exception):
    """The function does not export as a bounded dynamic module (the reason)."""


def _expr_bound(d: Any, bounds: dict[str, int]) -> int:
    """A symbolic dim's bound: its expression at the symbols' bounds. JAX's
    dim expressions of tensor sizes are sums of products of symbols with
    integer coefficients; one that shrinks as a symbol grows (a negative
    term) has no bound there, and refuses."""
    v = int(d._evaluate(dict(bounds)))
    smaller = {k: max(1, b - 1) for k, b in bounds.items()}
    if int(d._evaluate(smaller)) > v:
        raise NotBounded(f"the dim {d} does not grow with its symbols")
    if v < 0:
        raise NotBounded(f"the dim {d} is negative at the bounds")
    return v


@contextlib.contextmanager
def _bounded_types(bounds: dict[str, int]) -> Iterator[None]:
    """During the export, JAX's tensor types of symbolic shapes carry bounds."""
    from jax._src import core  # noqa: PLC0415
    from jax._src.interpreters import mlir  # noqa: PLC0415

    ir = mlir.ir
    original = mlir._dynamic_array_ir_types

    def bounded(aval: Any) -> Any:
        aval = core.physical_aval(aval)
        dyn = ir.ShapedType.get_dynamic_size()
        shape = [d if type(d) is int else dyn for d in aval.shape]
        marks = ["?" if type(d) is int else str(_expr_bound(d, bounds)) for d in aval.shape]
        enc = ir.Attribute.parse("#stablehlo.bounds<" + ", ".join(marks) + ">")
        return ir.RankedTensorType.get(shape, mlir.dtype_to_ir_type(aval.dtype), enc)

    mlir._dynamic_array_ir_types = bounded
    try:
        yield
    finally:
        mlir._dynamic_array_ir_types = original


def _bounds_of(t: Any) -> list[int]:
    """A bounded type's bound per dim (its static size where static)."""
    m = re.search(r"#stablehlo\.bounds<([^>]*)>", str(t))
    if m is None:
        raise NotBounded(f"a dynamic type without bounds: {t}")
    marks = [s.strip() for s in m.group(1).split(",")]
    return [int(b) if b != "?" else int(s) for b, s in zip(marks, t.shape)]


def _static_form(op: Any, hlo: Any, ir: Any) -> None:
    """Replaces a dynamic_broadcast_in_dim / dynamic_iota by its static op at
    the bound and ``set_dimension_size`` of each dynamic dim."""
    result = op.results[0]
    rtype = ir.RankedTensorType(result.type)
    bound = _bounds_of(rtype)
    shape_operand = op.operands[1] if op.name == "stablehlo.dynamic_broadcast_in_dim" else op.operands[0]
    i32 = ir.IntegerType.get_signless(32)
    with ir.InsertionPoint(op), op.location:
        static = ir.RankedTensorType.get(bound, rtype.element_type)
        if op.name == "stablehlo.dynamic_iota":
            v = hlo.iota(static, ir.IntegerAttr(op.attributes["iota_dimension"]).value)
        else:
            dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
            v = hlo.broadcast_in_dim(static, op.operands[0], dims)
        dynamic = [d for d in range(rtype.rank) if rtype.is_dynamic_dim(d)]
        marks = ["?"] * rtype.rank
        for k, d in enumerate(dynamic):
            size = hlo.slice(shape_operand, [d], [d + 1], [1])
            size = hlo.reshape(ir.RankedTensorType.get([], ir.RankedTensorType(size.type).element_type), size)
            if ir.RankedTensorType(size.type).element_type != i32:
                size = hlo.convert(ir.RankedTensorType.get([], i32), size)
            marks[d] = str(bound[d])
            done = set(dynamic[:k + 1])
            shape = [ir.ShapedType.get_dynamic_size() if j in done else bound[j] for j in range(rtype.rank)]
            enc = ir.Attribute.parse("#stablehlo.bounds<" + ", ".join(marks) + ">")
            t = ir.RankedTensorType.get(shape, rtype.element_type, enc)
            v = hlo.set_dimension_size(v, size, d, results=[t])
    result.replace_all_uses_with(v)
    op.erase()


def _rewrite(module: Any, hlo: Any, ir: Any) -> None:
    """Drops shape assertions and gives the dynamic-shape ops static forms."""
    todo: list = []

    def visit(op: Any) -> Any:
        todo.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    for op in todo:
        name = op.name
        if name == "stablehlo.custom_call":
            target = ir.StringAttr(op.attributes["call_target_name"]).value
            if target == "shape_assertion":
                op.erase()
            elif target.startswith("stablehlo.dynamic_"):
                raise NotBounded(f"the module calls {target}, which XLA cannot pad")
        elif name in _STATIC_FORM:
            _static_form(op, hlo, ir)
        elif name.startswith("stablehlo.") and ("dynamic_" in name and name not in _KEPT
                                                and name not in ("stablehlo.dynamic_slice",
                                                                 "stablehlo.dynamic_update_slice")):
            raise NotBounded(f"the module holds {name}, which XLA cannot pad")
        elif name == "stablehlo.real_dynamic_slice":
            raise NotBounded("the module holds stablehlo.real_dynamic_slice, which XLA cannot pad")
    if "jax.uses_shape_polymorphism" in module.operation.attributes:
        del module.operation.attributes["jax.uses_shape_polymorphism"]


def export_bounded(fn: Callable, structs: Sequence[Any], bounds: dict[str, int], platform: str) -> tuple:
    """(module text, exported out_avals with symbolic dims) of ``fn`` exported
    on ``structs`` (``jax.ShapeDtypeStruct`` with symbolic dims), each symbol
    bounded by ``bounds``. Raises NotBounded when a dim or op has no bounded
    form, and what jax.export raises when the function does not export
    symbolically (shape-dependent Python control flow)."""
    import jax  # noqa: PLC0415
    from jax._src.interpreters import mlir  # noqa: PLC0415
    from jax._src.lib.mlir.dialects import hlo  # noqa: PLC0415

    with _bounded_types(bounds):
        exported = jax.export.export(
            jax.jit(fn, keep_unused=True), platforms=[platform],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("ALL")],
        )(*structs)
    with mlir.make_ir_context():
        module = mlir.ir.Module.parse(exported.mlir_module())
        _rewrite(module, hlo, mlir.ir)
        module.operation.verify()
        text = module.operation.get_asm(enable_debug_info=False)
    return text, exported.out_avals


def evaluate(shape: Sequence[Any], env: dict[str, int]) -> list[int]:
    """A symbolic shape's sizes with the symbols at ``env``."""
    return [d if type(d) is int else int(d._evaluate(env)) for d in shape]
