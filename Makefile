# One task runner for the README, CI and developers.
PY ?= python3
# One target directory for every build (tests, the wheel, clippy), so none compiles the
# dependencies again.
export CARGO_TARGET_DIR ?= $(CURDIR)/target

# CLIPPY_BUILD=1 (.ci/run sets it) makes clippy-driver the compiler of the kerman crate in every
# cargo and maturin build, with every warning an error (CLIPPY_ARGS is how `cargo clippy` passes
# `-D warnings` to it): the builds that make the tests and the wheel are then the lint, and
# `make lint` needs no separate check build of the crate and its dependencies (docs/testing.md).
ifeq ($(CLIPPY_BUILD),1)
export RUSTC_WORKSPACE_WRAPPER := $(shell rustup which clippy-driver 2>/dev/null || command -v clippy-driver)
export CLIPPY_ARGS := -D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
endif

.PHONY: install test test-slow test-deps test-rust pg-server pg-stop test-python test-plugins stubtest lint fuzz demo bench bench-rust bench-instr bench-workers clean
.PHONY: wheels test-wheels
.PHONY: check-windows

# One release build of the extension, installed into the current Python.
install:
	$(PY) -m pip install -q --root-user-action=ignore "maturin>=1.16,<2.0"
	@# A private wheel folder per run, so parallel installs cannot pick up each other's wheel.
	d=$$(mktemp -d) && $(PY) -m maturin build --release --quiet -o $$d \
	  && $(PY) -m pip install -q --force-reinstall --no-deps --root-user-action=ignore $$d/kerman-*.whl \
	  && rm -rf $$d

test-deps:
	@# The vendors' SDKs (the providers' tests speak to loopback servers through them), pydantic
	@# and jsonschema (typed tools' model parameters and their schema cross-checks).
	$(PY) -m pip install -q --root-user-action=ignore "pytest>=8" "pytest-timeout>=2" "hypothesis>=6" "mypy>=1.10" "uvloop>=0.19" "pydantic>=2" "jsonschema>=4.18" "openai>=3.57" "anthropic>=2.15" "google-genai>=3.6" "pexpect>=4.8"
	@# nbclient, nbformat and ipykernel: examples/notebook.ipynb runs on a real kernel (tests/python/jupyter/).
	$(PY) -m pip install -q --root-user-action=ignore "nbclient>=0.10" "nbformat>=5.9" "ipykernel>=6.29"
	@# The web extra, ag-ui-protocol (its models check kerman.ui's events), httpx and selenium (the web tests).
	$(PY) -m pip install -q --root-user-action=ignore "ag-ui-protocol>=1.0" "starlette>=0.40" "uvicorn>=0.30" "sse-starlette>=2.1" "httpx>=0.27" "selenium>=4.20"
	@# PyYAML: the release workflow read as GitHub reads it (tests/python/packaging/test_release_workflow.py).
	$(PY) -m pip install -q --root-user-action=ignore "pyyaml>=6"
	@# openai-agents: kerman.integrations.openai_agents (tests/python/integrations/).
	$(PY) -m pip install -q --root-user-action=ignore "openai-agents>=0.24"
	@# The mcp extra: kerman.mcp's tests run real MCP servers written with its server side (tests/python/mcp/).
	$(PY) -m pip install -q --root-user-action=ignore "mcp>=2.3"
	@# genai-prices (kerman.usage's default pricer), the OpenTelemetry SDK (kerman.otel's spans) and
	@# its OTLP exporter (kerman log otel).
	$(PY) -m pip install -q --root-user-action=ignore "genai-prices>=0.2.3" "opentelemetry-api>=1.30" "opentelemetry-sdk>=1.30" \
	  "opentelemetry-exporter-otlp-proto-http>=1.30"
	@# pydantic-ai-slim: kerman.integrations.pydantic_ai (tests/python/integrations/); dbos: the
	@# conformance tests run the same agents under pydantic-ai's DBOSDurability (SQLite) for comparison.
	$(PY) -m pip install -q --root-user-action=ignore "pydantic-ai-slim>=2.78" "dbos>=3.4"

