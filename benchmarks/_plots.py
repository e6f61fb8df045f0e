"""matplotlib for the benchmarks' plots: an extra (`ingest[plot]`, part of `ingest[all]`)."""

from __future__ import annotations

PLOT_INSTALL = "pip install 'ingest[plot]'"


def pyplot():
    """`matplotlib.pyplot` on the file-only Agg backend, or an ImportError with the install command.

    The benchmarks call it before their first measurement too, so a missing matplotlib
    stops them at once instead of after minutes of work.
    """
    try:
        import matplotlib
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise ImportError(
            f"the benchmarks' plots need matplotlib, which is not installed. Install it with: {PLOT_INSTALL}"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
