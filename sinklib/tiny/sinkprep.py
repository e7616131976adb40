"""Fill chapter 9's cache with worker processes: every pilot try, every panel model with its adaptation and its
causal check, and the recipe tries, each computed exactly as the chapter computes it (the same parameters, so the
same cache keys), two or more at a time with one torch thread each.

On the 2-core machine the chapter trains one model after another on one thread (4-5 hours from an empty cache:
the 18 panel models' trainings alone add up to about 3.5 hours of one thread); ``python -m sinklib.tiny.sinkprep
--profile full --jobs 2`` fills the same cache in about half the wall time, after which the chapter reads
everything from the cache. On one machine the results are the same either way: a training run's numbers do not
depend on which process ran it (one thread each; ``tests/test_sinkprep.py``). On another machine they can
differ, and the adapted models more than the base models (chapter 9 says by how much).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sinklib.errors import ParameterError

CHAPTER = "09_sink_panel"


def chapter_params(profile: str = "full", root: Path | None = None) -> dict:
    """Chapter 9's parameters on `profile`: the notebook's parameters cell with the profile's values over it
    (what papermill runs it with), checked by ``CHAPTER9_PARAMS``."""
    from sinklib.book.prep import notebook_params
    from sinklib.tiny.sinkpanel import CHAPTER9_PARAMS

    return notebook_params(CHAPTER, profile, CHAPTER9_PARAMS, root)


def plan(p: Mapping) -> list[dict]:
    """The jobs: one per distinct trained model (its cache key), each with what to compute on it in order:
    'train', then 'adapt' with the chapter's adaptation (and the first recipe try where the chapter runs it) and
    'causal' for panel models. Longest first (by steps), so that two workers finish close together."""
    from sinklib.tiny import backcopy_adapt as ba
    from sinklib.tiny import backcopy_train as bt
    from sinklib.tiny import sinkpanel as sp

    common = {"batch": p["batch"], "eval_n": p["eval_n"], "check_every": p["check_every"]}
    adapt = {"stage1_steps": p["stage1_steps"], "stage2_steps": p["stage2_steps"], "lr_lm": p["lr_lm"],
             "vqa_n": p["vqa_n"]}
    jobs: dict[str, dict] = {}

    def add(params: Mapping, label: str, *, adapts=(), causal: bool = False) -> None:
        tp = bt.train_params(**dict(params))
        job = jobs.setdefault(str(bt._key(tp)), {"params": tp, "labels": [], "adapts": [], "causal": False})
        job["labels"].append(label)
        job["adapts"] += [a for a in adapts if a not in job["adapts"]]
        job["causal"] = job["causal"] or causal

    for t in p["pilot_tries"]:
        setting, chosen = sp.split_try(t, p["variants"])
        for v in chosen:
            add({**common, "steps": p["pilot_steps"], **sp.parse_setting(setting), "variant": v}, f"pilot {t} {v}")
    add({**common, "steps": p["pilot_steps"], "variant": p["variants"][0]}, "recipe tries",
        adapts=[{**adapt, **ba.FIRST_TRY}, adapt])
    if p["run_panel"]:
        for g in sp.model_grid(p["variants"], p["settings"], p["seeds"], {**common, "steps": p["panel_steps"]},
                               p["replicate_settings"]):
            add(g["params"], g["name"], adapts=[adapt], causal=True)
    return sorted(jobs.values(), key=lambda j: -j["params"]["steps"])


def run_job(job: Mapping, threads: int = 1) -> dict:
    """Compute one job in this process (one torch thread by default); returns its labels and seconds."""
    import torch

    from sinklib.tiny import backcopy_adapt as ba
    from sinklib.tiny import backcopy_train as bt
    from sinklib.tiny import sinkpanel as sp

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    bt.train_backcopy(job["params"], need_model=False)
    for a in job["adapts"]:
        ba.adapt(job["params"], a)
    if job["causal"]:
        sp.causal(job["params"])
    return {"labels": job["labels"], "seconds": time.perf_counter() - t0}


def prepare(p: Mapping, *, jobs: int = 2, threads: int = 1, log: Callable[[str], None] = print) -> list[dict]:
    """Run every job of ``plan(p)`` with `jobs` worker processes (spawned; `threads` torch threads each); jobs=1
    runs them here, one after another. Each job has its own cache keys, so workers never write the same entry."""
    todo = plan(p)
    log(f"chapter 9: {len(todo)} models to train (or read), {jobs} worker(s) of {threads} thread(s)")
    t0, done = time.perf_counter(), []
    if jobs <= 1:
        results = (run_job(j, threads) for j in todo)
        for i, r in enumerate(results, 1):
            done.append(r)
            log(f"[{i}/{len(todo)}] {', '.join(r['labels'])}: {r['seconds']:.0f} s "
                f"(elapsed {time.perf_counter() - t0:.0f} s)")
        return done
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as ex:
        futures = [ex.submit(run_job, j, threads) for j in todo]
        for i, f in enumerate(as_completed(futures), 1):
            r = f.result()
            done.append(r)
            log(f"[{i}/{len(todo)}] {', '.join(r['labels'])}: {r['seconds']:.0f} s "
                f"(elapsed {time.perf_counter() - t0:.0f} s)")
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="full", help="the chapter's profile (quick, full, colab)")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2: one per core here)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    ap.add_argument("--dry-run", action="store_true", help="list the jobs and stop")
    a = ap.parse_args(argv)
    from sinklib.book.carry import import_committed

    if not a.dry_run:
        import_committed()   # what earlier machines finished (the checkout's carried/)
    p = chapter_params(a.profile)
    if a.dry_run:
        for j in plan(p):
            print(f"{j['params']['steps']:5d} steps  {', '.join(j['labels'])}  adapt x{len(j['adapts'])}"
                  f"{'  causal' if j['causal'] else ''}")
        return 0
    prepare(p, jobs=a.jobs, threads=a.threads, log=lambda s: print(s, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