# The PostgreSQL store's tests need a server: scripts/pg-test-server.sh starts a throwaway one on
# 127.0.0.1 (about 10 s cold, milliseconds when already up) unless KERMAN_PG_DSN names one; when
# PostgreSQL is missing it installs Debian's postgresql (and openssl) with apt-get, as root,
# saying so first. KERMAN_PG_REQUIRED=1 makes a missing server a failure, not a skip.
PG_ENV = dsn="$${KERMAN_PG_DSN:-}"; [ -n "$$dsn" ] || dsn="$$(bash scripts/pg-test-server.sh)" || exit 1; \
	echo "KERMAN_PG_DSN=$$dsn"; export KERMAN_PG_DSN="$$dsn" KERMAN_PG_REQUIRED=1;

# With CLIPPY_BUILD=1 every target (the benchmarks too) is built first, and so linted, before
# any wheel build: the wheel's library and the tests' share one unhashed file name
# (libkerman.so, the cdylib), so a test build after a wheel build compiles the library again.
test-rust:
ifeq ($(CLIPPY_BUILD),1)
	cargo test --release --quiet --all-targets --features postgres --no-run
endif
	@$(PG_ENV) cargo test --release --quiet --features postgres

# Starts (or finds) the test PostgreSQL server and prints its DSN.
pg-server:
	@bash scripts/pg-test-server.sh

# Stops the test PostgreSQL server if scripts/pg-test-server.sh started it (a server started
# otherwise, or the one KERMAN_PG_DSN names, is left alone).
pg-stop:
	@bash scripts/pg-test-server.sh stop

# With the local test server, tests/python/postgres/test_pgbouncer.py runs a PgBouncer in front
# of it: Debian's pgbouncer is installed first (apt-get, as root, said on stderr) when missing.
test-python: install test-deps
	@$(PG_ENV) case "$$dsn" in postgresql://postgres@127.0.0.1:*) bash scripts/pgbouncer-test.sh install || exit 1;; esac; \
	$(PY) -m pytest -q
	$(MAKE) stubtest

stubtest:
	$(PY) -m mypy.stubtest kerman._core --allowlist tests/stubtest-allowlist.txt

# The example plugin package (examples/plugins/), as a third party ships one: installed like
# any package (--no-deps: the kerman it needs is the wheel just installed), its own tests
# (written with kerman.testing), and mypy --strict over it.
test-plugins: install test-deps
	$(PY) -m pip install -q --no-deps --force-reinstall --root-user-action=ignore ./examples/plugins
	$(PY) -m pytest -q examples/plugins/tests
	$(PY) -m mypy --strict --no-incremental examples/plugins/src examples/plugins/tests

# Everything: Rust unit + integration tests, the Python suite against the built wheel, then the
# example plugin package. The test PostgreSQL server is stopped at the end (also on failure or
# Ctrl-C) when this run started it; one that was already running, or KERMAN_PG_DSN's, is not.
test:
	@bash scripts/pg-test-server.sh scoped $(MAKE) --no-print-directory test-rust test-python test-plugins

# Formatting (rustfmt.toml), clippy with every warning an error (the [lints] table in
# Cargo.toml: the default groups and the pedantic one, less a reasoned allow list), ruff
# ([tool.ruff] in pyproject.toml, lints and the format check; install it first, .ci/run pins the
# version), mypy --strict over the package and its stubs ([tool.mypy]), and the stubs against
# the built module.
#
# With CLIPPY_BUILD=1 (CI, after `make test`) there is no clippy pass here: `test-rust` built,
# and so linted, every target without pyo3, and `install` the library with it; the lints are
# the same, and nothing is compiled again.
lint: install test-deps
	cargo fmt --check
ifneq ($(CLIPPY_BUILD),1)
	cargo clippy --release --all-targets --features python,postgres -- -D warnings
endif
	$(PY) -m ruff check
	$(PY) -m ruff format --check
	$(PY) -m mypy
	$(MAKE) stubtest

