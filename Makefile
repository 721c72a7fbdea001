# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck pytest bench serve clean venv

$(STAMP): pyproject.toml
	@python=$$(scripts/find-python) || exit 1; \
	  echo "creating $(VENV) with $$python"; \
	  "$$python" -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
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

# The whole suite on SQLite, then the durable tests again on a PostgreSQL the script starts.
pytest: $(STAMP)
	$(PY) -m django makemigrations --check --dry-run --settings=tests.settings nexo_django
	$(PY) -m coverage run -m pytest $(PYTEST_ARGS)
	$(PY) -m coverage report --sort=cover --skip-covered | tail -n 12
	WITH_POSTGRES_PYTHON=$(PY) scripts/with-postgres $(PY) -m pytest -m durable $(PYTEST_ARGS)
	# ... and once more with prepared statements (docs/deployment.md): every statement prepared.
	WITH_POSTGRES_PYTHON=$(PY) WITH_POSTGRES_URL_OPTIONS="server_side_binding=true&prepare_threshold=1" \
	  scripts/with-postgres $(PY) -m pytest -m durable $(PYTEST_ARGS)

test: lint typecheck pytest

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
