"""Peer environments for `bench_peers.py`: one pinned venv per peer, made once, under a cache dir.

Each peer lives in its own `python3 -m venv` (pip, not uv: the CPU torch wheel is on this
machine's disk as a find-links wheel, which only pip sees), so nothing third-party enters
locojax's own environment or repository. A venv is "ready" once its stamp file exists, which
is written only after every pinned package installed and the peer imported.

TRL needs torch: the CPU build is installed FIRST, on its own, and then pinned by a constraint
file, so that resolving trl/transformers can never pull a multi-GB CUDA build of torch.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("LOCOJAX_PEERS_DIR",
                                    Path.home() / ".cache" / "locojax" / "peers"))


@dataclasses.dataclass(frozen=True)
class PeerEnv:
    name: str
    first: tuple[str, ...]  # installed alone, before everything else (torch's CPU wheel)
    packages: tuple[str, ...]  # then these, with `first` pinned by a constraint
    check: str  # a Python statement that must run in the finished venv

    def root(self, cache: Path) -> Path:
        return cache / self.name

    def python(self, cache: Path) -> Path:
        return self.root(cache) / "bin" / "python"

    def stamp(self, cache: Path) -> Path:
        return self.root(cache) / ".locojax-ready"


PEERS = {
    "tunix": PeerEnv(
        "tunix", first=(),
        packages=("google-tunix==0.1.7", "jax==0.10.2", "jaxlib==0.10.2", "flax==0.12.8",
                  "optax==0.2.8"),
        check="import tunix.rl.grpo.grpo_learner, flax, jax; assert jax.__version__ == '0.10.2'"),
    "trl": PeerEnv(
        "trl", first=("torch==2.13.0",),
        packages=("trl==1.16.*", "transformers==5.24.0"),
        check="import trl, torch, transformers; assert torch.__version__.startswith('2.13.0')"
              " and '+cpu' in torch.__version__, torch.__version__"),
}


def is_ready(peer: PeerEnv, cache: Path = DEFAULT_CACHE) -> bool:
    return peer.stamp(cache).exists() and peer.python(cache).exists()


def _run(argv: list[str], log) -> None:
    log.write("$ " + " ".join(argv) + "\n")
    log.flush()
    code = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT)
    if code:
        raise RuntimeError(f"exit {code}: {' '.join(argv)}")


def install(peer: PeerEnv, cache: Path = DEFAULT_CACHE) -> Path:
    """Make the peer's venv unless it is ready; return its python. Raises with the log's tail."""
    if is_ready(peer, cache):
        return peer.python(cache)
    root = peer.root(cache)
    root.parent.mkdir(parents=True, exist_ok=True)
    log_path = cache / f"{peer.name}-install.log"
    with open(log_path, "w") as log:
        try:
            _run(["python3", "-m", "venv", "--clear", str(root)], log)
            pip = [str(peer.python(cache)), "-m", "pip", "install", "--quiet",
                   "--disable-pip-version-check"]
            constraint = root / "peer-constraints.txt"
            constraint.write_text("".join(p + "\n" for p in peer.first))
            if peer.first:
                _run(pip + list(peer.first), log)
            _run(pip + ["-c", str(constraint)] + list(peer.packages), log)
            _run([str(peer.python(cache)), "-c", peer.check], log)
            frozen = subprocess.run([str(peer.python(cache)), "-m", "pip", "freeze"],
                                    capture_output=True, text=True).stdout
            (root / "pip-freeze.txt").write_text(frozen)
        except (OSError, RuntimeError) as e:
            log.flush()
            tail = "\n".join(log_path.read_text().splitlines()[-6:])
            raise RuntimeError(f"installing {peer.name} failed ({e}); log {log_path}:\n{tail}")
    peer.stamp(cache).write_text("ok\n")
    return peer.python(cache)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(PEERS):
        print(name, install(PEERS[name]))
