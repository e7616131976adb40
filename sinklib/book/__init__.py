"""The runtime of the book: the papermill runner, profiles and results with provenance (`runner`), the
course guide (`course`), differences between results folders (`compare`) and the paper's reported values
(`reported`). ``python -m sinklib.book`` runs the runner's command line."""
from sinklib.book.runner import (BOOTSTRAP_FIRST_LINE, CHAPTERS, GLUE_PREFIX, NOTEBOOKS, PROFILES, PROFILE_NAMES,
    README_FIGURE_TAG, READS_RESULTS_OF, REPO, bootstrap_source, code_sources, device_info, executed_parameters,
    export_tagged_figures, fold_injected_cell, fold_parameters, glue, load_profile, load_results, main,
    notebook_names, parameters_cell, repository_url, run, run_order, save_results, set_repo, sync_text)
