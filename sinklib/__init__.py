"""sinklib: the helper package of sinkbook (attention-sink diagnosis of text-capability loss).

The subpackages, lowest first (each imports only from those above it in this list):

    errors       the errors users meet
    core         parameters, package data, model anatomy and registry, the sink probe, S and the sink
                 intervention, cache, training loop
    plots        the book's figures
    stats        panel statistics, schema, architecture test, verdict rules, intervals, display
    evals        the text suites, graders, paired changes, power
    vl           the miniature vision-language task and its model parts
    bound        the perturbation bound: theorem, random instances, real layers
    bench        the benchmark (CPU, GPU configs, report)
    book         the runtime of the book: runner, profiles, results, course guide, compare, reported values
    adapt        chapter 4's adapted pairs and their controls (isolate, dose, seeds, sweep)
    controls     chapter 6: merging and QK-norm injection
    tiny         chapters 7 and 9: tiny LMs trained from scratch
    causal       chapter 8: suites under an intervention, the BOS ablation, head-wise repair
    claims       the claims page, one module per chapter's rows
    install      the Colab bootstrap (`python -m sinklib.install models graders`)

Notebooks import what they use from this top level, by short name (``from sinklib import pairs, glue,
validate``): `NOTEBOOK_NAMES` says where each lives. Nothing is imported until it is used.
"""
import importlib as _importlib
import importlib.abc as _abc
import importlib.util as _util
import sys as _sys
import warnings as _warnings

__version__ = "0.1.0"

# transformers imports tqdm.auto, which warns inside Jupyter when ipywidgets is absent. Progress bars are
# off by default in the book (show_progress=False) and fall back to text bars otherwise, so the warning
# (which also prints the local site-packages path into the rendered pages) carries no information.
_warnings.filterwarnings("ignore", message="IProgress not found")

#: the notebooks' namespace: short name -> "module" or "module:attribute"
NOTEBOOK_NAMES: dict[str, str] = {
    # modules
    "anatomy": "sinklib.core.anatomy", "cache": "sinklib.core.cache", "data": "sinklib.core.data",
    "models": "sinklib.core.models", "params": "sinklib.core.params", "probe": "sinklib.core.probe",
    "resources": "sinklib.core.resources", "sink": "sinklib.core.sink", "train": "sinklib.core.train",
    "pairs": "sinklib.adapt.pairs", "isolate": "sinklib.adapt.isolate", "dose": "sinklib.adapt.dose",
    "seeds": "sinklib.adapt.seeds", "sweep": "sinklib.adapt.sweep",
    "panel": "sinklib.stats.panel", "architecture": "sinklib.stats.architecture", "verdicts": "sinklib.stats.verdicts",
    "power": "sinklib.evals.power", "paired": "sinklib.evals.paired",
    "merge": "sinklib.controls.merge", "inject": "sinklib.controls.inject",
    "intervene": "sinklib.core.intervene", "repair": "sinklib.causal.repair",
    "reported": "sinklib.book.reported", "course": "sinklib.book.course", "compare": "sinklib.book.compare",
    # the functions every chapter uses
    "validate": "sinklib.core.params:validate", "load_prompts": "sinklib.core.data:load_prompts",
    "load_model": "sinklib.core.models:load_model", "glue": "sinklib.book.runner:glue",
    "save_results": "sinklib.book.results:save_results", "load_results": "sinklib.book.results:load_results",
    "paper_value": "sinklib.book.reported:reported",
}

#: module paths that moved, kept importable only for the executed chapters that ran with them (their code
#: cells must match the source notebooks); each entry goes when no notebook uses it (tests/test_layout.py)
LEGACY_PATHS: dict[str, str] = {}   # chapters 6 and 8 were the last to use sinklib.data, .params and .reported


def __getattr__(name: str):
    target = NOTEBOOK_NAMES.get(name)
    if target is None:
        raise AttributeError(f"module 'sinklib' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = _importlib.import_module(module)
    return getattr(value, attr) if attr else value


def __dir__():
    return sorted(list(globals()) + list(NOTEBOOK_NAMES))


class _Legacy(_abc.MetaPathFinder, _abc.Loader):
    """Imports a moved module path (`LEGACY_PATHS`) as the module at its new place (the same object)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in LEGACY_PATHS:
            return _util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return _importlib.import_module(LEGACY_PATHS[spec.name])

    def exec_module(self, module):
        pass


_sys.meta_path.insert(0, _Legacy())