# The slow profile: many more crash iterations (200 kills per durability mode), the decisions'
# kill matrix at every event boundary (a PostgreSQL server as for test-python), then every fuzz
# target for FUZZ_SECONDS, the wheels and the Windows check (docs/testing.md).
test-slow: install test-deps
	KERMAN_SLOW=1 $(PY) -m pytest -q -p no:cacheprovider tests/python/store/test_crash.py
	@# The decisions' kill matrix at every event boundary, over a file and a PostgreSQL store.
	@$(PG_ENV) KERMAN_SLOW=1 $(PY) -m pytest -q -p no:cacheprovider tests/python/decisions/test_kill_matrix.py
	$(MAKE) fuzz
	$(MAKE) test-wheels
	$(MAKE) check-windows

FUZZ_SECONDS ?= 60

# Release artefacts: a manylinux wheel (glibc 2.17, linked with zig) for every CPython 3.10-3.14
# on this machine, and the sdist, checked with auditwheel (scripts/build-wheels.sh installs its
# tools into a venv under CARGO_TARGET_DIR).
WHEEL_DIR ?= $(CURDIR)/dist/wheels
wheels:
	PY=$(PY) WHEEL_DIR=$(WHEEL_DIR) bash scripts/build-wheels.sh

# Each wheel installed into a fresh venv of its Python with no Rust on PATH, and the sdist built
# and installed, each then running the public-API tests (tests/python/packaging/).
test-wheels: wheels
	KERMAN_WHEEL_DIR=$(WHEEL_DIR) $(PY) -m pytest -q -p no:cacheprovider tests/python/packaging/test_wheel_install.py tests/python/packaging/test_sdist_install.py

# The Windows port, checked here: clippy and the Rust core's tests cross-built for
# x86_64-pc-windows-gnu (Debian's rustc-web, std built from source, MinGW-w64) and run under
# Wine; WINDOWS_WHEEL=1 also builds and checks a Windows wheel (docs/testing.md, "Windows").
check-windows:
	PY=$(PY) bash scripts/windows-check.sh

# Short libFuzzer runs (cargo-fuzz, installed on first use; skipped with a message if it cannot be).
fuzz:
	bash fuzz/run.sh $(FUZZ_SECONDS)

demo: install
	kerman demo

# The Python targets against the baseline, the native→Python operations per loop turn (a
# deterministic probe), the web streams (100 SSE followers of one session), the UI projections'
# cost per log event, then the Rust micro-benchmarks.
bench: install
	$(PY) benches/python/bench.py
	$(PY) benches/python/crossings.py
	$(PY) benches/python/providers_cost.py
	$(PY) benches/python/providers_long_reply.py
	$(PY) benches/python/web_sse.py
	$(PY) benches/python/ui_fold.py
	$(PY) benches/python/mcp_call.py
	$(PY) benches/python/usage_otel.py
	$(PY) benches/python/compaction_cost.py
	$(PY) benches/python/run_cost.py
	$(PY) benches/python/pydantic_ai_durability.py
	$(MAKE) bench-rust
	$(MAKE) bench-workers

# The distributed benchmark: 4 `kerman worker` processes, 10,000 sessions, load
# generators at 500 enqueues/s then a burst, a kill -9, an audit, LISTEN with 10,000 channels;
# about 3 minutes, in a fresh schema of the test server (started if KERMAN_PG_DSN is unset).
bench-workers: install
	@$(PG_ENV) $(PY) benches/python/pg_workers.py

# Criterion micro-benchmarks of the core alone (about a minute); BENCH_ARGS go to criterion,
# e.g. `make bench-rust BENCH_ARGS=claim` runs only the benchmarks whose name contains "claim".
bench-rust:
	cargo bench --bench micro -- $(BENCH_ARGS)

# Instructions per loop turn (P3, P4 shapes), Kerman and baseline, under callgrind: a
# repeatable A/B measure on a noisy machine (a few minutes; needs valgrind).
bench-instr: install
	$(PY) benches/python/turn_cost.py
	@# The live OpenTelemetry exporter's instructions per P4 turn (docs/tracing.md's target).
	$(PY) benches/python/turn_cost.py --otel

clean:
	rm -rf $(CARGO_TARGET_DIR) dist
