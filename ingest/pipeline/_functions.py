"""This package's tf.data functions: traced without AutoGraph, instantiated without Grappler.

Every iterator instantiates its dataset's functions anew, and tf.data instantiates each
as a multi-device function: placed, then rewritten by Grappler's meta-optimizer, one
function at a time. On the seekable block pipeline that was 150 of the 190 ms a new
iterator took (measured with Grappler disabled process-wide), paid at every Keras epoch,
and with the 500k-row benchmark corpus it halved the throughput of a pipeline iterated
once per epoch. A function carrying the `experimental_ints_on_device` attribute (as
tf.data's own prefetch-to-device functions do) is instantiated for the iterator's device
alone, without that pass.

tf.data also converts every function with AutoGraph before tracing it: in a fresh process
that was 1.5 of the 1.8 s `make_dataset` took to build the seekable block pipeline
(cProfile), against 0.13 s for a hand-written pipeline. This package's functions use
`tf.cond` and datasets, never Python control flow on tensors: they need no conversion.

tf.data's public `map`, `flat_map`, `scan` ... take neither function attributes nor an
AutoGraph switch: inside `own_functions()`, the functions the calling thread gives tf.data
are marked `do_not_convert` and get the attribute. Only for this package's own functions,
whose ops all have CPU kernels and which touch no resource on another device: not a
user's `preprocess`, nor a `start_batch` variable read (a variable may live on a GPU).
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["own_functions"]

_ATTRIBUTE = "experimental_ints_on_device"
_local = threading.local()
_install_lock = threading.Lock()
_installed = False


def _install() -> bool:
    """Wraps tf.data's function wrapper once; False if this TensorFlow does not have it."""
    global _installed
    with _install_lock:
        if _installed:
            return True
        import tensorflow as tf

        try:
            from tensorflow.python.data.ops import structured_function
        except ImportError:  # only a slower new iterator
            return False
        wrapper = getattr(structured_function, "StructuredFunctionWrapper", None)
        if wrapper is None:
            return False
        traced = wrapper.__init__

        def __init__(self, func, *args, defun_kwargs=None, **kwargs):
            if getattr(_local, "depth", 0):
                func = tf.autograph.experimental.do_not_convert(func)
                defun_kwargs = {_ATTRIBUTE: True, **(defun_kwargs or {})}
            traced(self, func, *args, defun_kwargs=defun_kwargs, **kwargs)

        wrapper.__init__ = __init__
        _installed = True
        return True


@contextlib.contextmanager
def own_functions(enabled: bool = True):
    """Functions given to tf.data in this block (this thread) are this package's own.

    `own_functions(False)` inside it turns it off for a nested stretch (a user's function,
    a variable read).
    """
    if enabled and not _install():
        enabled = False
    saved = getattr(_local, "depth", 0)
    _local.depth = saved + 1 if enabled else 0
    try:
        yield
    finally:
        _local.depth = saved
