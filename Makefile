# sinkbook: the two commands of the README.
#   make book   set up .venv (+ the qwen models), execute every notebook (profile=full) on the embedded models, build _build/html
#   make test   set up .venv, run the tests (unit, notebooks on the quick profile, book build, freshness)
PROFILE ?= full
PY := .venv/bin/python

.PHONY: setup setup-qwen book notebooks html test test-fast clean
setup:
	bash scripts/setup.sh

# the two Qwen2.5-Coder models (about 1.6 GB, --no-deps): the book's chapters use them, make test does not
setup-qwen: setup
	$(PY) -m sinklib.install qwen

notebooks: setup setup-qwen
	$(PY) -m sinklib.book run --profile $(PROFILE)
	$(PY) -m sinklib.claims     # the claims page's table, from data/results
	$(PY) -m sinklib.book.models_page  # the models page's table, from the registry and data/results
	$(PY) -m sinklib.book.course report  # the course guide's times, from data/results/course_times.json (measure: python -m sinklib.book.course time)

html: setup
	.venv/bin/jupyter-book build . -W -n --keep-going

book: notebooks html

test: setup
	$(PY) -m pytest -q -ra

test-fast: setup
	$(PY) -m pytest -q -ra -m "not slow"

clean:
	rm -rf _build
