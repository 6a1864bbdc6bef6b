"""flexc: FlexAttention and a fused linear + cross-entropy loss in C, for PyTorch users.

    import flexc.torch as ft
    mask = ft.create_block_mask(ft.sliding_window_mask(256), None, None, L, L)
    out = ft.flex_attention(q, k, v, block_mask=mask)

`flexc.torch` needs PyTorch; this module does not.
"""
from . import _lib
from ._lib import Error

__version__ = "0.1.0"

__all__ = ["Error", "set_num_threads", "get_num_threads", "version"]

# flexc's own thread count (None: OpenMP's, which PyTorch shares in a process); applied around
# each call and undone after, so that torch.set_num_threads and this stay independent.
_state = {"threads": None}


def set_num_threads(n):
    """Threads used by flexc's kernels and matrix products (OpenMP); PyTorch's are set apart, with
    torch.set_num_threads. Results are bitwise the same for any count."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"set_num_threads: n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"set_num_threads: n = {n} must be >= 1")
    _state["threads"] = n


def get_num_threads():
    """The thread count flexc's kernels use: set_num_threads's, else OpenMP's (OMP_NUM_THREADS,
    else the number of cores, or what torch.set_num_threads set)."""
    return _state["threads"] or _lib.fx_get_num_threads()


def version():
    """The version of the loaded libflexc."""
    return _lib.fx_version().decode()
