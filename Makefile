# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Python writes no bytecode where PYTHONDONTWRITEBYTECODE is set (this machine sets it): every
# Python the suite starts (each rq worker, each `manage.py` of the demo tests, each xdist process)
# then compiles Django and the rest from source, about 3 CPU-s a start, and pytest rewrites every
# test module's asserts again. Writing it (into the venvs and __pycache__/, both ignored) took
# tests/durable/test_workers.py from 77 to 29 CPU-s.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint typecheck pytest postgres matrix bench serve clean venv

$(STAMP): pyproject.toml
	@python=$$(scripts/find-python) || exit 1; \
	  echo "creating $(VENV) with $$python"; \
	  "$$python" -m venv $(VENV)
	scripts/install $(PY) -e '.[test]'
	@scripts/rq-tests $(PY) >/dev/null || echo "scripts/rq-tests: rq's tests not fetched now; tests/test_rq_worker_suite.py tries again"
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py nexo_demo

serve: $(STAMP)
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py nexo_demo --serve

lint: $(STAMP)
	$(VENV)/bin/ruff check nexo_django tests example_project bench manage.py
	$(VENV)/bin/lint-imports --no-cache

typecheck: $(STAMP)
	$(VENV)/bin/mypy

RESULTS := .test-results
JOBS ?= 2
# The whole suite on SQLite, in two processes (pytest-xdist, one file each at a time): much of it
# waits on servers, workers and browsers, and CI has two cores.
# rq's own worker tests (tests/test_rq_worker_suite.py: one pytest of rq's, about a minute, mostly
# waiting on rq's workers) run on their own, beside the other passes, as the matrix does.
RQ_SUITE := tests/test_rq_worker_suite.py
SQLITE_RUN = $(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder --cov=nexo_django --cov-report= --junitxml=$(RESULTS)/sqlite.xml \
  $(or $(PYTEST_ARGS),--ignore=$(RQ_SUITE))
RQ_SUITE_RUN = $(PY) -m pytest -q -p no:cacheprovider --junitxml=$(RESULTS)/rq-suite.xml $(RQ_SUITE)
VERSIONS = $(PY) -c "import django, sys; print('main cell: Python', sys.version.split()[0], 'Django', django.__version__)"
MIGRATIONS_CHECK = $(PY) -m django makemigrations --check --dry-run --settings=tests.settings nexo_django
COVERAGE_REPORT = $(PY) -m coverage report --sort=cover --skip-covered | tail -n 12
PREPARED_TESTS := tests/durable/test_sql.py tests/durable/test_driver.py tests/durable/test_run_queries.py tests/durable/test_runs.py \
  tests/durable/test_concurrency.py tests/test_storable.py tests/admin/test_admin_decision.py

# The whole suite on SQLite, then the durable tests again on a PostgreSQL the script starts.
pytest: $(STAMP)
	@mkdir -p $(RESULTS)
	$(MIGRATIONS_CHECK)
	@$(VERSIONS)
	$(SQLITE_RUN)
	$(COVERAGE_REPORT)
	$(if $(PYTEST_ARGS),,$(RQ_SUITE_RUN))
	$(MAKE) --no-print-directory postgres

# The durable tests again on a PostgreSQL the script starts (in two processes, each with its own
# test database, as the SQLite run; the browser tests once, on SQLite: what they add over the
# page tests is the browser, not the database), then the statements' own tests once
# more with prepared statements (docs/deployment.md): what preparing can change is how each
# statement is sent.
postgres: $(STAMP)
	@mkdir -p $(RESULTS)
	WITH_POSTGRES_PYTHON=$(PY) scripts/with-postgres $(PY) -m pytest -m "durable and not browser" -n $(JOBS) \
	  --dist loadfile --no-loadscope-reorder --junitxml=$(RESULTS)/postgres.xml $(PYTEST_ARGS)
	WITH_POSTGRES_PYTHON=$(PY) WITH_POSTGRES_URL_OPTIONS="server_side_binding=true&prepare_threshold=1" \
	  scripts/with-postgres $(PY) -m pytest -m durable --junitxml=$(RESULTS)/postgres-prepared.xml \
	  $(or $(PYTEST_ARGS),$(PREPARED_TESTS))

# The other cells of the supported matrix (docs/testing.md): the fast SQLite part.
matrix: $(STAMP)
	@mkdir -p $(RESULTS)
	MATRIX_RESULTS=$(RESULTS) scripts/matrix

# Every step runs even if one fails, so the total of every test run is printed last; when one
# failed, make adds its "Error" line below it, which .ci/run (what CI runs) leaves out.
# The steps run side by side, not one after another: the SQLite pass spends much of its time
# waiting on servers, workers and browsers, and the PostgreSQL passes, the matrix, rq's worker
# tests and the checks (lint, mypy) fill both cores meanwhile. Each of them writes its own log
# in $(RESULTS), printed once it is over (all of it when it failed, its summary lines when not).
# Nothing is shared between them: each pytest run starts its own Redis, PostgreSQL, test
# databases and rq workers on free ports. The checks and the matrix (no servers, no workers,
# nothing timed) run niced: they take the cores the passes leave idle, not the passes' share.
SHOW = show() { if wait $$2; then grep -E "$$3" $(RESULTS)/$$1.log; else cat $(RESULTS)/$$1.log; status=1; fi; }
test: $(STAMP)
	@rm -rf $(RESULTS); mkdir -p $(RESULTS)
	@status=0; $(SHOW); \
	  nice -n 10 $(MAKE) --no-print-directory lint typecheck > $(RESULTS)/checks.log 2>&1 & checks=$$!; \
	  $(MAKE) --no-print-directory postgres > $(RESULTS)/postgres.log 2>&1 & pg=$$!; \
	  MATRIX_RESULTS=$(RESULTS) nice -n 10 scripts/matrix > $(RESULTS)/matrix.log 2>&1 & matrix=$$!; \
	  $(if $(PYTEST_ARGS),true,$(RQ_SUITE_RUN)) > $(RESULTS)/rq-suite.log 2>&1 & rqsuite=$$!; \
	  $(MIGRATIONS_CHECK) || status=1; \
	  $(VERSIONS); \
	  $(SQLITE_RUN) || status=1; \
	  $(COVERAGE_REPORT); \
	  echo "the checks, the PostgreSQL passes, the matrix and rq's worker tests ran beside it:"; \
	  show checks $$checks 'All checks passed|^Contracts:|^Success:'; show postgres $$pg '^=+ .*(passed|failed)'; \
	  show matrix $$matrix '^matrix '; show rq-suite $$rqsuite '(passed|failed)'; \
	  echo; echo "every pytest run of make test:"; scripts/total $(RESULTS) || status=1; \
	  exit $$status

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	scripts/install $(PY) -e '.[test,bench]'
	@touch $(BENCH_STAMP)

# The worker's targets are measured on Python 3.12 too (bench/run.py's concurrency_py312 step).
BENCH312 := .venv-bench312
$(BENCH312)/.installed: pyproject.toml
	@python=$$(scripts/find-python 3.12) || exit 1; rm -rf $(BENCH312); "$$python" -m venv $(BENCH312)
	scripts/install $(BENCH312)/bin/python -e '.[test,bench]'
	@touch $@

bench: $(BENCH_STAMP) $(BENCH312)/.installed
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .venv-matrix $(BENCH312) $(RESULTS) .pytest_cache .mypy_cache .ruff_cache
