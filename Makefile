# Two entry points: `make demo` and `make test`. Each builds .venv first if needed.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: demo test test-fast bench bench-peers clean

$(STAMP): pyproject.toml constraints.txt
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	.venv/bin/locojax demo

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/bench_engine.py

# locojax vs Tunix vs TRL, interleaved in one run; installs the peers' pinned venvs under
# ~/.cache/locojax/peers on first use (pass ARGS=--no-install to use only existing ones).
bench-peers: $(STAMP)
	$(PY) benchmarks/bench_peers.py $(ARGS)

clean:
	rm -rf .venv
