"""tf.data functions that a new iterator instantiates without Grappler.

Every iterator instantiates its dataset's functions anew, and tf.data instantiates each
as a multi-device function: placed, then rewritten by Grappler's meta-optimizer, one
function at a time. On the seekable block pipeline that was 150 of the 190 ms a new
iterator took (measured with Grappler disabled process-wide), paid at every Keras epoch,
and with the 500k-row benchmark corpus it halved the throughput of a pipeline iterated
once per epoch. A function carrying the `experimental_ints_on_device` attribute (as
tf.data's own prefetch-to-device functions do) is instantiated for the iterator's device
alone, without that pass.

tf.data's public `map`, `flat_map`, `scan` ... take no function attributes: inside
`single_device()`, the functions the calling thread traces get the attribute. Only for
this package's own functions, whose ops all have CPU kernels and which touch no resource
on another device: not a user's `preprocess`, nor a `start_batch` variable read (a
variable may live on a GPU).
"""

from __future__ import annotations

import contextlib
import threading

__all__ = ["single_device"]

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
        try:
            from tensorflow.python.data.ops import structured_function
        except ImportError:  # only a slower new iterator
            return False
        wrapper = getattr(structured_function, "StructuredFunctionWrapper", None)
        if wrapper is None:
            return False
        traced = wrapper.__init__

        def __init__(self, *args, defun_kwargs=None, **kwargs):
            if getattr(_local, "depth", 0):
                defun_kwargs = {_ATTRIBUTE: True, **(defun_kwargs or {})}
            traced(self, *args, defun_kwargs=defun_kwargs, **kwargs)

        wrapper.__init__ = __init__
        _installed = True
        return True


@contextlib.contextmanager
def single_device(enabled: bool = True):
    """Functions traced by tf.data in this block (this thread) skip Grappler at iterator creation.

    `single_device(False)` inside it turns it off for a nested stretch (a variable read).
    """
    if enabled and not _install():
        enabled = False
    saved = getattr(_local, "depth", 0)
    _local.depth = saved + 1 if enabled else 0
    try:
        yield
    finally:
        _local.depth = saved
