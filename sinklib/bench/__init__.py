"""The benchmark: timing primitives shared by its parts (`timing`), the CPU run (`cpu`,
``python -m sinklib.bench``), the 7-8B GPU configurations (`gpu`), the performance page's table and figure (`report`)."""
from sinklib.bench.timing import (BOOK, DEFAULT_LENGTHS, DEFAULT_MODELS, GIB, MEM_RESOLUTION, METHODS,
    MIN_SECONDS, PROBE_OVER_PLAIN, QUICK_LENGTHS, REPO, S_PROFILE, S_PROFILE_QUICK, TARGETS, check_targets,
    fit_loglog_slope, interleaved_timings, long_input, memory_fits, plain_passes, probe_over_plain, ratio_table,
    rounds_for, s_cost_fns)
from sinklib.bench.cpu import (bench_input, load, main, method_fns, peak_memory, predict_eager_bytes, run_cpu,
    save, timing_rows)
from sinklib.bench.report import cpu_markdown, gpu_markdown, plot_cpu, write_report
