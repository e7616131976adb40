# sinkbook: the commands of the README.
#   make book        set up .venv (+ the qwen models), re-execute only the STALE chapters (profile=full), build _build/html
#   make test        set up .venv, run the tests (unit, notebooks on the quick profile, book build, freshness)
#   make reproduce   re-execute every chapter (or ONLY=04) with progress, compare with the committed results
#   make render      build _build/html from the committed pages only (no torch, no models; what CI publishes)
PROFILE ?= full
ONLY ?=
DEVICE ?=
TOL ?= 1e-6
PY := .venv/bin/python
BUILD := .venv/bin/jupyter-book build . -W -n --keep-going

.PHONY: setup setup-qwen setup-render book notebooks html render status reproduce test test-fast clean
setup:
	bash scripts/setup.sh

# the two Qwen2.5-Coder models (about 1.6 GB, --no-deps): the book's chapters use them, make test does not
setup-qwen: setup
	$(PY) -m sinklib.install qwen

setup-render:
	SINKBOOK_SETUP=render bash scripts/setup.sh

notebooks: setup setup-qwen
	$(PY) -m sinklib.book update --profile $(PROFILE)   # stale chapters only; prints what else needs a rerun
	$(PY) -m sinklib.claims     # the claims page's table, from data/results
	$(PY) -m sinklib.book.models_page  # the models page's table, from the registry and data/results
	$(PY) -m sinklib.book.course report  # the course guide's times, from data/results/course_times.json (measure: python -m sinklib.book.course time)

html: setup
	$(BUILD)

render: setup-render
	$(BUILD)

book: notebooks html

status: setup
	$(PY) -m sinklib.book status --profile $(PROFILE)

reproduce: setup
	$(PY) -m sinklib.book reproduce --profile $(PROFILE) $(if $(ONLY),--only $(ONLY)) $(if $(DEVICE),--device $(DEVICE)) --tol $(TOL)

test: setup
	$(PY) -m pytest -q -ra

test-fast: setup
	$(PY) -m pytest -q -ra -m "not slow"

clean:
	rm -rf _build
