"""Test-session setup: 8 simulated CPU devices, set before anything touches the backend.

Layout tests build meshes over subsets of these (1, 2, 4 or 8 devices); everything else
runs on device 0.
"""

import os

os.environ.setdefault("XLA_FLAGS", "")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_enable_x64", False)
