"""Not the ingest package: the root of an ingest checkout (the package is `ingest/` inside it).

Python imports this folder as `ingest` when a script runs from the folder that holds the
checkout: the script's folder comes first on sys.path, and a folder named `ingest` there
shadows the installed package. Without this file it became an empty namespace package
(no `__file__`), which wins even over an editable install (setuptools' finder comes after
the path search) and failed later with "module 'ingest' has no attribute 'load_info'".

So, imported as `ingest`, this file hands over to the package that the import would have
found without this folder (an editable or a regular install, or a PYTHONPATH entry), and
where there is none, says what happened.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _spec_elsewhere(here: str):
    """The `ingest` package's spec found by sys.meta_path, this checkout's folder left out."""
    holder = os.path.realpath(os.path.dirname(here))
    path = [p for p in sys.path if os.path.realpath(p or os.getcwd()) != holder]
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder:
            spec = finder.find_spec("ingest", path)
        elif hasattr(finder, "find_spec"):
            spec = finder.find_spec("ingest", None)
        else:
            continue
        # A namespace portion (origin None) is what went wrong in the first place.
        if spec is not None and spec.origin and os.path.realpath(spec.origin) != os.path.realpath(__file__):
            return spec
    return None


def _hand_over() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    spec = _spec_elsewhere(here)
    if spec is None:
        raise ImportError(
            f"`import ingest` found {here}, an ingest checkout (the repository's folder), not the ingest package: "
            f"Python looks first in {os.path.dirname(here)}, the folder of the running script (or the current "
            "directory), and no ingest package is installed to take over. Install it (pip install -e "
            f"{here}), or add {here} to PYTHONPATH, or run the script from another folder",
            name="ingest",
        )
    # The import system returns what sys.modules holds once this file has run.
    module = importlib.util.module_from_spec(spec)
    sys.modules["ingest"] = module
    spec.loader.exec_module(module)


if __name__ == "ingest":  # pytest imports this file under the checkout folder's name: nothing to do
    _hand_over()
