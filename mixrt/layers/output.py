"""MXNet's ``SoftmaxOutput``: its arguments and layouts, written once; the training signal
is each front end's (on NDArrays MXNet's own backward, an ``autograd.Function``; on a symbol
the loss :meth:`mixrt.module.Module.from_symbol` attaches)."""

from __future__ import annotations

from dataclasses import dataclass

NORMALIZATIONS = ("null", "batch", "valid")


@dataclass(frozen=True)
class SoftmaxOptions:
    grad_scale: float
    ignore_label: float
    use_ignore: bool
    normalization: str
    multi_output: bool
    preserve_shape: bool
    out_grad: bool
    smooth_alpha: float

    @property
    def axis(self) -> int:
        """The classes' axis: 1 (multi_output, or of the flattened data), else the last."""
        return -1 if self.preserve_shape else 1

    @property
    def flattened(self) -> bool:
        """Whether the softmax runs over the data flattened to (batch, rest), MXNet's
        default layout."""
        return not (self.multi_output or self.preserve_shape)


def SoftmaxOutput(frontend, data=None, label=None, grad_scale=1.0, ignore_label=-1.0,
                  multi_output=False, use_ignore=False, preserve_shape=False,
                  normalization="null", out_grad=False, smooth_alpha=0.0, name=None,
                  **unknown):
    """Forward: the softmax of the data over the classes: of the data flattened to (batch,
    rest) by default (label (batch,)), over axis 1 with ``multi_output`` (data (batch,
    classes, d1, ...), label (batch, d1, ...)), over the last axis with ``preserve_shape``
    (label: the data's leading shape). Its training signal is MXNet's: the gradient
    ``(softmax - one_hot(label)) * grad_scale / norm``, whatever the head gradient
    (``out_grad=True`` multiplies by it), the label's gradient 0. ``norm`` is 1 for
    ``normalization="null"`` (``multi_output``: d1 * ..., as MXNet), the number of labels
    for ``"batch"``, the number not equal to ``ignore_label`` for ``"valid"``;
    ``use_ignore`` zeroes the gradient where the label is ``ignore_label``;
    ``smooth_alpha`` puts ``1 - smooth_alpha`` on the label's class and spreads the rest
    over the others. ``smooth_alpha`` with ``multi_output`` is refused (MXNet ignores it
    there)."""
    layer = frontend("SoftmaxOutput", name, unknown)
    options = SoftmaxOptions(
        grad_scale=layer.number("grad_scale", grad_scale),
        ignore_label=layer.number("ignore_label", ignore_label),
        use_ignore=layer.flag("use_ignore", use_ignore),
        normalization=layer.choice("normalization", normalization, NORMALIZATIONS),
        multi_output=layer.flag("multi_output", multi_output),
        preserve_shape=layer.flag("preserve_shape", preserve_shape),
        out_grad=layer.flag("out_grad", out_grad),
        smooth_alpha=layer.number("smooth_alpha", smooth_alpha))
    if options.multi_output and options.preserve_shape:
        raise layer.error("give multi_output or preserve_shape, not both")
    if options.multi_output and options.smooth_alpha:
        raise layer.error("smooth_alpha with multi_output is not supported (MXNet ignores it "
                          "there)")
    return layer.softmax_output(layer.data(data), label, options)
