"""A read-only FUSE mirror of a directory that adds a fixed latency to every read request.

Slow storage for the benchmark: TensorFlow's own file reader goes through the kernel,
so each read it issues pays the latency, as reads from object storage do. Runs until
unmounted (`fusermount3 -u MNT`) or killed.

    python -m benchmarks.slowfs SOURCE MOUNTPOINT LATENCY_MS
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time


def _operations():
    import mfusepy as fuse

    class SlowMirror(fuse.Operations):
        use_ns = True

        def __init__(self, root: str, latency_s: float):
            self.root, self.latency_s = root, latency_s

        def _path(self, path):
            return os.path.join(self.root, path.lstrip("/"))

        def getattr(self, path, fh=None):
            st = os.lstat(self._path(path))
            keys = ("st_mode", "st_size", "st_nlink", "st_uid", "st_gid", "st_atime_ns", "st_mtime_ns", "st_ctime_ns")
            return {k.replace("_ns", ""): getattr(st, k) for k in keys}

        def readdir(self, path, fh):
            return [".", ".."] + os.listdir(self._path(path))

        def open(self, path, flags):
            return os.open(self._path(path), os.O_RDONLY)

        def read(self, path, size, offset, fh):
            time.sleep(self.latency_s)
            return os.pread(fh, size, offset)

        def release(self, path, fh):
            os.close(fh)

    return fuse, SlowMirror


def unavailable_reason() -> str | None:
    """Why a FUSE mount cannot work here, or None if it can."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"mfusepy cannot load libfuse ({e}); pip install mfusepy and apt-get install fuse3"
    return None


@contextlib.contextmanager
def mounted(source: str, mountpoint: str, latency_ms: float, *, timeout_s: float = 20.0):
    """Mounts the slow mirror for the duration of the block; always unmounts."""
    os.makedirs(mountpoint, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.slowfs", source, mountpoint, str(latency_ms)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not os.path.ismount(mountpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"slow filesystem did not mount at {mountpoint}: {proc.stderr.read().decode()[-500:]}"
                )
            time.sleep(0.05)
        yield mountpoint
    finally:
        subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv=None) -> int:
    source, mountpoint, latency_ms = (argv or sys.argv[1:])[:3]
    fuse, SlowMirror = _operations()
    fuse.FUSE(SlowMirror(os.path.abspath(source), float(latency_ms) / 1000), mountpoint, foreground=True, ro=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
