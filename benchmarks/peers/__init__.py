"""The sides of `bench_peers.py`: one worker per framework, each in its own environment.

The Tunix and TRL workers run as files in their own venvs (`install.py`), where nothing but
the standard library, numpy and the peer is installed: they import `common` from their own
folder, which Python puts first on sys.path for a script. The locojax worker runs in
locojax's environment as `python -m benchmarks.peers.locojax_worker`.
"""
