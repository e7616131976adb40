"""The runtime of the book: the papermill runner and profiles (`runner`), results with provenance (`results`), the
course guide (`course`), differences between results folders (`compare`) and the paper's reported values
(`reported`). ``python -m sinklib.book`` runs the runner's command line."""
from sinklib.book.results import device_info, load_results, save_results
from sinklib.book.runner import (BOOTSTRAP_FIRST_LINE, CHAPTERS, GLUE_PREFIX, NOTEBOOKS, PROFILES, PROFILE_NAMES,
    README_FIGURE_TAG, READS_RESULTS_OF, REPO, bootstrap_source, code_sources, executed_parameters,
    export_tagged_figures, fold_injected_cell, fold_parameters, glue, load_profile, main,
    notebook_names, parameters_cell, repository_url, run, run_order, set_repo, sync_text)
